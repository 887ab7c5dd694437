"""A snapshot dict checked and read into a Capture.

The dict is what ``torch.cuda.memory._snapshot()`` returns; it is checked and read into a
:class:`~jupyter_memprof._records.Capture`.

What it holds (docs/snapshots.md has the format): ``device_traces[i]`` is ``cuda:i``'s ring
buffer of allocator events, each with ``action``, ``addr``, ``size``, ``stream``,
``time_us`` (since late 2023) and ``frames``; ``segments`` is the allocator's state when the
snapshot was taken, each segment with its blocks; ``external_annotations`` are
``record_function`` ranges; ``allocator_settings`` the allocator's configuration.

The records made of it:

- ``alloc`` starts a block, its ``free_completed`` ends it (``free_requested`` alone, when
  the history ends before the block's stream work did); a free with no allocation is a
  block older than the history (the ring buffer wrapped, or recording started late);
- blocks alive in the final ``segments`` that the history never allocated are
  :class:`~jupyter_memprof._records.OlderBlock`\\ s: alive throughout;
- ``segment_alloc`` / ``segment_free`` / ``segment_map`` / ``segment_unmap`` are
  :class:`~jupyter_memprof._records.SegmentRecord`\\ s, and the reserved total after every
  event (counted back from the final segments) is each memory record's ``total_reserved``;
- annotations become ops of kind ``annotation`` (``Optimizer.step#...`` ones of kind
  ``optimizer``): the only ops a snapshot has. Tensor ids, versions and an op tree with
  shapes a snapshot does not record: none are invented.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np

from ..._devices import device_sort_key
from ..._records import (
    NO_ID,
    Capture,
    MemoryRecord,
    OlderBlock,
    OpRecord,
    SegmentRecord,
    StackContext,
    Stacks,
    Trace,
)
from ..._vocab import OpKind
from . import columns
from .blocks import Layout, Rules
from .frames import Bad, StackReader

__all__ = ["Bad", "Read", "read_snapshot"]

#: The largest int a snapshot may hold for an address, a size, a stream or a time (in ns):
#: sums and roundings of them stay in int64.
_INT64 = 2**62
_FREES = ("free_completed", "free_requested", "free")
_BLOCK_ACTIONS = frozenset(("alloc", *_FREES))
_SEGMENT_ACTIONS = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
#: the size of the caching allocator's small-pool segments
_SMALL_SEGMENT = 2 * 2**20
#: the largest block of the small pool (a larger one's size may depend on the layout)
_SMALL_BLOCK = 2**20


class Read(NamedTuple):
    """The records of a snapshot and what it says beyond them (for ``meta``)."""

    capture: Capture
    meta: dict


def _int(v: object, what: str, *, low: int = 0) -> int:
    if type(v) is not int:
        raise Bad(f"{what} must be an int, not {type(v).__name__}")
    if not low <= v < _INT64:
        raise Bad(
            f"{what} out of range ({v:.3g})" if abs(v) > 2**70 else f"{what} out of range ({v})"
        )
    return v


def _num(v: object, what: str) -> float:
    if type(v) not in (int, float) or v != v or abs(v) > 2**62:
        raise Bad(f"{what} must be a finite number, not {type(v).__name__}")
    return v


def _list(v: object, what: str) -> list:
    if not isinstance(v, (list, tuple)):
        raise Bad(f"{what} must be a list, not {type(v).__name__}")
    return v


def _dict(v: object, what: str) -> dict:
    if not isinstance(v, dict):
        raise Bad(f"{what} must be a dict, not {type(v).__name__}")
    return v


def _str(v: object, what: str) -> str:
    if not isinstance(v, str):
        raise Bad(f"{what} must be text, not {type(v).__name__}")
    return v


#: The fields of a trace entry as read (plain tuples: a million of them are made): sorting
#: the tuples sorts by time, then by the order in the file.
T, ORDER, DEV, ACTION, ADDR, SIZE, STREAM, STACK, CAT = range(9)
_new_record = partial(tuple.__new__, MemoryRecord)  # a MemoryRecord without its __new__


def _ok(v: object) -> bool:
    return type(v) is int and 0 <= v < _INT64


def _entries(
    snap: dict, stacks: StackReader, wanted, consume: bool = False
) -> tuple[columns.Rows, bool, Counter]:
    """Every trace entry of the wanted devices (as tuples, fields :data:`T` ...), time
    ordered; whether times were recorded (else the entry order is the clock); how many of
    each action. Read a field at a time (:func:`.columns.entries`) where every entry is
    plain (int times, sizes and addresses, no ``oom``), else entry by entry."""
    fast = columns.entries(snap, stacks, wanted, consume)
    if fast is not None:
        return fast
    return _entries_one_by_one(snap, stacks, wanted)


def _entries_one_by_one(snap: dict, stacks: StackReader, wanted):
    """:func:`_entries`, an entry at a time: every check, each with its own message."""
    traces = _list(snap.get("device_traces", []), "device_traces")
    rows: list = []
    append = rows.append
    timed = True
    actions: Counter = Counter()
    order = 0
    by_id, index = stacks.by_id, stacks.index
    for dev, trace in enumerate(traces):
        trace = _list(trace, f"device_traces[{dev}]")
        if not wanted(dev):
            continue
        for e in trace:
            if type(e) is not dict:
                _dict(e, "a trace entry")
            action = e.get("action")
            if type(action) is not str:
                _str(action, "an entry's action")
            t = e.get("time_us")
            if type(t) is int and 0 <= t < 2**53:
                t_ns = t * 1000
            elif t is None:
                timed, t_ns = False, order
            else:
                t_ns = int(_num(t, "time_us") * 1000)
                if not -_INT64 < t_ns < _INT64:
                    raise Bad(f"time_us out of range ({t!r:.40})")
            addr = e.get("device_free" if action == "oom" else "addr", 0)
            addr = 0 if addr is None else addr
            size, stream = e.get("size", 0), e.get("stream", 0)
            if not (_ok(addr) and _ok(size) and _ok(stream)):
                _int(addr, f"{action} address"), _int(size, f"{action} size")
                _int(stream, "stream")
            frames = e.get("frames")
            stack = by_id.get(id(frames))
            if stack is None:
                stack = index(frames)
            cat = e.get("category")  # torch's profile_plot and our to_snapshot write one
            if type(cat) is not str or len(cat) > 64:
                cat = None
            append((t_ns, order, dev, action, addr, size, stream, stack, cat))
            order += 1
    actions.update(r[ACTION] for r in rows)
    if not timed:
        rows = [(r[ORDER], *r[1:]) for r in rows]
    rows.sort()
    return columns.Rows.of(rows), timed, actions


class _Final(NamedTuple):
    """The allocator's state when the snapshot was taken."""

    blocks: dict  # (device, address) -> (size, stack index)
    segments: list  # (device, address, size, pool, stream)
    reserved: Counter  # device -> bytes reserved
    allocated: Counter  # device -> bytes of active blocks


