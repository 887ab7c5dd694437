"""The tables cut to a level of detail a browser can hold.

Nothing here is analysis: every number comes from the profile's tables, from each device's
peak (:mod:`.peaks`: what :meth:`Profile.peak` reports, computed once per profile) and from
:func:`jupyter_memprof._analysis.lineage.lineage_steps` (what :meth:`Profile.lineage` lists;
its columns are :mod:`.lineage`'s).
This module only chooses *which* rows to show, converts times to milliseconds since the
capture started, and lays the rows out as flat columns for Bokeh's ColumnDataSources.

Level of detail (the budgets below are per dashboard):

- timeline: at most :data:`TIMELINE_POINTS` points per device. The event-by-event series is cut
  into equal-count buckets; each bucket keeps its first and last point and the points where the
  total is lowest and highest (the "M4" rule used by time-series plotters). Every kept point is
  an exact state of the tables, the global peak is always kept (it is the highest point of its
  bucket), and local extremes survive while long runs of small changes are thinned.
- allocations: the :data:`ALLOC_BUDGET` largest blocks, plus the largest blocks live at each
  device's peak; all other blocks are grouped into one "summarised" row per (device, category)
  with their count and total size.
- ops: at most about :data:`OP_BUDGET` ops: the ops that created or freed a shown block, then the
  longest ops and the biggest allocators, always with all their enclosing ops so the tree stays a
  tree. How many were left out is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..._analysis.allocator.model import reserved_timeline
from ..._analysis.peak import PeakPoint
from ..._analysis.schema import Category
from ..._analysis.timeline import live_by_category
from ..._units import format_bytes, format_time
from .. import peaks as _peaks
from . import levels as _levels
from .columns import (
    CATEGORY_COLORS,
    PHASE_COLORS,
    SUMMARY_CATEGORY_COLOR,
    Window,
    as_text,
    formatted,
    int_ids,
    is_value,
    lookup,
    op_positions,
    rows_of,
    summarised,
    time_texts,
    window,  # noqa: F401 (read here by the dashboard and its tests)
)
from .columns import op_text as _op_text

#: :func:`.columns.time_texts` under the name it had here
_time_texts = time_texts

TIMELINE_POINTS = 4000
ALLOC_BUDGET = 2000
OP_BUDGET = 4000


# ----------------------------------------------------------------------------------------
# timeline
# ----------------------------------------------------------------------------------------
def m4_indices(total: np.ndarray, budget: int) -> np.ndarray:
    """Indices of the points to keep so that at most ~``budget`` remain.

    Equal-count buckets of consecutive points; from each bucket the first, the last, the
    lowest and the highest point (by ``total``). Sorted, unique; the global maximum is
    always among them.
    """
    n = len(total)
    if n <= budget:
        return np.arange(n)
    buckets = max(1, budget // 4)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    starts, ends = edges[:-1], edges[1:]
    keep = [starts, ends - 1]
    # the first lowest and first highest point of each bucket, all buckets at once
    lens = ends - starts
    lo_hit = np.flatnonzero(total == np.repeat(np.minimum.reduceat(total, starts), lens))
    hi_hit = np.flatnonzero(total == np.repeat(np.maximum.reduceat(total, starts), lens))
    lo = lo_hit[np.searchsorted(lo_hit, starts)]
    hi = hi_hit[np.searchsorted(hi_hit, starts)]
    keep += [lo, hi, np.array([int(np.argmax(total))])]
    return np.unique(np.concatenate(keep))


@dataclass
class Timeline:
    device: str
    categories: list[str]  # categories with any bytes on this device, in display order
    columns: dict[str, object]  # t, total, b_<cat>, op, module
    points_in: int  # event-level points before thinning
    peak_ms: float | None
    peak_bytes: int
    #: zoom levels (:mod:`.levels`) when the states are more than the budget: the
    #: kept states' columns (t, total, b_<cat>, op and module as codes into ``pools``,
    #: level), what the page re-aggregates from on zoom; None otherwise
    levels: dict[str, object] | None = None
    pools: dict[str, list[str]] = field(default_factory=dict)
    level_info: _levels.Levels | None = None
    #: every state (t in ms, total, the categories' bytes, op positions) for the kernel's
    #: answer to a zoom beyond the levels sent; None when not zoomable
    states: tuple | None = None


def timeline(
    prof, device: str, win: Window, budget: int = TIMELINE_POINTS, *, peak=None
) -> Timeline:
    """The stacked category timeline of one device, thinned to ``budget`` points.

    Wide form: one row per state change (``time_ns`` of the timeline table), one column of live
    bytes per category (:func:`jupyter_memprof._analysis.timeline.live_by_category`). A first
    point at the capture start and a last point at its end make the areas span the whole
    capture.
    ``peak``: :func:`peak_or_none` of the device when the caller has it already.
    """
    tl = prof.timeline[is_value(prof.timeline["device"], device)]
    times, wide = live_by_category(tl)
    shown = [j for j in range(wide.shape[1]) if (wide[:, j] != 0).any()]
    cats = [Category.values()[j] for j in shown]
    values = wide[:, shown]
    total = values.sum(axis=1) if len(cats) else np.zeros(len(times))
    points_in = len(times)

    # the op running at each point: from the events table's op column (innermost op)
    op_at = np.full(len(times), -1, dtype=np.int64)
    ev = prof.events
    if len(times) and "op_id" in ev.columns and len(ev):
        mine = is_value(ev["device"], device)
        et = ev["time_ns"].to_numpy(dtype=np.int64)[mine]
        eo = int_ids(ev["op_id"])[mine]
        et, eo = et[eo >= 0], eo[eo >= 0]
        if len(et):
            if not bool((et[1:] >= et[:-1]).all()):  # events are time ordered: no sort then
                order = np.argsort(et, kind="stable")
                et, eo = et[order], eo[order]
            last = np.append(et[1:] != et[:-1], True)  # the last event at each time
            et, eo = et[last], eo[last]
            at = np.searchsorted(et, times).clip(0, len(et) - 1)
            op_at = op_positions(prof, np.where(et[at] == times, eo[at], -1))

    zoom = None
    if points_in > budget:  # per pixel column, re-aggregated on zoom
        t_ms = win.ms(np.asarray(times, dtype=np.int64))
        lv = _levels.build(t_ms, total, 0.0, max(win.end_ms, 1e-6), columns=max(1, budget // 4))
        zoom = (lv, t_ms, values, total, op_at)
        keep = lv.keep[lv.level == 0]
    else:
        keep = np.arange(points_in)
    times, values, total, op_at = times[keep], values[keep], total[keep], op_at[keep]

    # open with the capture start (state before the first event: empty, unless the first
    # event is at the start) and close with the capture end (last state held)
    if len(times) == 0 or times[0] > win.start_ns:
        times = np.concatenate([[win.start_ns], times])
        values = np.vstack([np.zeros((1, len(cats))), values])
        total = np.concatenate([[0.0], total])
        op_at = np.concatenate([[-1], op_at])
    if times[-1] < win.end_ns:
        times = np.concatenate([times, [win.end_ns]])
        values = np.vstack([values, values[-1:]])
        total = np.concatenate([total, total[-1:]])
        op_at = np.concatenate([op_at, [-1]])

    cols: dict[str, object] = {"t": win.ms(np.asarray(times, dtype=np.int64)), "total": total}
    for j, c in enumerate(cats):
        cols[f"b_{c}"] = values[:, j]
    cols["op"] = _op_text(prof, "name", op_at)
    cols["module"] = _op_text(prof, "module", op_at)

    peak_ms, peak_bytes = None, 0
    pk = peak_or_none(prof, device) if peak is None else peak
    if pk is not None and pk.peak_ns is not None:
        peak_ms, peak_bytes = float(win.ms([pk.peak_ns])[0]), pk.peak_bytes
    if peak_ms is None and len(total) and total.max() > 0:
        i = int(np.argmax(total))
        peak_ms, peak_bytes = float(cols["t"][i]), int(total[i])
    out = Timeline(device, cats, cols, points_in, peak_ms, peak_bytes)
    if zoom is not None:
        _levels.attach(prof, out, *zoom)
    return out


def stack(columns: dict, categories: list[str], visible: list[str]) -> None:
    """Add ``lo_<cat>``/``hi_<cat>`` stacking bounds (hidden categories take no height)."""
    acc = np.zeros(len(columns["t"]))
    for c in categories:
        columns[f"lo_{c}"] = acc.copy()
        if c in visible:
            acc = acc + np.asarray(columns[f"b_{c}"])
        columns[f"hi_{c}"] = acc.copy()


# ----------------------------------------------------------------------------------------
# ops
# ----------------------------------------------------------------------------------------
@dataclass
class Ops:
    columns: dict[str, object]
    row_of: dict[int, int]  # op_id -> row in columns
    total: int  # ops in the profile
    left_out: int
    max_depth: int


def _parent_positions(o: pd.DataFrame) -> np.ndarray:
    """For each row of an ops table, the row of its parent op; -1 for roots / unknown."""
    parents = o["parent_id"].to_numpy(dtype=np.int64, na_value=-1)
    return rows_of(o["op_id"].to_numpy(dtype=np.int64), parents)


def _keep_with_ancestors(keep: np.ndarray, rows: np.ndarray, parent_pos: np.ndarray) -> None:
    """Mark ``rows`` in ``keep`` with all their enclosing ops, so the kept ops stay a tree
    (``keep`` is one already). Each step visits only the ops newly kept, not the table."""
    frontier = np.unique(rows[~keep[rows]])
    while len(frontier):
        keep[frontier] = True
        up = parent_pos[frontier]
        up = np.unique(up[up >= 0])
        frontier = up[~keep[up]]


def _interleaved(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Two orders of the same rows merged, alternating (first[0], second[0], first[1], ...),
    each row where it comes first: in linear time (each row's first place decides)."""
    n = len(first)
    place, later = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    place[first] = 2 * np.arange(n)
    later[second] = 2 * np.arange(n) + 1
    np.minimum(place, later, out=place)
    slots = np.full(2 * n, -1, dtype=np.int64)
    slots[place] = np.arange(n)
    return slots[slots >= 0]


