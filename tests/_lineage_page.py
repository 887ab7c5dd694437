"""What the dashboard's page shows of a block's lineage, decoded as its browser code does
(``js/dashboard.js`` reads the same columns): tests compare it with the lineage table."""

from __future__ import annotations

import numpy as np

from jupyter_memprof._units import format_time
from jupyter_memprof._views.dashboard.lineage import LINEAGE_STRINGS


def decode_lineage(
    cols: dict, pool: list[str], start: int, end: int, *, records: bool = False
) -> dict[str, list[str]]:
    """The display rows of one block from :func:`jupyter_memprof._views.dashboard.lineage.lineage_columns` (what the page shows);
    ``records=True`` for an estimate (times are records of its fake run, not ms)."""
    out = {
        "t_txt": [
            format_time(v, records=records) if np.isfinite(v) else "before capture"
            for v in cols["t"][start:end]
        ]
    }
    for k in LINEAGE_STRINGS:
        out[k] = [pool[c] if c >= 0 else "" for c in cols[k][start:end]]
    out["version"] = [str(v) if v >= 0 else "" for v in cols["version"][start:end]]
    return out
