"""Memory events and the per-category timeline, derived from categorised tables.

``events`` follows torch's raw memory-timeline vocabulary (preexisting, create,
increment_version, destroy). ``timeline`` holds, after each event, the live bytes of every
(device, category) that event changed; the state at time t is the last row of each
(device, category) at or before t, and the sum over categories equals the bytes of the
blocks alive at t.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import schema as S
from .schema import Action

_ACTION_ORDER = {
    Action.PREEXISTING.value: 0,
    Action.CREATE.value: 1,
    Action.INCREMENT_VERSION.value: 2,
    Action.DESTROY.value: 3,
}


def build_events(
    allocations: pd.DataFrame, versions: pd.DataFrame, ops: pd.DataFrame, start_ns: int
) -> pd.DataFrame:
    a = allocations
    if a.empty:
        return S.empty(S.EVENTS)
    v = versions
    first_v = v.drop_duplicates("alloc_id", keep="first").set_index("alloc_id")
    last_v = v.drop_duplicates("alloc_id", keep="last").set_index("alloc_id")
    ids = a["alloc_id"].to_numpy()
    pre = a["alloc_ns"].isna().to_numpy()
    # the category at creation is version 0's (the block's own for raw blocks)
    v0_cat = first_v["category"].reindex(ids).astype(object).to_numpy()
    block_cat = a["category"].astype(object).to_numpy()
    create_cat = np.where(pd.isna(v0_cat), block_cat, v0_cat)
    last_version = last_v["version"].reindex(ids).to_numpy()
    tid = a["tensor_id"]

    start = pd.DataFrame(
        {
            "time_ns": np.where(
                pre, start_ns, a["alloc_ns"].to_numpy(dtype=np.int64, na_value=start_ns)
            ),
            "action": np.where(pre, Action.PREEXISTING.value, Action.CREATE.value),
            "alloc_id": ids,
            "tensor_id": tid.to_numpy(),
            "version": pd.array(np.where(tid.isna(), None, 0), dtype="Int64"),
            "device": a["device"].astype(object).to_numpy(),
            "size_bytes": a["size_bytes"].to_numpy(),
            "category": create_cat,
            "op_id": a["alloc_op_id"].to_numpy(),
        }
    )
    freed = a["free_ns"].notna().to_numpy()
    fa = a[freed]
    end = pd.DataFrame(
        {
            "time_ns": fa["free_ns"].to_numpy(dtype=np.int64),
            "action": Action.DESTROY.value,
            "alloc_id": fa["alloc_id"].to_numpy(),
            "tensor_id": fa["tensor_id"].to_numpy(),
            "version": pd.array(last_version[freed], dtype="Int64"),
            "device": fa["device"].astype(object).to_numpy(),
            "size_bytes": fa["size_bytes"].to_numpy(),
            "category": block_cat[freed],
            "op_id": fa["free_op_id"].to_numpy(),
        }
    )
    bumps = v[(v["version"] > 0) & v["start_ns"].notna()]
    pos = pd.Series(np.arange(len(a)), index=ids).reindex(bumps["alloc_id"].to_numpy()).to_numpy()
    mid = pd.DataFrame(
        {
            "time_ns": bumps["start_ns"].to_numpy(dtype=np.int64),
            "action": Action.INCREMENT_VERSION.value,
            "alloc_id": bumps["alloc_id"].to_numpy(),
            "tensor_id": bumps["tensor_id"].to_numpy(),
            "version": bumps["version"].to_numpy(),
            "device": a["device"].astype(object).to_numpy()[pos],
            "size_bytes": a["size_bytes"].to_numpy()[pos],
            "category": bumps["category"].astype(object).to_numpy(),
            "op_id": bumps["op_id"].to_numpy(),
        }
    )
    ev = pd.concat([start, mid, end], ignore_index=True)
    ev["_o"] = ev["action"].map(_ACTION_ORDER)
    ev = ev.sort_values(["time_ns", "_o", "alloc_id"], kind="stable").drop(columns="_o")
    ev = ev.astype({"tensor_id": "Int64", "version": "Int64", "op_id": "Int64"})
    return S.conform(ev.reset_index(drop=True), S.EVENTS, name="events")


def _deltas(events: pd.DataFrame, versions: pd.DataFrame) -> pd.DataFrame:
    """Signed byte changes per (device, category), one or two per event, in event order."""
    ev = events.reset_index(drop=True)
    act = ev["action"].astype(object).to_numpy()
    size = ev["size_bytes"].to_numpy()
    cat = ev["category"].astype(object).to_numpy()
    sign = np.where(act == Action.DESTROY.value, -1, 1)
    rows = pd.DataFrame(
        {
            "event": np.arange(len(ev)),
            "time_ns": ev["time_ns"].to_numpy(),
            "device": ev["device"].astype(object).to_numpy(),
            "category": cat,
            "delta": sign * size,
        }
    )
    bump = act == Action.INCREMENT_VERSION.value
    if bump.any():
        # the version before: its category loses the bytes, the new one gains them
        key = versions.set_index(["alloc_id", "version"])["category"]
        prev_idx = pd.MultiIndex.from_arrays(
            [
                ev["alloc_id"].to_numpy()[bump],
                ev["version"].to_numpy(dtype=np.int64, na_value=0)[bump] - 1,
            ]
        )
        prev_cat = key.reindex(prev_idx).astype(object).to_numpy()
        changed = prev_cat != cat[bump]
        keep = ~bump
        keep[np.flatnonzero(bump)[changed]] = True
        minus = rows[bump][changed].assign(category=prev_cat[changed], delta=lambda d: -d["delta"])
        rows = pd.concat([minus, rows[keep]], ignore_index=True).sort_values(
            ["event", "delta"], kind="stable"
        )
    return rows


def build_timeline(events: pd.DataFrame, versions: pd.DataFrame) -> pd.DataFrame:
    if events.empty:
        return S.empty(S.TIMELINE)
    d = _deltas(events, versions)
    d["bytes"] = d.groupby(["device", "category"], sort=False)["delta"].cumsum()
    out = d[["time_ns", "device", "category", "bytes"]]
    return S.conform(out, S.TIMELINE, name="timeline")


def totals(events: pd.DataFrame, versions: pd.DataFrame) -> pd.DataFrame:
    """Total live bytes per device after each event: columns event, time_ns, device, bytes."""
    if events.empty:
        return pd.DataFrame({"event": [], "time_ns": [], "device": [], "bytes": []})
    ev = events.reset_index(drop=True)
    sign = np.where(ev["action"].astype(object).to_numpy() == Action.DESTROY.value, -1, 1)
    sign[ev["action"].astype(object).to_numpy() == Action.INCREMENT_VERSION.value] = 0
    d = pd.DataFrame(
        {
            "event": np.arange(len(ev)),
            "time_ns": ev["time_ns"].to_numpy(),
            "device": ev["device"].astype(object).to_numpy(),
            "delta": sign * ev["size_bytes"].to_numpy(),
        }
    )
    d["bytes"] = d.groupby("device", sort=False)["delta"].cumsum()
    return d.drop(columns="delta")