def _final_state(snap: dict, stacks: StackReader, wanted) -> _Final:
    blocks: dict = {}
    segs: list = []
    reserved: Counter = Counter()
    allocated: Counter = Counter()
    seen: set = set()
    for s in _list(snap.get("segments", []), "segments"):
        s = _dict(s, "a segment")
        dev = _int(s.get("device", 0), "a segment's device")
        if not wanted(dev):
            continue
        addr = _int(s.get("address", 0), "a segment's address")
        total = _int(s.get("total_size", 0), "a segment's total_size")
        kind = s.get("segment_type")
        pool = kind if kind in ("small", "large") else _pool(total)
        segs.append((dev, addr, total, pool, _int(s.get("stream", 0), "stream")))
        reserved[dev] += total
        bl = s.get("blocks", [])
        if id(bl) in seen:  # a shared list of blocks is one segment's, read once
            continue
        seen.add(id(bl))
        at = addr
        for b in _list(bl, "a segment's blocks"):
            b = _dict(b, "a block")
            size = _int(b.get("size", 0), "a block's size")
            state = b.get("state")
            baddr = b.get("address", at)
            baddr = _int(baddr, "a block's address") if baddr is not None else at
            if state in ("active_allocated", "active_pending_free"):
                blocks[(dev, baddr)] = (size, stacks.index(_block_frames(b)))
                allocated[dev] += size
            at = baddr + size
    return _Final(blocks, segs, reserved, allocated)


def _pool(size: int) -> str:
    return "small" if size <= _SMALL_SEGMENT else "large"


def _block_frames(b: dict) -> object:
    """A block's frames: its own, else (old snapshots) its last ``history`` entry's."""
    frames = b.get("frames")
    if frames:
        return frames
    history = _list(b.get("history") or [], "a block's history")
    for h in history:
        _int(_dict(h, "a history entry").get("real_size", 0), "a history entry's real_size")
    return _dict(history[-1], "a history entry").get("frames") if history else None


