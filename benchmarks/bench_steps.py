"""Long runs: 1,000 steps of the benchmark MLP (scenarios.mlp_adam) in one capture.

Each variant runs in a fresh process (so the resident memory it reports is its own), in
turn, round after round, so that load from elsewhere on the machine hits them alike; the
table reports the median of the rounds:

- none: the loop without any profiler;
- torch: ``torch.profiler.profile`` with the same flags as a capture (memory, shapes,
  Python stacks) and a schedule of windows of the same length (``schedule(wait=0,
  warmup=0, active=W)``, ``on_trace_ready`` doing nothing, ``prof.step()`` in the loop):
  what torch needs to profile a long loop in bounded memory;
- torch + trace files: the windowed torch profiler as torch documents it for a schedule,
  ``on_trace_ready=tensorboard_trace_handler(dir)`` writing each window's trace file (a
  temporary folder, removed after);
- torch + table: the windowed torch profiler, with ``on_trace_ready`` reading each window's
  table (``prof.key_averages()``, which builds torch's Python events of the window first:
  what any reading of a window through torch's Python API starts with);
- torch one window: the same profiler without a schedule, every step in one window
  (what one capture keeps: memory grows with the loop, and the stop waits for all of it);
- torch + timeline: the windowed torch profiler, with ``on_trace_ready`` building torch's own memory timeline
  of each window (``MemoryProfile(result).timeline``, what ``export_memory_timeline``
  needs): torch's profiler doing the work ours does (categories and live bytes over time);
- ours: ``jupyter_memprof.profile(steps=W)``, every window read and analysed as it ends.

Columns: the loop's time per step and its overhead over ``none``, the wait after the loop
(from its end to the end of the ``with`` block), the overhead per step with that wait
spread over the steps (what the user waits for in all), the growth of the process's resident
memory over the run (peak RSS during the run less RSS before it), and for ours the
windows, the largest window's events and the blocks carried to the end.

``--switch`` measures only the switch between two windows, ours (torch's profiler stopped
and a new one started, as :class:`WindowRecorder` does) against torch's schedule (the
``prof.step()`` that ends a window), medians of 10 windows in one process.

Run: ``.venv/bin/python benchmarks/bench_steps.py [--steps 1000] [--window 20] [--rounds 3]
[--variants none,torch,ours]``
or ``.venv/bin/python benchmarks/bench_steps.py --switch [--window 20]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _nothing(tp) -> None:
    """A window's results, dropped."""


def _table(tp) -> None:
    """torch's table of one window (its events built first)."""
    tp.key_averages()


def _memory_timeline(tp) -> None:
    """torch's memory timeline of one window (categories, live bytes over time)."""
    from torch.profiler._memory_profiler import MemoryProfile

    _ = MemoryProfile(tp.profiler.kineto_results).timeline


def _on_trace_ready(variant: str, trace_dir: str):
    """What a windowed torch variant does with each window (see the module's docstring)."""
    import torch

    if variant.endswith("trace files"):
        return torch.profiler.tensorboard_trace_handler(trace_dir)
    if variant.endswith("table"):
        return _table
    if variant.endswith("timeline"):
        return _memory_timeline
    return _nothing


def one(variant: str, steps: int, window: int) -> dict:
    """Run one variant in this process; returns its numbers."""
    sys.path.insert(0, HERE)
    warnings.filterwarnings("ignore")
    import torch
    from scenarios import mlp_adam

    import jupyter_memprof

    torch.set_num_threads(1)
    ns, step = mlp_adam()
    for _ in range(3):  # warm: the first steps make Adam's state and load kernels
        step()
    if variant != "none":  # torch's first profiler start imports torch._inductor: not timed
        with torch.autograd.profiler.profile():
            pass
    trace_dir = tempfile.mkdtemp(prefix="bench_steps_")
    rss0 = _rss()
    out: dict = {}
    if variant == "none":
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        t1 = t2 = time.perf_counter()
    elif variant.startswith("torch"):
        windowed = variant != "torch one window"
        tp = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            profile_memory=True,
            record_shapes=True,
            with_stack=True,
            schedule=torch.profiler.schedule(wait=0, warmup=0, active=window) if windowed else None,
            on_trace_ready=_on_trace_ready(variant, trace_dir) if windowed else None,
        )
        with tp:
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
                tp.step()
            t1 = time.perf_counter()
        t2 = time.perf_counter()
    else:
        with jupyter_memprof.profile(steps=window, namespace=ns) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        run = prof.meta["long_run"]
        out.update(
            rows=len(prof.steps),
            windows=run["windows"],
            window_events=run["window_events_max"],
            carried=run["carried_blocks"],
            leaks=len(prof.leaks()),
        )
    shutil.rmtree(trace_dir, ignore_errors=True)
    out.update(
        step_ms=(t1 - t0) / steps * 1e3,
        wait_s=t2 - t1,
        rss_mib=max(_peak_rss() - rss0, 0) / 2**20,
    )
    return out


