"""``prof.segments`` from the allocator's own record, not a replay.

It reads the allocator's own record of its segments
(``Capture.segments``, a memory snapshot's ``segment_alloc`` / ``segment_free`` /
``segment_map`` / ``segment_unmap``) instead of the model's replay."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._records import SegmentRecord
from .._vocab import Source
from . import schema as S

__all__ = ["recorded_segments"]


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