class _Replay:
    """The trace replayed in time order into records."""

    def __init__(
        self, final: _Final, rules: Rules, every_block: bool, name: Callable[[int], str]
    ) -> None:
        self.name = name  # a device index -> its name
        self.layout = Layout(rules, every_block=every_block)
        self.sizes: dict = {}  # (device, address) -> the open block's bytes
        self.memory: list[MemoryRecord] = []
        self.of_memory: list[int] = []
        self.recorded: list[str | None] = []  # by memory record: the file's own category
        self.segments: list[SegmentRecord] = []
        self.open: dict = {}  # (device, address) -> allocation id
        self.next_id = 0
        self.freed_older = 0
        self.ooms: list[dict] = []
        self.pending: dict = {}  # (device, address) -> its free_requested entry
        self.final = final
        self.reserved: Counter = Counter()
        self.track_reserved = False

    def run(self, rows: columns.Rows, ops: list[int], actions: Counter | None = None) -> None:
        """Replay ``rows``; ``ops[i]``: the innermost annotation open at row i's time;
        ``actions``: how many of each action the rows hold, where known."""
        segmented = actions is None or any(a in actions for a in _SEGMENT_ACTIONS)
        acts = rows.column(ACTION)  # the one column looked at: no row made for the others
        segment_rows = (
            [rows[i] for i, a in enumerate(acts) if a in _SEGMENT_ACTIONS] if segmented else []
        )
        # the reserved total before the history: the end's minus what the history changed
        net: Counter = Counter()
        for r in segment_rows:
            net[r[DEV]] += _SEGMENT_ACTIONS[r[ACTION]] * r[SIZE]
        self.track_reserved = bool(net) or bool(self.final.segments)
        if self.final.segments:  # counted back from the end
            self.reserved = Counter(
                {d: self.final.reserved[d] - net[d] for d in set(net) | set(self.final.reserved)}
            )
        self._layout_at_start(rows, segment_rows)
        names = [self.name(d) for d in range(max(rows.column(DEV), default=0) + 1)]
        self._loop(rows, ops, names)

    def _loop(self, rows: columns.Rows, ops: list[int], names: list[str]) -> None:
        """The replay proper: a block's size from its request (each distinct request
        rounded once; the layout asked only where a block's size depends on it)."""
        open_, sizes, pending, reserved = self.open, self.sizes, self.pending, self.reserved
        layout = self.layout
        place, release, placed = layout.place, layout.release, layout.size
        rounding = layout.rules.rounding
        ask = layout.every_block  # else only large blocks in plain segments are placed
        large = None if layout.rules.expandable else _SMALL_BLOCK
        rounded: dict = {}
        memory, of_memory = self.memory.append, self.of_memory.append
        recorded = self.recorded.append
        track = self.track_reserved
        new = _new_record
        for r, op in zip(rows, ops):
            t, _, dev, action, addr, req, _, stack, cat = r
            key = (dev, addr)
            if action == "alloc":
                if key in open_:  # its free fell out of the record: end it here
                    self._free(r, key, op, NO_ID)
                aid = open_[key] = self.next_id
                self.next_id += 1
                size = rounded.get(req)
                if size is None:
                    size = rounded[req] = rounding(req)
                if ask or (large is not None and size > large):
                    size = place(dev, addr, req)
                sizes[key] = size
                total = reserved[dev] if track else NO_ID
                memory(new((t, addr, size, NO_ID, aid, names[dev], op, NO_ID, total)))
                of_memory(stack)
                recorded(cat)
            elif (action == "free_completed" or action == "free") and key in open_:
                pending.pop(key, None)
                aid, size = open_.pop(key), sizes.pop(key)
                if key in placed:
                    release(dev, addr)
                total = reserved[dev] if track else NO_ID
                memory(new((t, addr, -size, NO_ID, aid, names[dev], op, NO_ID, total)))
                of_memory(stack)
                recorded(None)
            elif action == "free_completed" or action == "free":
                pending.pop(key, None)
                self._free(r, key, op, stack)
            elif action == "free_requested":
                pending[key] = r
            else:
                self.rare(r)

    def rare(self, r: tuple) -> None:
        """Segments and ``oom`` entries (the rest are counted, not replayed)."""
        action, dev = r[ACTION], r[DEV]
        if action in _SEGMENT_ACTIONS:
            sign = _SEGMENT_ACTIONS[action]
            self.reserved[dev] += sign * r[SIZE]
            if sign > 0:
                self.layout.add_segment(dev, r[ADDR], r[SIZE])
            else:
                self.layout.drop_segment(dev, r[ADDR], r[SIZE])
            pool = self._segment_pool(r)
            self.segments.append(
                SegmentRecord(r[T], self.name(dev), r[ADDR], sign * r[SIZE], pool, r[STREAM])
            )
        elif action == "oom":
            self.ooms.append(
                {
                    "device": self.name(dev),
                    "time_ns": r[T],
                    "size": r[SIZE],
                    "device_free": r[ADDR],
                    "stream": r[STREAM],
                    # the allocator then, as the trace records it: the fragmentation
                    "allocated_bytes": self.layout.allocated.get(dev, 0),
                    "reserved_bytes": self.reserved[dev],
                    "largest_free_bytes": self.layout.largest_free(dev),
                }
            )

    def _layout_at_start(self, rows: columns.Rows, segment_rows: list[tuple]) -> None:
        """Segments and blocks in use before the first entry: the final state's segments
        the history did not allocate, its blocks the history did not allocate, and blocks
        the history frees before allocating them."""
        made = {(r[DEV], r[ADDR]) for r in segment_rows}
        for dev, addr, size, _, _ in self.final.segments:
            if (dev, addr) not in made:
                self.layout.add_segment(dev, addr, size)
        blocks = _BLOCK_ACTIONS  # the first entry of each address (the last one written)
        devs, addrs, acts = rows.column(DEV), rows.column(ADDR), rows.column(ACTION)
        at = {
            (d, a): i
            for i, d, a, x in zip(
                range(len(rows) - 1, -1, -1), reversed(devs), reversed(addrs), reversed(acts)
            )  # fmt: skip
            if x in blocks
        }
        first = {key: rows[i] for key, i in at.items() if acts[i] != "alloc"}
        for key, (size, _) in self.final.blocks.items():
            if key not in at:
                self.layout.occupy(*key, size)
        rounding = self.layout.rules.rounding
        for (dev, addr), r in first.items():  # freed before it was allocated: in use already
            self.layout.occupy(dev, addr, rounding(r[SIZE]))

    def _segment_pool(self, r: tuple) -> str:
        for dev, addr, _, pool, _ in self.final.segments:
            if dev == r[DEV] and addr == r[ADDR]:
                return pool
        return _pool(abs(r[SIZE]))

    def _free(self, r: tuple, key, op: int, stack: int) -> None:
        aid = self.open.pop(key, None)
        size = self.sizes.pop(key, None)
        if aid is None:  # allocated before the history began
            aid = self.next_id
            self.next_id += 1
            self.freed_older += 1
        if size is None:
            size = self.layout.rules.rounding(r[SIZE])
        self.layout.remove(r[DEV], r[ADDR])
        total = self.reserved[r[DEV]] if self.track_reserved else NO_ID
        dev = self.name(r[DEV])
        self.memory.append(_new_record((r[T], r[ADDR], -size, NO_ID, aid, dev, op, NO_ID, total)))
        self.of_memory.append(stack)
        self.recorded.append(None)

    def finish(self, end_ns: int) -> None:
        """Frees only requested when the history ended complete then (their stream work was
        still pending: the block is counted until then)."""
        for key, r in sorted(self.pending.items(), key=lambda kv: kv[1][ORDER]):
            if key in self.open and key not in self.final.blocks:
                self._free((max(r[T], end_ns), *r[1:]), key, NO_ID, r[STACK])


