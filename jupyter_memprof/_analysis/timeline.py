"""Memory events and the per-category timeline.

``events`` follows torch's raw memory-timeline vocabulary (preexisting, create,
increment_version, destroy). ``timeline`` holds, after each event, the live bytes of every
(device, category) that event changed; the state at time t is the last row of each
(device, category) at or before t, and the sum over categories equals the bytes of the
blocks alive at t.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import schema as S
from .schema import Action

_ACTION = S.codes_of(S.ACTION_DTYPE)
PREEXISTING, CREATE, INCREMENT_VERSION, DESTROY = (
    _ACTION[a.value]
    for a in (Action.PREEXISTING, Action.CREATE, Action.INCREMENT_VERSION, Action.DESTROY)
)
#: Events at the same time sort by action: a block exists, is created, written, destroyed.
_ACTION_ORDER = np.zeros(len(_ACTION), dtype=np.int8)
_ACTION_ORDER[[PREEXISTING, CREATE, INCREMENT_VERSION, DESTROY]] = np.arange(4)


def _first_last(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """For each value 0..n-1: the position of its first and of its last occurrence in
    ``keys`` (-1 where it does not occur)."""
    first = np.full(n, -1, dtype=np.int64)
    last = np.full(n, -1, dtype=np.int64)
    ok = np.flatnonzero(keys >= 0)
    first[keys[ok[::-1]]] = ok[::-1]  # the last write wins: the first occurrence
    last[keys[ok]] = ok
    return first, last


def build_events(
    allocations: pd.DataFrame, versions: pd.DataFrame, ops: pd.DataFrame, start_ns: int
) -> pd.DataFrame:
    """The events table: each block's creation (or its presence when the capture started,
    at ``start_ns``), each version an op made of it, its free."""
    a = allocations
    if a.empty:
        return S.empty(S.EVENTS)
    n = len(a)
    v = versions
    ids = a["alloc_id"].to_numpy()
    v_pos = pd.Index(ids).get_indexer(v["alloc_id"].to_numpy())  # the block of each version
    first_v, last_v = _first_last(v_pos, n)
    v_cat = v["category"].cat.codes.to_numpy()
    v_version = v["version"].to_numpy()
    # the category at creation is version 0's (the block's own for raw blocks)
    block_cat = a["category"].cat.codes.to_numpy()
    v0_cat = np.where(first_v >= 0, v_cat[np.maximum(first_v, 0)], -1) if len(v) else block_cat
    create_cat = np.where(v0_cat < 0, block_cat, v0_cat)
    pre = a["alloc_ns"].isna().to_numpy()
    tid = a["tensor_id"].to_numpy(dtype=np.int64, na_value=0)
    tid_na = a["tensor_id"].isna().to_numpy()
    dev = a["device"].cat.codes.to_numpy()
    size = a["size_bytes"].to_numpy()
    alloc_op = a["alloc_op_id"]
    free_op = a["free_op_id"]

    freed = np.flatnonzero(a["free_ns"].notna().to_numpy())
    bumps = np.flatnonzero((v_version > 0) & v["start_ns"].notna().to_numpy())
    b_pos = v_pos[bumps]
    v_op = v["op_id"]
    nf, nb = len(freed), len(bumps)

    def cat(*parts) -> np.ndarray:
        return np.concatenate(parts)

    c = {}  # the columns, as arrays; ``*_na``: where a value is missing
    c["time"] = cat(
        np.where(pre, start_ns, a["alloc_ns"].to_numpy(dtype=np.int64, na_value=0)),
        v["start_ns"].to_numpy(dtype=np.int64, na_value=0)[bumps],
        a["free_ns"].to_numpy(dtype=np.int64, na_value=0)[freed],
    ).astype(np.int64)
    c["action"] = cat(
        np.where(pre, PREEXISTING, CREATE),
        np.full(nb, INCREMENT_VERSION),
        np.full(nf, DESTROY),
    ).astype(np.int8)
    c["alloc_id"] = cat(ids, v["alloc_id"].to_numpy()[bumps], ids[freed]).astype(np.int64)
    c["tensor"] = cat(tid, v["tensor_id"].to_numpy()[bumps], tid[freed])
    c["tensor_na"] = cat(tid_na, np.zeros(nb, dtype=bool), tid_na[freed])
    last_version = (
        np.where(last_v >= 0, v_version[np.maximum(last_v, 0)], 0)
        if len(v)
        else np.zeros(n, dtype=np.int64)
    )
    c["version"] = cat(np.zeros(n, dtype=np.int64), v_version[bumps], last_version[freed])
    c["version_na"] = cat(tid_na, np.zeros(nb, dtype=bool), (last_v < 0)[freed])
    c["device"] = cat(dev, dev[b_pos], dev[freed])
    c["size"] = cat(size, size[b_pos], size[freed]).astype(np.int64)
    c["category"] = cat(create_cat, v_cat[bumps], block_cat[freed])
    c["op"] = cat(
        alloc_op.to_numpy(dtype=np.int64, na_value=0),
        v_op.to_numpy(dtype=np.int64, na_value=0)[bumps],
        free_op.to_numpy(dtype=np.int64, na_value=0)[freed],
    )
    c["op_na"] = cat(
        alloc_op.isna().to_numpy(), v_op.isna().to_numpy()[bumps], free_op.isna().to_numpy()[freed]
    )
    return _sorted_events(c, a["device"].cat.categories)


def _sorted_events(c: dict[str, np.ndarray], devices: pd.Index) -> pd.DataFrame:
    """The events table from its columns as arrays (``*_na``: where a value is missing):
    by time; at one time, in the order of the actions, then by block."""
    order = np.lexsort((c["alloc_id"], _ACTION_ORDER[c["action"]], c["time"]))
    c = {k: col[order] for k, col in c.items()}
    return pd.DataFrame(
        {
            "time_ns": c["time"],
            "action": pd.Categorical.from_codes(c["action"], dtype=S.ACTION_DTYPE),
            "alloc_id": c["alloc_id"],
            "tensor_id": S.integers(c["tensor"], c["tensor_na"]),
            "version": S.integers(c["version"], c["version_na"]),
            "device": S.open_categorical_codes(c["device"], devices),
            "size_bytes": c["size"],
            "category": pd.Categorical.from_codes(c["category"], dtype=S.CATEGORY_DTYPE),
            "op_id": S.integers(c["op"], c["op_na"]),
            "reserved_bytes": S.integers(np.zeros(len(order)), np.ones(len(order), dtype=bool)),
        }
    )


def with_reserved(events: pd.DataFrame, mem: pd.DataFrame, reserved_start: dict) -> pd.DataFrame:
    """Fill ``reserved_bytes``: the allocator's reserved total after the last recorded
    allocator event at or before each event on its device (CUDA's caching allocator records
    it with every event), the total read at the start before the first one, NA elsewhere."""
    if events.empty or (not reserved_start and not (mem["total_reserved"].to_numpy() >= 0).any()):
        return events
    values = np.zeros(len(events), dtype=np.int64)
    missing = np.ones(len(events), dtype=bool)
    ev_dev = events["device"].astype(object).to_numpy()
    ev_t = events["time_ns"].to_numpy()
    rec = mem[mem["total_reserved"].to_numpy() >= 0]
    rec_dev = rec["device"].astype(object).to_numpy()
    for device in pd.unique(ev_dev).tolist():
        rows = np.flatnonzero(ev_dev == device)
        r = rec[rec_dev == device]
        t = r["time_ns"].to_numpy()
        order = np.argsort(t, kind="stable")
        t, total = t[order], r["total_reserved"].to_numpy()[order]
        pos = np.searchsorted(t, ev_t[rows], side="right") - 1
        hit = pos >= 0
        values[rows[hit]] = total[pos[hit]]
        missing[rows[hit]] = False
        if device in reserved_start:
            values[rows[~hit]] = reserved_start[device]
            missing[rows[~hit]] = False
    return events.assign(reserved_bytes=S.integers(values, missing))


def _version_positions(versions: pd.DataFrame, alloc_id: np.ndarray, version: np.ndarray):
    """The row of ``versions`` holding each (alloc_id, version), or -1."""
    keys = pd.MultiIndex.from_arrays([versions["alloc_id"].to_numpy(), versions["version"]])
    return keys.get_indexer(pd.MultiIndex.from_arrays([alloc_id, version]))


def _deltas(events: pd.DataFrame, versions: pd.DataFrame) -> dict[str, np.ndarray]:
    """Signed byte changes per (device, category), one or two per event, in event order:
    columns ``event``, ``time_ns``, ``device`` and ``category`` (codes), ``delta``."""
    act = events["action"].cat.codes.to_numpy()
    size = events["size_bytes"].to_numpy()
    cat = events["category"].cat.codes.to_numpy()
    rows = {
        "event": np.arange(len(events)),
        "time_ns": events["time_ns"].to_numpy(),
        "device": events["device"].cat.codes.to_numpy(),
        "category": cat,
        "delta": np.where(act == DESTROY, -1, 1) * size,
    }
    bump = np.flatnonzero(act == INCREMENT_VERSION)
    if len(bump):
        # the version before: its category loses the bytes, the new one gains them
        prev = _version_positions(
            versions,
            events["alloc_id"].to_numpy()[bump],
            events["version"].to_numpy(dtype=np.int64, na_value=0)[bump] - 1,
        )
        v_cat = versions["category"].cat.codes.to_numpy()
        prev_cat = np.where(prev >= 0, v_cat[np.maximum(prev, 0)], -1)
        changed = (prev_cat < 0) | (prev_cat != cat[bump])
        keep = np.ones(len(events), dtype=bool)
        keep[bump[~changed]] = False
        minus = bump[changed]
        take = np.concatenate([minus, np.flatnonzero(keep)])
        rows = {k: x[take] for k, x in rows.items()}
        m = len(minus)
        rows["category"][:m] = prev_cat[changed]
        rows["delta"][:m] = -rows["delta"][:m]
        order = np.lexsort((rows["delta"], rows["event"]))
        rows = {k: x[order] for k, x in rows.items()}
    return rows


def build_timeline(events: pd.DataFrame, versions: pd.DataFrame) -> pd.DataFrame:
    if events.empty:
        return S.empty(S.TIMELINE)
    d = _deltas(events, versions)
    # running bytes of each (device, category)
    group = d["device"].astype(np.int64) * (len(S.CATEGORY_DTYPE.categories) + 1) + (
        d["category"] + 1
    )
    order = np.argsort(group, kind="stable")
    run = np.cumsum(d["delta"][order])
    g = group[order]
    start = np.r_[True, g[1:] != g[:-1]] if len(g) else np.zeros(0, dtype=bool)
    before = (run - d["delta"][order])[start]
    total = np.empty(len(run), dtype=np.int64)
    total[order] = run - before[np.cumsum(start) - 1]
    return pd.DataFrame(
        {
            "time_ns": d["time_ns"],
            "device": S.open_categorical_codes(d["device"], events["device"].cat.categories),
            "category": pd.Categorical.from_codes(d["category"], dtype=S.CATEGORY_DTYPE),
            "bytes": total,
        }
    )


def totals(events: pd.DataFrame, versions: pd.DataFrame) -> pd.DataFrame:
    """Total live bytes per device after each event: columns event, time_ns, device, bytes."""
    if events.empty:
        return pd.DataFrame({"event": [], "time_ns": [], "device": [], "bytes": []})
    ev = events.reset_index(drop=True)
    act = ev["action"].cat.codes.to_numpy()
    sign = np.where(act == DESTROY, -1, 1)
    sign[act == INCREMENT_VERSION] = 0
    d = pd.DataFrame(
        {
            "event": np.arange(len(ev)),
            "time_ns": ev["time_ns"].to_numpy(),
            "device": ev["device"].astype(object).to_numpy(),
            "delta": sign * ev["size_bytes"].to_numpy(),
        }
    )
    d["bytes"] = d.groupby("device", sort=False)["delta"].cumsum()
    return d.drop(columns="delta")


def live_by_category(timeline: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The states of one device's rows of a ``timeline`` table, in wide form: the distinct
    times of its rows (int64 ns, sorted) and, at each, the live bytes of every category of
    :data:`.schema.CATEGORY_DTYPE`, in that order (float64; each category's last row at or
    before that time, 0 before its first). Rows without a category are left out."""
    cats = S.CATEGORY_DTYPE.categories
    col = pd.Categorical(timeline["category"], dtype=S.CATEGORY_DTYPE).codes.astype(np.int64)
    ok = col >= 0
    col = col[ok]
    t = timeline["time_ns"].to_numpy(dtype=np.int64)[ok]
    if len(t) and bool((t[1:] >= t[:-1]).all()):  # time ordered (as the analysis makes it)
        new = np.concatenate([[True], t[1:] != t[:-1]])
        times, row = t[new], np.cumsum(new) - 1
    else:
        times, row = np.unique(t, return_inverse=True)
        row = row.reshape(-1)
    values = timeline["bytes"].to_numpy(dtype="float64")[ok]
    wide = np.zeros((len(times), len(cats)))
    for c in np.flatnonzero(np.bincount(col, minlength=len(cats))):
        wide[:, c] = _held(len(times), row[col == c], values[col == c])
    return times, wide


def _held(n: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Over ``n`` states, the value of the last of ``rows`` (in table order) at or before
    each state; 0 before the first."""
    if len(rows) > 1 and not bool((rows[1:] >= rows[:-1]).all()):
        order = np.argsort(rows, kind="stable")
        rows, values = rows[order], values[order]
    last = np.append(rows[1:] != rows[:-1], True)  # the last row at each state
    src = np.full(n, -1, dtype=np.int64)
    src[rows[last]] = np.flatnonzero(last)
    np.maximum.accumulate(src, out=src)
    return np.where(src >= 0, values[src.clip(0)], 0.0)
