"""A memory limit: the first moment a device would run out of it.

On the CPU, the first event after which live bytes exceed the limit. On a CUDA device, what
runs out is not the sum of live tensors: it is the caching allocator's segments (reserved
bytes, modelled by :mod:`.allocator`) plus the memory CUDA itself keeps outside PyTorch (the
context, library handles: :data:`CUDA_CONTEXT_BYTES` unless told). The first request the
allocator could not serve, even after giving its cached segments back, is where a real run
would raise ``torch.OutOfMemoryError``.

Used by estimate mode to say where a step would run out of memory: the op whose allocation
crossed the limit (its module, Python line and phase) and what was live then, by category.
Pure functions of the tables, like every other analysis.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .allocator.config import AllocatorConfig
from .allocator.model import is_cuda, profile_stream, replay
from .peak import live_after
from .tables import op_context
from .timeline import totals

#: What a CUDA device holds outside the caching allocator while a training step runs:
#: measured on an NVIDIA H100 80GB with torch 2.11.0+cu130 (``total - free - reserved`` from
#: ``torch.cuda.mem_get_info``, tests/data/allocator): 552,402,944 B for the CUDA context
#: alone, 787,283,968 B once cuBLAS has run (every step with a matmul), 804,061,184 B with
#: cuDNN too. The default is the cuBLAS figure; ``context=`` overrides it.
CUDA_CONTEXT_BYTES = 787_283_968

#: Which of the three parts of a GPU's memory pushed it over the limit.
CAUSES = {
    "tensors": "the tensors alone exceed the limit",
    "context": "the tensors fit, but not with the CUDA context",
    "cache": "the tensors and the CUDA context fit; the allocator's cached and partly used "
    "segments (fragmentation) push it over",
}


def context_bytes(device: str, context: int | None = None) -> int:
    """The memory ``device`` holds outside PyTorch's allocator: ``context`` when given, else
    :data:`CUDA_CONTEXT_BYTES` on a CUDA device and nothing on the CPU."""
    if not is_cuda(device):
        return 0
    return CUDA_CONTEXT_BYTES if context is None else int(context)


def first_over(
    tables: dict[str, pd.DataFrame],
    limit: int,
    device: str | None = None,
    *,
    allocator: AllocatorConfig | None = None,
    context: int | None = None,
) -> dict[str, Any] | None:
    """Where the step would first run out of ``limit`` bytes on ``device`` (default: any
    device), or None when it never would: on a CUDA device, judged against the modelled
    reserved bytes plus the CUDA context (:func:`first_over_gpu`); on the CPU, against live
    bytes (:func:`first_over_live`)."""
    if device is not None and is_cuda(device):
        return first_over_gpu(tables, limit, device, allocator=allocator, context=context)
    return first_over_live(tables, limit, device)


def first_over_live(
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
    return {
        **_at_event(tables, int(row["event"]), str(row["device"])),
        "limit": int(limit),
        "bytes": int(row["bytes"]),
    }


def _at_event(tables: dict[str, pd.DataFrame], event: int, device: str) -> dict[str, Any]:
    """The moment of event ``event`` (a row of ``events``) on ``device``: its time, block,
    the op that allocated it, and the bytes live then by category."""
    ev = tables["events"].reset_index(drop=True).iloc[event]
    alloc = tables["allocations"]
    block = alloc[alloc["alloc_id"] == int(ev["alloc_id"])]
    op_ids = block["alloc_op_id"] if len(block) else pd.Series([pd.NA], dtype="Int64")
    ctx = op_context(tables["ops"], op_ids.reset_index(drop=True))
    live = alloc[alloc["alloc_id"].isin(live_after(tables, event))]
    live = live[live["device"].astype(object) == device]
    by_cat = (
        live.groupby("category", observed=True)["size_bytes"].sum().sort_values(ascending=False)
    )
    op_id = op_ids.iloc[0]
    return {
        "device": device,
        "time_ns": int(ev["time_ns"]),
        "alloc_id": int(ev["alloc_id"]),
        "size_bytes": int(ev["size_bytes"]),
        "op_id": None if pd.isna(op_id) else int(op_id),
        **{k: (None if v[0] is None or pd.isna(v[0]) else str(v[0])) for k, v in ctx.items()},
        "live_by_category": {str(k): int(v) for k, v in by_cat.items() if v > 0},
    }


def _replay_limited(
    tables: dict[str, pd.DataFrame], device: str, capacity: int, config: AllocatorConfig
):
    """The device's stream replayed with ``capacity`` bytes to reserve: (stream, the first
    out-of-memory or None, the reserved peak)."""
    stream = profile_stream(tables)
    mine = [i for i, d in enumerate(stream.device) if d == device]
    keys = [stream.key[i] for i in mine]
    sizes = [stream.size[i] for i in mine]
    result = replay([device] * len(mine), keys, sizes, config=config, capacity={device: capacity})
    peak = result.peaks[device].reserved if device in result.peaks else 0
    oom = result.oom.get(device)
    return np.asarray(stream.event)[mine] if mine else np.zeros(0, int), oom, peak


def reserved_within(
    tables: dict[str, pd.DataFrame],
    limit: int,
    device: str,
    *,
    allocator: AllocatorConfig | None = None,
    context: int | None = None,
) -> int | None:
    """What CUDA ``device`` needs at most when the step runs within ``limit`` (the caching
    allocator's reserved peak, replayed as :func:`first_over_gpu` replays it, plus the CUDA
    context), or None when it does not fit (exactly when :func:`first_over_gpu` finds the
    moment it runs out)."""
    ctx = context_bytes(device, context)
    _, oom, peak = _replay_limited(tables, device, limit - ctx, allocator or AllocatorConfig())
    return None if oom is not None else int(peak) + ctx


def first_over_gpu(
    tables: dict[str, pd.DataFrame],
    limit: int,
    device: str,
    *,
    allocator: AllocatorConfig | None = None,
    context: int | None = None,
) -> dict[str, Any] | None:
    """The first request on CUDA ``device`` the caching allocator could not serve within
    ``limit`` bytes less the CUDA context, even after giving back its cached segments; None
    when the step fits.

    The keys of :func:`first_over_live` (``bytes``: what the device would need then, the
    three parts summed), and ``tensors_bytes`` (blocks in use, with the request),
    ``cache_bytes`` (the rest of the segments, with the new one), ``context_bytes``,
    ``reserved_bytes`` (the segments after the cache was emptied), ``cause`` (which of
    ``tensors``, ``context`` or ``cache`` pushed it over: :data:`CAUSES`) and
    ``expandable_segments``: what ``expandable_segments:True`` would change (``fits``, and
    ``reserved_peak_bytes`` or where it would still run out).
    """
    config = allocator or AllocatorConfig()
    ctx = context_bytes(device, context)
    events, oom, _ = _replay_limited(tables, device, limit - ctx, config)
    if oom is None:
        return None
    tensors = oom.allocated + oom.size
    needed = oom.reserved + oom.segment + ctx
    if tensors > limit:
        cause = "tensors"
    elif tensors + ctx > limit:
        cause = "context"
    else:
        cause = "cache"
    out = {
        **_at_event(tables, int(events[oom.event]), device),
        "limit": int(limit),
        "bytes": int(needed),
        "tensors_bytes": int(tensors),
        "cache_bytes": int(needed - tensors - ctx),
        "context_bytes": int(ctx),
        "reserved_bytes": int(oom.reserved),
        "cause": cause,
    }
    if not config.expandable_segments:
        _, other, peak = _replay_limited(tables, device, limit - ctx, config.with_expandable())
        out["expandable_segments"] = (
            {"fits": True, "reserved_peak_bytes": int(peak)}
            if other is None
            else {
                "fits": False,
                "time_ns": int(tables["events"]["time_ns"].iloc[events[other.event]]),
            }
        )
    return out
