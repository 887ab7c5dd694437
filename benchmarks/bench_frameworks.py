"""Framework loops (framework_loops.py) profiled and plain: categories and wall time.

For each loop, a plain run (nothing recorded) and a profiled one (``jupyter_memprof.profile``)
of the same loop, each built afresh. We report:

- the wall time of the plain loop, of the loop under the profiler, and of leaving the
  ``with`` block (the wait after the code; ``finish_s`` with its parts);
- the bytes live at the peak per category (``unknown`` should be 0), and whether the
  parameters, gradients and optimizer state alive at the end equal the live objects' bytes;
- how many complete steps ``prof.steps`` holds.

Run: ``.venv/bin/python benchmarks/bench_frameworks.py [loop ...]`` (default: every loop;
HuggingFace's Trainer and Lightning only when installed).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(__file__))

import framework_loops as L
import torch

import jupyter_memprof
from jupyter_memprof._units import format_bytes

warnings.filterwarnings("ignore")

#: name -> (make the loop, the optimizer it trains with once it ran, the package it needs)
LOOPS = {
    "closure_sgd": (L.closure_sgd, None, None),
    "lbfgs": (L.lbfgs, None, None),
    "dataloader_0": (lambda: L.dataloader(0), None, None),
    "dataloader_2": (lambda: L.dataloader(2), None, None),
    "grad_scaler": (L.grad_scaler, None, None),
    "ema": (L.ema, None, None),
    "hf_trainer": (L.hf_trainer, L.trainer_optimizer, "accelerate"),
    "hf_accumulation": (
        lambda: L.hf_trainer(gradient_accumulation_steps=2),
        L.trainer_optimizer,
        "accelerate",
    ),
    "hf_bf16": (lambda: L.hf_trainer(bf16=True), L.trainer_optimizer, "accelerate"),
    "hf_checkpointing": (
        lambda: L.hf_trainer(activation_checkpointing=True),
        L.trainer_optimizer,
        "accelerate",
    ),
    "lightning": (L.lightning, L.lightning_optimizer, "lightning"),
}


def _timed(run) -> float:
    gc.collect()
    t = time.perf_counter()
    run()
    return time.perf_counter() - t


def bench(name: str) -> dict:
    make, optimizer_of, _ = LOOPS[name]
    plain_s = _timed(make().run)
    loop = make()
    gc.collect()
    t = time.perf_counter()
    with jupyter_memprof.profile(namespace=loop.ns) as prof:
        loop.run()
        left = time.perf_counter()
    waited = time.perf_counter() - left
    if optimizer_of is not None:
        loop.optimizer = optimizer_of(loop)
    a = prof.allocations
    alive = a[a["free_ns"].isna().to_numpy()]
    alive = alive.groupby("category", observed=True)["size_bytes"].sum()
    exact = all(int(alive.get(k, 0)) == v for k, v in L.live_bytes(loop).items())
    peak = prof.peak_by("category")
    m = prof.meta
    return {
        "plain_s": plain_s,
        "profiled_s": left - t,
        "exit_s": waited,
        "finish": {k: m.get(k) for k in ("stop_s", "capture_s", "analysis_s", "free_s")},
        "peak": {str(k): int(v) for k, v in peak.items() if v},
        "unknown_share": float(peak.get("unknown", 0)) / max(int(peak.sum()), 1),
        "exact": exact,
        "steps": int(prof.steps.drop_duplicates("step")["complete"].sum()),
    }


def main(names: list[str]) -> None:
    torch.set_num_threads(1)
    with jupyter_memprof.profile(namespace={}):  # torch's profiler set up once, untimed
        torch.ones(1) + 1
    for name in names:
        need = LOOPS[name][2]
        if need is not None and importlib.util.find_spec(need) is None:
            print(f"{name}: skipped ({need} is not installed)")
            continue
        r = bench(name)
        parts = ", ".join(f"{k[:-2]} {v:.3f}" for k, v in r["finish"].items() if v is not None)
        print(
            f"{name}: plain {r['plain_s']:.3f} s, profiled {r['profiled_s']:.3f} s, "
            f"then {r['exit_s']:.3f} s ({parts}); {r['steps']} steps; "
            f"unknown {r['unknown_share']:.1%} of the peak; "
            f"parameters/gradients/optimizer state exact: {r['exact']}"
        )
        print("   peak: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in r["peak"].items()))


if __name__ == "__main__":
    main(sys.argv[1:] or list(LOOPS))