def _annotations(snap: dict, wanted, timed: bool) -> list[tuple[int, int, str]]:
    """``external_annotations`` as spans ``(start, end, name)``: each START paired with the
    next END of its name (one per name and stage and time: torch repeats them per device)."""
    raw = _list(snap.get("external_annotations", []) or [], "external_annotations")
    if not timed:
        return []  # no clock to place them on
    seen: set = set()
    marks: list = []
    for a in raw:
        a = _dict(a, "an annotation")
        name = _str(a.get("name"), "an annotation's name")
        stage = a.get("stage")
        t = int(_num(a.get("time_us", 0), "an annotation's time_us") * 1000)
        dev = a.get("device", 0)
        if type(dev) is int and not wanted(dev):
            continue
        if stage not in ("START", "END") or (name, stage, t) in seen:
            continue
        seen.add((name, stage, t))
        marks.append((t, stage == "START", name))
    marks.sort(key=lambda m: (m[0], m[1]))  # an END before a START at the same time
    opened: dict[str, list] = {}
    spans: list = []
    last = marks[-1][0] if marks else 0
    for t, start, name in marks:
        if start:
            opened.setdefault(name, []).append(t)
        elif opened.get(name):
            spans.append((opened[name].pop(), t, name))
    spans += [(t0, last, name) for name, ts in opened.items() for t0 in ts]
    return spans