def select_ops(prof, win: Window, must: set[int], budget: int = OP_BUDGET) -> Ops:
    """The ops to draw (see the module docstring for the rule)."""
    o = prof.ops
    n = len(o)
    op_ids = o["op_id"].to_numpy(dtype="int64")
    if n > budget:
        parent_pos = _parent_positions(o)
        keep = np.zeros(n, dtype=bool)
        must_rows = np.isin(op_ids, np.fromiter(must, dtype=np.int64, count=len(must)))
        _keep_with_ancestors(keep, np.flatnonzero(must_rows), parent_pos)
        room = budget - int(keep.sum())
        if room > 0:
            dur = (o["end_ns"] - o["start_ns"]).to_numpy()
            size = o["total_alloc_bytes"].to_numpy()
            # alternate: longest, biggest, longest, ... until the budget (with ancestors) is met
            by_dur = np.argsort(-dur, kind="stable")
            by_size = np.argsort(-size, kind="stable")
            order = _interleaved(by_dur, by_size)
            # take in chunks: each chunk is closed over ancestors, stop at the budget
            i = 0
            while i < n and keep.sum() < budget:
                room = budget - int(keep.sum())
                chunk = order[i : i + max(1, room // 2)]
                i += len(chunk)
                _keep_with_ancestors(keep, chunk, parent_pos)
        pos = np.flatnonzero(keep)
    else:
        pos = np.arange(n)
    start_ns = o["start_ns"].to_numpy(dtype=np.int64)[pos]
    depth = o["depth"].to_numpy(dtype="int64")[pos]
    order = np.lexsort((depth, start_ns))  # by start, then depth; ties keep table order
    pos, start_ns, depth = pos[order], start_ns[order], depth[order]
    left = win.ms(start_ns)
    right = win.ms(o["end_ns"].to_numpy(dtype=np.int64)[pos])
    est = bool(prof.meta.get("estimate"))  # an estimate's clock counts records, not ms
    self_b = o["self_alloc_bytes"].to_numpy()[pos]
    total_b = o["total_alloc_bytes"].to_numpy()[pos]
    cols = {
        "op_id": op_ids[pos],
        "name": as_text(o["name"].take(pos)),
        "kind": as_text(o["kind"].take(pos)),
        "phase": as_text(o["phase"].take(pos), "other"),
        "module": as_text(o["module"].take(pos)),
        "callsite": as_text(o["callsite"].take(pos)),
        "thread": o["thread"].to_numpy(dtype="int64")[pos],
        "left": left,
        "right": right,
        "dur": right - left,
        "dur_txt": time_texts(right - left, records=est, span=True),
        "start_txt": time_texts(left, records=est),
        "top": depth + 0.05,
        "bottom": depth + 0.95,
        "cy": depth + 0.5,
        "cx": (left + right) / 2,
        "self_b": self_b.astype("float64"),
        "total_b": total_b.astype("float64"),
        "self_txt": formatted(self_b, format_bytes),
        "total_txt": formatted(total_b, format_bytes),
    }
    cols["color"] = lookup(cols["phase"], PHASE_COLORS, PHASE_COLORS["other"])
    row_of = dict(zip(cols["op_id"].tolist(), range(len(pos))))
    return Ops(cols, row_of, n, n - len(pos), int(depth.max()) if len(depth) else 0)


def nearest_shown(op_ids, prof, ops: Ops) -> np.ndarray:
    """Row (in the shown ops) of each op id, or of its nearest shown enclosing op; -1 if none."""
    o = prof.ops
    all_ids = o["op_id"].to_numpy(dtype=np.int64)
    parent_pos = _parent_positions(o)
    shown_row = np.full(len(all_ids), -1, dtype=np.int64)  # by position in prof.ops
    shown = np.asarray(ops.columns["op_id"], dtype=np.int64)
    shown_row[rows_of(all_ids, shown)] = np.arange(len(shown))
    out = np.full(len(op_ids), -1, dtype=np.int64)
    pos = rows_of(all_ids, int_ids(op_ids))
    todo = np.flatnonzero(pos >= 0)  # walk up from each op until a shown one
    pos = pos[todo]
    for _ in range(256):  # deeper than any op tree
        if not len(todo):
            break
        row = shown_row[pos]
        hit = row >= 0
        out[todo[hit]] = row[hit]
        todo, pos = todo[~hit], parent_pos[pos[~hit]]
        todo, pos = todo[pos >= 0], pos[pos >= 0]
    return out


# ----------------------------------------------------------------------------------------
# allocations and their lineage
# ----------------------------------------------------------------------------------------
def reserved_line(prof, device: str, win: Window) -> dict[str, list] | None:
    """The caching allocator's reserved bytes on ``device`` over time (``prof.segments``), as
    the points of a step line in the window's ms (held to its end); None without segments."""
    r = reserved_timeline(prof.segments, device)
    if r.empty:
        return None
    x = win.ms(r["time_ns"].to_numpy()).tolist()
    y = r["reserved_bytes"].to_numpy().tolist()
    end = float(win.end_ms)
    if end > x[-1]:
        x, y = x + [end], y + [y[-1]]
    return {"x": x, "y": y}


def peak_or_none(prof, device: str) -> PeakPoint | None:
    """The peak of ``device`` (what ``prof.peak(device)`` reports, without the blocks'
    details), or None where the peak analysis cannot answer (no events)."""
    try:
        return _peaks.peak_point(prof, device)
    except Exception:  # no peak on this device (no events)
        return None


@dataclass
class Allocations:
    table: pd.DataFrame  # the shown blocks (rows of prof.allocations), in display order
    summarised: pd.DataFrame  # device, category, count, size_bytes
    total: int
    peak_ids: set[int] = field(default_factory=set)


def select_allocations(
    prof,
    device: str | None = None,
    categories: list[str] | None = None,
    budget: int = ALLOC_BUDGET,
    *,
    peaks: dict | None = None,
) -> Allocations:
    """The blocks to list, largest first, and the summarised rest (see the module docstring).
    ``peaks``: ``{device: peak_or_none(prof, device)}``, when the caller has them already."""
    a = prof.allocations
    chosen = np.ones(len(a), dtype=bool)
    if device is not None:
        chosen &= is_value(a["device"], device)
    if categories is not None:
        chosen &= a["category"].astype("object").isin(list(categories)).to_numpy(dtype=bool)
    rows = np.flatnonzero(chosen)
    total = len(rows)
    peak_ids: set[int] = set()
    for dev in [device] if device is not None else prof.devices:
        pk = peaks.get(dev) if peaks is not None and dev in peaks else peak_or_none(prof, dev)
        if pk is not None:  # else no peak on this device (no events): nothing to add
            peak_ids |= set(pk.alloc_ids.tolist())
    # largest first, then by alloc_id
    all_ids = a["alloc_id"].to_numpy(dtype=np.int64)
    all_sizes = a["size_bytes"].to_numpy(dtype=np.int64)

    def largest_first(r: np.ndarray) -> np.ndarray:
        return r[np.lexsort((all_ids[r], -all_sizes[r]))]

    if total <= budget:
        listed, rest = largest_first(rows), rows[:0]
    else:  # sort only the largest (millions of blocks: the rest is summarised, not sorted)
        sizes = all_sizes[rows]
        cut = np.partition(sizes, total - budget)[total - budget]  # the budget-th largest
        top = largest_first(rows[sizes >= cut])[:budget]
        listed_mask = np.zeros(len(a), dtype=bool)
        listed_mask[top] = True
        at_peak = rows[np.isin(all_ids[rows], list(peak_ids)) & ~listed_mask[rows]]
        extra = largest_first(at_peak)[: budget // 4]
        listed_mask[extra] = True
        listed = np.concatenate([top, extra])
        rest = rows[~listed_mask[rows]]
    table = a.take(listed).reset_index(drop=True)
    return Allocations(table, summarised(a, rest), total, peak_ids)


def _block_names(op_names, sizes, alloc_ids) -> list[str]:
    """Names for blocks no variable holds: the op that made them and their size
    (``addmm 128.0 KiB``), else ``block 466``."""
    out = []
    for op, nbytes, aid in zip(op_names.tolist(), sizes.tolist(), alloc_ids.tolist()):
        op = str(op).removeprefix("aten::")
        out.append(f"{op} {format_bytes(nbytes)}" if op else f"block {aid}")
    return out


def allocation_columns(prof, sel: Allocations, ops: Ops, win: Window) -> dict[str, object]:
    """Columns of the allocations source: shown blocks first, then the summarised rows."""
    a = sel.table
    n = len(a)
    alloc_ids = a["alloc_id"].to_numpy(dtype=np.int64)
    op_ids = int_ids(a["alloc_op_id"])
    at = op_positions(prof, op_ids)
    op_name = _op_text(prof, "name", at)
    op_module = _op_text(prof, "module", at)
    thread = np.full(n, -1, dtype=np.int64)
    thread[at >= 0] = prof.ops["thread"].to_numpy(dtype=np.int64)[at[at >= 0]]
    if "module" in a.columns:  # the block's own module (a parameter's holder...), else its op's
        own = a["module"]
        has = own.notna().to_numpy(dtype=bool)
        if has.any():
            own_text = as_text(own[has])
            op_module = op_module.astype(np.result_type(op_module, own_text))
            op_module[has] = own_text
    t_alloc = win.ms(a["alloc_ns"])
    t_free = win.ms(a["free_ns"])
    x0 = np.where(np.isnan(t_alloc), 0.0, t_alloc)
    x1 = np.where(np.isnan(t_free), win.end_ms, t_free)
    # lanes of the lifetime chart: per device, in order of allocation time
    lane = np.zeros(n, dtype=np.int64)
    order = np.lexsort((alloc_ids, x0, a["device"].astype("object").map(str).to_numpy()))
    lane[order] = np.arange(n)

    est = bool(prof.meta.get("estimate"))  # an estimate's clock counts records, not ms
    no_alloc, no_free = np.isnan(t_alloc), np.isnan(t_free)
    lifetime = np.full(n, "", dtype=object)
    lifetime[no_alloc & no_free] = "whole capture"
    only_free = no_alloc & ~no_free
    lifetime[only_free] = [f"until {format_time(v, records=est)}" for v in t_free[only_free]]
    lifetime[~no_alloc & no_free] = "still alive"
    both = ~no_alloc & ~no_free
    lifetime[both] = time_texts(t_free[both] - t_alloc[both], records=est, span=True)

    cat = as_text(a["category"], "unknown")
    names = as_text(a["name"]).astype(object)
    unnamed = names == ""
    size = a["size_bytes"].to_numpy()
    names[unnamed] = _block_names(op_name[unnamed], size[unnamed], alloc_ids[unnamed])
    s = sel.summarised
    m = len(s)
    s_size = s["size_bytes"].to_numpy()
    nan = np.full(m, np.nan)
    none = np.full(m, -1, dtype=np.int64)
    blank = np.full(m, "", dtype=object)

    def text(shown, summarised) -> np.ndarray:
        return np.concatenate([np.asarray(shown, dtype=str), np.asarray(summarised, dtype=str)])

    cols: dict[str, object] = {
        "alloc_id": np.concatenate([alloc_ids, none]),
        "name": text(names, [f"({int(c):,} smaller blocks, summarised)" for c in s["count"]]),
        "category": text(cat, np.array([str(c) for c in s["category"]], dtype=object)),
        "reason": text(as_text(a["reason"]), blank),
        "size": np.concatenate([size.astype("float64"), s_size.astype("float64")]),
        "size_txt": text(
            formatted(size, format_bytes), np.array([format_bytes(v) for v in s_size], object)
        ),
        "device": text(as_text(a["device"]), np.array([str(d) for d in s["device"]], dtype=object)),
        "op": text(op_name, blank),
        "module": text(op_module, blank),
        "lifetime": text(lifetime, blank),
        "at_peak": text(np.where(np.isin(alloc_ids, list(sel.peak_ids)), "yes", ""), blank),
        "t_alloc": np.concatenate([t_alloc, nan]),
        "x0": np.concatenate([x0, nan]),
        "x1": np.concatenate([x1, nan]),
        "y": np.concatenate([lane.astype("float64"), nan]),
        "thread": np.concatenate([thread, none]),
        "op_row": np.concatenate([nearest_shown(a["alloc_op_id"], prof, ops), none]),
        "color": text(
            lookup(cat, CATEGORY_COLORS, CATEGORY_COLORS["unknown"]),
            np.full(m, SUMMARY_CATEGORY_COLOR, dtype=object),
        ),
        "summary": [False] * n + [True] * m,
    }
    return cols


def flow_columns(prof, ops: Ops) -> dict[str, object]:
    """Forward -> backward links whose two ends are both shown."""
    f = prof.flows
    fi = _shown_rows(ops, f["forward_op_id"].to_numpy(dtype=np.int64))
    bi = _shown_rows(ops, f["backward_op_id"].to_numpy(dtype=np.int64))
    ok = (fi >= 0) & (bi >= 0)
    fi, bi = fi[ok], bi[ok]
    c = ops.columns
    return {
        "fi": fi,
        "bi": bi,
        "seq_nr": f["seq_nr"].to_numpy(dtype=np.int64)[ok],
        "x0": np.asarray(c["cx"], dtype=np.float64)[fi],
        "y0": np.asarray(c["cy"], dtype=np.float64)[fi],
        "x1": np.asarray(c["cx"], dtype=np.float64)[bi],
        "y1": np.asarray(c["cy"], dtype=np.float64)[bi],
        "fname": np.asarray(c["name"], dtype=str)[fi],
        "bname": np.asarray(c["name"], dtype=str)[bi],
    }


def _shown_rows(ops: Ops, op_ids: np.ndarray) -> np.ndarray:
    """The row of each op id among the shown ops, -1 for one not shown."""
    shown = np.asarray(ops.columns["op_id"], dtype=np.int64)
    if not len(shown) or not len(op_ids):
        return np.full(len(op_ids), -1, dtype=np.int64)
    order = np.argsort(shown, kind="stable")
    at = order[np.searchsorted(shown, op_ids, sorter=order).clip(0, len(shown) - 1)]
    return np.where(shown[at] == op_ids, at, -1)
