"""What users wait for after their code: ours against torch's own profiler and the floor.

One training step (Adam on a 64-block Linear+LayerNorm+ReLU MLP, as in bench_analysis.py) is
profiled over and over in one process. Each round runs every variant once, in turn, so that
load from elsewhere on the machine hits them alike; the tables report the median of the
rounds and their spread (min-max). Every time starts at the end of the profiled code:

- ours: ``with jupyter_memprof.profile():`` exits with every table built (torch's profiler
  stopped, its events read, tables, categories, timeline); then the dashboard widget built
  (``prof.show()``) and the standalone HTML written (``prof.to_html``), each counted from the
  end of the code; once as in a script, once as in a notebook cell with the extension loaded
  (torch's raw result and the records read from it freed after the cell, that free timed on
  its own);
- torch: a plain ``torch.profiler.profile`` with the same flags (memory, shapes, stacks)
  stopped, then ``MemoryProfile(result).timeline``, what torch needs for its memory timeline;
- floor: the same plain profiler stopped, then a bare walk of the event tree that reads every
  field we need and builds nothing.

It also reports the step's own time under each profiler against no profiler (capture
overhead), the same for the cheaper capture without Python stacks, and the fixed cost of an
empty ``%%memprofile`` cell in an IPython shell.

Run: ``.venv/bin/python benchmarks/bench_latency.py [--steps 1,8] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_analysis import floor_walk, make_model

import jupyter_memprof
from jupyter_memprof._producers.recorder import LATER

warnings.filterwarnings("ignore", category=FutureWarning)


@contextlib.contextmanager
def _quiet_fd2():
    """kineto prints start/stop lines on file descriptor 2; keep them off the report."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class Workload:
    def __init__(self, steps: int):
        self.model, self.opt, self.x = make_model()
        self.ns = {"model": self.model, "opt": self.opt, "x": self.x}
        self.steps = steps
        self.run()  # warm-up: optimizer state exists, as in a real training loop

    def run(self) -> float:
        model, opt, x = self.model, self.opt, self.x
        t = time.perf_counter()
        for _ in range(self.steps):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        return time.perf_counter() - t


def ours(
    work: Workload,
    html_path: str,
    *,
    with_stack: bool = True,
    views: bool = True,
    notebook: bool = False,
) -> dict:
    """``notebook``: as in a cell with the extension loaded, where torch's raw result and
    the records read from it are freed after the cell (IPython's post_run_cell): that free
    is timed on its own."""
    gc.collect()
    LATER.enabled = notebook
    try:
        with jupyter_memprof.profile(namespace=work.ns, with_stack=with_stack) as prof:
            step_s = work.run()
            end = time.perf_counter()
        tables_s = time.perf_counter() - end
    finally:
        LATER.enabled = False
    out = {
        "step": step_s,
        "stop": prof.meta["stop_s"],
        "read": prof.meta["capture_s"],
        "tables": tables_s,
        "events": prof.meta["event_count"],
    }
    if views:
        t = time.perf_counter()
        widget = prof.show(header=False)
        out["widget"] = tables_s + time.perf_counter() - t
        widget.close()
        t = time.perf_counter()
        prof.to_html(html_path)
        out["html"] = tables_s + time.perf_counter() - t
    if notebook:
        t = time.perf_counter()
        LATER.free()  # what post_run_cell does once the cell's output is out
        out["free_after"] = time.perf_counter() - t
    jupyter_memprof._frontends.session.release(prof.session_id)
    return out


def plain_torch(work: Workload, *, with_stack: bool = True, analyse: bool = True) -> dict:
    from torch.profiler._memory_profiler import MemoryProfile

    gc.collect()
    tp = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        profile_memory=True,
        record_shapes=True,
        with_stack=with_stack,
    )
    with _quiet_fd2():
        tp.__enter__()
    step_s = work.run()
    t = time.perf_counter()
    with _quiet_fd2():
        tp.__exit__(None, None, None)
    stop_s = time.perf_counter() - t
    results = tp.profiler.kineto_results
    out = {"step": step_s, "stop": stop_s}
    if analyse:
        t = time.perf_counter()
        floor_walk(results)
        out["floor"] = stop_s + time.perf_counter() - t
        t = time.perf_counter()
        _ = MemoryProfile(results).timeline
        out["torch"] = stop_s + time.perf_counter() - t
    return out


