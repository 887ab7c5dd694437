"""CUDA: a real capture on a GPU against the caching allocator's own counters, and an
estimate for CUDA against that capture.

    python benchmarks/bench_cuda.py                   # needs a GPU (cuda:0 unless --device)
    python benchmarks/bench_cuda.py --estimate-only   # any machine: estimates for cuda:0 only

For every scenario of ``scenarios.py``, the quickstart model and the LSTM, built on the GPU
(``with torch.device(...)``) and warmed up by one step, one more step is

- captured for real with :func:`jupyter_memprof.profile`, its peak on the device set against
  ``torch.cuda.max_memory_allocated`` around the same step, and its bytes at the end against
  ``torch.cuda.memory_allocated`` (the profile sees blocks alive before the capture only
  through the names it is given, so both are compared as growth from the capture's start);
- estimated with :func:`jupyter_memprof.estimate` on that device (fake CUDA tensors), the
  estimate's peak set against the real capture's, with the parameter, gradient and
  optimizer-state bytes compared exactly.

``--estimate-only`` builds the models on the CPU and estimates each step for ``cuda:0``: on
a machine without a GPU this is the simulated path (``meta["simulated_cuda"]``, CUDA's
kernels for the GPU ``--gpu`` names, an H100 by default). Its table gives each estimate
beside the real peak recorded on an H100 (:data:`H100_PEAKS`, docs/estimate.md) and the
ops whose kernel memory no rule covers.
"""

from __future__ import annotations

import argparse
import gc
import sys
import traceback

import torch

import jupyter_memprof

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_estimate import (
    _kernel_temporaries,
    _mib,
    _role_bytes,
    estimate_closure,
    lstm_adam,
    quickstart,
)
from scenarios import SCENARIOS

ROLES = ("parameter", "gradient", "optimizer_state")

#: The real peak of each scenario's step on cuda:0 of an NVIDIA H100 80GB (torch 2.11.0+cu130,
#: cuDNN 9.19), bytes: live tensor bytes at the step's start plus the caching allocator's
#: ``max_memory_allocated`` growth over the step (docs/estimate.md, "Measured on a GPU").
#: The LSTM's: the start of the real capture misses one of cuDNN's flat buffers (3,424,256
#: B; the capture's 50,958,336), so the allocator's own count is used; both are in the docs.
H100_PEAKS = {
    "MLP + Adam": 8_055_808,
    "CNN (conv, BN, in-place ReLU, dropout) + SGD momentum": 5_852_672,
    "TransformerEncoderLayer + AdamW": 1_747_456,
    "activation checkpointing + SGD": 2_259_456,
    "bare nn.Parameters + RMSprop": 619_008,
    "in-place writes through views + SGD": 336_384,
    "Embedding + Adagrad": 6_412_288,
    "quickstart TinyLM + AdamW": 30_699_008,
    "LSTM + Adam": 54_382_592,
}
#: How close the estimate must come (the CNN and the LSTM depend on cuDNN's heuristics).
TOLERANCE = {"CNN (conv, BN, in-place ReLU, dropout) + SGD momentum": 0.05, "LSTM + Adam": 0.05}


def _all_scenarios():
    out = dict(SCENARIOS)
    out["quickstart TinyLM + AdamW"] = quickstart
    out["LSTM + Adam"] = lstm_adam
    return out


def _growth_peak(prof, device: str) -> tuple[int, int]:
    """(peak, end) growth of the device's live bytes over the capture's start, from the
    memory events: blocks made add their size, blocks freed take it away (blocks alive before
    the capture are not growth)."""
    e = prof.events
    e = e[e["device"].astype(str) == device]
    sign = e["action"].astype(str).map({"create": 1, "destroy": -1}).fillna(0)
    live = (sign * e["size_bytes"]).cumsum()
    if live.empty:
        return 0, 0
    return int(max(live.max(), 0)), int(live.iloc[-1])


def real_row(name: str, make, device: str) -> dict:
    with torch.device(device):
        ns, step = make()
    step()  # warm up: gradients and optimizer state exist, kernels are loaded
    torch.cuda.synchronize(device)
    gc.collect()
    note = ""
    try:
        est = estimate_closure(step, device=device)
    except jupyter_memprof.EstimateError as exc:
        if "cudnn" not in str(exc):
            raise
        print(f"{name}: {exc}")
        with torch.backends.cudnn.flags(enabled=False):
            est = estimate_closure(step, device=device)
        note = " (estimated with cuDNN off)"
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    with jupyter_memprof.profile(namespace=ns) as real:
        step()
    torch.cuda.synchronize(device)
    torch_peak = torch.cuda.max_memory_allocated(device) - base
    torch_end = torch.cuda.memory_allocated(device) - base
    ours_peak, ours_end = _growth_peak(real, device)
    pe = est.peak(device).attrs["peak_bytes"]
    # the capture counts everything live on the device, cuBLAS's workspaces and other memory
    # nothing names included (one block, never freed during the step): the estimate of the
    # step is compared with the rest
    unnamed = int((real.meta.get("unreachable_bytes") or {}).get(device, 0))
    pr = real.peak(device).attrs["peak_bytes"] - unnamed
    ce, cr = est.peak_by("category", device), real.peak_by("category", device)
    te, tr = _kernel_temporaries(est), _kernel_temporaries(real)
    other = real.allocations[real.allocations["device"].astype(str) != device]
    counts_e = est.ops["name"].astype(str).value_counts()
    counts_r = real.ops["name"].astype(str).value_counts()
    return {
        "scenario": name + note,
        "op_count_diffs": {
            op: int(counts_e.get(op, 0)) - int(counts_r.get(op, 0))
            for op in sorted(set(counts_e.index) | set(counts_r.index))
            if op.startswith("aten::") and counts_e.get(op, 0) != counts_r.get(op, 0)
        },
        "category_diffs": {
            c: int(ce.get(c, 0)) - int(cr.get(c, 0))
            for c in sorted(set(ce.index) | set(cr.index))
            if int(ce.get(c, 0)) != int(cr.get(c, 0))
        },
        "temporaries_diffs": {
            op: te.get(op, 0) - tr.get(op, 0)
            for op in sorted(set(te) | set(tr))
            if te.get(op, 0) != tr.get(op, 0)
        },
        "other_devices": other.groupby(other["device"].astype(str))["size_bytes"]
        .agg(["count", "sum"])
        .to_dict("index"),
        "events": len(real.events),
        "base": base,
        "torch_growth_peak": torch_peak,
        "ours_growth_peak": ours_peak,
        "torch_growth_end": torch_end,
        "ours_growth_end": ours_end,
        "real_peak": pr,
        "unnamed": unnamed,
        "estimate_peak": pe,
        "error": (pe - pr) / pr if pr else float("nan"),
        "simulated": bool(est.meta.get("simulated_cuda")),
        "state_exact": all(_role_bytes(est, r) == _role_bytes(real, r) for r in ROLES),
        "state_bytes": {r: _role_bytes(real, r) for r in ROLES},
        "devices": sorted(set(real.allocations["device"].astype(str))),
    }


