"""The allocations table: one row per block, allocation to free.

Allocator events are paired into blocks (:func:`_pair_events`); then come the blocks from
before the capture: those ops used but the allocator never reported (:func:`_add_op_inputs`),
the baseline of storages the session named at the start (:func:`_untouched_blocks`) and
what nothing names (on CUDA :func:`_unreachable_blocks`, on the CPU :func:`_unnamed_blocks`);
frees seen by weak references and
frees implied by an address handed out again end blocks from before the capture.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from .._devices import cuda_block_bytes
from . import schema as S
from .arrays import runs
from .lost_frees import frees_from_totals

__all__ = ["allocated_at_start", "build_allocations", "infer_invisible_frees"]


def allocated_at_start(mem: pd.DataFrame, totals_start: dict | None) -> dict[str, int]:
    """Per CUDA device, the bytes the caching allocator held just before the capture: the
    counter read when the capture started, or its first recorded event's total less the
    event's own size (the allocator's own count) where that is more (blocks other threads
    made in between). The counter is more when frees went unreported before the first event
    (without Python stacks: :mod:`.lost_frees`)."""
    out = {d: int(t.allocated) for d, t in (totals_start or {}).items()}
    known = mem[mem["total_allocated"].to_numpy() >= 0] if len(mem) else mem
    if len(known):
        first = known.drop_duplicates("device")
        for d, total, size in zip(
            first["device"].tolist(), first["total_allocated"].tolist(), first["size"].tolist()
        ):
            out[str(d)] = max(int(total) - int(size), out.get(str(d), 0))
    return out


@dataclass
class _Blocks:
    """The block columns while the table is built: device codes (into ``dev_names``),
    address, size, tensor id and its missing mask, whether the allocation and the free were
    recorded, their times and ops (-1: none)."""

    dev: np.ndarray
    ptr: np.ndarray
    size: np.ndarray
    tid: np.ndarray
    tid_na: np.ndarray
    has_a: np.ndarray
    has_f: np.ndarray
    alloc_ns: np.ndarray
    free_ns: np.ndarray
    alloc_op: np.ndarray
    free_op: np.ndarray
    dev_names: list

    def _columns(self) -> list[str]:
        return [f.name for f in fields(self) if f.name != "dev_names"]

    def append_preexisting(self, devices: list, ptr, size, tensor_ids) -> None:
        """Add blocks from before the capture: alive to the end as far as the allocator
        says, with no op of theirs. ``tensor_ids`` None: no tensor the profiler saw."""
        k = len(devices)
        code = {d: i for i, d in enumerate(self.dev_names)}
        dev_code = np.array([code.setdefault(d, len(code)) for d in devices], dtype=np.int64)
        no_tid = tensor_ids is None
        tids = np.zeros(k, dtype=np.int64) if no_tid else tensor_ids
        no, zero, none = np.zeros(k, dtype=bool), np.zeros(k, dtype=np.int64), np.full(k, -1)
        added = (dev_code, ptr, size, tids, np.full(k, no_tid), no, no, zero, zero, none, none)
        for name, extra in zip(self._columns(), added):
            col = getattr(self, name)
            setattr(self, name, np.concatenate([col, np.asarray(extra).astype(col.dtype)]))
        self.dev_names = [*code]

    def reorder(self, order: np.ndarray) -> None:
        for name in self._columns():
            setattr(self, name, getattr(self, name)[order])

    def key_of(self, rows: np.ndarray) -> list[tuple]:
        """``(device, ptr)`` of ``rows``."""
        dn = np.array(self.dev_names, dtype=object)
        return list(zip(dn[self.dev[rows]].tolist(), self.ptr[rows].tolist()))

    def frame(self) -> pd.DataFrame:
        n = len(self.dev)
        out = pd.DataFrame(
            {
                "alloc_id": np.arange(n, dtype=np.int64),
                "tensor_id": S.integers(self.tid, self.tid_na),
                "device": S.open_categorical(np.array(self.dev_names, dtype=object)[self.dev]),
                "ptr": self.ptr.astype(np.int64),
                "size_bytes": self.size.astype(np.int64),
                "alloc_ns": S.integers(self.alloc_ns, ~self.has_a),
                "free_ns": S.integers(self.free_ns, ~self.has_f),
                "alloc_op_id": S.integers(self.alloc_op, self.alloc_op < 0),
                "free_op_id": S.integers(self.free_op, self.free_op < 0),
                "category": pd.Categorical.from_codes(
                    np.full(n, -1, dtype=np.int8), dtype=S.CATEGORY_DTYPE
                ),
                "reason": S.no_strings(n),
                "name": S.no_strings(n),
                "module": S.no_strings(n),
                "module_reason": S.no_strings(n),
                "callsite": S.no_strings(n),
            }
        )
        return S.conform(out, S.ALLOCATIONS, name="allocations")


def build_allocations(
    mem: pd.DataFrame,
    untracked: pd.DataFrame,
    names: pd.DataFrame,
    devices: list[str],
    totals_start: dict | None = None,
    watched_frees: list | None = None,
    totals_end: dict | None = None,
    inferred: dict | None = None,
    older: list | None = None,
    unnamed: list | None = None,
) -> pd.DataFrame:
    """One row per block, from allocation to free.

    Allocator events are paired by ``allocation_id`` (torch gives the allocation and its free
    the same id, including raw blocks with no tensor identity). A free with no allocation is
    a block that existed before the capture. Tensors that ops used but whose blocks the
    allocator never reported (parameters, inputs made before the capture and still alive)
    become pre-existing blocks too; their size comes from the live object when the session
    knows it, else from the furthest byte any view of them reached.

    The baseline: every storage the session named at the start is a block even when the
    capture never touches it (:func:`_untouched_blocks`); its free, when a weak reference saw
    one (``watched_frees``), ends it. On a CUDA device whose allocator held more at the start
    than every block known, the rest is one block of address 0 (:func:`_unreachable_blocks`).
    Frees the profiler did not report end blocks where the CUDA allocator's totals say they
    were freed (:func:`.lost_frees.frees_from_totals`; ``totals_end``: the totals at the stop;
    what it did per device is put in ``inferred``).

    ``older``: blocks alive throughout that no event recorded (``Capture.older``);
    ``unnamed``: CPU storages live at the start that no name reached (``Capture.unnamed``,
    :func:`_unnamed_blocks`).

    Rows: the blocks existing before the capture first, then by allocation time, then by
    free time; ties keep the order of (``allocation_id``, device) and blocks seen only as op
    inputs last, in order of first use.
    """
    if (
        mem.empty
        and untracked.empty
        and not totals_start
        and not older
        and not unnamed
        and not (names["when"] == "start").any()
    ):
        return S.empty(S.ALLOCATIONS)  # nothing happened: skip pandas' fixed costs
    b = _pair_events(mem)
    live = _start_sizes(names, unnamed) if (~b.has_a).any() or not untracked.empty else {}
    _fix_stale_sizes(b, live)
    _add_op_inputs(b, untracked, devices, live)
    held_at_start = allocated_at_start(mem, totals_start)
    _add_baseline(b, mem, untracked, names, devices, held_at_start)
    if unnamed:
        _unnamed_blocks(b, unnamed, watched_frees, devices)
    _watched_frees(watched_frees, b)
    if older:
        _append_found(b, [(o.device, o.ptr, o.size) for o in older])
    # Preexisting blocks first (alloc_ns NA), then by allocation time.
    b.reorder(np.lexsort((b.free_ns, b.has_f, b.alloc_ns, b.has_a)))
    reported = b.has_f.copy()
    infer_invisible_frees(b.has_a, b.alloc_ns, b.has_f, b.free_ns, b.dev, b.ptr)
    unseen_frees(b.dev, b.ptr, b.size, b.has_a, b.has_f, b.alloc_ns, b.free_ns)
    n = len(b.dev)
    end = {d: t.allocated for d, t in (totals_end or {}).items()}
    found = frees_from_totals(b, mem, reported, (held_at_start, end), names)
    if inferred is not None:
        inferred.update(found)
    if len(b.dev) > n:  # a block split off what nothing named at the start
        b.reorder(np.lexsort((b.free_ns, b.has_f, b.alloc_ns, b.has_a)))
    return b.frame()


def callsites_from_ops(allocations: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """Pass: each block's ``callsite`` is the callsite of the op that allocated it, where
    the producer gave the block none (a snapshot's blocks have their stack's already)."""
    if allocations.empty or ops.empty:
        return allocations
    op = allocations["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    by_op = pd.Series(ops["callsite"].astype(S.STRING).array, index=ops["op_id"].to_numpy())
    site = by_op.reindex(op).array
    have = allocations["callsite"].array
    return allocations.assign(callsite=pd.array(np.where(have.isna(), site, have), dtype=S.STRING))


def _pair_events(mem: pd.DataFrame) -> _Blocks:
    """Allocator events paired by (``allocation_id``, device), in event order: each
    allocation starts a block and the first free after it ends that block; a free before any
    allocation of its key is a block from before the capture.

    An id can carry several allocations: torch numbers storages by address and reuses the
    live number when an address is handed out again while its last free went unrecorded (a
    thread the profiler does not see, as gloo's, dropped it). Each such allocation is its
    own block; the one before stays open here and :func:`unseen_frees` ends it."""
    time = mem["time_ns"].to_numpy()
    ptr = mem["ptr"].to_numpy()
    size = mem["size"].to_numpy()
    tid = mem["tensor_id"].to_numpy(dtype=np.int64, na_value=-1)
    tid_na = mem["tensor_id"].isna().to_numpy()
    aid = mem["allocation_id"].to_numpy()
    op = mem["op_id"].to_numpy(dtype=np.int64, na_value=-1)  # ids: negative is none
    dev_code, dev_names = pd.factorize(mem["device"].to_numpy(dtype=object), sort=True)

    order, key_start = runs((aid, dev_code), by=2)  # event order within each key
    is_a = size[order] > 0
    block_start = key_start | is_a
    block = np.cumsum(block_start) - 1
    # a block's rows: its allocation (none before the capture), then frees; the first counts
    first_free = ~is_a & (block_start | np.r_[False, is_a[:-1]])
    nb = int(block_start.sum())
    a_row = np.full(nb, -1, dtype=np.int64)
    f_row = np.full(nb, -1, dtype=np.int64)
    a_row[block[is_a]] = order[is_a]
    f_row[block[first_free]] = order[first_free]
    has_a, has_f = a_row >= 0, f_row >= 0
    ar, fr = np.maximum(a_row, 0), np.maximum(f_row, 0)
    a_tid_ok = has_a & ~tid_na[ar]
    return _Blocks(
        dev=np.where(has_a, dev_code[ar], dev_code[fr]),
        ptr=np.where(has_a, ptr[ar], ptr[fr]),
        size=np.where(has_a, size[ar], -size[fr]),
        tid=np.where(a_tid_ok, tid[ar], tid[fr]),
        tid_na=~(a_tid_ok | (has_f & ~tid_na[fr])),
        has_a=has_a,
        has_f=has_f,
        alloc_ns=np.where(has_a, time[ar], 0),
        free_ns=np.where(has_f, time[fr], 0),
        alloc_op=np.where(has_a, op[ar], -1),
        free_op=np.where(has_f, op[fr], -1),
        dev_names=[*dev_names],
    )


def _fix_stale_sizes(b: _Blocks, live: dict) -> None:
    """Frees of blocks from before the capture on the CPU: torch reports the size its
    allocator last recorded at that address, which is stale when that block was freed
    outside any capture and another one got its address (see docs/tables.md). A storage
    the session named at the start, at that address, has the true size."""
    pre_freed = np.flatnonzero(b.has_f & ~b.has_a)
    if not (len(pre_freed) and live and "cpu" in b.dev_names):
        return
    pre_freed = pre_freed[b.dev[pre_freed] == b.dev_names.index("cpu")]
    for i in pre_freed.tolist():
        b.size[i] = live.get(("cpu", int(b.ptr[i])), b.size[i])


def _add_op_inputs(b: _Blocks, untracked: pd.DataFrame, devices: list[str], live: dict) -> None:
    """Tensors seen only as op inputs: blocks from before the capture, still alive after
    it, in order of first use; sized from the live object when the session knows it, else
    from the furthest byte any view of them reached (rounded as CUDA's blocks are)."""
    g = untracked[~untracked["tensor_id"].isin(b.tid[~b.tid_na])]
    if not g.empty:
        g = g[g["device"].isin(devices)]
    if g.empty:
        return
    g_dev = g["device"].to_numpy(dtype=object)
    g_ptr = g["ptr"].to_numpy(dtype=np.int64)
    live_size = np.array(
        [live.get(k, 0) for k in zip(g_dev.tolist(), g_ptr.tolist())], dtype=np.int64
    )
    g_size = np.maximum(g["extent"].to_numpy(dtype=np.int64), live_size)
    # a view's furthest byte is a request: CUDA's block around it is rounded
    cuda = np.array([str(d).startswith("cuda") for d in g_dev.tolist()], dtype=bool)
    g_size = np.where(cuda, cuda_block_bytes(g_size), g_size)
    b.append_preexisting(g_dev.tolist(), g_ptr, g_size, g["tensor_id"].to_numpy(np.int64))


def _add_baseline(b, mem, untracked, names, devices, held_at_start: dict) -> None:
    """The baseline: storages named at the start but never seen, then (after them: they are
    known too) what nothing names on CUDA. A CUDA device the capture did not use gets none:
    its counters stay in the meta."""
    used = set(pd.unique(mem["device"]).tolist()) | set(pd.unique(untracked["device"]).tolist())
    baseline_devices = [d for d in devices if not d.startswith("cuda") or d in used]
    extra = _untouched_blocks(names, baseline_devices, b)
    if extra:
        _append_found(b, extra)
    extra = _unreachable_blocks(held_at_start, baseline_devices, b)
    if extra:
        _append_found(b, extra)


def _append_found(b: _Blocks, extra: list) -> None:
    b.append_preexisting(
        [d for d, _, _ in extra],
        np.array([p for _, p, _ in extra], dtype=np.int64),
        np.array([z for _, _, z in extra], dtype=np.int64),
        None,  # no tensor the profiler saw
    )


def _untouched_blocks(names, devices, b: _Blocks) -> list:
    """``(device, ptr, bytes)`` of every storage the session named at the start that is no
    block yet: memory the capture never touched (a model's gradients and optimizer state
    during an evaluation, a list of cached batches), in the order the names were read."""
    when = names["when"].to_numpy(dtype=object) == "start"
    if not when.any():
        return []
    pre = np.flatnonzero(~b.has_a)
    have = set(b.key_of(pre))
    wanted = set(devices)
    out: list = []
    for key in zip(
        names["device"].to_numpy(dtype=object)[when].tolist(),
        names["ptr"].to_numpy()[when].tolist(),
        names["size_bytes"].to_numpy()[when].tolist(),
    ):
        if key[0] in wanted and key[:2] not in have:
            have.add(key[:2])
            out.append(key)
    return out


def _unreachable_blocks(allocated, devices, b: _Blocks) -> list:
    """One ``(device, 0, bytes)`` per CUDA device whose allocator held more at the start
    than every block known then: memory allocated before the capture that nothing the
    session knows reaches (cuBLAS workspaces, tensors only C++ holds, a graph kept alive)."""
    out = []
    pre = ~b.has_a
    for device, total in allocated.items():
        if device not in devices:
            continue
        known = 0
        if device in b.dev_names:
            known = int(b.size[pre & (b.dev == b.dev_names.index(device))].sum())
        if total > known:
            out.append((device, 0, total - known))
    return out


def _unnamed_blocks(b: _Blocks, unnamed: list, watched: list | None, devices: list) -> None:
    """On the CPU, what nothing names: the storages live at the start that no name reached
    (``Capture.unnamed``) and that are no block yet (the captured code used them, or freed
    them where torch reported it), as on CUDA: one block of address 0 per device, alive to
    the end, and one of address 0 per storage a weak reference saw freed during the capture,
    ended then."""
    have = set(b.key_of(np.flatnonzero(~b.has_a)))
    gone = {(d, p): t for d, p, t in watched or ()}
    alive: dict[str, int] = {}
    ended: list[tuple[str, int, int]] = []
    for device, ptr, size in unnamed:
        key = (device, ptr)
        if device not in devices or key in have:
            continue
        have.add(key)
        if key in gone:
            ended.append((device, size, gone[key]))
        else:
            alive[device] = alive.get(device, 0) + size
    extra = [(d, 0, z) for d, z in alive.items()] + [(d, 0, z) for d, z, _ in ended]
    if not extra:
        return
    _append_found(b, extra)
    for i, (_, _, t) in enumerate(ended, start=len(b.dev) - len(ended)):
        b.has_f[i], b.free_ns[i] = True, t


def _watched_frees(watched, b: _Blocks) -> None:
    """End blocks from before the capture that the allocator never reported freed, at the
    time a weak reference on their storage saw them go. Updates ``b.has_f`` and ``b.free_ns``."""
    if not watched:
        return
    open_pre = np.flatnonzero(~b.has_a & ~b.has_f)
    if not len(open_pre):
        return
    at = dict(zip(b.key_of(open_pre), open_pre.tolist()))
    for device, ptr, t in watched:
        i = at.pop((device, ptr), None)
        if i is not None:
            b.has_f[i] = True
            b.free_ns[i] = t


def _start_sizes(names: pd.DataFrame, unnamed: list | None = None) -> dict:
    """``(device, ptr) -> bytes`` of the storages the session named at the start, then of
    those it did not (``unnamed``)."""
    when = names["when"].to_numpy(dtype=object) == "start"
    live: dict = {}
    for key in zip(
        names["device"].to_numpy(dtype=object)[when].tolist(),
        names["ptr"].to_numpy()[when].tolist(),
        names["size_bytes"].to_numpy()[when].tolist(),
    ):
        live.setdefault(key[:2], key[2])
    for device, ptr, size in unnamed or ():
        live.setdefault((device, ptr), size)
    return live


def unseen_frees(dev, ptr, size, has_a, has_f, alloc_ns, free_ns) -> None:
    """End blocks made during the capture whose free the profiler never reported at the
    next allocation that overlaps them: two live blocks never share an address, so the
    first was freed by then. torch's profiler sees the memory events of the threads it
    profiles only, and a block whose last reference goes on another thread (gloo's, which
    finishes a collective and drops the buffers it held) is freed unseen; the CPU allocator
    may then hand out its address, or a part of it. Updates ``has_f`` and ``free_ns``."""
    made = np.flatnonzero(has_a)
    open_ = made[~has_f[made]]
    if not len(open_) or len(made) < 2:
        return
    order = made[np.lexsort((ptr[made], dev[made]))]
    dev_s, ptr_s, end_s = dev[order], ptr[order], ptr[order] + size[order]
    widest = int(size[made].max())
    for i in open_.tolist():
        lo, hi = ptr[i], ptr[i] + size[i]
        a = np.searchsorted(ptr_s, lo - widest, side="left")
        z = np.searchsorted(ptr_s, hi, side="left")
        cand = order[a:z]
        hit = (dev_s[a:z] == dev[i]) & (end_s[a:z] > lo) & (alloc_ns[cand] > alloc_ns[i])
        if hit.any():
            has_f[i] = True
            free_ns[i] = alloc_ns[cand[hit]].min()


def infer_invisible_frees(
    has_alloc: np.ndarray,
    alloc_ns: np.ndarray,
    has_free: np.ndarray,
    free_ns: np.ndarray,
    device: np.ndarray,
    ptr: np.ndarray,
) -> None:
    """Close pre-existing blocks whose address was handed out again during the capture.

    torch's CPU allocator does not report frees of blocks allocated before profiling began
    (it does not know their size). When a new block later starts at the same address on the
    same device, the old one was necessarily freed before: we end it there (``free_ns`` =
    the new allocation's time, no ``free_op_id``). Updates ``has_free`` and ``free_ns``.
    """
    pre_open = ~has_alloc & ~has_free
    if not pre_open.any():
        return
    for dev in np.unique(device[pre_open]):
        later = np.flatnonzero(has_alloc & (device == dev))
        rows = np.flatnonzero(pre_open & (device == dev))
        if not len(later):
            continue
        # the first allocation at each address
        order, first = runs((ptr[later], alloc_ns[later]), by=1)
        at, first_ns = ptr[later][order[first]], alloc_ns[later][order[first]]
        j = np.minimum(np.searchsorted(at, ptr[rows]), len(at) - 1)
        hit = at[j] == ptr[rows]
        has_free[rows[hit]] = True
        free_ns[rows[hit]] = first_ns[j[hit]]  # int64 throughout: no rounding of the times
