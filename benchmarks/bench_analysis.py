"""How long the analysis after the profiled code takes, against torch and against the floor.

For each size, one training trace is captured exactly as ``jupyter_memprof.profile()``
captures it (memory, shapes, Python stacks, module annotations). On that same trace we time:

- ours: every table built (records, ops, allocations, versions, uses, names, flows,
  categories, events, timeline): ``jupyter_memprof._frontends.capture.build_tables``;
- torch: ``torch.profiler._memory_profiler.MemoryProfile(result).timeline``, the analysis
  behind torch's deprecated memory-timeline export;
- floor: a bare walk of torch's event tree that reads every field we need and builds nothing.

Run: ``.venv/bin/python benchmarks/bench_analysis.py [--sizes 1,4,19] [--torch-max-events N]``
(sizes are numbers of Adam steps of a 64-block MLP in one capture: 1 step is ~50k events).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
import warnings

import torch

from jupyter_memprof._frontends.capture import build_tables
from jupyter_memprof._producers.recorder import Recorder

warnings.filterwarnings("ignore", category=FutureWarning)


def make_model(blocks: int = 64, width: int = 64):
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt, torch.randn(32, width)


def capture(steps: int):
    """Capture ``steps`` Adam steps exactly as ``profile()`` does; keep torch's raw result."""
    model, opt, x = make_model()
    ns = {"model": model, "opt": opt, "x": x}

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()  # warm-up: optimizer state exists, as in a real training loop
    recorder = Recorder(["cpu"], with_stack=True, namespace=lambda: ns)
    recorder.start()
    for _ in range(steps):
        step()
    recorder.stop()
    names, rows = recorder.session_names()
    return recorder.kineto_results, names, rows


def floor_walk(results) -> int:
    """Read every field the analysis needs from every event; build nothing."""
    from torch._C._profiler import _EventType, _TensorMetadata

    n = 0
    stack = list(results.experimental_event_tree())
    while stack:
        ev = stack.pop()
        n += 1
        tag = ev.tag
        if tag == _EventType.TorchOp:
            f = ev.extra_fields
            _ = (f.name, f.scope, f.sequence_number, ev.start_time_ns, ev.end_time_ns, ev.start_tid)
            for x in f.inputs:
                if type(x) is _TensorMetadata:
                    _ = (x.id, x.sizes, x.strides, x.storage_data_ptr, x.device, x.dtype)
                elif type(x) is list:
                    for y in x:
                        if type(y) is _TensorMetadata:
                            _ = (y.id, y.sizes, y.strides, y.storage_data_ptr, y.device, y.dtype)
        elif tag == _EventType.Allocation:
            f = ev.extra_fields
            _ = (
                f.ptr,
                f.alloc_size,
                f.id,
                f.allocation_id,
                f.device,
                ev.start_time_ns,
                ev.start_tid,
            )
        elif tag in (_EventType.PyCall, _EventType.PyCCall):
            c = ev.extra_fields.caller
            _ = (c.file_name, c.line_number, c.function_name)
        stack.extend(ev.children)
    return n


def timed(fn, repeat: int = 1):
    best = float("inf")
    out = None
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def measure(steps: int, torch_max_events: int) -> tuple:
    results, names, name_rows = capture(steps)
    floor_s, events = timed(lambda: floor_walk(results), repeat=3)
    ours_s, (tables, _) = timed(
        lambda: build_tables(results, names=names, name_rows=name_rows, devices=["cpu"]), repeat=3
    )
    tracemalloc.start()
    build_tables(results, names=names, name_rows=name_rows, devices=["cpu"])
    _, peak_mem = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    torch_s = float("nan")
    if events <= torch_max_events:
        from torch.profiler._memory_profiler import MemoryProfile

        torch_s, _ = timed(lambda: MemoryProfile(results).timeline)
    return (
        events,
        len(tables["ops"]),
        len(tables["allocations"]),
        floor_s,
        ours_s,
        torch_s,
        peak_mem,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,4,29", help="Adam steps per capture, comma separated")
    ap.add_argument(
        "--torch-max-events", type=int, default=1_200_000, help="skip torch above this many events"
    )
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    for steps in (int(s) for s in args.sizes.split(",")):
        row = measure(steps, args.torch_max_events)
        rows.append(row)
        events, _, _, floor_s, ours_s, torch_s, _ = row
        print(
            f"steps={steps}: {events} events, ours {ours_s:.2f} s, floor {floor_s:.2f} s, torch {torch_s:.2f} s",
            file=sys.stderr,
            flush=True,
        )
    print()
    print(
        "| events | ops | blocks | floor walk | ours (all tables) | torch MemoryProfile | ours/torch "
        "| ours/floor | ours µs/event | analysis peak memory |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for events, n_ops, n_blocks, floor_s, ours_s, torch_s, peak_mem in rows:
        ratio_t = f"{ours_s / torch_s:.3f}x" if torch_s == torch_s else "n/a"
        torch_txt = f"{torch_s:.2f} s" if torch_s == torch_s else "skipped"
        print(
            f"| {events:,} | {n_ops:,} | {n_blocks:,} | {floor_s:.2f} s | {ours_s:.2f} s | {torch_txt} "
            f"| {ratio_t} | {ours_s / floor_s:.1f}x | {ours_s / events * 1e6:.1f} | {peak_mem / 2**20:.0f} MiB |"
        )


if __name__ == "__main__":
    main()
