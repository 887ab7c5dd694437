"""A timeline's zoom levels: every peak kept at every zoom.

A timeline of millions of states cannot be sent to a browser, and thinning it once (to the
few thousand points a first view needs) loses the peaks that zooming in should reveal. So
the states are aggregated per pixel column, at every zoom:

- level ``L`` cuts the capture into ``columns * 2**L`` equal slices of time (the columns);
- from each column it keeps four states: the first, the last, the lowest and the highest
  (by total live bytes; the first such state on a tie). What a column shows is its
  min/max envelope, drawn from exact states of the tables;
- a column of level ``L`` is two columns of level ``L + 1``, so the states a level keeps
  are among those of the next (the highest of two columns is the highest of one of them):
  each state carries the coarsest level that keeps it (:attr:`Levels.level`), and level
  ``L`` is the states whose level is at most ``L``.

A view of a window of the capture ``w`` wide, ``px`` pixels across, takes the level whose
columns are at most one pixel wide (``columns * 2**L >= px * span / w``), clipped to the
window: every column's highest state is drawn where it happened, so every local peak is
in its pixel column, at its true height. The finest level kept for a page is the finest
whose states fit :data:`STATE_BUDGET` (the standalone HTML's size); zoomed in beyond it,
the page shows that level (peaks exact in height, their place within a column of it), and
the notebook asks the kernel, which holds every state (:func:`window_indices`).

Nothing here is analysis: the states are :func:`.data.timeline`'s (the tables'
states of one device), only chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .columns import op_text

#: columns of level 0 (about one per pixel of a full-width chart)
COLUMNS = 1024
#: at most this many states of a timeline are sent to a page (its finest level's)
STATE_BUDGET = 250_000


@dataclass
class Levels:
    """The zoom levels of one timeline (see the module docstring)."""

    columns: int  # columns of level 0
    start: float  # the window's start and end, in the chart's unit (ms)
    end: float
    keep: np.ndarray  # indices of the states kept by the finest level sent, ascending
    level: np.ndarray  # for each of ``keep``: the coarsest level that keeps it
    finest: int  # the finest level sent


def _m4(col: np.ndarray, total: np.ndarray, first: np.ndarray, last: np.ndarray, lo, hi):
    """Merge runs of equal ``col`` (sorted): their first, last, lowest and highest state
    (indices into ``total``; the first lowest/highest on a tie). Returns the merged
    (col, first, last, lo, hi)."""
    starts = np.flatnonzero(np.concatenate([[True], col[1:] != col[:-1]]))
    lens = np.diff(np.append(starts, len(col)))
    hv, lv = total[hi], total[lo]
    top = np.maximum.reduceat(hv, starts)
    bottom = np.minimum.reduceat(lv, starts)
    pos = np.arange(len(col), dtype=np.int64)
    none = len(col)
    new_hi = hi[np.minimum.reduceat(np.where(hv == np.repeat(top, lens), pos, none), starts)]
    new_lo = lo[np.minimum.reduceat(np.where(lv == np.repeat(bottom, lens), pos, none), starts)]
    ends = starts + lens - 1
    return col[starts], first[starts], last[ends], new_lo, new_hi


def _kept(first, last, lo, hi) -> np.ndarray:
    out = np.concatenate([first, last, lo, hi])
    out.sort()
    return out[np.concatenate([[True], out[1:] != out[:-1]])] if len(out) else out


def build(
    t: np.ndarray,
    total: np.ndarray,
    start: float,
    end: float,
    *,
    columns: int = COLUMNS,
    budget: int = STATE_BUDGET,
) -> Levels:
    """The levels of the states at times ``t`` (sorted, in the unit of ``start``/``end``)
    with totals ``total``; the finest sent is the finest whose states fit ``budget``."""
    n = len(t)
    span = max(float(end - start), 1e-12)
    finest = 0  # the finest level computed: columns of about one state, or a budget's
    while columns << finest < min(n, budget) and finest < 40:
        finest += 1
    x = (np.asarray(t, dtype=np.float64) - start) / span
    col = np.clip((x * (columns << finest)).astype(np.int64), 0, (columns << finest) - 1)
    idx = np.arange(n, dtype=np.int64)
    runs = _m4(col, total, idx, idx, idx, idx)
    coarsest = np.full(n, 127, dtype=np.int8)  # the coarsest level keeping each state
    for lv in range(finest, -1, -1):
        if lv < finest:
            runs = _m4(runs[0] >> 1, total, *runs[1:])
        for kept in runs[1:]:
            coarsest[kept] = lv
    counts = np.cumsum(np.bincount(coarsest[coarsest <= finest], minlength=finest + 1))
    top = max([lv for lv in range(finest + 1) if counts[lv] <= budget], default=0)
    keep = np.flatnonzero(coarsest <= top)
    level = coarsest[keep].astype(np.int64)
    return Levels(columns, float(start), float(end), keep, level, top)


def level_for(lv: Levels, lo: float, hi: float, px: int) -> int:
    """The level whose columns are at most one pixel wide for a view of [lo, hi] that is
    ``px`` pixels across (what ``js/zoom.js`` computes)."""
    need = px * (lv.end - lv.start) / max(hi - lo, 1e-12) / lv.columns
    return max(0, int(np.ceil(np.log2(max(need, 1.0)))))


def window_indices(t: np.ndarray, total: np.ndarray, lo: float, hi: float, px: int) -> np.ndarray:
    """For the kernel, which holds every state: the states a view of [lo, hi], ``px`` pixels
    across, draws (the first, last, lowest and highest of each pixel column, plus the state
    in force at ``lo`` and the one after ``hi``)."""
    a = max(int(np.searchsorted(t, lo, side="right")) - 1, 0)
    b = min(int(np.searchsorted(t, hi, side="right")) + 1, len(t))
    if b - a <= 4 * px:
        return np.arange(a, b)
    x = (np.asarray(t[a:b], dtype=np.float64) - lo) / max(hi - lo, 1e-12)
    col = np.clip((x * px).astype(np.int64), -1, px)
    idx = np.arange(a, b, dtype=np.int64)
    _, first, last, low, high = _m4(col, total, idx, idx, idx, idx)
    return _kept(first, last, low, high)


def attach(prof, tl, lv, t_ms, values, total, op_at) -> None:
    """Give ``tl`` its zoom levels (the kept states' columns, see :class:`Timeline`) and
    every state, for the kernel."""
    keep = lv.keep
    cols: dict[str, object] = {"t": t_ms[keep], "total": total[keep]}
    for j, c in enumerate(tl.categories):
        cols[f"b_{c}"] = values[keep, j]
    for name in ("op", "module"):
        codes, uniques = pd.factorize(op_text(prof, "name" if name == "op" else name, op_at[keep]))
        cols[name] = codes.astype(np.int32)
        tl.pools[name] = [str(u) for u in uniques]
    cols["level"] = lv.level.astype(np.int32)
    tl.levels, tl.level_info = cols, lv
    tl.states = (t_ms, total, values, op_at)


def zoomed(prof, tl, lo: float, hi: float, px: int) -> dict[str, object]:
    """The columns of ``tl``'s source for a view of [lo, hi] ms that is ``px`` pixels
    across, from every state (the kernel's answer to a zoom; the page's own answer, from
    the levels sent, is ``js/zoom.js``)."""
    t_ms, total, values, op_at = tl.states
    at = window_indices(t_ms, total, lo, hi, px)
    cols: dict[str, object] = {"t": t_ms[at], "total": total[at]}
    for j, c in enumerate(tl.categories):
        cols[f"b_{c}"] = values[at, j]
    cols["op"] = op_text(prof, "name", op_at[at])
    cols["module"] = op_text(prof, "module", op_at[at])
    return cols
