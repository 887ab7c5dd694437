"""The peak: a device's highest live memory and the blocks in it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._devices import device_sort_key
from .._units import shown
from . import schema as S
from .schema import Action

PEAK_COLUMNS = {
    **S.ALLOCATIONS,
    "op_name": S.OPEN_CATEGORY,
    "callsite": S.STRING,
    "phase": S.PHASE_DTYPE,
}


def _peaks(events: pd.DataFrame) -> dict[str, tuple[int, int, int]]:
    """For each device: the highest total of live bytes after any event (the first event to
    reach it), its time and the event's position (see :func:`live_bytes`)."""
    if events.empty:
        return {}
    live = live_bytes(events)
    times = events["time_ns"].to_numpy(dtype=np.int64)
    codes, devices = _device_codes(events["device"])
    out = {}
    for code, dev in enumerate(devices):
        rows = np.flatnonzero(codes == code)
        if not len(rows):
            continue
        top = int(rows[np.argmax(live[rows])])
        out[str(dev)] = (int(live[top]), int(times[top]), top)
    return out


def live_bytes(events: pd.DataFrame) -> np.ndarray:
    """The live bytes of each event's device right after it: creating (or finding
    preexisting) a block adds its bytes, destroying it takes them away; a new version
    changes nothing. 0 for an event without a device."""
    sign = np.where(_is(events, Action.DESTROY), -1, 1)
    sign[_is(events, Action.INCREMENT_VERSION)] = 0
    delta = sign * events["size_bytes"].to_numpy(dtype=np.int64)
    codes, devices = _device_codes(events["device"])
    if len(devices) == 1 and not (codes < 0).any():
        return np.cumsum(delta)
    live = np.zeros(len(events), dtype=np.int64)
    for code in range(len(devices)):
        rows = np.flatnonzero(codes == code)
        live[rows] = np.cumsum(delta[rows])
    return live


