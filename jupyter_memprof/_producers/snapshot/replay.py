"""The trace entries replayed into records, a column at a time.

The rules (docs/snapshots.md, "What it reads"), per address of a device, in time order:
``alloc`` opens a block (one still open there is ended first: its free fell out of the
record); ``free_completed`` (or ``free``) ends the open block, or, with none open, is a
block older than the history (a new id, its size the request rounded);
``free_requested`` is remembered until a free of its address: one still pending when the
history ends ends its block then, unless the final state holds the block. Allocation ids
count the allocations and the older blocks in time order.

The pairing is array work: the entries of each address side by side (one stable sort),
each free or allocation looking at the one before it. Only what depends on the layout
of blocks in memory (:class:`.blocks.Layout`) runs an entry at a time: segments, ``oom``
entries, and the entries of the addresses whose blocks the layout holds (large blocks in
plain segments, whose size may be the cached block's; blocks in use before the history;
every block when the trace has an ``oom``, whose largest free block is reported).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..._records import NO_ID, MemoryColumns, SegmentRecord
from .blocks import Layout, Rules, default_rounding
from .columns import (
    ALLOC,
    FREE,
    FREE_COMPLETED,
    FREE_REQUESTED,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    Entries,
)

__all__ = ["Final", "Replayed", "pool_of", "replay"]

#: the size of the caching allocator's small-pool segments
_SMALL_SEGMENT = 2 * 2**20
#: the largest block of the small pool (a larger one's size may depend on the layout)
_SMALL_BLOCK = 2**20
_MIN_BLOCK = 512  # the rounding of a request by default
_SIGN = {SEGMENT_ALLOC: 1, SEGMENT_MAP: 1, SEGMENT_FREE: -1, SEGMENT_UNMAP: -1}


class Final(NamedTuple):
    """The allocator's state when the snapshot was taken."""

    blocks: dict  # (device, address) -> (size, stack index)
    segments: list  # (device, address, size, pool, stream)
    reserved: Counter  # device -> bytes reserved
    allocated: Counter  # device -> bytes of active blocks


class Replayed(NamedTuple):
    """What the replay made: the records (columns), each record's stack and the file's own
    category for it (or None), the recorded segments, the blocks still open at the end
    ``(device, address)``, how many frees had no allocation, the ``oom`` entries."""

    memory: MemoryColumns
    of_memory: np.ndarray
    recorded: list | None
    segments: list[SegmentRecord]
    open: set
    freed_older: int
    ooms: list[dict]


def pool_of(size: int) -> str:
    """The pool of a segment of ``size`` bytes when the file does not say."""
    return "small" if size <= _SMALL_SEGMENT else "large"


class _Pairs(NamedTuple):
    """The allocations and frees (``free_requested`` aside) in time order, each paired
    with the entry before it at its address: ``rows`` (their positions in the entries),
    ``after_alloc`` (the entry before it there is an allocation: the block it ends),
    ``prev`` (that entry's position, else -1), ``last`` (the last entry there). By entry,
    ``kid``: the number of its address (entries of blocks), else -1; by address number,
    ``first``: its first entry (``free_requested`` too) and ``open_at``: the allocation
    still open there at the end, else -1; ``unfreed``: each ``free_requested`` no free of
    its address follows (the last there)."""

    rows: np.ndarray
    after_alloc: np.ndarray
    prev: np.ndarray
    last: np.ndarray
    kid: np.ndarray
    first: np.ndarray
    open_at: np.ndarray
    unfreed: np.ndarray


