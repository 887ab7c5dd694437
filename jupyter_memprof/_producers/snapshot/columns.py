"""A snapshot's trace entries read a field at a time (fast path).

Reading an entry at a time costs about 3 µs of Python per entry (its dict looked up field
by field, each value checked). Here each field of a trace is one list made by ``map`` over
the entries (no Python code per entry), checked at once (the set of its types, then its
range in numpy), and the entries are time ordered by one stable ``argsort``. Where any
entry is not plain (a time that is not an int, an address that is not an int, a value out
of range, an ``oom`` entry, whose address is its ``device_free``), :func:`entries` returns
None and the reader goes entry by entry, which says what is wrong or reads the rare case.
"""

from __future__ import annotations

from collections import Counter
from itertools import chain, repeat

import numpy as np

from ..._records import NO_ID
from .frames import StackReader

__all__ = ["ACTIONS", "Entries", "entries"]

#: as in :mod:`.read`: the largest int an address, size or stream may be; a time in µs
#: below 2**53 (its ns fit in int64)
_INT64 = 2**62
_TIME_US = 2**53
_FIELDS = ("addr", "size", "stream")

#: The actions the replay tells apart, by code (:attr:`Entries.act`): any other action an
#: entry names gets a code after these (:attr:`Entries.names`), counted and not replayed.
ACTIONS = (
    "alloc", "free_completed", "free", "free_requested",
    "segment_alloc", "segment_map", "segment_free", "segment_unmap", "oom",
)  # fmt: skip
ALLOC, FREE_COMPLETED, FREE, FREE_REQUESTED = range(4)
SEGMENT_ALLOC, SEGMENT_MAP, SEGMENT_FREE, SEGMENT_UNMAP, OOM = range(4, 9)


class Entries:
    """Trace entries as columns, in time order (then in the file's order): one int64 array
    per field (``t``: the time in ns, or the entry's position where no time was recorded;
    ``order``: its position in the file; ``dev``; ``act``, the action's code, ``names[act]``
    its name; ``addr``; ``size``; ``stream``; ``stack``: the index of its frames in the
    :class:`.frames.StackReader`, or NO_ID) and ``cat``: the category the file itself
    gives each entry (a list), or None when no entry has one."""

    __slots__ = ("t", "order", "dev", "act", "names", "addr", "size", "stream", "stack", "cat")

    def __init__(self, t, order, dev, act, names, addr, size, stream, stack, cat) -> None:
        self.t, self.order, self.dev, self.act = t, order, dev, act
        self.names, self.addr, self.size, self.stream = names, addr, size, stream
        self.stack, self.cat = stack, cat

    @classmethod
    def of(cls, rows: list[tuple]) -> Entries:
        """The entries ``rows``, tuples ``(t, order, dev, action, addr, size, stream, stack,
        category)`` already in order (the entry-by-entry reader's)."""
        cols = [list(c) for c in zip(*rows)] if rows else [[] for _ in range(9)]
        codes, names = _codes(cols[3])
        ints = [np.array(cols[k], dtype=np.int64) for k in (0, 1, 2, 4, 5, 6, 7)]
        t, order, dev, addr, size, stream, stack = ints
        cat = cols[8] if any(c is not None for c in cols[8]) else None
        return cls(t, order, dev, codes, names, addr, size, stream, stack, cat)

    def __len__(self) -> int:
        return len(self.t)

    def __iter__(self):
        """The entries as tuples ``(t, order, dev, action, addr, size, stream, stack,
        category)``, one at a time."""
        names = [self.names[a] for a in self.act.tolist()]
        cat = self.cat if self.cat is not None else repeat(None, len(self))
        ints = (c.tolist() for c in (self.addr, self.size, self.stream, self.stack))
        return zip(self.t.tolist(), self.order.tolist(), self.dev.tolist(), names, *ints, cat)

    def counts(self) -> Counter:
        """How many entries of each action."""
        n = np.bincount(self.act, minlength=len(self.names)).tolist()
        return Counter({name: c for name, c in zip(self.names, n) if c})

    def reordered(self, order: np.ndarray) -> Entries:
        """The entries at ``order`` (positions), in that order."""
        cat = None if self.cat is None else list(map(self.cat.__getitem__, order.tolist()))
        cols = (self.t, self.order, self.dev, self.act)
        t, o, dev, act = (c[order] for c in cols)
        addr, size, stream, stack = (
            c[order] for c in (self.addr, self.size, self.stream, self.stack)
        )
        return Entries(t, o, dev, act, self.names, addr, size, stream, stack, cat)


