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

__all__ = ["Rows", "entries"]

#: as in :mod:`.read`: the largest int an address, size or stream may be; a time in µs
#: below 2**53 (its ns fit in int64)
_INT64 = 2**62
_TIME_US = 2**53
_FIELDS = ("addr", "size", "stream")


def _ints(values: list, high: int) -> np.ndarray | None:
    """``values`` as int64 when every one is an int in ``[0, high)``, else None."""
    if set(map(type, values)) - {int}:
        return None
    try:
        a = np.array(values, dtype=np.int64)
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
    times = _ints(list(map(dict.get, trace, repeat("time_us"))), _TIME_US)
    if times is None:  # none recorded, or not all ints: entry by entry
        return None
    ints = [_ints(list(map(dict.get, trace, repeat(k), repeat(0))), _INT64) for k in _FIELDS]
    if any(a is None for a in ints):
        return None
    frames = list(map(dict.get, trace, repeat("frames")))
    ids = list(map(id, frames))
    for f in dict(zip(ids, frames)).values():  # each shared list once
        stacks.index(f)  # a list that is not frames raises its Bad here
    del frames
    index = dict(stacks.by_id)
    index[id(None)] = NO_ID
    stack = list(map(index.__getitem__, ids))
    del ids
    cats = list(map(dict.get, trace, repeat("category")))
    if set(map(type, cats)) - {type(None)}:
        cats = [c if type(c) is str and len(c) <= 64 else None for c in cats]
    return times * 1000, actions, *ints, stack, cats


def entries(snap: dict, stacks: StackReader, wanted, consume: bool = False):
    """``(rows, timed, actions)`` as :func:`.read._entries` makes them, or None where an
    entry is not plain (the caller then reads entry by entry). With ``consume`` (the
    snapshot is the reader's own, read from a file), every trace is emptied once all are
    read, so their entries are freed before the rows are made."""
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
    if consume:
        for trace in traces:
            trace.clear()
    n = sum(len(c[1]) for _, c in cols)
    t = np.concatenate([c[0] for _, c in cols]) if cols else np.zeros(0, np.int64)
    devs = list(chain.from_iterable(repeat(d, len(c[1])) for d, c in cols))
    fields = [_joined(cols, k) for k in range(1, 7)]
    del cols
    actions = Counter(fields[0])
    columns: list = [t.tolist(), range(n), devs, *fields]
    del fields, devs
    if n > 1 and not bool((t[1:] >= t[:-1]).all()):
        order = np.argsort(t, kind="stable").tolist()  # by time, then by the order in the file
        for k, col in enumerate(columns):
            columns[k] = list(map(col.__getitem__, order))
    return Rows(columns), True, actions


def _joined(cols: list, k: int) -> list:
    """Field ``k`` of every device's columns, as one list."""
    parts = [c[k] for _, c in cols]
    if parts and isinstance(parts[0], np.ndarray):
        return np.concatenate(parts).tolist()
    return list(chain.from_iterable(parts))


class Rows:
    """Trace entries as columns (the fields :data:`.read.T` to :data:`.read.CAT`, a list
    each), read as tuples: iterating makes one tuple at a time, so the entries are never all
    tuples at once (a million tuples of nine fields are about 200 MB)."""

    __slots__ = ("columns",)

    def __init__(self, columns: list) -> None:
        self.columns = columns

    @classmethod
    def of(cls, tuples: list[tuple], width: int = 9) -> Rows:
        """The rows ``tuples`` (each of ``width`` fields) as columns."""
        return cls([list(c) for c in zip(*tuples)] if tuples else [[] for _ in range(width)])

    def __len__(self) -> int:
        return len(self.columns[0])

    def __iter__(self):
        return zip(*self.columns)

    def __reversed__(self):
        return zip(*(reversed(c) for c in self.columns))

    def __getitem__(self, i: int) -> tuple:
        return tuple(c[i] for c in self.columns)

    def column(self, k: int) -> list:
        """Field ``k`` of every row."""
        return self.columns[k]


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
        for tag in TAGS:
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
    return {tag: counts for tag, counts in out.items() if counts}
