"""What a profile's dashboard shows, chosen once per profile.

:func:`shown` picks the rows to draw (:mod:`.data`) and encodes the data sources'
columns; the dashboard under a cell, then ``prof.to_html`` (or ``prof.show()`` again) reuse
that choice (:class:`.memo.LastProfile`: weak references tell whether the profile and its
tables are still the same, and the profile's death drops the choice).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import peaks as _peaks
from ..memo import LastProfile
from . import data as dd
from . import lineage as dl


def cds_data(columns: dict) -> dict:
    """A data source's columns as sent: numeric columns as numpy arrays (sent as compact
    binary), text columns as numpy arrays of ``str`` (sent as one plain list, not encoded
    item by item)."""
    data = {}
    for k, v in columns.items():
        arr = v if isinstance(v, np.ndarray) else None
        if arr is None and len(v):
            kinds = {type(x) for x in v}
            if kinds <= {int, np.int32, np.int64}:
                arr = np.asarray(v, dtype="int64")
            elif kinds <= {int, float, np.int64, np.float64}:
                arr = np.asarray(v, dtype="float64")
            elif kinds <= {str, np.str_}:
                arr = np.asarray(v, dtype=str)
        if arr is None or not len(arr) or arr.dtype.kind not in "iufU":
            data[k] = list(v)
        elif arr.dtype.kind == "U":
            data[k] = arr
        elif arr.dtype.kind in "iu" and np.abs(arr).max() < 2**31:
            data[k] = arr.astype("int32")
        elif arr.dtype == np.float32:
            data[k] = arr
        else:
            data[k] = arr.astype("float64")
    return data


@dataclass
class Shown:
    """What a dashboard of one profile shows (:mod:`.data`), before any model."""

    win: dd.Window
    sel: dd.Allocations
    ops: dd.Ops
    acols: dict
    lcols: dict
    pool: list[str]
    flows: dict
    timelines: list[dd.Timeline]  # stacked: the categories chosen, the others hidden
    visible: list[list[bool]]  # per timeline and category: stacked
    tiny: list[tuple[str, int]]  # devices too small to chart, and their peaks
    data: dict = field(default_factory=dict)  # every data source's columns, as sent ...
    encoded: dict = field(default_factory=dict)  # ... and as Bokeh serializes them


#: The last profile's selection, reused while that profile and its tables live.
_selection = LastProfile()
#: Its record (none, or one :class:`.memo.Remembered` holding a :class:`Shown`).
last_shown = _selection.entries


def _key(prof, device: str | None, cats: list[str] | None) -> tuple:
    """What the selection depends on besides the tables: the choice, the window (the
    capture's start and end: from the metadata, else from the tables), the clock."""
    meta = prof.meta
    return (
        device,
        None if cats is None else tuple(cats),
        meta.get("start_ns"),
        meta.get("end_ns"),
        bool(meta.get("estimate")),
        meta.get("limit"),
    )


def shown(prof, device: str | None, cats: list[str] | None) -> Shown:
    """What a dashboard of ``prof`` shows (of ``device`` only, and of the categories ``cats``,
    when given): chosen the first time, then reused while ``prof`` and its tables live."""
    key = _key(prof, device, cats)
    found = _selection.get(prof, key)
    if found is not None:
        return found
    _selection.forget(None)  # another profile's, or stale: never two at once
    win = dd.window(prof)
    devs = [device] if device is not None else _question_first(prof)
    peaks = {dev: dd.peak_or_none(prof, dev) for dev in devs}
    sel = dd.select_allocations(prof, device, cats, peaks=peaks)
    alloc_ids = sel.table["alloc_id"].astype("int64").tolist()
    lin = dl.lineage_rows(prof, alloc_ids)
    ops = dd.select_ops(prof, win, dl.must_show_ops(prof, sel, lin, dd.OP_BUDGET // 2))
    acols = dd.allocation_columns(prof, sel, ops, win)
    lcols, pool, lin0, lin1 = dl.lineage_columns(prof, lin, alloc_ids, ops, win)
    acols["lin0"] = np.asarray(lin0 + [0] * len(sel.summarised), dtype=np.int64)
    acols["lin1"] = np.asarray(lin1 + [0] * len(sel.summarised), dtype=np.int64)
    tiny = tiny_devices(peaks)
    charted = [dev for dev in devs if dev not in dict(tiny)]
    timelines = [dd.timeline(prof, dev, win, peak=peaks[dev]) for dev in charted]
    visible = []
    for tl in timelines:
        chosen = [c for c in tl.categories if cats is None or c in cats]
        dd.stack(tl.columns, tl.categories, chosen)
        visible.append([c in chosen for c in tl.categories])
    flows = dd.flow_columns(prof, ops)
    out = Shown(win, sel, ops, acols, lcols, pool, flows, timelines, visible, tiny)
    data = {"ops": ops.columns, "allocs": acols, "flows": flows, "lineage_all": lcols}
    for k, tl in enumerate(timelines):
        data[f"timeline{k}"] = tl.columns
        if tl.levels is not None:  # zoomable: its levels, and the overview's own source
            data[f"levels{k}"] = tl.levels
            data[f"overview{k}"] = {"t": tl.columns["t"], "total": tl.columns["total"]}
    out.data = {name: cds_data(columns) for name, columns in data.items()}
    _selection.put(prof, key, out)
    return out


def _question_first(prof) -> list[str]:
    """The profile's devices, the one its question is about first (an estimate's device,
    the limit's), then the others in device order."""
    meta = prof.meta
    first = (meta.get("oom") or {}).get("device") or (
        meta.get("device") if meta.get("estimate") or meta.get("limit") is not None else None
    )
    devs = list(prof.devices)
    return [first, *(d for d in devs if d != first)] if first in devs else devs


#: A device whose peak is under this many bytes, and under :data:`TINY_SHARE` of the largest
#: device's peak, gets no chart (its peak is in the summary): 208 B of optimizer step
#: counters on the CPU next to a GPU's gigabytes say nothing a full-size chart could show.
TINY_BYTES = 64 * 1024
TINY_SHARE = 0.01


def tiny_devices(peaks: dict) -> list[tuple[str, int]]:
    """The devices of ``peaks`` (device -> PeakPoint or None) too small to chart, with their
    peaks in bytes."""
    sizes = {dev: p.peak_bytes for dev, p in peaks.items() if p is not None}
    largest = max(sizes.values(), default=0)
    return [(dev, n) for dev, n in sizes.items() if n < TINY_BYTES and n < TINY_SHARE * largest]


def forget(prof=None) -> None:
    """Drop the reused selection and the peaks of ``prof`` (of any profile when None)."""
    _selection.forget(prof)
    _peaks.forget(prof)