def _codes(actions: list) -> tuple[np.ndarray, list[str]]:
    """Each action's code (:data:`ACTIONS` first, then the others in the order met)."""
    code = {a: i for i, a in enumerate(ACTIONS)}
    for a in dict.fromkeys(actions):
        code.setdefault(a, len(code))
    codes = np.fromiter(map(code.__getitem__, actions), dtype=np.int64, count=len(actions))
    return codes, list(code)


class _Absent:
    """A field an entry does not hold (an address, a size, a stream: read as 0)."""


_ABSENT = _Absent()


def _ints(values: list, high: int, kinds: set | None = None) -> np.ndarray | None:
    """``values`` as int64 when every one is an int in ``[0, high)``, else None; ``kinds``:
    their types, where known (:data:`_ABSENT` is read as 0)."""
    kinds = set(map(type, values)) if kinds is None else kinds
    if _Absent in kinds:
        values = [0 if v is _ABSENT else v for v in values]
        kinds = kinds - {_Absent}
    if kinds - {int}:
        return None
    try:  # ints only (checked above: fromiter would take floats, bools and text too)
        a = np.fromiter(values, dtype=np.int64, count=len(values))
    except OverflowError:
        return None
    if a.size and (a.min() < 0 or a.max() >= high):
        return None
    return a


def _trace(trace: object, stacks: StackReader):
    """One device's entries as columns ``(times_ns, actions, addr, size, stream, stack,
    category)``, or None where they are not all plain."""
    if type(trace) is not list or set(map(type, trace)) - {dict}:
        return None
    actions = list(map(dict.get, trace, repeat("action")))
    kinds = set(actions)
    if set(map(type, kinds)) - {str} or "oom" in kinds:
        return None
    times = list(map(dict.get, trace, repeat("time_us")))
    kinds = set(map(type, times))
    times = None if type(None) in kinds else _ints(times, _TIME_US, kinds)
    if times is None:  # none recorded, or not all ints: entry by entry
        return None
    got = [list(map(dict.get, trace, repeat(k), repeat(_ABSENT))) for k in _FIELDS]
    kinds = [set(map(type, v)) for v in got]
    ints = [_ints(v, _INT64, k) for v, k in zip(got, kinds)]
    del got
    if any(a is None for a in ints):
        return None
    frames = list(map(dict.get, trace, repeat("frames")))
    ids = list(map(id, frames))
    shared = dict(zip(ids, frames))
    for f in shared.values():  # each shared list once
        stacks.index(f)  # a list that is not frames raises its Bad here
    del frames
    # each entry has the six fields torch always writes (action, time_us, addr, size,
    # stream, frames) and no other: none has a category or a tag
    six = id(None) not in shared and all(_Absent not in k for k in kinds)
    extra = not (six and max(map(len, trace), default=0) <= 6)
    index = dict(stacks.by_id)
    index[id(None)] = NO_ID
    stack = np.fromiter(map(index.__getitem__, ids), dtype=np.int64, count=len(ids))
    del ids
    cats = None
    if extra and any(map(dict.__contains__, trace, repeat("category"))):
        cats = list(map(dict.get, trace, repeat("category")))
        cats = [c if type(c) is str and len(c) <= 64 else None for c in cats]
    return times * 1000, actions, *ints, stack, cats, extra


