"""What the dashboard draws: the tables cut down to a level of detail a browser can hold.

Nothing here is analysis: every number comes from the profile's tables, from
:meth:`Profile.peak` and from :func:`jupyter_memprof._analysis.lineage.all_lineages`. This module only
chooses *which* rows to show, converts times to milliseconds since the capture started, and
lays the rows out as flat columns for Bokeh's ColumnDataSources.

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

from .._analysis.schema import Category, Phase, Relation
from .._units import format_bytes, format_time

TIMELINE_POINTS = 4000
ALLOC_BUDGET = 2000
OP_BUDGET = 4000

# One fixed colour per category (colour-blind-friendly enough, and the same in every view).
CATEGORY_COLORS: dict[str, str] = {
    Category.PARAMETER.value: "#2ca02c",
    Category.OPTIMIZER_STATE.value: "#e6a817",
    Category.INPUT.value: "#5b5b5b",
    Category.TEMPORARY.value: "#9467bd",
    Category.ACTIVATION.value: "#d62728",
    Category.GRADIENT.value: "#1f77b4",
    Category.AUTOGRAD_DETAIL.value: "#17becf",
    Category.UNKNOWN.value: "#b0b0b0",
}
PHASE_COLORS: dict[str, str] = {
    Phase.FORWARD.value: "#4c72b0",
    Phase.BACKWARD.value: "#dd8452",
    Phase.OPTIMIZER.value: "#55a868",
    Phase.OTHER.value: "#9a9a9a",
}
SUMMARY_CATEGORY_COLOR = "#dddddd"


def _str(values, missing: str = "") -> np.ndarray:
    """A column as text (NA -> ``missing``): a numpy array of ``str``, which Bokeh sends as
    one plain list (no per-element encoding). Each distinct value is converted once."""
    codes, uniques = pd.factorize(pd.Series(values, dtype=None if _is_col(values) else object))
    lut = np.array([str(u) for u in uniques] + [missing], dtype=str)
    return lut[codes]  # NA (code -1) picks the trailing ``missing``


def _is_col(values) -> bool:
    return isinstance(values, (pd.Series, pd.Index, np.ndarray, pd.api.extensions.ExtensionArray))


def _formatted(values, fmt) -> np.ndarray:
    """``fmt(v)`` for each number of ``values`` (text), each distinct value formatted once."""
    arr = np.asarray(values)
    if not len(arr):
        return np.zeros(0, dtype=str)
    uniques, codes = np.unique(arr, return_inverse=True)
    if len(uniques) * 2 > len(arr):  # mostly distinct: no point in sharing
        return np.array([fmt(v) for v in arr.tolist()], dtype=str)
    return np.array([fmt(v) for v in uniques.tolist()], dtype=str)[codes.reshape(-1)]


def _ns(values) -> np.ndarray:
    """Nullable integer ns -> float64 ns with NaN for NA."""
    return pd.to_numeric(pd.Series(values), errors="coerce").astype("float64").to_numpy()


def _is(col: pd.Series, value) -> np.ndarray:
    """``col == value`` as a boolean array (a categorical column compares its codes)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        if value not in cats:
            return np.zeros(len(col), dtype=bool)
        return col.cat.codes.to_numpy() == cats.get_loc(value)
    return (col.astype("object") == value).to_numpy(dtype=bool)


def _ids(values) -> np.ndarray:
    """Nullable integer ids -> int64 with -1 for NA."""
    return pd.array(values, dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)


def op_positions(prof, op_ids) -> np.ndarray:
    """Row of each op id in ``prof.ops`` (int64), -1 for NA or an id it does not have."""
    q = np.asarray(op_ids, dtype=np.int64)
    all_ids = prof.ops["op_id"].to_numpy(dtype=np.int64)
    n = len(all_ids)
    if not n or not len(q):
        return np.full(len(q), -1, dtype=np.int64)
    if all_ids[0] == 0 and all_ids[-1] == n - 1 and np.array_equal(all_ids, np.arange(n)):
        return np.where((q >= 0) & (q < n), q, -1)  # ids are rows: the tables' usual layout
    order = np.argsort(all_ids, kind="stable")
    at = order[np.searchsorted(all_ids, q, sorter=order).clip(0, n - 1)]
    return np.where((q >= 0) & (all_ids[at] == q), at, -1)


