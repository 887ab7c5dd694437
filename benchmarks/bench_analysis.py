"""How long the analysis after the profiled code takes, against torch and against the floor.

For each size, one training trace is captured exactly as ``jupyter_memprof.profile()``
captures it (memory, shapes, Python stacks). On that same trace we time:

- ours: every table built (records, ops, allocations, versions, uses, names, flows,
  categories, events, timeline): ``jupyter_memprof._frontends.capture.build_tables``;
- torch: ``torch.profiler._memory_profiler.MemoryProfile(result).timeline``, the analysis
  behind torch's deprecated memory-timeline export;
- floor: a bare walk of torch's event tree that reads, from every event, what the reader
  reads of every event of its kind, and builds nothing (:func:`floor_walk`).

Run: ``.venv/bin/python benchmarks/bench_analysis.py [--sizes 1,8,29] [--rounds 3] [--torch-max-events N]``
(sizes are numbers of Adam steps of a 64-block MLP in one capture: 1 step is ~35k events).
Each size reports the median of ``--rounds`` rounds and their spread; the rounds run floor,
ours and torch in turn, so that load from elsewhere on the machine hits all three alike.
"""

from __future__ import annotations

import argparse
import gc
import statistics
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


def capture(steps: int) -> Recorder:
    """Capture ``steps`` Adam steps exactly as ``profile()`` does; keep torch's raw result."""
    model, opt, x = make_model()
    ns = {"model": model, "opt": opt, "x": x}

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()  # warm-up: optimizer state exists, as in a real training loop
    warm_up_profiler(step)
    recorder = Recorder(["cpu"], with_stack=True, namespace=lambda: ns)
    recorder.start()
    for _ in range(steps):
        step()
    recorder.stop()
    return recorder


def warm_up_profiler(step) -> None:
    """One throwaway capture of ``step``, so the measured one is not the first of the process.

    The first capture records one-time work (lazy imports, first calls through the hooks):
    about 4.6k more events on one step of this MLP. Every benchmark warms up this way, so
    their event counts for the same step agree.
    """
    recorder = Recorder(["cpu"], with_stack=True, namespace=dict)
    recorder.start()
    step()
    recorder.stop()
    recorder.release()


def floor_walk(results) -> int:
    """Read from every event the fields the reader needs of every event of its kind; build
    nothing.

    Events are told apart the cheapest way there is, by the type of their extra fields (as
    the reader does): comparing ``ev.tag``, a pybind11 enum, costs about 0.3 µs a time. What
    the reader reads only for some events (the strides, device and type of a tensor that
    existed before the capture; the scope of an annotation) is left out.
    """
    from torch._C._profiler import (
        _ExtraFields_Allocation,
        _ExtraFields_PyCall,
        _ExtraFields_PyCCall,
        _ExtraFields_TorchOp,
        _TensorMetadata,
    )

    n = 0
    stack = list(results.experimental_event_tree())
    while stack:
        ev = stack.pop()
        n += 1
        f = ev.extra_fields
        kind = type(f)
        if kind is _ExtraFields_TorchOp:
            _ = (f.name, f.sequence_number, ev.start_time_ns, ev.end_time_ns, ev.start_tid)
            for x in f.inputs:
                if type(x) is _TensorMetadata:
                    _ = (x.id, x.sizes)
                elif type(x) is list:
                    for y in x:
                        if type(y) is _TensorMetadata:
                            _ = (y.id, y.sizes)
        elif kind is _ExtraFields_Allocation:
            _ = (
                f.ptr,
                f.alloc_size,
                f.id,
                f.allocation_id,
                f.device,
                ev.start_time_ns,
                ev.start_tid,
            )
        elif kind is _ExtraFields_PyCall or kind is _ExtraFields_PyCCall:
            c = f.caller
            _ = (c.file_name, c.line_number, c.function_name)
        stack.extend(ev.children)
    return n


def timed(fn):
    gc.collect()
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def measure(steps: int, torch_max_events: int, rounds: int) -> tuple:
    """Rounds of floor, ours and torch in turn, so load from elsewhere hits them alike."""
    recorder = capture(steps)
    results = recorder.kineto_results
    floor, ours, torch_ = [], [], []
    events = floor_walk(results)
    for r in range(rounds):
        floor.append(timed(lambda: floor_walk(results))[0])
        ours_s, (tables, _) = timed(lambda: build_tables(recorder))
        ours.append(ours_s)
        if events <= torch_max_events:
            from torch.profiler._memory_profiler import MemoryProfile

            torch_.append(timed(lambda: MemoryProfile(results).timeline)[0])
        print(
            f"steps={steps} round {r + 1}/{rounds}: {events} events, ours {ours[-1]:.2f} s, "
            f"floor {floor[-1]:.2f} s, torch {torch_[-1] if torch_ else float('nan'):.2f} s",
            file=sys.stderr,
            flush=True,
        )
    tracemalloc.start()
    build_tables(recorder)
    _, peak_mem = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return (events, len(tables["ops"]), len(tables["allocations"]), floor, ours, torch_, peak_mem)


def fmt(xs: list[float]) -> str:
    """The median and the spread (min-max) of the rounds."""
    if not xs:
        return "skipped"
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}–{max(xs):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,8,29", help="Adam steps per capture, comma separated")
    ap.add_argument(
        "--torch-max-events", type=int, default=1_200_000, help="skip torch above this many events"
    )
    ap.add_argument("--rounds", type=int, default=3, help="rounds per size (median reported)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = [measure(int(s), args.torch_max_events, args.rounds) for s in args.sizes.split(",")]
    print(f"\nMedian of {args.rounds} rounds (min–max in brackets).\n")
    print(
        "| events | ops | blocks | floor walk | ours (all tables) | torch MemoryProfile | ours/torch "
        "| ours/floor | ours µs/event | analysis peak memory |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for events, n_ops, n_blocks, floor, ours, torch_, peak_mem in rows:
        f, o = statistics.median(floor), statistics.median(ours)
        ratio_t = f"{o / statistics.median(torch_):.3f}x" if torch_ else "n/a"
        print(
            f"| {events:,} | {n_ops:,} | {n_blocks:,} | {fmt(floor)} | {fmt(ours)} | {fmt(torch_)} "
            f"| {ratio_t} | {o / f:.1f}x | {o / events * 1e6:.1f} | {peak_mem / 2**20:.0f} MiB |"
        )


if __name__ == "__main__":
    main()