def entries(snap: dict, stacks: StackReader, wanted, consume: bool = False):
    """``(entries, timed, actions, tags)`` as :func:`.read._entries` makes them (``tags``:
    as :func:`tags` counts them), or None where an entry is not plain (the caller then
    reads entry by entry). With ``consume`` (the snapshot is the reader's own, read from a
    file), every trace is emptied once all are read, so their entries are freed before the
    columns are joined."""
    traces = snap.get("device_traces", [])
    if type(traces) is not list:
        return None
    cols: list = []
    for dev, trace in enumerate(traces):
        if type(trace) is not list:
            return None
        if not wanted(dev):
            continue
        c = _trace(trace, stacks)
        if c is None:
            return None
        cols.append((dev, c))
    found: dict = {}
    for (_, c), trace in zip(cols, (t for d, t in enumerate(traces) if wanted(d))):
        if c[-1]:  # an entry may hold a tag
            count_tags(trace, found)
    if consume:
        for trace in traces:
            trace.clear()
    got = _joined(cols)
    del cols
    t = got.t
    if len(t) > 1 and not bool((t[1:] >= t[:-1]).all()):
        got = got.reordered(np.argsort(t, kind="stable"))  # by time, then the file's order
    return got, True, got.counts(), {tag: counts for tag, counts in found.items() if counts}


def _joined(cols: list) -> Entries:
    """Every device's columns as one :class:`Entries`, in the file's order."""
    n = sum(len(c[1]) for _, c in cols)

    def ints(k: int) -> np.ndarray:
        return np.concatenate([c[k] for _, c in cols]) if cols else np.zeros(0, np.int64)

    dev = np.concatenate([np.full(len(c[1]), d, np.int64) for d, c in cols] or [ints(0)])
    codes, names = _codes(list(chain.from_iterable(c[1] for _, c in cols)))
    cats = [c[6] for _, c in cols]
    cat = None
    if any(c is not None for c in cats):
        cat = list(chain.from_iterable(c if c is not None else repeat(None, len(x[1]))
                                       for c, (_, x) in zip(cats, cols)))  # fmt: skip
    order = np.arange(n, dtype=np.int64)
    return Entries(ints(0), order, dev, codes, names, ints(2), ints(3), ints(4), ints(5), cat)


#: The text tags torch may record on each trace entry: ``compile_context`` (the
#: ``torch.compile`` frame and graph an allocation came from) and ``user_metadata`` (what the
#: user set with ``torch.cuda.memory._set_memory_metadata``).
TAGS = ("compile_context", "user_metadata")
#: At most this many distinct values of a tag are named (the rest are counted as ``(other)``),
#: each cut to this many characters.
_MOST_TAGS, _TAG_CHARS = 64, 200


def tags(snap: dict, wanted) -> dict:
    """The ``alloc`` entries per value of each tag recorded: ``{tag: {value: {"allocs": n,
    "requested_bytes": b}}}``, only tags with a non-empty text value; entries that are not
    plain are left to the reader, which says what is wrong with them."""
    out: dict = {}
    traces = snap.get("device_traces", [])
    if type(traces) is not list:
        return out
    for dev, trace in enumerate(traces):
        if type(trace) is not list or not wanted(dev) or set(map(type, trace)) - {dict}:
            continue
        count_tags(trace, out)
    return {tag: counts for tag, counts in out.items() if counts}


def count_tags(trace: list[dict], out: dict) -> None:
    """Add the ``alloc`` entries of ``trace`` (dicts) per value of each tag to ``out``."""
    for tag in TAGS:
        if not any(map(dict.__contains__, trace, repeat(tag))):
            continue
        values = list(map(dict.get, trace, repeat(tag)))
        if not set(values) - {None, ""}:
            continue
        counts = out.setdefault(tag, {})
        for e, v in zip(trace, values):
            if type(v) is not str or not v or e.get("action") != "alloc":
                continue
            v = v[:_TAG_CHARS]
            if v not in counts and len(counts) >= _MOST_TAGS:
                v = "(other)"
            c = counts.setdefault(v, {"allocs": 0, "requested_bytes": 0})
            size = e.get("size", 0)
            c["allocs"] += 1
            c["requested_bytes"] += size if type(size) is int and 0 <= size < _INT64 else 0
