"""What steps and leak finding cost: the analysis of a long timeline and the end's graph walk.

- ``build_steps`` on a timeline of a million rows (38 steps), the size of a 38-step capture
  of the benchmark MLP;
- ``held_rows`` (the tensors autograd graphs keep, read when a capture ends) for 20 graphs
  of a 64-block Linear+LayerNorm+ReLU MLP kept alive (an evaluation loop keeping its
  losses), and for the same graphs after their backward ran (a training loop keeping its
  losses: the walk stops at each graph's first node);
- ``Profile.leaks()`` on a real capture of 20 steps of that loop.

Medians of several rounds. Run: ``.venv/bin/python benchmarks/bench_leaks.py``.
"""

from __future__ import annotations

import statistics
import time
import warnings

import numpy as np
import pandas as pd
import torch

import jupyter_memprof
from jupyter_memprof._analysis import schema as S
from jupyter_memprof._analysis.steps import build_steps
from jupyter_memprof._producers.live import SessionNames, held_rows

warnings.filterwarnings("ignore", category=FutureWarning)
ROUNDS = 5


def median_s(fn, rounds: int = ROUNDS) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def long_timeline(n: int = 1_000_000, steps: int = 38):
    """A timeline of ``n`` rows over 8 categories and the ops of ``steps`` optimizer steps."""
    rng = np.random.default_rng(0)
    timeline = pd.DataFrame(
        {
            "time_ns": np.arange(n, dtype=np.int64) * 10,
            "device": pd.Categorical(["cpu"] * n),
            "category": pd.Categorical.from_codes(rng.integers(0, 8, n), dtype=S.CATEGORY_DTYPE),
            "bytes": rng.integers(0, 1 << 30, n),
        }
    )
    events = pd.DataFrame(
        {
            "time_ns": timeline["time_ns"],
            "action": pd.Categorical(["create"] * n, dtype=S.ACTION_DTYPE),
        }
    )
    ends = np.arange(1, steps + 1, dtype=np.int64) * (n * 10 // (steps + 1))
    ops = pd.DataFrame(
        {
            "op_id": np.arange(steps),
            "parent_id": pd.array([None] * steps, dtype="Int64"),
            "name": ["Optimizer.step#Adam.step"] * steps,
            "kind": pd.Categorical(["optimizer"] * steps, dtype=S.KIND_DTYPE),
            "start_ns": ends - 5,
            "end_ns": ends,
        }
    )
    return ops, events, timeline, n * 10


def mlp(blocks: int = 64, width: int = 256) -> torch.nn.Module:
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def main() -> None:
    torch.manual_seed(0)
    ops, events, timeline, end = long_timeline()
    s = median_s(lambda: build_steps(ops, events, timeline, 0, end))
    print(f"build_steps, 1,000,000 timeline rows, 38 steps: {s * 1e3:.0f} ms")

    model, x = mlp(), torch.randn(32, 256)
    losses = [model(x).sum() for _ in range(20)]
    ns = {"model": model, "x": x, "losses": losses}
    names = SessionNames(ns, [], [])
    rows = held_rows(names, ns)
    s = median_s(lambda: held_rows(names, ns))
    print(f"held_rows, 20 kept graphs of 576 nodes: {s * 1e3:.0f} ms ({len(rows):,} rows)")
    for loss in losses:
        loss.backward()
    s = median_s(lambda: held_rows(names, ns))
    print(f"held_rows, the same graphs after backward: {s * 1e3:.2f} ms")

    kept = []
    with torch.no_grad():
        model(x)  # warm-up
    with jupyter_memprof.profile(namespace={"model": model, "x": x, "kept": kept}) as prof:
        for _ in range(20):
            kept.append(model(x).sum())  # no torch.no_grad(): every graph is kept
            jupyter_memprof.step()
    s = median_s(prof.leaks)
    leak = prof.leaks().iloc[0]
    print(
        f"leaks(), 20 steps, {len(prof.allocations):,} blocks: {s * 1e3:.0f} ms; first row "
        f"{leak['holder']}: {leak['bytes_per_step']:,} bytes per step over {leak['steps']} steps"
    )


if __name__ == "__main__":
    main()