def switch(window: int, windows: int = 10) -> None:
    """Print the median cost of one switch between windows, ours and torch's schedule."""
    sys.path.insert(0, HERE)
    warnings.filterwarnings("ignore")
    import torch
    from scenarios import mlp_adam

    from jupyter_memprof._producers.recorder import force_stop, quiet_stderr
    from jupyter_memprof._producers.windows import _new_profiler

    torch.set_num_threads(1)
    _, step = mlp_adam()
    for _ in range(3):
        step()
    with torch.autograd.profiler.profile():
        pass
    ours = []
    tp = _new_profiler(["cpu"], True)
    with quiet_stderr():
        tp.__enter__()
    for _ in range(windows):
        for _ in range(window):
            step()
        t = time.perf_counter()
        force_stop(tp)
        tp.profiler = None
        tp = _new_profiler(["cpu"], True)
        with quiet_stderr():
            tp.__enter__()
        ours.append(time.perf_counter() - t)
    force_stop(tp)
    theirs = []
    tp = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
        schedule=torch.profiler.schedule(wait=0, warmup=0, active=window),
        on_trace_ready=_nothing,
    )
    with quiet_stderr():
        tp.__enter__()
    for _ in range(windows):
        for i in range(window):
            step()
            t = time.perf_counter()
            with quiet_stderr():
                tp.step()
            if i == window - 1:
                theirs.append(time.perf_counter() - t)
    with quiet_stderr():
        tp.__exit__(None, None, None)
    print(
        f"switch between windows of {window} steps, median of {windows}: ours (stop + a new "
        f"profiler) {statistics.median(ours) * 1e3:.1f} ms, torch's schedule (the prof.step() "
        f"ending a window) {statistics.median(theirs) * 1e3:.1f} ms"
    )


#: every variant, in the table's order; what each includes: :data:`INCLUDES`
VARIANTS = (
    "none",
    "torch",
    "torch + trace files",
    "torch + table",
    "torch one window",
    "torch + timeline",
    "ours",
)
#: what each variant's time per step includes, printed under the table
INCLUDES = {
    "none": "the loop alone",
    "torch": "torch's profiler (memory, shapes, Python stacks) in windows of W steps: "
    "recording, and stopping and starting at each window's end; nothing read",
    "torch + trace files": "the same, each window's trace written by "
    "tensorboard_trace_handler (torch's documented on_trace_ready)",
    "torch + table": "the same, each window's key_averages() (torch's Python events built)",
    "torch one window": "the same profiler without a schedule: every step in one window, "
    "read by nobody (the stop waits for all of it)",
    "torch + timeline": "the same windows, each window's MemoryProfile(...).timeline",
    "ours": "profile(steps=W): the same flags and windows, each window read and analysed "
    "(steps rows, carried blocks, kept tables) as it ends",
}


def _child(variant: str, steps: int, window: int) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, "--steps", str(steps)]
    cmd += ["--window", str(window)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child")
    ap.add_argument("--switch", action="store_true")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    if args.switch:
        switch(args.window)
        return
    if args.child:
        print(json.dumps(one(args.child, args.steps, args.window)))
        return
    variants = tuple(v.strip() for v in args.variants.split(","))
    unknown = set(variants) - set(VARIANTS)
    if unknown or "none" not in variants:
        ap.error(f"--variants: choose among {', '.join(VARIANTS)}, none included")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            runs[v].append(_child(v, args.steps, args.window))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    def med(v: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[v])

    base = [x["step_ms"] for x in runs["none"]]
    print(
        f"{args.steps} steps of the benchmark MLP (Adam), windows of {args.window} steps, "
        f"median of {args.rounds} rounds"
    )
    print()
    print(
        "| variant | ms per step | overhead per step | wait after the loop "
        "| overhead per step, wait included | RSS growth |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for v in variants:
        over = statistics.median(x["step_ms"] - b for x, b in zip(runs[v], base))
        # what the user waits for: the loop's extra time and the wait after it, per step
        total = statistics.median(
            x["step_ms"] - b + x["wait_s"] * 1e3 / args.steps for x, b in zip(runs[v], base)
        )
        print(
            f"| {v} | {med(v, 'step_ms'):.2f} ms | "
            f"{'-' if v == 'none' else f'{over:.2f} ms'} | "
            f"{med(v, 'wait_s'):.2f} s | {'-' if v == 'none' else f'{total:.2f} ms'} | "
            f"{med(v, 'rss_mib'):.0f} MiB |"
        )
    print()
    for v in variants:
        print(f"- {v}: {INCLUDES[v].replace('W steps', f'{args.window} steps')}")
    if "ours" not in variants:
        return
    ours = runs["ours"][-1]
    print()
    print(
        f"ours: {ours['rows']} rows in prof.steps, {ours['windows']} windows, at most "
        f"{ours['window_events']} events in one, {ours['carried']} blocks carried to the end, "
        f"{ours['leaks']} leaks"
    )


if __name__ == "__main__":
    main()