def empty_cell_cost(rounds: int) -> tuple[list[float], list[float]]:
    """Seconds of ``%%memprofile`` on an empty cell, and of the same cell without it."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "jupyter_memprof")
    magic, plain = [], []
    with contextlib.redirect_stdout(io.StringIO()), _quiet_fd2():
        shell.run_cell("%%memprofile\npass\n")  # first use: imports, the tracer's set-up
        for _ in range(rounds):
            for cell, sink in (("%%memprofile\npass\n", magic), ("pass\n", plain)):
                gc.collect()
                t = time.perf_counter()
                shell.run_cell(cell)
                sink.append(time.perf_counter() - t)
    return magic, plain


def against_torch(r: dict[str, list[float]], variant: str) -> str:
    """Ours (``variant``'s every-table time) against torch's and the floor, as table cells."""
    o = med(r[f"{variant}.tables"])
    return f"{o / med(r['torch.torch']):.3f}x | {o / med(r['torch.floor']):.2f}x"


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt(xs: list[float], unit: str = "s") -> str:
    """Median and spread (min-max) of a list of seconds."""
    if unit == "ms":
        return f"{med(xs) * 1e3:.0f} ms ({min(xs) * 1e3:.0f}–{max(xs) * 1e3:.0f})"
    return f"{med(xs):.2f} s ({min(xs):.2f}–{max(xs):.2f})"


def measure(steps: int, rounds: int) -> dict[str, list[float]]:
    work = Workload(steps)
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        html = os.path.join(tmp, "step.html")
        ours(work, html)  # warm-up: first capture of the process, first dashboard
        for r in range(rounds):
            variants = [
                ("ours", lambda: ours(work, html)),
                ("nb", lambda: ours(work, html, notebook=True)),
                ("torch", lambda: plain_torch(work)),
                ("nostack", lambda: ours(work, html, with_stack=False, views=False)),
                ("torch_nostack", lambda: plain_torch(work, with_stack=False, analyse=False)),
                ("bare", lambda: {"step": work.run()}),
            ]
            for name, fn in variants:
                for key, value in fn().items():
                    runs.setdefault(f"{name}.{key}", []).append(value)
            print(
                f"steps={steps} round {r + 1}/{rounds}: ours {runs['ours.tables'][-1]:.2f} s, "
                f"torch {runs['torch.torch'][-1]:.2f} s, floor {runs['torch.floor'][-1]:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", default="1", help="Adam steps per capture, comma separated")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per size (median reported)")
    ap.add_argument("--cell-rounds", type=int, default=7, help="rounds of the empty-cell cost")
    args = ap.parse_args()
    torch.set_num_threads(2)
    results = [(int(s), measure(int(s), args.rounds)) for s in args.steps.split(",")]
    magic, plain = empty_cell_cost(args.cell_rounds)

    print(
        f"\nMedian of {args.rounds} rounds (min–max), seconds from the end of the profiled code.\n"
    )
    print(
        "| events | ours: every table | torch: stop + MemoryProfile | floor: stop + bare walk "
        "| ours/torch | ours/floor | ours: widget built | ours: to_html written |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for _, r in results:
        print(
            f"| {int(med(r['ours.events'])):,} | {fmt(r['ours.tables'])} | {fmt(r['torch.torch'])} "
            f"| {fmt(r['torch.floor'])} | {against_torch(r, 'ours')} | {fmt(r['ours.widget'])} "
            f"| {fmt(r['ours.html'])} |"
        )

    print(
        "\nIn a notebook (the extension loaded: torch's raw result and the records read from "
        "it are freed after the cell, once its output is out):\n"
    )
    print(
        "| events | every table | ours/torch | ours/floor | widget built | to_html written "
        "| freed after the cell |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for _, r in results:
        print(
            f"| {int(med(r['nb.events'])):,} | {fmt(r['nb.tables'])} | {against_torch(r, 'nb')} "
            f"| {fmt(r['nb.widget'])} | {fmt(r['nb.html'])} | {fmt(r['nb.free_after'], 'ms')} |"
        )

    print("\nWhere ours goes, and the profiler's stop against a plain torch profiler's:\n")
    print(
        "| events | ours: stop | ours: read events | ours: tables after reading "
        "| plain torch: stop (same flags) | ours without stacks: stop | plain torch without stacks: stop |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for _, r in results:
        after = [a - b - c for a, b, c in zip(r["ours.tables"], r["ours.stop"], r["ours.read"])]
        print(
            f"| {int(med(r['ours.events'])):,} | {fmt(r['ours.stop'], 'ms')} | {fmt(r['ours.read'], 'ms')} "
            f"| {fmt(after, 'ms')} | {fmt(r['torch.stop'], 'ms')} | {fmt(r['nostack.stop'], 'ms')} "
            f"| {fmt(r['torch_nostack.stop'], 'ms')} |"
        )

    print("\nCapture overhead: the step's own time (the profiled code, nothing after it):\n")
    print(
        "| steps | no profiler | ours | plain torch (same flags) | ours/none | ours/torch "
        "| ours without stacks | plain torch without stacks | ours without stacks: every table |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for steps, r in results:
        b, o, t = med(r["bare.step"]), med(r["ours.step"]), med(r["torch.step"])
        print(
            f"| {steps} | {fmt(r['bare.step'], 'ms')} | {fmt(r['ours.step'], 'ms')} | {fmt(r['torch.step'], 'ms')} "
            f"| {o / b:.1f}x | {o / t:.2f}x | {fmt(r['nostack.step'], 'ms')} "
            f"| {fmt(r['torch_nostack.step'], 'ms')} | {fmt(r['nostack.tables'])} |"
        )

    print(f"\nFixed cost of an empty cell (IPython shell, median of {args.cell_rounds}):\n")
    print("| `%%memprofile` + `pass` | `pass` |")
    print("|---:|---:|")
    print(f"| {fmt(magic, 'ms')} | {fmt(plain, 'ms')} |")


if __name__ == "__main__":
    main()