def _lookup(text: np.ndarray, mapping: dict[str, str], default: str) -> np.ndarray:
    """``mapping.get(t, default)`` for each string of ``text``."""
    if not len(text):
        return np.zeros(0, dtype=str)
    uniques, codes = np.unique(text, return_inverse=True)
    return np.array([mapping.get(u, default) for u in uniques.tolist()], dtype=str)[
        codes.reshape(-1)
    ]


# ----------------------------------------------------------------------------------------
# the time window the views share
# ----------------------------------------------------------------------------------------
@dataclass
class Window:
    """The time window every view shows: absolute ns (the profiler's clock) of its start and
    end. Times on screen are milliseconds since ``start_ns``, the capture's start."""

    start_ns: int
    end_ns: int

    def ms(self, ns) -> np.ndarray:
        """Absolute ns (array-like, NA allowed) -> ms since the capture started (NaN for NA).

        The subtraction happens in integers: absolute ns do not fit a float64 exactly."""
        if isinstance(ns, np.ndarray) and ns.dtype.kind in "iu":  # no NA: plain int64
            return (ns.astype(np.int64) - self.start_ns).astype("float64") / 1e6
        if isinstance(ns, (pd.Series, pd.Index, np.ndarray, pd.api.extensions.ExtensionArray)):
            arr = pd.Series(ns).astype("Int64").array
        else:  # a list may mix ints and None: build the nullable array directly (exact)
            arr = pd.array(list(ns), dtype="Int64")
        rel = arr - self.start_ns
        return rel.to_numpy(dtype="float64", na_value=np.nan) / 1e6

    @property
    def end_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def window(prof) -> Window:
    """From the capture's start to its end (:attr:`Profile.start_ns`, :attr:`Profile.end_ns`)."""
    start = prof.start_ns
    start = 0 if start is None else start
    end = prof.end_ns
    return Window(start, start if end is None else max(end, start))


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


def timeline(
    prof, device: str, win: Window, budget: int = TIMELINE_POINTS, *, peak=None
) -> Timeline:
    """The stacked category timeline of one device, thinned to ``budget`` points.

    Wide form: one row per state change (``time_ns`` of the timeline table), one column of live
    bytes per category, carried forward from the long-form ``prof.timeline``. A first point at
    the capture start and a last point at its end make the areas span the whole capture.
    ``peak``: ``prof.peak(device)`` when the caller has it already.
    """
    tl = prof.timeline[_is(prof.timeline["device"], device)]
    tl = tl[tl["category"].notna().to_numpy()]
    cats_all = Category.values()
    # the long form's last value per (time, category), carried forward: a pivot in numpy
    times, row = np.unique(tl["time_ns"].to_numpy(dtype=np.int64), return_inverse=True)
    row = row.reshape(-1)
    col = pd.Categorical(tl["category"].astype("object"), categories=cats_all).codes
    col = np.asarray(col, dtype=np.int64)
    ok = col >= 0
    wide = np.full((len(times), len(cats_all)), np.nan)
    if ok.any():
        key = (row * len(cats_all) + col)[ok]
        last = len(key) - 1 - np.unique(key[::-1], return_index=True)[1]  # last row per key
        wide[row[ok][last], col[ok][last]] = tl["bytes"].to_numpy(dtype="float64")[ok][last]
        have = ~np.isnan(wide)
        src = np.maximum.accumulate(np.where(have, np.arange(len(times))[:, None], 0), axis=0)
        wide = wide[src, np.arange(len(cats_all))]
    wide = np.nan_to_num(wide, nan=0.0)
    present = set(tl["category"].astype("object").unique().tolist())
    shown = [j for j, c in enumerate(cats_all) if c in present and (wide[:, j] != 0).any()]
    cats = [cats_all[j] for j in shown]
    values = wide[:, shown]
    total = values.sum(axis=1) if len(cats) else np.zeros(len(times))
    points_in = len(times)

    # the op running at each point: from the events table's op column (innermost op)
    op_at = np.full(len(times), -1, dtype=np.int64)
    ev = prof.events
    if len(times) and "op_id" in ev.columns and len(ev):
        mine = _is(ev["device"], device)
        et = ev["time_ns"].to_numpy(dtype=np.int64)[mine]
        eo = _ids(ev["op_id"])[mine]
        et, eo = et[eo >= 0], eo[eo >= 0]
        if len(et):
            order = np.argsort(et, kind="stable")
            et, eo = et[order], eo[order]
            last = np.append(et[1:] != et[:-1], True)  # the last event at each time
            et, eo = et[last], eo[last]
            at = np.searchsorted(et, times).clip(0, len(et) - 1)
            op_at = op_positions(prof, np.where(et[at] == times, eo[at], -1))

    keep = m4_indices(total, budget)
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
    try:
        pk = prof.peak(device) if peak is None else peak
        peak_ns, peak_bytes = pk.attrs.get("peak_ns"), int(pk.attrs.get("peak_bytes") or 0)
        if peak_ns is not None:
            peak_ms = float(win.ms([peak_ns])[0])
    except Exception:  # the peak analysis cannot answer (e.g. no events): use the timeline
        peak_ms = None
    if peak_ms is None and len(total) and total.max() > 0:
        i = int(np.argmax(total))
        peak_ms, peak_bytes = float(cols["t"][i]), int(total[i])
    return Timeline(device, cats, cols, points_in, peak_ms, peak_bytes)


