"""Will it fit: a memory limit split into what fills it.

For a device and a limit (an estimate's ``limit=``, or any profile whose ``meta["limit"]``
is set), the parts of the limit at the step's worst moment:

- the tensors live at the peak, by category;
- on a CUDA device, the caching allocator's cache and fragmentation: its reserved peak less
  the live peak (what the allocator holds beyond the tensors; modelled, or recorded);
- on a CUDA device, the CUDA context and library handles
  (:func:`.limit.context_bytes`: ``meta["context"]`` when told, else the measured default);
- the headroom (the limit less the three), or the overshoot when they exceed it.

When the step runs out (``meta["oom"]``, :func:`.limit.first_over`), the parts are those of
that moment, as the out-of-memory report gives them. A pure function of the tables and the
metadata, like every analysis.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .limit import context_bytes
from .peak import peak_point


def _by_category(allocations: pd.DataFrame, alloc_ids) -> dict[str, int]:
    """Bytes of the blocks ``alloc_ids`` by category, largest first (none left out)."""
    live = allocations[allocations["alloc_id"].isin(list(alloc_ids))]
    sums = live.groupby("category", observed=True)["size_bytes"].sum()
    return {str(c): int(b) for c, b in sums.sort_values(ascending=False).items() if b > 0}


def headroom(
    tables: dict[str, pd.DataFrame], meta: dict[str, Any], device: str | None = None
) -> dict[str, Any] | None:
    """The limit's parts on ``device`` (default: ``meta["device"]``, else the device with the
    highest peak), or None without a limit.

    Keys: ``device``, ``limit``, ``categories`` (category -> tensor bytes, largest first),
    ``tensors``, ``cache`` (allocator cache and fragmentation; 0 off CUDA), ``context``
    (0 off CUDA), ``used`` (their sum), ``headroom`` (limit less used; negative: the
    overshoot), ``fits`` and ``at`` (``"peak"``, or ``"out of memory"`` when the step ran
    out: the parts of that moment).
    """
    limit = meta.get("limit")
    if limit is None:
        return None
    oom = meta.get("oom") or None
    device = device or (oom or {}).get("device") or meta.get("device")
    if oom and oom.get("device") == device:
        cats = {str(k): int(v) for k, v in (oom.get("live_by_category") or {}).items()}
        tensors = int(oom.get("tensors_bytes", oom.get("bytes", 0)) or 0)
        cache = int(oom.get("cache_bytes") or 0)
        ctx = int(oom.get("context_bytes") or 0)
        at = "out of memory"
    else:
        point = peak_point(tables, device)
        device = point.device if device is None else device
        if device is None:
            return None
        cats = _by_category(tables["allocations"], point.alloc_ids)
        tensors = int(point.peak_bytes or 0)
        reserved = (meta.get("reserved_peak_bytes") or {}).get(device)
        cache = max(int(reserved) - tensors, 0) if reserved is not None else 0
        ctx = context_bytes(str(device), meta.get("context"))
        at = "peak"
    used = tensors + cache + ctx
    return {
        "device": str(device),
        "limit": int(limit),
        "categories": cats,
        "tensors": tensors,
        "cache": cache,
        "context": ctx,
        "used": used,
        "headroom": int(limit) - used,
        "fits": used <= int(limit) and not (oom and oom.get("device") == device),
        "at": at,
    }
