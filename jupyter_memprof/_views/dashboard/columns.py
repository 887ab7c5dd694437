"""The columns as sent: colours, text, times, ids to rows, window.

The helpers :mod:`.data` lays its columns out with: a column as text (each distinct
value converted once), times as people read them, ids looked up as rows, and the time window
every view shares (ms since the capture started).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..._analysis.schema import Category, Phase
from ..._units import format_time

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


def as_text(values, missing: str = "") -> np.ndarray:
    """A column as text (NA -> ``missing``): a numpy array of ``str``, which Bokeh sends as
    one plain list (no per-element encoding). Each distinct value is converted once."""
    codes, uniques = pd.factorize(pd.Series(values, dtype=None if is_column(values) else object))
    lut = np.append(np.asarray(uniques, dtype=object).astype(str), missing)
    return lut[codes]  # NA (code -1) picks the trailing ``missing``


def is_column(values) -> bool:
    return isinstance(values, (pd.Series, pd.Index, np.ndarray, pd.api.extensions.ExtensionArray))


def formatted(values, fmt) -> np.ndarray:
    """``fmt(v)`` for each number of ``values`` (text), each distinct value formatted once."""
    arr = np.asarray(values)
    if not len(arr):
        return np.zeros(0, dtype=str)
    uniques, codes = np.unique(arr, return_inverse=True)
    if len(uniques) * 2 > len(arr):  # mostly distinct: no point in sharing
        return np.array([fmt(v) for v in arr.tolist()], dtype=str)
    return np.array([fmt(v) for v in uniques.tolist()], dtype=str)[codes.reshape(-1)]


def time_texts(ms, *, records: bool, span: bool = False) -> np.ndarray:
    """:func:`jupyter_memprof._units.format_time` of each value (ms on a profile's clock).

    Thousands of op times are formatted for every dashboard: a capture's (``format_ms``) are
    done here a unit at a time over the whole array, with the same float operations as
    ``format_ms`` (tests/test_dashboard.py compares the two)."""
    if records:
        return formatted(ms, lambda v: format_time(v, records=True, span=span))
    ms = np.asarray(ms, dtype=np.float64)
    out = np.full(len(ms), "", dtype=object)
    a = np.abs(ms)
    sign = np.where(ms < 0, "-", "")
    left = np.isfinite(ms)
    # (unit, scaled value, decimals, below): the first unit whose rounded value fits
    for unit, x, digits, below in (
        ("µs", np.where(a < 1, a * 1000, np.inf), 1, 10000),
        ("ms", np.where(a < 1000, a, np.inf), 3, 1000000),
        ("s", a / 1000, 3, np.inf),
    ):
        scale = 10**digits
        k = np.floor(x * scale + 0.5)
        take = np.flatnonzero(left & (k < below))
        left[take] = False
        whole, part = np.divmod(k[take].astype(np.int64), scale)
        fmt = f"%s%d.%0{digits}d {unit}"
        out[take] = [fmt % t for t in zip(sign[take].tolist(), whole.tolist(), part.tolist())]
    return out.astype(str)


def is_value(col: pd.Series, value) -> np.ndarray:
    """``col == value`` as a boolean array (a categorical column compares its codes)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        if value not in cats:
            return np.zeros(len(col), dtype=bool)
        return col.cat.codes.to_numpy() == cats.get_loc(value)
    return (col.astype("object") == value).to_numpy(dtype=bool)


def codes_in(col: pd.Series, categories: list[str]) -> np.ndarray:
    """Each value's place in ``categories`` (int64; -1 for NA or a value not among them); a
    categorical column of those categories gives its codes as they are."""
    if isinstance(col.dtype, pd.CategoricalDtype) and list(col.cat.categories) == categories:
        return col.cat.codes.to_numpy(dtype=np.int64)
    return np.asarray(pd.Categorical(col.astype(object), categories).codes, dtype=np.int64)


def int_ids(values) -> np.ndarray:
    """Nullable integer ids -> int64 with -1 for NA."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return values.astype(np.int64, copy=False)
    return pd.array(values, dtype="Int64").to_numpy(dtype=np.int64, na_value=-1)


def op_positions(prof, op_ids) -> np.ndarray:
    """Row of each op id in ``prof.ops`` (int64), -1 for NA or an id it does not have."""
    return rows_of(prof.ops["op_id"].to_numpy(dtype=np.int64), np.asarray(op_ids, dtype=np.int64))


def rows_of(all_ids: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Row of each id of ``q`` in ``all_ids`` (an ops table's op_id column), -1 for NA (-1)
    or an id it does not have."""
    n = len(all_ids)
    if not n or not len(q):
        return np.full(len(q), -1, dtype=np.int64)
    if all_ids[0] == 0 and all_ids[-1] == n - 1 and np.array_equal(all_ids, np.arange(n)):
        return np.where((q >= 0) & (q < n), q, -1)  # ids are rows: the tables' usual layout
    order = np.argsort(all_ids, kind="stable")
    at = order[np.searchsorted(all_ids, q, sorter=order).clip(0, n - 1)]
    return np.where((q >= 0) & (all_ids[at] == q), at, -1)


def lookup(text: np.ndarray, mapping: dict[str, str], default: str) -> np.ndarray:
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


def op_text(prof, column: str, pos: np.ndarray) -> np.ndarray:
    """``prof.ops[column]`` as text at rows ``pos`` ("" where ``pos`` is -1 or NA)."""
    out = np.zeros(len(pos), dtype=str)
    have = pos >= 0
    if have.any():
        text = as_text(prof.ops[column].take(pos[have]))
        out = out.astype(text.dtype)
        out[have] = text
    return out


def summarised(a: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """One row per (device, category) of the blocks at ``rows`` (in order of first
    appearance, then by total size, largest first): how many and their total size. Blocks
    without a device or category are left out."""
    dev_codes, devs = _factorized(a["device"], rows)
    cat_codes, cats = _factorized(a["category"], rows)
    ok = (dev_codes >= 0) & (cat_codes >= 0)
    key = (dev_codes * max(len(cats), 1) + cat_codes)[ok]
    groups, first, which = np.unique(key, return_index=True, return_inverse=True)
    sizes = np.zeros(len(groups), dtype=np.int64)
    np.add.at(sizes, which, a["size_bytes"].to_numpy(dtype=np.int64)[rows][ok])
    order = np.argsort(first, kind="stable")  # groups in order of first appearance ...
    order = order[np.argsort(-sizes[order], kind="stable")]  # ... then largest first
    groups = groups[order]
    return pd.DataFrame(
        {
            "device": np.asarray(devs, dtype=object)[groups // max(len(cats), 1)],
            "category": np.asarray(cats, dtype=object)[groups % max(len(cats), 1)],
            "count": np.bincount(which, minlength=len(first))[order],
            "size_bytes": sizes[order],
        }
    )


def _factorized(col: pd.Series, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize`` of ``col`` at ``rows`` (codes in order of first appearance, -1 for
    NA), from a categorical's codes without converting its values."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        codes, uniques = pd.factorize(col.astype("object").to_numpy()[rows])
        return codes, np.asarray(uniques, dtype=object)
    codes = col.cat.codes.to_numpy().astype(np.int64)[rows]
    used, first = np.unique(codes, return_index=True)
    first, used = first[used >= 0], used[used >= 0]
    used = used[np.argsort(first, kind="stable")]  # in order of first appearance
    remap = np.full(len(col.cat.categories) + 1, -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    return remap[codes], np.asarray(col.cat.categories.astype(object), dtype=object)[used]