#: The name of an ``optimizer.step()`` call found from frames: the prefix the steps
#: analysis splits at, then where it comes from.
OPTIMIZER_FROM_FRAMES = "Optimizer.step#(from its frames)"


def _optimizer_spans(rows: columns.Rows, stacks: StackReader) -> list[tuple[int, int, str]]:
    """Where no ``Optimizer.step#`` annotation was recorded: each run of entries whose
    stacks are inside ``optimizer.step()`` (ended by an entry of another context) as a span,
    so that steps split there as they split at a captured ``optimizer.step()``."""
    context = stacks.context
    inside, other = StackContext.OPTIMIZER_STEP.value, StackContext.NONE.value
    spans: list = []
    start = last = None
    for r in rows:
        c = context[r[STACK]] if r[STACK] >= 0 else other
        if c == inside:
            start = r[T] if start is None else start
            last = r[T]
        elif c != other and start is not None:
            spans.append((start, last, OPTIMIZER_FROM_FRAMES))
            start = None
    if start is not None:
        spans.append((start, last, OPTIMIZER_FROM_FRAMES))
    return spans


def _nest(spans: list) -> list[OpRecord]:
    """Spans ``(start, end, name)`` as ops in pre-order, each inside the innermost open one
    that contains it."""
    spans.sort(key=lambda s: (s[0], -s[1]))
    ops: list[OpRecord] = []
    stack: list[OpRecord] = []
    for t0, t1, name in spans:
        while stack and not (stack[-1].start_ns <= t0 and t1 <= stack[-1].end_ns):
            stack.pop()
        parent = stack[-1].op_id if stack else NO_ID
        optimizer = name.startswith("Optimizer.")
        kind = OpKind.OPTIMIZER if optimizer else OpKind.ANNOTATION
        op = OpRecord(
            len(ops), parent, len(stack), name, kind, t0, t1, 0, NO_ID, False,
            optimizer, NO_ID, NO_ID, None, [], NO_ID,
        )  # fmt: skip
        ops.append(op)
        stack.append(op)
    return ops


def _innermost(ops: list[OpRecord], times) -> list[int]:
    """For each time (ascending), the innermost op open then (``start <= t <= end``), or
    NO_ID. The innermost op only changes where an op starts or ends: it is found at those
    few points by one sweep over the ops (pre-order: by start), then each time takes the
    point at or before it (``searchsorted``)."""
    if not ops:
        return [NO_ID] * len(times)
    points = sorted({o.start_ns for o in ops} | {o.end_ns + 1 for o in ops})
    inner: list[int] = []
    stack: list[OpRecord] = []
    i, n = 0, len(ops)
    for t in points:
        while i < n and ops[i].start_ns <= t:
            while stack and stack[-1].end_ns < ops[i].start_ns:
                stack.pop()
            stack.append(ops[i])
            i += 1
        while stack and stack[-1].end_ns < t:
            stack.pop()
        inner.append(stack[-1].op_id if stack else NO_ID)
    at = np.searchsorted(np.asarray(points, dtype=np.int64), np.asarray(times, np.int64), "right")
    table = np.asarray([NO_ID, *inner], dtype=np.int64)
    return table[at].tolist()


#: Block sizes as written: a file :meth:`Profile.to_snapshot` wrote holds the blocks' own
#: sizes (no request to round, no cached block to take whole), on any device.
EXACT = Rules(rounding=lambda size: size, expandable=True)
_DEVICE_NAME = re.compile(r"(cpu|cuda:\d{1,4}|[a-z]{2,10}(:\d{1,4})?)")


def device_names(snap: dict) -> tuple[Callable[[int], str], bool]:
    """How the file names device index ``i``, and whether it is one of our own exports:
    ``device_traces[i]`` is ``cuda:i``, except in a file :meth:`Profile.to_snapshot` wrote,
    whose ``jupyter_memprof`` key names each index (the CPU after the last CUDA device).
    A malformed key is ignored (memory_viz ignores it too)."""
    ours = snap.get("jupyter_memprof")
    named = ours.get("devices") if isinstance(ours, dict) else None
    if not isinstance(named, list) or len(named) > 4096:
        return (lambda i: f"cuda:{i}"), False
    names = [n if isinstance(n, str) and _DEVICE_NAME.fullmatch(n) else None for n in named]
    if len({n for n in names if n}) != len([n for n in names if n]):
        return (lambda i: f"cuda:{i}"), False  # a name twice: not ours to trust

    def name(i: int) -> str:
        return (names[i] if 0 <= i < len(names) else None) or f"cuda:{i}"

    return name, True