def _op_text(prof, column: str, pos: np.ndarray) -> np.ndarray:
    """``prof.ops[column]`` as text at rows ``pos`` ("" where ``pos`` is -1 or NA)."""
    out = np.zeros(len(pos), dtype=str)
    have = pos >= 0
    if have.any():
        text = _str(prof.ops[column].take(pos[have]))
        out = out.astype(text.dtype)
        out[have] = text
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
    op_ids = o["op_id"].to_numpy(dtype=np.int64)
    parents = o["parent_id"].to_numpy(dtype=np.int64, na_value=-1)
    if not len(op_ids):
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(op_ids, kind="stable")
    at = order[np.searchsorted(op_ids, parents, sorter=order).clip(0, len(op_ids) - 1)]
    return np.where((parents >= 0) & (op_ids[at] == parents), at, -1)


def _with_ancestors(keep: np.ndarray, parent_pos: np.ndarray) -> np.ndarray:
    """Close a boolean mask over the parent links so every kept op's enclosing ops are kept."""
    keep = keep.copy()
    frontier = keep.copy()
    while frontier.any():
        p = parent_pos[frontier]
        p = p[p >= 0]
        new = np.zeros_like(keep)
        new[p] = True
        new &= ~keep
        keep |= new
        frontier = new
    return keep