def _device_codes(col: pd.Series) -> tuple[np.ndarray, list]:
    """A device column as (a code per row, -1 where missing; the device of each code)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy(), list(col.cat.categories)
    codes, devices = pd.factorize(col.astype(object))
    return codes, list(devices)


def _is(events: pd.DataFrame, action: Action) -> np.ndarray:
    """Which events are ``action`` (a categorical column compares its codes)."""
    col = events["action"]
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        if action.value not in cats:
            return np.zeros(len(col), dtype=bool)
        return col.cat.codes.to_numpy() == cats.get_loc(action.value)
    return (col.astype(object) == action.value).to_numpy(dtype=bool)


def live_after(tables: dict[str, pd.DataFrame], event: int) -> np.ndarray:
    """alloc_ids of the blocks alive right after event number ``event``."""
    ev = tables["events"].iloc[: event + 1]
    destroy = _is(ev, Action.DESTROY)
    ids = ev["alloc_id"].to_numpy()
    born = ids[~destroy & ~_is(ev, Action.INCREMENT_VERSION)]
    gone = ids[destroy]
    if len(born) and born.min() >= 0 and born.max() < 4 * len(ids) + 1024:
        # ids are small (the analysis numbers blocks 0, 1, ...): a mask, not a sort
        alive = np.zeros(int(born.max()) + 1, dtype=bool)
        alive[born] = True
        alive[gone[gone <= born.max()].clip(0)] = False
        return np.flatnonzero(alive).astype(ids.dtype)
    return np.setdiff1d(born, gone)


def member(ids: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """``np.isin(ids, pool)`` for block ids: a mask over the ids where they are small (the
    analysis numbers blocks 0, 1, ...), not a sort."""
    ids, pool = np.asarray(ids, dtype=np.int64), np.asarray(pool, dtype=np.int64)
    if not len(ids) or not len(pool):
        return np.zeros(len(ids), dtype=bool)
    low, high = min(ids.min(), pool.min()), max(ids.max(), pool.max())
    if low < 0 or high >= 4 * (len(ids) + len(pool)) + 1024:
        return np.isin(ids, pool)
    mask = np.zeros(int(high) + 1, dtype=bool)
    mask[pool] = True
    return mask[ids]


def with_op_context(tables: dict[str, pd.DataFrame], blocks: pd.DataFrame) -> pd.DataFrame:
    """Add the allocating op's name, callsite and phase to allocation rows (their ``module``
    is the block's own: see :mod:`.categories`)."""
    ops = tables["ops"]
    op_id = blocks["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    if not len(ops):
        op_id = np.full(len(op_id), -1, dtype=np.int64)
    out = blocks.copy()
    out["op_name"] = _taken(ops["name"], op_id, open_vocabulary=True)
    out["callsite"] = _taken(ops["callsite"], op_id)
    out["phase"] = _taken(ops["phase"], op_id)
    return S.conform(out, PEAK_COLUMNS, name="peak")


def _taken(col: pd.Series, rows: np.ndarray, *, open_vocabulary: bool = False):
    """``col`` at ``rows`` (missing where a row is -1) in the column's own dtype, taken
    from its storage (no per-row conversion). ``open_vocabulary``: a categorical's
    categories are then the values it holds, sorted (as ``astype("category")`` makes them)."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return col.array.take(rows, allow_fill=True)
    codes = col.cat.codes.to_numpy()
    at = np.where(rows >= 0, codes[rows.clip(0)], -1) if len(codes) else rows
    taken = pd.Categorical.from_codes(at, dtype=col.dtype)
    if open_vocabulary:
        taken = taken.remove_unused_categories()
        if not taken.categories.is_monotonic_increasing:
            taken = taken.reorder_categories(taken.categories.sort_values())
    return taken


@dataclass
class PeakPoint:
    """Where live memory was highest on one device: how much, when, and which blocks (their
    ``alloc_id``) were alive then. ``peak_ns`` is None when there were no memory events."""

    device: str | None
    peak_bytes: int
    peak_ns: int | None
    alloc_ids: np.ndarray


def peak_point(tables: dict[str, pd.DataFrame], device: str | None = None) -> PeakPoint:
    """The peak of ``device`` (default: the device with the highest peak) without the
    blocks' details: what :func:`peak` lists, for callers that need only the numbers."""
    peaks = _peaks(tables["events"])
    if device is not None:
        device = str(device)
        if device not in peaks:
            if peaks:
                raise ValueError(
                    f"no memory events on device {shown(device)}; devices seen: "
                    f"{sorted(peaks, key=device_sort_key)}"
                )
            return PeakPoint(device, 0, None, np.zeros(0, dtype=np.int64))
    elif peaks:  # the highest peak; on a tie, the first device in device order
        device = max(sorted(peaks, key=device_sort_key), key=lambda d: peaks[d][0])
    else:
        return PeakPoint(None, 0, None, np.zeros(0, dtype=np.int64))
    peak_bytes, peak_ns, event = peaks[device]
    a = tables["allocations"]
    ids = a["alloc_id"].to_numpy(dtype=np.int64)
    mine = member(ids, live_after(tables, event)) & _on(a["device"], device)
    return PeakPoint(device, peak_bytes, peak_ns, ids[mine])


def _on(col: pd.Series, device: str) -> np.ndarray:
    """``col == device`` for a device column (a categorical one compares its codes)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        if device not in cats:
            return np.zeros(len(col), dtype=bool)
        return col.cat.codes.to_numpy() == cats.get_loc(device)
    return (col.astype(object) == device).to_numpy(dtype=bool)


def peak(tables: dict[str, pd.DataFrame], device: str | None = None) -> pd.DataFrame:
    """The blocks live at the peak of ``device`` (default: the device with the highest peak),
    largest first, with the module they belong to and the op and callsite that allocated
    them.

    ``.attrs``: ``peak_bytes``, ``peak_ns`` and ``device``. With no memory events the table is
    empty and ``peak_bytes`` is 0.
    """
    point = peak_point(tables, device)
    if point.peak_ns is None:
        out = S.empty(PEAK_COLUMNS)
        out.attrs.update(peak_bytes=0, peak_ns=None, device=point.device)
        return out
    a = tables["allocations"]
    blocks = a[member(a["alloc_id"].to_numpy(dtype=np.int64), point.alloc_ids)]
    out = (
        with_op_context(tables, blocks)
        .sort_values(["size_bytes", "alloc_id"], ascending=[False, True])
        .reset_index(drop=True)
    )
    out.attrs.update(peak_bytes=point.peak_bytes, peak_ns=point.peak_ns, device=point.device)
    return out


GROUPS = {"category": "category", "module": "module", "op": "op_name", "name": "name"}


def peak_by(
    tables: dict[str, pd.DataFrame], by: str = "category", device: str | None = None
) -> pd.Series:
    """Bytes live at the peak, grouped; blocks with no value for ``by`` count under "(none)"."""
    if by not in GROUPS:
        raise ValueError(f"peak_by(by={by!r}): choose one of {sorted(GROUPS)}")
    p = peak(tables, device)
    key = p[GROUPS[by]].astype(object).where(p[GROUPS[by]].notna(), "(none)")
    out = p["size_bytes"].groupby(key.to_numpy()).sum().sort_values(ascending=False)
    out.name = "size_bytes"
    out.index.name = by
    out.attrs.update(p.attrs)
    return out