def estimate_row(name: str, make, device: str, gpu: str | None = None) -> dict:
    ns, step = make()
    step()
    est = estimate_closure(step, device=device, gpu=gpu)
    peak = est.peak(device).attrs["peak_bytes"]
    real = H100_PEAKS.get(name)
    return {
        "scenario": name,
        "estimate_peak": peak,
        "h100_peak": real,
        "error": (peak - real) / real if real else None,
        "simulated": bool(est.meta.get("simulated_cuda")),
        "state_bytes": {r: _role_bytes(est, r) for r in ROLES},
        "not_modelled": est.meta.get("kernel_memory_not_modelled") or {},
    }


def print_estimates(device: str, gpu: str | None) -> int:
    """The --estimate-only table: each scenario's estimated peak against the H100's."""
    print(
        "| scenario | estimated peak | real peak on an H100 | error | simulated "
        "| parameters, gradients, optimizer state | kernel memory not modelled |"
    )
    print("|---|---:|---:|---:|---|---|---|")
    for name, make in _all_scenarios().items():
        r = estimate_row(name, make, device, gpu)
        state = ", ".join(f"{v:,}" for v in r["state_bytes"].values())
        real = f"{r['h100_peak']:,} B" if r["h100_peak"] else "-"
        err = f"{100 * r['error']:+.2f}%" if r["error"] is not None else "-"
        missing = ", ".join(r["not_modelled"]) or "-"
        print(
            f"| {name} | {r['estimate_peak']:,} B | {real} | {err} | {r['simulated']} "
            f"| {state} | {missing} |"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--estimate-only", action="store_true")
    parser.add_argument("--gpu", default=None, help="the GPU the estimate follows (H100)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    if args.estimate_only:
        return print_estimates(args.device, args.gpu)
    if not torch.cuda.is_available():
        print("no CUDA device here: run with --estimate-only", file=sys.stderr)
        return 2
    print(f"device {args.device}: {torch.cuda.get_device_name(args.device)}")
    rows, failed = [], []
    for name, make in _all_scenarios().items():
        try:
            rows.append(real_row(name, make, args.device))
        except Exception as exc:  # report every scenario, then fail
            failed.append(f"- {name}: {type(exc).__name__}: {exc}")
            traceback.print_exc()
    print(
        "| scenario | events | growth peak: ours / torch.cuda | growth at end: ours / torch.cuda "
        "| real peak | estimated peak | error | params, grads, optimizer state |"
    )
    print("|---|---:|---|---|---:|---:|---:|---|")
    bad = 0
    for r in rows:
        same_peak = r["ours_growth_peak"] == r["torch_growth_peak"]
        same_end = r["ours_growth_end"] == r["torch_growth_end"]
        bad += not (same_peak and same_end and r["state_exact"])
        print(
            f"| {r['scenario']} | {r['events']:,} "
            f"| {r['ours_growth_peak']:,} / {r['torch_growth_peak']:,} {'=' if same_peak else '!='} "
            f"| {r['ours_growth_end']:,} / {r['torch_growth_end']:,} {'=' if same_end else '!='} "
            f"| {_mib(r['real_peak'])} | {_mib(r['estimate_peak'])} | {100 * r['error']:+.2f}% "
            f"| {'equal' if r['state_exact'] else 'DIFFER'} |"
        )
    print()
    for r in rows:
        print(
            f"- {r['scenario']}: real peak {r['real_peak']:,} B (plus {r['unnamed']:,} B live "
            f"before the step that nothing names), estimated {r['estimate_peak']:,} B,"
            f" state bytes {r['state_bytes']}, "
            f"simulated estimate: {r['simulated']}"
        )
        if r["category_diffs"]:
            parts = ", ".join(f"{c} {d:+,} B" for c, d in r["category_diffs"].items())
            print(f"  at the peak, estimate minus real: {parts}")
        if r["temporaries_diffs"]:
            parts = ", ".join(f"{c} {d:+,} B" for c, d in r["temporaries_diffs"].items())
            print(f"  blocks made and freed inside one op, estimate minus real: {parts}")
        if r["op_count_diffs"]:
            parts = ", ".join(f"{c} {d:+}" for c, d in r["op_count_diffs"].items())
            print(f"  aten op calls, estimate minus real: {parts}")
        if r["other_devices"]:
            print(f"  blocks on other devices in the real capture: {r['other_devices']}")
    print("\n".join(failed))
    return 1 if bad or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
