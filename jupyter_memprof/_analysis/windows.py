"""Long runs: windows of steps, each analysed alone, joined here.

Each window of a long run (``profile(steps=N)``) is a capture of its own with its own
tables. What joins them is small and does not grow with the number of steps unless the
loop itself keeps memory: the ``steps`` rows of every window, and the *carried* blocks
(:data:`~.schema.CARRIED`), those alive at the end of a window, kept with their size,
callsite, category and the step that made them until a later window frees them. From those
:func:`.leaks.over_run` finds what grows step after step over the whole run, with the same
analysis as a single capture's.

A window sees the blocks from before it only when its code uses or frees them, so its live
bytes lack the carried blocks it never touches: :func:`live_offset` adds them back, and the
``steps`` rows of every window count the same memory.

All of these are pure functions of tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import schema as S

#: the byte columns of ``steps`` that count live memory (moved by a window's offset)
_LIVE_COLUMNS = ("peak_bytes", "live_start_bytes", "live_end_bytes")


def block_keys(device, ptr) -> pd.MultiIndex:
    """(device, ptr) pairs, to find the same block in two windows (or a name's block)."""
    return pd.MultiIndex.from_arrays(
        [np.asarray(device, dtype=object).astype(str), np.asarray(ptr, dtype=np.int64)]
    )


def _before_window(allocations: pd.DataFrame) -> pd.DataFrame:
    """The window's rows for blocks that existed before it (no allocation time)."""
    return allocations[allocations["alloc_ns"].isna().to_numpy()]


def live_offset(carried: pd.DataFrame, tables: dict[str, pd.DataFrame]) -> dict[str, int]:
    """Bytes per device of the carried blocks (alive when the window starts) that the
    window's own tables do not hold: the live memory its timeline cannot see."""
    if carried.empty:
        return {}
    seen = _before_window(tables["allocations"])
    known = block_keys(seen["device"], seen["ptr"])
    unseen = ~block_keys(carried["device"], carried["ptr"]).isin(known)
    sizes = carried["size_bytes"].to_numpy()[unseen]
    devices = carried["device"].astype(object).to_numpy()[unseen]
    out: dict[str, int] = {}
    for d, s in zip(devices.tolist(), sizes.tolist()):
        out[str(d)] = out.get(str(d), 0) + int(s)
    return out


def window_steps(
    tables: dict[str, pd.DataFrame], first_step: int, offset: dict[str, int]
) -> pd.DataFrame:
    """The window's ``steps`` rows numbered from ``first_step``, their live bytes moved up by
    ``offset`` (per device; see :func:`live_offset`)."""
    steps = tables["steps"].copy()
    steps["step"] = steps["step"] + first_step
    extra = steps["device"].astype(object).map(lambda d: offset.get(str(d), 0)).to_numpy()
    for col in _LIVE_COLUMNS:
        steps[col] = steps[col].to_numpy() + extra.astype(np.int64)
    return S.conform(steps, S.STEPS, name="steps")


def fold_tail(steps: pd.DataFrame, tail: pd.DataFrame) -> pd.DataFrame:
    """A window's ``steps`` with the run's tail folded into its last step, per device: a
    last window that allocated nothing (frees only, as ``opt.zero_grad()`` after the last
    ``opt.step()``) ends the last step, as the same stretch after a capture's last step
    does (see :func:`.steps.step_bounds`)."""
    if steps.empty or tail.empty:
        return steps
    steps = steps.copy()
    change = tail.groupby(tail["device"].astype(str), observed=True)["growth_bytes"].sum()
    end = int(tail["end_ns"].max())
    last = steps["step"].to_numpy() == steps["step"].max()
    for device, grew in change.items():
        row = last & (steps["device"].astype(str) == device).to_numpy()
        steps.loc[row, "live_end_bytes"] += int(grew)
        steps.loc[row, "growth_bytes"] += int(grew)
        steps.loc[row, "end_ns"] = end
        shrunk = row & (steps["growth_bytes"].to_numpy() <= 0)
        steps.loc[shrunk, "growth_category"] = None
    return S.conform(steps, S.STEPS, name="steps")


def forget_freed(carried: pd.DataFrame, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The carried blocks still alive after a window: those the window freed go, and so do
    those whose address the window allocated again (their free fell between two windows)."""
    if carried.empty:
        return carried
    a = tables["allocations"]
    freed = a["free_ns"].notna().to_numpy() & a["alloc_ns"].isna().to_numpy()
    made = a["alloc_ns"].notna().to_numpy()
    gone = freed | made
    keep = ~_among(carried, a["device"].to_numpy()[gone], a["ptr"].to_numpy()[gone])
    return carried[keep].reset_index(drop=True)


def _among(blocks: pd.DataFrame, device: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """Which of ``blocks`` (few: the carried ones) have their (device, address) among the
    pairs ``device``, ``ptr`` (many: a window's blocks), one device at a time."""
    out = np.zeros(len(blocks), dtype=bool)
    mine = blocks["device"].astype(object).to_numpy().astype(str)
    theirs = np.asarray(device, dtype=object).astype(str)
    ptrs = blocks["ptr"].to_numpy(dtype=np.int64)
    for d in np.unique(mine).tolist():
        on = mine == d
        out[on] = np.isin(ptrs[on], np.asarray(ptr, dtype=np.int64)[theirs == d])
    return out


def survivors(
    tables: dict[str, pd.DataFrame],
    first_step: int,
    id_offset: int,
    *,
    before_run: bool = False,
) -> pd.DataFrame:
    """The blocks the window made and left alive, as :data:`~.schema.CARRIED` rows: ids
    moved by ``id_offset``, the run's step that made them. With ``before_run`` (the first
    window) the blocks alive from before the run come too, as step -1."""
    a = tables["allocations"]
    alive = a["free_ns"].isna().to_numpy()
    made = a["alloc_ns"].notna().to_numpy()
    rows = a[alive & (made | before_run)]
    steps = tables["steps"].drop_duplicates("step").sort_values("step")
    ends = steps["end_ns"].to_numpy(dtype=np.int64)
    alloc_ns = rows["alloc_ns"].to_numpy(dtype=np.int64, na_value=-1)
    if len(ends):
        step = np.minimum(np.searchsorted(ends, alloc_ns, side="left"), len(ends) - 1)
        step = step + first_step
    else:
        step = np.full(len(rows), first_step, dtype=np.int64)
    step = np.where(rows["alloc_ns"].isna().to_numpy(), -1, step)
    site = _callsites(tables["ops"], rows["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1))
    out = pd.DataFrame(
        {
            "alloc_id": rows["alloc_id"].to_numpy(dtype=np.int64) + id_offset,
            "device": rows["device"].astype(object).to_numpy(),
            "ptr": rows["ptr"].to_numpy(dtype=np.int64),
            "size_bytes": rows["size_bytes"].to_numpy(dtype=np.int64),
            "alloc_ns": rows["alloc_ns"].to_numpy(),
            "step": step.astype(np.int64),
            "category": rows["category"].to_numpy(),
            "callsite": site,
        }
    )
    return S.conform(out, S.CARRIED, name="carried")


def _callsites(ops: pd.DataFrame, op_ids: np.ndarray) -> np.ndarray:
    """The ``callsite`` of each op in ``op_ids`` (None where there is none), read only for
    those ops."""
    pos = pd.Index(ops["op_id"].to_numpy()).get_indexer(op_ids)
    out = np.full(len(op_ids), None, dtype=object)
    found = pos >= 0
    if found.any():
        out[found] = ops["callsite"].take(pos[found]).to_numpy(dtype=object)
    return out


def next_id_offset(tables: dict[str, pd.DataFrame], id_offset: int) -> int:
    """Where the next window's block ids start: after every id this window used."""
    ids = tables["allocations"]["alloc_id"]
    return id_offset + (int(ids.max()) + 1 if len(ids) else 0)


def join(parts: list[pd.DataFrame], schema: dict, name: str) -> pd.DataFrame:
    """Tables of one schema from several windows, one after the other."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return S.empty(schema)
    return S.conform(pd.concat(parts, ignore_index=True), schema, name=name)
