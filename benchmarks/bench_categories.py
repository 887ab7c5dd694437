"""Are the categories right? Unknown bytes and agreement with torch, per scenario.

For each scenario (see scenarios.py) one warm-up step runs, then one step is captured as
``jupyter_memprof.profile()`` captures it. On that same trace we report:

- unknown share of the bytes live at the peak, and over time (time-weighted);
- the same two numbers for torch's ``MemoryProfile`` (its categories, on the same trace);
- agreement: of the (tensor, version) pairs torch categorised, the share we put in the
  same category, and the disagreements (torch -> ours, weighted by bytes).

Run: ``.venv/bin/python benchmarks/bench_categories.py``.
"""

from __future__ import annotations

import collections
import os
import sys
import warnings

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, os.path.dirname(__file__))

from scenarios import SCENARIOS

from jupyter_memprof._frontends.capture import build_tables
from jupyter_memprof._producers.recorder import Recorder
from jupyter_memprof._results.profile import Profile

warnings.filterwarnings("ignore", category=FutureWarning)


def capture(make):
    """One warm-up step, then one step captured exactly as ``profile()`` does."""
    ns, step = make()
    step()
    recorder = Recorder(["cpu"], with_stack=True, namespace=lambda: ns)
    recorder.start()
    step()
    recorder.stop()
    tables, meta = build_tables(recorder)  # keeps torch's raw result for MemoryProfile
    return Profile(**tables, meta=meta), recorder.kineto_results


def unknown_over_time(timeline: pd.DataFrame, unknown_label="unknown") -> float:
    """Time-weighted share of live bytes in the unknown category."""
    if timeline.empty:
        return 0.0
    tl = timeline.sort_values("time_ns", kind="stable")
    wide = (
        tl.pivot_table(
            index="time_ns", columns="category", values="bytes", aggfunc="last", observed=True
        )
        .ffill()
        .fillna(0)
    )
    dt = np.diff(wide.index.to_numpy(), append=wide.index.to_numpy()[-1])
    total = (wide.sum(axis=1).to_numpy() * dt).sum()
    unk = (wide[unknown_label].to_numpy() * dt).sum() if unknown_label in wide else 0.0
    return float(unk / total) if total else 0.0


def torch_view(results):
    """torch's categories per (tensor id, version), and its timeline's unknown shares."""
    from torch.profiler._memory_profiler import Action, MemoryProfile, TensorKey

    mp = MemoryProfile(results)
    snapshot = mp._category_snapshot()
    cats = {
        (key.id, version): (cat.name.lower() if cat is not None else None)
        for (key, version), cat in snapshot.items()
        if isinstance(key, TensorKey)
    }
    # replay torch's timeline: live bytes by category
    live: dict = {}
    size_of: dict = {}
    peak_total, peak_unknown = 0, 0
    rows = []
    for t, action, (key, version), size in mp.timeline:
        k = (key, version)
        if action in (Action.PREEXISTING, Action.CREATE):
            live[key] = (version, size)
        elif action == Action.INCREMENT_VERSION:
            live[key] = (version + 1, size)
        elif action == Action.DESTROY:
            live.pop(key, None)
        size_of[key] = size
        total = sum(s for _, s in live.values())
        unknown = sum(
            s
            for kk, (v, s) in live.items()
            if not isinstance(kk, TensorKey) or mp._categories.get(kk, v) is None
        )
        rows.append((t, total, unknown))
        if total > peak_total:
            peak_total, peak_unknown = total, unknown
        del k
    arr = np.array([(t, tot, unk) for t, tot, unk in rows if t >= 0], dtype=float)
    if len(arr) > 1:
        dt = np.diff(arr[:, 0], append=arr[-1, 0])
        over_time = (arr[:, 2] * dt).sum() / max((arr[:, 1] * dt).sum(), 1)
    else:
        over_time = 0.0
    return cats, (peak_unknown / peak_total if peak_total else 0.0), over_time


def main() -> None:
    torch.set_num_threads(2)
    lines = []
    for title, make in SCENARIOS.items():
        prof, results = capture(make)
        pk = prof.peak()
        peak_bytes = pk.attrs["peak_bytes"]
        unknown_peak = (
            pk.loc[pk["category"] == "unknown", "size_bytes"].sum() / peak_bytes
            if peak_bytes
            else 0.0
        )
        ours_time = unknown_over_time(prof.timeline)
        torch_cats, torch_peak, torch_time = torch_view(results)
        v = prof.versions.merge(prof.allocations[["alloc_id", "size_bytes"]], on="alloc_id")
        ours = {
            (int(r.tensor_id), int(r.version)): (str(r.category), int(r.size_bytes))
            for r in v.itertuples()
        }
        decided = [(k, c) for k, c in torch_cats.items() if c is not None and k in ours]
        agree = sum(1 for k, c in decided if ours[k][0] == c)
        diffs: collections.Counter = collections.Counter()
        for k, c in decided:
            if ours[k][0] != c:
                diffs[f"{c}->{ours[k][0]}"] += ours[k][1]
        share = agree / len(decided) if decided else 1.0
        decided_bytes = sum(ours[k][1] for k, _ in decided)
        agree_bytes = decided_bytes - sum(diffs.values())
        byte_share = agree_bytes / decided_bytes if decided_bytes else 1.0
        diff_txt = ", ".join(f"{k} {b:,} B" for k, b in diffs.most_common(3)) or "-"
        lines.append(
            f"| {title} | {peak_bytes / 2**20:.2f} MiB | {unknown_peak:.1%} | {ours_time:.1%} | {torch_peak:.1%} | {torch_time:.1%} "
            f"| {share:.1%} ({byte_share:.2%} of bytes) | {diff_txt} |"
        )
        print(title, "done", file=sys.stderr, flush=True)
    print()
    print(
        "| scenario | peak | unknown at peak (ours) | unknown over time (ours) | unknown at peak (torch) "
        "| unknown over time (torch) | agreement where torch decided: versions (bytes) | where we differ (torch->ours, bytes) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
