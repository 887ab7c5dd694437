"""A memory limit: the first moment live bytes on a device went over it.

Used by estimate mode to say where a step would run out of memory: the op whose allocation
crossed the limit (its module, Python line and phase) and what was live then, by category.
A pure function of the tables, like every other analysis.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .peak import live_after
from .tables import op_context
from .timeline import totals


def first_over(
    tables: dict[str, pd.DataFrame], limit: int, device: str | None = None
) -> dict[str, Any] | None:
    """The first event after which live bytes on ``device`` (default: any device) exceed
    ``limit``, or None when they never do.

    Keys: ``device``, ``limit``, ``bytes`` (live right after the event), ``time_ns``,
    ``alloc_id`` and ``size_bytes`` of the block whose allocation crossed the limit,
    ``op_id``, ``op_name``, ``module``, ``callsite`` and ``phase`` of the op that allocated it,
    and ``live_by_category`` (category -> bytes live on the device then, largest first).
    """
    t = totals(tables["events"], tables["versions"])
    if t.empty:
        return None
    if device is not None:
        t = t[t["device"] == device]
    over = t[t["bytes"] > limit]
    if over.empty:
        return None
    row = over.iloc[0]
    event = int(row["event"])
    ev = tables["events"].reset_index(drop=True).iloc[event]
    alloc = tables["allocations"]
    block = alloc[alloc["alloc_id"] == int(ev["alloc_id"])]
    op_ids = block["alloc_op_id"] if len(block) else pd.Series([pd.NA], dtype="Int64")
    ctx = op_context(tables["ops"], op_ids.reset_index(drop=True))
    live = alloc[alloc["alloc_id"].isin(live_after(tables, event))]
    live = live[live["device"].astype(object) == row["device"]]
    by_cat = (
        live.groupby("category", observed=True)["size_bytes"].sum().sort_values(ascending=False)
    )
    op_id = op_ids.iloc[0]
    return {
        "device": str(row["device"]),
        "limit": int(limit),
        "bytes": int(row["bytes"]),
        "time_ns": int(row["time_ns"]),
        "alloc_id": int(ev["alloc_id"]),
        "size_bytes": int(ev["size_bytes"]),
        "op_id": None if pd.isna(op_id) else int(op_id),
        **{k: (None if v[0] is None or pd.isna(v[0]) else str(v[0])) for k, v in ctx.items()},
        "live_by_category": {str(k): int(v) for k, v in by_cat.items() if v > 0},
    }