def _wanted(device: int | None):
    return (lambda d: True) if device is None else (lambda d: d == device)


def read_snapshot(
    snap: object,
    *,
    device: int | None = None,
    rules: Rules | None = None,
    consume: bool = False,
) -> Read:
    """The records of the snapshot dict ``snap`` (of every CUDA device, or only of
    ``device``); block sizes follow ``rules`` (the snapshot's allocator settings, see
    :mod:`.blocks`). :class:`Bad` (one phrase) for anything a snapshot does not hold.
    ``consume``: ``snap`` is the reader's own (read from a file): its traces are emptied
    as they are read, so that memory is free again sooner."""
    snap = _dict(snap, "a memory snapshot")
    if "segments" not in snap and "device_traces" not in snap:
        raise Bad("not a memory snapshot (it has neither 'segments' nor 'device_traces')")
    wanted = _wanted(device)
    stacks = StackReader()
    tags = columns.tags(snap, wanted)  # read before the entries are let go
    rows, timed, actions = _entries(snap, stacks, wanted, consume)
    final = _final_state(snap, stacks, wanted)
    spans = _annotations(snap, wanted, timed)
    if not any(name.startswith("Optimizer.step#") for _, _, name in spans):
        spans += _optimizer_spans(rows, stacks)
    ops = _nest(spans)
    settings = snap.get("allocator_settings")
    name, ours = device_names(snap)
    snap = None  # the file's objects may go now (its frames are copied into stacks)
    stacks.let_go()
    if ours:  # our own export: its sizes are the blocks' already, on any device, and its
        # segments were drawn from the blocks alive at the end, not recorded: the analysis
        # models a CUDA device's segments as for a capture, and a CPU has none
        rules = EXACT
        final = final._replace(segments=[], reserved=Counter())
    replay = _Replay(final, rules or Rules(), actions.get("oom", 0) > 0, name)
    replay.run(rows, _innermost(ops, rows.column(T)), actions)
    start = rows[0][T] if rows else (ops[0].start_ns if ops else 0)
    end = max([rows[-1][T] if rows else start, *(o.end_ns for o in ops)])
    replay.finish(end)
    opened = {(s.device, s.address) for s in replay.segments if s.size > 0}
    alive_before = [
        SegmentRecord(start, name(d), a, z, pool, stream)
        for d, a, z, pool, stream in final.segments
        if (name(d), a) not in opened
    ]
    older, of_older = [], []
    for (dev, addr), (size, stack) in final.blocks.items():
        if (dev, addr) not in replay.open:
            older.append(OlderBlock(name(dev), addr, size))
            of_older.append(stack)
    devices = sorted(
        {name(d) for d in set(rows.column(DEV))}
        | {name(d) for d, *_ in final.segments}
        | {b.device for b in older},
        key=device_sort_key,
    )
    if device is not None and not devices:
        devices = [name(device)]
    trace = Trace(ops, [], replay.memory, [], len(rows))
    capture = Capture(
        trace,
        [],
        [],
        [],
        devices,
        start,
        stacks=Stacks(
            stacks.frames,
            stacks.context,
            stacks.callsite,
            replay.of_memory,
            of_older,
            replay.recorded if any(replay.recorded) else None,
        ),
        segments=None if ours else alive_before + replay.segments,
        older=older,
    )
    meta = {
        "snapshot_actions": dict(sorted(actions.items())),
        "snapshot_older_blocks": {
            "alive": len(older),
            "alive_bytes": sum(b.size for b in older),
            "freed": replay.freed_older,
        },
        "snapshot_ooms": replay.ooms,
        "snapshot_end_allocated": {name(d): int(v) for d, v in sorted(final.allocated.items())},
        "snapshot_end_reserved": {name(d): int(v) for d, v in sorted(final.reserved.items())},
        "clock": "time_us" if timed else "entry order",
    }
    if tags:
        meta["snapshot_tags"] = tags
    if isinstance(settings, dict):
        conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
        meta["snapshot_alloc_conf"] = conf if isinstance(conf, str) else ""
    return Read(capture, meta)
