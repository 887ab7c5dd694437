"""Saving and loading a large profile: the zip of JSON against the folder of Parquet files.

One capture of N Adam steps of the 64-block MLP of ``bench_analysis.py`` (29 steps is about
a million events), analysed once; then, for each format, the median of several rounds of
``prof.save(...)`` and of ``jupyter_memprof.load(...)`` (which coerces every table back to its
schema), and the size on disk.

Run: ``.venv/bin/python benchmarks/bench_storage.py [--steps 29] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import torch

import jupyter_memprof
from jupyter_memprof._frontends.capture import build_tables
from jupyter_memprof._producers.recorder import Recorder
from jupyter_memprof._results.profile import Profile

sys.path.insert(0, os.path.dirname(__file__))
from bench_analysis import make_model

warnings.filterwarnings("ignore", category=FutureWarning)


def capture(steps: int) -> Profile:
    model, opt, x = make_model()
    ns = {"model": model, "opt": opt, "x": x}

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()
    recorder = Recorder(["cpu"], with_stack=True, namespace=lambda: ns)
    recorder.start()
    for _ in range(steps):
        step()
    recorder.stop()
    tables, meta = build_tables(recorder)
    recorder.release()
    return Profile(**tables, meta={**meta, "devices": ["cpu"], "label": f"{steps} steps"})


def size_on_disk(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return os.path.getsize(path)


def median_time(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=29, help="Adam steps in the capture")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per measurement (median)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    prof = capture(args.steps)
    rows = sum(len(t) for t in prof.tables.values())
    print(
        f"{prof.meta['event_count']:,} events, {len(prof.ops):,} ops, "
        f"{len(prof.allocations):,} blocks, {rows:,} table rows",
        file=sys.stderr,
        flush=True,
    )
    folder = tempfile.mkdtemp(prefix="bench_storage.")
    try:
        results = {}
        for fmt, name in (("zip", "p.memprof"), ("parquet", "p.parquet")):
            path = os.path.join(folder, name)

            def save(path=path, fmt=fmt):
                if fmt == "zip" and os.path.exists(path):
                    os.remove(path)
                prof.save(path, format=fmt)

            save_s = median_time(save, args.rounds)
            load_s = median_time(lambda path=path: jupyter_memprof.load(path), args.rounds)
            results[fmt] = (save_s, load_s, size_on_disk(path))
            print(f"{fmt}: save {save_s:.2f} s, load {load_s:.2f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    zs, zl, zb = results["zip"]
    ps, pl, pb = results["parquet"]
    print()
    print(
        f"Capture: {prof.meta['event_count']:,} events; tables: {len(prof.ops):,} ops, "
        f"{len(prof.allocations):,} blocks, {rows:,} rows in all. Medians of {args.rounds} rounds."
    )
    print()
    print("| format | save | load | size on disk |")
    print("|---|---:|---:|---:|")
    print(f"| zip of JSON (`save(path)`) | {zs:.2f} s | {zl:.2f} s | {zb / 2**20:.1f} MiB |")
    print(
        f'| Parquet folder (`save(path, format="parquet")`) | {ps:.2f} s | {pl:.2f} s '
        f"| {pb / 2**20:.1f} MiB |"
    )
    print(
        f"| Parquet / zip | {ps / zs:.2f}x | {pl / zl:.2f}x ({zl / pl:.1f} times faster) "
        f"| {pb / zb:.2f}x |"
    )


if __name__ == "__main__":
    main()
