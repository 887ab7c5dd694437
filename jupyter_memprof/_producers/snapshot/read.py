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
from typing import NamedTuple

import numpy as np

from ..._devices import device_sort_key
from ..._records import (
    NO_ID,
    Capture,
    OlderBlock,
    OpRecord,
    SegmentRecord,
    StackContext,
    Stacks,
    Trace,
)
from ..._vocab import OpKind
from . import columns
from .blocks import Rules
from .columns import Entries
from .frames import Bad, StackReader
from .replay import Final, Replayed, pool_of, replay

__all__ = ["Bad", "Read", "read_snapshot"]

#: The largest int a snapshot may hold for an address, a size, a stream or a time (in ns):
#: sums and roundings of them stay in int64.
_INT64 = 2**62


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


#: The fields of a trace entry read entry by entry (:func:`_entries_one_by_one`): sorting
#: the tuples sorts by time, then by the order in the file.
T, ORDER = 0, 1


def _ok(v: object) -> bool:
    return type(v) is int and 0 <= v < _INT64


def _entries(
    snap: dict, stacks: StackReader, wanted, consume: bool = False
) -> tuple[Entries, bool, Counter, dict]:
    """Every trace entry of the wanted devices (:class:`.columns.Entries`), time ordered;
    whether times were recorded (else the entry order is the clock); how many of each
    action; the entries' tags (:func:`.columns.tags`). Read a field at a time
    (:func:`.columns.entries`) where every entry is plain (int times, sizes and addresses,
    no ``oom``), else entry by entry."""
    fast = columns.entries(snap, stacks, wanted, consume)
    if fast is not None:
        return fast
    return (*_entries_one_by_one(snap, stacks, wanted), columns.tags(snap, wanted))


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
    actions.update(r[3] for r in rows)
    if not timed:
        rows = [(r[ORDER], *r[1:]) for r in rows]
    rows.sort()
    return Entries.of(rows), timed, actions


def _final_state(snap: dict, stacks: StackReader, wanted) -> Final:
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
        pool = kind if kind in ("small", "large") else pool_of(total)
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
    return Final(blocks, segs, reserved, allocated)


def _block_frames(b: dict) -> object:
    """A block's frames: its own, else (old snapshots) its last ``history`` entry's."""
    frames = b.get("frames")
    if frames:
        return frames
    history = _list(b.get("history") or [], "a block's history")
    for h in history:
        _int(_dict(h, "a history entry").get("real_size", 0), "a history entry's real_size")
    return _dict(history[-1], "a history entry").get("frames") if history else None


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


def _optimizer_spans(e: Entries, stacks: StackReader) -> list[tuple[int, int, str]]:
    """Where no ``Optimizer.step#`` annotation was recorded: each run of entries whose
    stacks are inside ``optimizer.step()`` (ended by an entry of another context; entries
    with no frames are passed over) as a span, so that steps split there as they split at
    a captured ``optimizer.step()``."""
    context = [*stacks.context, StackContext.NONE.value]  # NO_ID (-1): the last, no frames
    said_of = np.array([c != StackContext.NONE.value for c in context], dtype=bool)
    inside_of = np.array([c == StackContext.OPTIMIZER_STEP.value for c in context], dtype=bool)
    said = np.flatnonzero(said_of[e.stack])
    inside = inside_of[e.stack[said]]
    edge = np.diff(np.concatenate([[False], inside, [False]]).astype(np.int8))
    starts, ends = said[edge[:-1] == 1], said[edge[1:] == -1]
    t = e.t
    return [(s, z, OPTIMIZER_FROM_FRAMES) for s, z in zip(t[starts].tolist(), t[ends].tolist())]


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


def _innermost(ops: list[OpRecord], times) -> np.ndarray:
    """For each time (ascending), the innermost op open then (``start <= t <= end``), or
    NO_ID. The innermost op only changes where an op starts or ends: it is found at those
    few points by one sweep over the ops (pre-order: by start), then each time takes the
    point at or before it (``searchsorted``)."""
    if not ops:
        return np.full(len(times), NO_ID, dtype=np.int64)
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
    return table[at]


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
    e, timed, actions, tags = _entries(snap, stacks, wanted, consume)
    final = _final_state(snap, stacks, wanted)
    spans = _annotations(snap, wanted, timed)
    if not any(name.startswith("Optimizer.step#") for _, _, name in spans):
        spans += _optimizer_spans(e, stacks)
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
    start = int(e.t[0]) if len(e) else (ops[0].start_ns if ops else 0)
    end = max([int(e.t[-1]) if len(e) else start, *(o.end_ns for o in ops)])
    every_block = actions.get("oom", 0) > 0
    done = replay(e, _innermost(ops, e.t), final, rules or Rules(), every_block, name, end)
    capture = _capture(e, ops, done, final, stacks, name, start, device, ours)
    meta = {
        "snapshot_actions": dict(sorted(actions.items())),
        "snapshot_older_blocks": {
            "alive": len(capture.older),
            "alive_bytes": sum(b.size for b in capture.older),
            "freed": done.freed_older,
        },
        "snapshot_ooms": done.ooms,
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


def _capture(
    e: Entries,
    ops: list[OpRecord],
    done: Replayed,
    final: Final,
    stacks: StackReader,
    name: Callable[[int], str],
    start: int,
    device: int | None,
    ours: bool,
) -> Capture:
    """The replay's records, the segments alive before the history, the blocks older than
    it (alive at the end, never allocated in it) and the devices, as a Capture."""
    opened = {(s.device, s.address) for s in done.segments if s.size > 0}
    alive_before = [
        SegmentRecord(start, name(d), a, z, pool, stream)
        for d, a, z, pool, stream in final.segments
        if (name(d), a) not in opened
    ]
    older, of_older = [], []
    for (dev, addr), (size, stack) in final.blocks.items():
        if (dev, addr) not in done.open:
            older.append(OlderBlock(name(dev), addr, size))
            of_older.append(stack)
    devices = sorted(
        {name(d) for d in np.unique(e.dev).tolist()}
        | {name(d) for d, *_ in final.segments}
        | {b.device for b in older},
        key=device_sort_key,
    )
    if device is not None and not devices:
        devices = [name(device)]
    st = Stacks(
        stacks.frames, stacks.context, stacks.callsite, done.of_memory, of_older, done.recorded
    )
    return Capture(
        Trace(ops, [], done.memory, [], len(e)),
        [],
        [],
        [],
        devices,
        start,
        stacks=st,
        segments=None if ours else alive_before + done.segments,
        older=older,
    )