def _by_address(e: Entries, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` (ascending positions) ordered by device and address, each address's in
    time order, and whether each has the same address as the one before it."""
    o = np.argsort(e.addr[rows], kind="stable")
    dev = e.dev[rows[o]]
    if len(dev) and dev.min() != dev.max():
        o = o[np.argsort(dev, kind="stable")]
    r = rows[o]
    same = np.zeros(len(r), dtype=bool)
    same[1:] = (e.addr[r[1:]] == e.addr[r[:-1]]) & (e.dev[r[1:]] == e.dev[r[:-1]])
    return r, same


def _runs(group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For entries ordered by address number ``group``: whether each has the same number
    as the one before it, and whether it is the last of its number."""
    same = np.zeros(len(group), dtype=bool)
    same[1:] = group[1:] == group[:-1]
    last = np.ones(len(group), dtype=bool)
    last[:-1] = ~same[1:]
    return same, last


def _pairs(e: Entries, is_alloc: np.ndarray, is_free: np.ndarray) -> _Pairs:
    r, same = _by_address(e, np.flatnonzero(e.act <= FREE_REQUESTED))
    first = r[~same]  # by address number
    kid = np.full(len(e), -1, dtype=np.int64)
    kid[r] = np.cumsum(~same) - 1
    frees = r[e.act[r] != ALLOC]  # requests and frees, by address
    _, last = _runs(kid[frees])
    unfreed = frees[last & (e.act[frees] == FREE_REQUESTED)]
    r = r[e.act[r] != FREE_REQUESTED]
    same, last = _runs(kid[r])
    alloc = is_alloc[r]
    after = np.zeros(len(r), dtype=bool)
    after[1:] = same[1:] & alloc[:-1]
    prev = np.full(len(r), -1, dtype=np.int64)
    prev[1:] = np.where(same[1:], r[:-1], -1)
    open_at = np.full(len(first), -1, dtype=np.int64)
    ends = r[last & alloc]
    open_at[kid[ends]] = ends
    rows = np.flatnonzero(is_alloc | is_free)
    at = np.empty(len(e), dtype=np.int64)
    at[r] = np.arange(len(r))
    back = at[rows]  # to time order
    return _Pairs(rows, after[back], prev[back], last[back], kid, first, open_at, unfreed)


class _Sizes:
    """Each distinct request rounded once."""

    def __init__(self, rounding: Callable[[int], int]) -> None:
        self.rounding = rounding

    def __call__(self, req: np.ndarray) -> np.ndarray:
        if not len(req):
            return req.copy()
        if self.rounding is default_rounding:  # 512 bytes: all at once
            return np.maximum(-(-req // _MIN_BLOCK) * _MIN_BLOCK, _MIN_BLOCK)
        u, inv = np.unique(req, return_inverse=True)
        got = np.fromiter(map(self.rounding, u.tolist()), dtype=np.int64, count=len(u))
        return got[inv.ravel()]


def replay(
    e: Entries,
    ops: np.ndarray,
    final: Final,
    rules: Rules,
    every_block: bool,
    name: Callable[[int], str],
    end_ns: int,
) -> Replayed:
    """The entries ``e`` replayed; ``ops[i]``: the innermost annotation open at entry i;
    ``every_block``: every block is placed in the layout (the trace has an ``oom``);
    ``name``: a device index's name; ``end_ns``: when the history ended."""
    act = e.act
    is_alloc = act == ALLOC
    is_free = (act == FREE_COMPLETED) | (act == FREE)
    p = _pairs(e, is_alloc, is_free)
    sizes = _Sizes(rules.rounding)
    size = np.zeros(len(e), dtype=np.int64)
    size[is_alloc] = sizes(e.size[is_alloc])
    orphan = np.zeros(len(e), dtype=bool)
    orphan[p.rows] = is_free[p.rows] & ~p.after_alloc
    size[orphan] = sizes(e.size[orphan])
    seq = _Sequence(e, final, rules, every_block, name)
    seq.run(p, is_alloc, size)
    new = is_alloc | orphan
    aid = np.cumsum(new) - 1
    ends = p.rows[p.after_alloc]  # entries ending the block allocated at prev
    ended = p.prev[p.after_alloc]
    of_end = np.zeros(len(e), dtype=np.int64)
    of_end[ends] = ended
    reserved, at_end = _reserved(e, final, seq.net)
    imp = ends[is_alloc[ends]]  # allocations ending the open block first
    main = p.rows
    sign = np.where(is_alloc[main], 1, -1)
    closes = ~is_alloc[main] & ~orphan[main]
    src = np.where(closes, of_end[main], main)  # the allocation whose block it is
    cols = {
        "time_ns": (e.t[imp], e.t[main]),
        "ptr": (e.addr[imp], e.addr[main]),
        "size": (-size[of_end[imp]], sign * size[src]),
        "allocation_id": (aid[of_end[imp]], aid[src]),
        "device": (e.dev[imp], e.dev[main]),
        "op_id": (ops[imp], ops[main]),
        "total_reserved": (reserved[imp], reserved[main]),
    }
    stack = (np.full(len(imp), NO_ID, np.int64), e.stack[main])
    pending = _pending(e, p, final)
    opened = p.open_at[p.kid[pending]]  # the allocation of each pending block
    fin = {
        "time_ns": np.maximum(e.t[pending], end_ns),
        "ptr": e.addr[pending],
        "size": -size[opened],
        "allocation_id": aid[opened],
        "device": e.dev[pending],
        "op_id": np.full(len(pending), NO_ID, np.int64),
        "total_reserved": at_end[e.dev[pending]] if len(pending) else np.zeros(0, np.int64),
    }
    place = _interleave(main, imp)
    memory = {k: _merged(place, *v, fin[k]) for k, v in cols.items()}
    if not seq.track:
        memory["total_reserved"][:] = NO_ID
    memory["tensor_id"] = np.full(len(memory["time_ns"]), NO_ID, np.int64)
    memory["total_allocated"] = memory["tensor_id"].copy()
    names = [name(d) for d in range(int(e.dev.max(initial=0)) + 1)]
    return Replayed(
        MemoryColumns(names, **memory),
        _merged(place, *stack, e.stack[pending]),
        _recorded(e, place, main, is_alloc, len(imp), len(pending)),
        seq.segments,
        _still_open(e, p, pending),
        int(orphan.sum()),
        seq.ooms,
    )


class _Places(NamedTuple):
    """Where each record goes (see :func:`_interleave`): ``main``, the places of the
    records of the entries; ``ends``, those of the ends just before some of them."""

    main: np.ndarray
    ends: np.ndarray


def _interleave(main: np.ndarray, imp: np.ndarray) -> _Places:
    """Where each record goes: the records of the entries ``main`` (ascending) with, just
    before those of ``imp`` (a subset), the end of the block open at its address."""
    before = np.zeros(len(main), dtype=np.int64)
    at = np.searchsorted(main, imp)
    before[at] = 1
    place = np.arange(len(main)) + np.cumsum(before)
    return _Places(place, place[at] - 1)


def _merged(place: _Places, imp: np.ndarray, main: np.ndarray, fin: np.ndarray):
    """One column: the records of the entries, the ends before some of them, then the
    ends at the history's end."""
    out = np.empty(len(main) + len(imp) + len(fin), dtype=np.int64)
    out[place.main] = main
    out[place.ends] = imp
    out[len(main) + len(imp) :] = fin
    return out


def _recorded(e, place, main, is_alloc, n_imp, n_fin) -> list | None:
    """By record: the category the file gives the block an allocation makes, else None;
    None when there is none."""
    if e.cat is None:
        return None
    out: list = [None] * (len(main) + n_imp + n_fin)
    for at, row in zip(place.main[is_alloc[main]].tolist(), main[is_alloc[main]].tolist()):
        out[at] = e.cat[row]
    return out if any(out) else None


def _pending(e: Entries, p: _Pairs, final: Final) -> np.ndarray:
    """The ``free_requested`` entries whose free the history did not record, of blocks
    still open at its end and not in the final state, in the file's order: their block
    ends when the history does (its stream work was pending until then)."""
    pending = p.unfreed[p.open_at[p.kid[p.unfreed]] >= 0]
    blocks = final.blocks
    keep = [(d, a) not in blocks for d, a in zip(e.dev[pending].tolist(), e.addr[pending].tolist())]
    out = pending[np.asarray(keep, dtype=bool)] if keep else pending
    return out[np.argsort(e.order[out], kind="stable")]


def _still_open(e: Entries, p: _Pairs, pending: np.ndarray) -> set:
    """``(device, address)`` of the blocks open when the replay ends (those ended by a
    pending free aside)."""
    at = p.open_at.copy()
    at[p.kid[pending]] = -1
    ends = at[at >= 0]
    return set(zip(e.dev[ends].tolist(), e.addr[ends].tolist()))


def _reserved(e: Entries, final: Final, net: Counter) -> tuple[np.ndarray, np.ndarray]:
    """The reserved total of each entry's device at each entry (as recorded: the final
    state's, counted back by the segments the history changed), and at the end, by
    device index."""
    ndev = int(max(e.dev.max(initial=0), *final.reserved, *net, 0)) + 1
    start = np.zeros(ndev, dtype=np.int64)
    if final.segments:  # counted back from the end
        for d in set(net) | set(final.reserved):
            start[d] = final.reserved[d] - net[d]
    delta = np.zeros(len(e), dtype=np.int64)
    for code, sign in _SIGN.items():
        on = e.act == code
        delta[on] = sign * e.size[on]
    out = start[e.dev]
    at_end = start.copy()
    for d in np.unique(e.dev[delta != 0]).tolist():
        mine = e.dev == d
        run = start[d] + np.cumsum(np.where(mine, delta, 0))
        out[mine] = run[mine]
        at_end[d] = run[-1]
    return out, at_end


class _Sequence:
    """What must run an entry at a time: the layout of blocks in memory (the sizes of the
    blocks it places), segments and ``oom`` entries."""

    def __init__(self, e: Entries, final: Final, rules: Rules, every_block: bool, name) -> None:
        self.e, self.final, self.name = e, final, name
        self.layout = Layout(rules, every_block=every_block)
        self.reserved: Counter = Counter()
        self.net: Counter = Counter()
        self.segments: list[SegmentRecord] = []
        self.ooms: list[dict] = []
        segs = np.isin(e.act, list(_SIGN))
        for d, s, a in zip(e.dev[segs].tolist(), e.size[segs].tolist(), e.act[segs].tolist()):
            self.net[d] += _SIGN[a] * s
        self.track = segs.any() or bool(final.segments)
        if final.segments:
            self.reserved = Counter(
                {d: final.reserved[d] - self.net[d] for d in set(self.net) | set(final.reserved)}
            )
        self.segment_rows = np.flatnonzero(segs)

    def run(self, p: _Pairs, is_alloc: np.ndarray, size: np.ndarray) -> None:
        """The layout before the history, then every entry it depends on, in time order:
        sets ``size`` of the blocks it places."""
        e, layout = self.e, self.layout
        relevant = self._at_start(p)  # by address number: the layout holds its blocks
        large = None if layout.rules.expandable else _SMALL_BLOCK
        placed = is_alloc & (layout.every_block | ((large is not None) & (size > (large or 0))))
        relevant[p.kid[placed]] = True
        rows = p.rows if layout.every_block else p.rows[relevant[p.kid[p.rows]]]
        rows = np.union1d(rows, np.concatenate([self.segment_rows, np.flatnonzero(e.act == OOM)]))
        opened: set = set()
        cols = (e.act[rows], e.dev[rows], e.addr[rows], e.size[rows], placed[rows])
        for i, a, dev, addr, req, place in zip(rows.tolist(), *(c.tolist() for c in cols)):
            if a == ALLOC:
                if (dev, addr) in opened:  # the open block ends here
                    layout.remove(dev, addr)
                opened.add((dev, addr))
                if place:
                    size[i] = layout.place(dev, addr, req)
            elif a == FREE_COMPLETED or a == FREE:
                opened.discard((dev, addr))
                layout.remove(dev, addr)
            else:
                self.rare(i)

    def _at_start(self, p: _Pairs) -> np.ndarray:
        """Segments and blocks in use before the first entry: the final state's segments
        the history did not allocate, its blocks the history does not name, and blocks
        the history frees before allocating them (by address number: these)."""
        e, layout = self.e, self.layout
        s = self.segment_rows
        made = set(zip(e.dev[s].tolist(), e.addr[s].tolist()))
        for dev, addr, size, _, _ in self.final.segments:
            if (dev, addr) not in made:
                layout.add_segment(dev, addr, size)
        seen = set(zip(e.dev[p.first].tolist(), e.addr[p.first].tolist()))
        for key, (size, _) in self.final.blocks.items():
            if key not in seen:
                layout.occupy(*key, size)
        first = np.sort(p.first[e.act[p.first] != ALLOC])
        touched = np.zeros(len(p.first), dtype=bool)
        touched[p.kid[first]] = True
        cols = (e.dev[first].tolist(), e.addr[first].tolist(), e.size[first].tolist())
        for dev, addr, req in zip(*cols):
            layout.occupy(dev, addr, layout.rules.rounding(req))  # in use already
        return touched

    def rare(self, i: int) -> None:
        """A segment or an ``oom`` entry."""
        e = self.e
        action, dev, addr, size = int(e.act[i]), int(e.dev[i]), int(e.addr[i]), int(e.size[i])
        t, stream = int(e.t[i]), int(e.stream[i])
        if action in _SIGN:
            sign = _SIGN[action]
            self.reserved[dev] += sign * size
            if sign > 0:
                self.layout.add_segment(dev, addr, size)
            else:
                self.layout.drop_segment(dev, addr, size)
            pool = next(
                (q for d, a, _, q, _ in self.final.segments if d == dev and a == addr),
                pool_of(size),
            )
            self.segments.append(SegmentRecord(t, self.name(dev), addr, sign * size, pool, stream))
        elif action == OOM:
            self.ooms.append(
                {
                    "device": self.name(dev),
                    "time_ns": t,
                    "size": size,
                    "device_free": addr,
                    "stream": stream,
                    # the allocator then, as the trace records it: the fragmentation
                    "allocated_bytes": self.layout.allocated.get(dev, 0),
                    "reserved_bytes": self.reserved[dev],
                    "largest_free_bytes": self.layout.largest_free(dev),
                }
            )
