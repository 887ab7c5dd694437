"""``prof.segments`` from the allocator's own record, not a replay.

It reads the allocator's own record of its segments
(``Capture.segments``, a memory snapshot's ``segment_alloc`` / ``segment_free`` /
``segment_map`` / ``segment_unmap``) instead of the model's replay; with it, the reserved
peak's time and the fragmentation then come from the recorded reserved totals
(:func:`recorded_peak_meta`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._records import SegmentRecord
from .._vocab import Source
from . import schema as S
from .arrays import cuda_rows
from .peak import live_bytes

__all__ = ["recorded_peak_meta", "recorded_segments"]


def recorded_segments(records: list[SegmentRecord], start_ns: int) -> pd.DataFrame:
    """One row per segment: each allocation (or mapping) ends at the free (or unmapping)
    of its address, an unmapping ends every mapped range inside it; a free of a segment the
    record never allocated (older than it) is a segment from ``start_ns``."""
    rows: list[list] = []
    open_: dict[tuple[str, int], int] = {}
    for r in records:
        if r.size > 0:
            open_[(r.device, r.address)] = len(rows)
            rows.append([r.device, r.pool, r.size, r.time_ns, None])
            continue
        hi = r.address - r.size
        ended = [k for k in open_ if k[0] == r.device and r.address <= k[1] < hi]
        for key in ended:
            rows[open_.pop(key)][4] = r.time_ns
        if not ended:
            rows.append([r.device, r.pool, -r.size, start_ns, r.time_ns])
    if not rows:
        return S.empty(S.SEGMENTS)
    dev, pool, size, t0, t1 = zip(*rows)
    t1 = np.array([-1 if t is None else t for t in t1], dtype=np.int64)
    return S.conform(
        pd.DataFrame(
            {
                "segment_id": np.arange(len(rows), dtype=np.int64),
                "device": pd.Categorical(dev),
                "pool": pd.Categorical(pool, dtype=S.POOL_DTYPE),
                "size_bytes": np.array(size, dtype=np.int64),
                "alloc_ns": np.array(t0, dtype=np.int64),
                "free_ns": S.integers(np.maximum(t1, 0), t1 < 0),
                "source": pd.Categorical([Source.RECORDED.value] * len(rows), dtype=S.SOURCE_DTYPE),
            }
        ),
        S.SEGMENTS,
        name="segments",
    )


def recorded_peak_meta(events: pd.DataFrame) -> dict:
    """``reserved_peak_ns`` and ``fragmentation_bytes`` of each CUDA device from the
    recorded reserved totals (the ``events`` table's ``reserved_bytes``): the time of the
    first event after which the reserved total was at its highest, and that total minus
    the bytes of the blocks in use right after the same event (what the allocator held
    that no block in use did: cached free blocks, the rests of split segments). Empty
    where nothing was recorded."""
    reserved = events["reserved_bytes"]
    have = reserved.notna().to_numpy() & cuda_rows(events["device"])
    if not have.any():
        return {}
    total = reserved.to_numpy(dtype=np.int64, na_value=0)
    live = live_bytes(events)
    times = events["time_ns"].to_numpy(dtype=np.int64)
    codes, devices = pd.factorize(events["device"], use_na_sentinel=True)
    when, frag = {}, {}
    for code, device in enumerate(devices):
        rows = np.flatnonzero(have & (codes == code))
        if len(rows):
            top = rows[np.argmax(total[rows])]
            when[str(device)] = int(times[top])
            frag[str(device)] = max(int(total[top] - live[top]), 0)
    return {"reserved_peak_ns": when, "fragmentation_bytes": frag}