def select_ops(prof, win: Window, must: set[int], budget: int = OP_BUDGET) -> Ops:
    """The ops to draw (see the module docstring for the rule)."""
    o = prof.ops
    n = len(o)
    op_ids = o["op_id"].to_numpy(dtype="int64")
    if n > budget:
        parent_pos = _parent_positions(o)
        keep = np.isin(op_ids, np.fromiter(must, dtype=np.int64, count=len(must)))
        keep = _with_ancestors(keep, parent_pos)
        room = budget - int(keep.sum())
        if room > 0:
            dur = (o["end_ns"] - o["start_ns"]).to_numpy()
            size = o["total_alloc_bytes"].to_numpy()
            # alternate: longest, biggest, longest, ... until the budget (with ancestors) is met
            by_dur = np.argsort(-dur, kind="stable")
            by_size = np.argsort(-size, kind="stable")
            order = np.empty(2 * n, dtype=np.int64)
            order[0::2], order[1::2] = by_dur, by_size
            _, first = np.unique(order, return_index=True)
            order = order[np.sort(first)]
            # take in chunks: each chunk is closed over ancestors, stop at the budget
            i = 0
            while i < n and keep.sum() < budget:
                room = budget - int(keep.sum())
                chunk = order[i : i + max(1, room // 2)]
                i += len(chunk)
                add = np.zeros(n, dtype=bool)
                add[chunk] = True
                keep = _with_ancestors(keep | add, parent_pos)
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
        "name": _str(o["name"].take(pos)),
        "kind": _str(o["kind"].take(pos)),
        "phase": _str(o["phase"].take(pos), "other"),
        "module": _str(o["module"].take(pos)),
        "callsite": _str(o["callsite"].take(pos)),
        "thread": o["thread"].to_numpy(dtype="int64")[pos],
        "left": left,
        "right": right,
        "dur": right - left,
        "dur_txt": _formatted(right - left, lambda v: format_time(v, records=est, span=True)),
        "start_txt": _formatted(left, lambda v: format_time(v, records=est)),
        "top": depth + 0.05,
        "bottom": depth + 0.95,
        "cy": depth + 0.5,
        "cx": (left + right) / 2,
        "self_b": self_b.astype("float64"),
        "total_b": total_b.astype("float64"),
        "self_txt": _formatted(self_b, format_bytes),
        "total_txt": _formatted(total_b, format_bytes),
    }
    cols["color"] = _lookup(cols["phase"], PHASE_COLORS, PHASE_COLORS["other"])
    row_of = dict(zip(cols["op_id"].tolist(), range(len(pos))))
    return Ops(cols, row_of, n, n - len(pos), int(depth.max()) if len(depth) else 0)


def nearest_shown(op_ids, prof, ops: Ops) -> np.ndarray:
    """Row (in the shown ops) of each op id, or of its nearest shown enclosing op; -1 if none."""
    o = prof.ops
    all_ids = o["op_id"].to_numpy(dtype=np.int64)
    order = np.argsort(all_ids, kind="stable")
    parent_pos = _parent_positions(o)
    shown_row = np.full(len(all_ids), -1, dtype=np.int64)  # by position in prof.ops
    if ops.row_of:
        ids = np.fromiter(ops.row_of.keys(), dtype=np.int64, count=len(ops.row_of))
        rows = np.fromiter(ops.row_of.values(), dtype=np.int64, count=len(ops.row_of))
        shown_row[order[np.searchsorted(all_ids, ids, sorter=order)]] = rows
    want = pd.array(np.asarray(op_ids, dtype=object), dtype="Int64")
    q = want.to_numpy(dtype=np.int64, na_value=-1)
    out = np.full(len(q), -1, dtype=np.int64)
    if not len(all_ids) or not len(q):
        return out
    at = order[np.searchsorted(all_ids, q, sorter=order).clip(0, len(all_ids) - 1)]
    pos = np.where((q >= 0) & (all_ids[at] == q), at, -1)
    for _ in range(256):  # deeper than any op tree
        live = pos >= 0
        if not live.any():
            break
        hit = live & (shown_row[np.where(live, pos, 0)] >= 0)
        out[hit] = shown_row[pos[hit]]
        pos = np.where(live & ~hit, parent_pos[np.where(live, pos, 0)], -1)
    return out


# ----------------------------------------------------------------------------------------
# allocations and their lineage
# ----------------------------------------------------------------------------------------
def peak_or_none(prof, device: str):
    """``prof.peak(device)``, or None where the peak analysis cannot answer (no events)."""
    try:
        return prof.peak(device)
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
    ``peaks``: ``{device: prof.peak(device)}`` (None where it cannot answer), when the caller
    has them already."""
    a = prof.allocations
    if device is not None:
        a = a[_is(a["device"], device)]
    if categories is not None:
        a = a[a["category"].astype("object").isin(list(categories)).to_numpy(dtype=bool)]
    total = len(a)
    peak_ids: set[int] = set()
    for dev in [device] if device is not None else prof.devices:
        pk = peaks.get(dev) if peaks is not None and dev in peaks else peak_or_none(prof, dev)
        if pk is None:  # no peak on this device (no events): nothing to add
            continue
        if len(pk) and "alloc_id" in pk.columns:
            peak_ids |= set(pk["alloc_id"].astype("int64").tolist())
    a = a.sort_values(["size_bytes", "alloc_id"], ascending=[False, True], kind="stable")
    if total > budget:
        keep = np.zeros(total, dtype=bool)
        keep[:budget] = True
        at_peak = a["alloc_id"].isin(peak_ids).to_numpy()
        extra = np.flatnonzero(at_peak & ~keep)[: budget // 4]
        keep[extra] = True
        rest = a[~keep]
        a = a[keep]
        summ = (
            rest.assign(
                device=rest["device"].astype("object"), category=rest["category"].astype("object")
            )
            .groupby(["device", "category"], sort=False)["size_bytes"]
            .agg(["count", "sum"])
            .reset_index()
            .rename(columns={"sum": "size_bytes"})
            .sort_values("size_bytes", ascending=False)
        )
    else:
        summ = pd.DataFrame({"device": [], "category": [], "count": [], "size_bytes": []})
    return Allocations(a.reset_index(drop=True), summ.reset_index(drop=True), total, peak_ids)


def allocation_columns(prof, sel: Allocations, ops: Ops, win: Window) -> dict[str, object]:
    """Columns of the allocations source: shown blocks first, then the summarised rows."""
    a = sel.table
    n = len(a)
    alloc_ids = a["alloc_id"].to_numpy(dtype=np.int64)
    op_ids = _ids(a["alloc_op_id"])
    at = op_positions(prof, op_ids)
    op_name = _op_text(prof, "name", at)
    op_module = _op_text(prof, "module", at)
    thread = np.full(n, -1, dtype=np.int64)
    thread[at >= 0] = prof.ops["thread"].to_numpy(dtype=np.int64)[at[at >= 0]]
    if "module" in a.columns:  # the block's own module (a parameter's holder...), else its op's
        own = a["module"]
        has = own.notna().to_numpy(dtype=bool)
        if has.any():
            own_text = _str(own[has])
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
    lifetime[both] = _formatted(
        t_free[both] - t_alloc[both], lambda v: format_time(v, records=est, span=True)
    )

    cat = _str(a["category"], "unknown")
    names = _str(a["name"]).astype(object)
    unnamed = names == ""
    names[unnamed] = [f"block {i}" for i in alloc_ids[unnamed].tolist()]
    size = a["size_bytes"].to_numpy()
    s = sel.summarised
    m = len(s)
    s_size = s["size_bytes"].to_numpy()
    nan = np.full(m, np.nan)
    none = np.full(m, -1, dtype=np.int64)
    blank = np.full(m, "", dtype=object)

    def text(shown, summarised) -> np.ndarray:
        return np.concatenate([np.asarray(shown, dtype=object), summarised]).astype(str)

    cols: dict[str, object] = {
        "alloc_id": np.concatenate([alloc_ids, none]),
        "name": text(names, [f"({int(c):,} smaller blocks, summarised)" for c in s["count"]]),
        "category": text(cat, np.array([str(c) for c in s["category"]], dtype=object)),
        "reason": text(_str(a["reason"]), blank),
        "size": np.concatenate([size.astype("float64"), s_size.astype("float64")]),
        "size_txt": text(
            _formatted(size, format_bytes), np.array([format_bytes(v) for v in s_size], object)
        ),
        "device": text(_str(a["device"]), np.array([str(d) for d in s["device"]], dtype=object)),
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
            _lookup(cat, CATEGORY_COLORS, CATEGORY_COLORS["unknown"]),
            np.full(m, SUMMARY_CATEGORY_COLOR, dtype=object),
        ),
        "summary": [False] * n + [True] * m,
    }
    return cols


# Relations whose op is highlighted in the op tree when a block is clicked: the op that
# created it, and backward ops that used or freed it.
HIGHLIGHT_RELATIONS = (
    Relation.ALLOCATED.value,
    Relation.USED_IN_BACKWARD.value,
    Relation.FREED.value,
)


def lineage_rows(prof, alloc_ids: list[int]) -> pd.DataFrame:
    """The lineages of the shown blocks, from the analysis (``all_lineages``)."""
    from .._analysis.lineage import all_lineages

    if not alloc_ids:
        return pd.DataFrame(columns=["alloc_id", "time_ns", "op_id", "relation", "phase"])
    return all_lineages(prof.tables, list(alloc_ids))


def must_show_ops(sel: Allocations, lin: pd.DataFrame, limit: int) -> set[int]:
    """Ops the op tree must keep so clicking a shown block can highlight them: the creating,
    freeing and backward ops of the largest shown blocks, up to ``limit`` ops."""
    a = sel.table
    rank = {int(i): r for r, i in enumerate(a["alloc_id"])}
    rows = []
    for col in ("alloc_op_id", "free_op_id"):
        rows.append(pd.DataFrame({"rank": np.arange(len(a)), "op_id": _ns(a[col])}))
    if len(lin):
        rel = lin["relation"].astype("object")
        ph = lin["phase"].astype("object")
        mask = (rel == Relation.ALLOCATED.value) | (
            (ph == Phase.BACKWARD.value) & rel.isin(HIGHLIGHT_RELATIONS)
        )
        ll = lin[mask.fillna(False).to_numpy(dtype=bool)]
        rows.append(pd.DataFrame({"rank": ll["alloc_id"].map(rank), "op_id": _ns(ll["op_id"])}))
    allrows = pd.concat(rows).dropna().sort_values("rank", kind="stable")
    ids = pd.unique(allrows["op_id"].astype("int64"))[:limit]
    return {int(i) for i in ids}


LINEAGE_STRINGS = ("op_name", "relation", "category", "phase", "module", "callsite")


def lineage_columns(
    prof, lin: pd.DataFrame, alloc_ids: list[int], ops: Ops, win: Window
) -> tuple[dict, list[str], list[int], list[int]]:
    """All shown blocks' lineages as one flat table, plus each block's [start, end) rows.

    Rows come from :func:`jupyter_memprof._analysis.lineage.all_lineages` (the analysis); this only
    orders them by block (keeping their time order) and converts times and op ids for display.
    Strings are stored as indices into one pool of unique strings (returned alongside), and
    versions as integers (-1 for none), so tens of thousands of rows stay compact binary
    arrays; the page turns the clicked block's rows back into text. ``hl`` marks the rows
    whose op the op tree highlights: the op that allocated the block and the backward ops
    that used or freed it.
    """
    n_blocks = len(alloc_ids)
    if not n_blocks or not len(lin):
        cols = {
            k: np.zeros(0, dtype=np.int32) for k in (*LINEAGE_STRINGS, "version", "op_row", "hl")
        }
        cols["t"] = np.zeros(0)
        return cols, [], [0] * n_blocks, [0] * n_blocks
    pos = pd.Series(np.arange(n_blocks), index=np.asarray(alloc_ids, dtype=np.int64))
    lin = lin.assign(_pos=lin["alloc_id"].map(pos)).dropna(subset=["_pos"])
    lin = lin.sort_values("_pos", kind="stable").reset_index(drop=True)
    counts = np.bincount(lin["_pos"].astype(np.int64), minlength=n_blocks)
    ends = np.cumsum(counts)
    starts = ends - counts
    pool_index: dict[str, int] = {}
    # float32 ms: µs resolution for captures up to ~15 s, plenty for a table cell
    cols: dict[str, np.ndarray] = {"t": win.ms(lin["time_ns"]).astype(np.float32)}
    for k in LINEAGE_STRINGS:
        codes, uniques = pd.factorize(lin[k].astype(object), use_na_sentinel=True)
        remap = np.array([pool_index.setdefault(str(u), len(pool_index)) for u in uniques] + [-1])
        cols[k] = remap[codes].astype(np.int32)  # NA (-1) picks the trailing -1
    pool = list(pool_index)
    cols["version"] = pd.array(lin["version"], dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)
    op_row = nearest_shown(lin["op_id"], prof, ops)
    cols["op_row"] = op_row
    rel = lin["relation"].astype(object).to_numpy()
    phase = lin["phase"].astype(object).to_numpy()
    hl = (op_row >= 0) & (
        (rel == Relation.ALLOCATED.value)
        | ((phase == Phase.BACKWARD.value) & np.isin(rel, HIGHLIGHT_RELATIONS))
    )
    cols["hl"] = hl.astype(np.int32)
    return cols, pool, starts.tolist(), ends.tolist()


def decode_lineage(
    cols: dict, pool: list[str], start: int, end: int, *, records: bool = False
) -> dict[str, list[str]]:
    """The display rows of one block from :func:`lineage_columns` (what the page shows);
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


def flow_columns(prof, ops: Ops) -> dict[str, object]:
    """Forward -> backward links whose two ends are both shown."""
    f = prof.flows
    fi = f["forward_op_id"].map(ops.row_of)
    bi = f["backward_op_id"].map(ops.row_of)
    ok = (fi.notna() & bi.notna()).to_numpy()
    fi = fi[ok].astype("int64").to_numpy()
    bi = bi[ok].astype("int64").to_numpy()
    c = ops.columns
    return {
        "fi": fi.tolist(),
        "bi": bi.tolist(),
        "seq_nr": f["seq_nr"][ok].astype("int64").tolist(),
        "x0": np.asarray(c["cx"])[fi].tolist(),
        "y0": np.asarray(c["cy"])[fi].tolist(),
        "x1": np.asarray(c["cx"])[bi].tolist(),
        "y1": np.asarray(c["cy"])[bi].tolist(),
        "fname": [c["name"][i] for i in fi],
        "bname": [c["name"][i] for i in bi],
    }
