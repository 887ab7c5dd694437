"""A snapshot beside a capture: segments on the capture's clock.

``profile(..., snapshot=True)`` records two histories of the same allocator at once: torch's
profiler (every allocation and free, with its time and the allocator's totals) and the
allocator's own history (``_record_memory_history``: the same allocations and frees in the
same order, plus ``segment_alloc`` / ``segment_free`` / ``segment_map`` / ``segment_unmap``).
The two clocks are not the same clock, so the segments are placed by order, not by time: each
``alloc`` and ``free_requested`` entry of the history is matched with the capture's next
event of the same address and sign, and a segment entry takes the time of the event that
follows it (a segment is allocated inside the ``malloc`` whose event reports it; a segment
freed to make room, or by ``empty_cache``, is given back before the next event). The
profiler's ``Total Reserved`` after each event then equals the reserved bytes the segments
give (tested on H100 recordings in ``tests/data/h100``).

Segments alive before the history began are the snapshot's final segments less what the
history changed inside them; they count from the capture's start.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from typing import Any, NamedTuple

from ..._records import Capture, MemoryRecord, SegmentRecord

__all__ = ["Aligned", "segments_on_capture", "with_recorded_segments"]

#: a segment action and the sign of its change of reserved memory
SEGMENT_ACTIONS = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
#: the entries the profiler reports too, and the sign of their event's size
BLOCK_ACTIONS = {"alloc": 1, "free_requested": -1, "free": -1}
#: the small pool's segments are 2 MiB (``kSmallBuffer``); larger ones are the large pool's
SMALL_SEGMENT = 2 << 20


class Aligned(NamedTuple):
    """The segments on the capture's clock, and how well the two histories agreed."""

    segments: list[SegmentRecord]
    #: per device: history entries matched with a capture event, and entries left unmatched
    #: (recorded before the capture began or after it ended, or an event the profiler lost)
    matched: dict[str, int]
    unmatched: dict[str, int]


def segments_on_capture(
    snapshot: dict[str, Any], memory: Iterable[MemoryRecord], start_ns: int
) -> Aligned:
    """The segments of ``snapshot`` (as ``torch.cuda.memory._snapshot()`` returns it) on the
    clock of ``memory`` (the capture's allocator events), from ``start_ns``."""
    events: dict[str, list[MemoryRecord]] = defaultdict(list)
    for m in memory:
        events[m.device].append(m)
    traces = snapshot.get("device_traces") or []
    finals = _final_segments(snapshot.get("segments") or [])
    segments: list[SegmentRecord] = []
    matched: dict[str, int] = {}
    unmatched: dict[str, int] = {}
    for index, entries in enumerate(traces):
        device = f"cuda:{index}"
        placed, matched[device], unmatched[device] = _place(
            entries or [], sorted(events.get(device, []), key=lambda m: m.time_ns), start_ns
        )
        pools = {addr: pool for addr, _, pool, _ in finals.get(index, [])}
        segments += _alive_before(finals.get(index, []), placed, device, start_ns)
        segments += [
            SegmentRecord(t, device, addr, size, pools.get(addr, _pool(abs(size))), stream)
            for t, addr, size, stream in placed
        ]
    for index, final in finals.items():  # a device the history never saw
        if index >= len(traces):
            segments += _alive_before(final, [], f"cuda:{index}", start_ns)
    return Aligned(segments, matched, unmatched)


def with_recorded_segments(capture: Capture, snapshot: Any) -> tuple[Capture, dict[str, Any]]:
    """``capture`` with the segments ``snapshot`` recorded (``Capture.segments``: reserved
    memory recorded, not modelled) when every allocator event of every CUDA device of the
    capture found its entry in the snapshot's history; else ``capture`` as it is. The meta
    says which: ``snapshot_segments`` (device -> events matched) or
    ``snapshot_segments_error`` (why the model's segments were kept)."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("device_traces"), list):
        return capture, {}
    cuda = [d for d in capture.devices if d.startswith("cuda")]
    if not cuda:
        return capture, {}
    start = capture.start_ns
    if start is None:
        start = min((m.time_ns for m in capture.trace.memory), default=0)
    aligned = segments_on_capture(snapshot, capture.trace.memory, start)
    counts = {d: 0 for d in cuda}
    for m in capture.trace.memory:
        if m.device in counts:
            counts[m.device] += 1
    short = {d: n - aligned.matched.get(d, 0) for d, n in counts.items()}
    short = {d: n for d, n in short.items() if n}
    if short:
        lost = ", ".join(f"{n} of the {counts[d]} on {d}" for d, n in short.items())
        return capture, {
            "snapshot_segments_error": f"allocator events not in the recorded history: {lost} "
            "(its ring buffer wrapped, or it missed them): segments modelled"
        }
    ours = [s for s in aligned.segments if s.device in counts]
    return capture._replace(segments=ours), {"snapshot_segments": dict(counts)}


def _place(
    entries: list[dict], events: list[MemoryRecord], start_ns: int
) -> tuple[list[tuple[int, int, int, int]], int, int]:
    """The segment entries of one device as ``(time_ns, address, signed size, stream)``,
    and the counts of block entries matched and unmatched."""
    waiting: dict[tuple[int, int], deque[int]] = defaultdict(deque)
    for k, m in enumerate(events):
        waiting[(m.ptr, 1 if m.size > 0 else -1)].append(k)
    placed: list[tuple[int, int, int, int]] = []
    pending: list[tuple[int, int, int]] = []
    nxt, last_t, found, lost = 0, start_ns, 0, 0
    for e in entries:
        action = e.get("action")
        if action in SEGMENT_ACTIONS:
            size = SEGMENT_ACTIONS[action] * int(e.get("size", 0))
            pending.append((int(e.get("addr", 0)), size, int(e.get("stream", 0))))
            continue
        sign = BLOCK_ACTIONS.get(action)
        if sign is None:
            continue
        queue = waiting.get((int(e.get("addr", 0)), sign))
        while queue and queue[0] < nxt:  # events already passed belong to no later entry
            queue.popleft()
        if not queue:
            lost += 1
            continue
        k = queue.popleft()
        nxt, last_t, found = k + 1, events[k].time_ns, found + 1
        placed += [(last_t, addr, size, stream) for addr, size, stream in pending]
        pending.clear()
    placed += [(last_t, addr, size, stream) for addr, size, stream in pending]
    return placed, found, lost


def _final_segments(raw: list) -> dict[int, list[tuple[int, int, str, int]]]:
    """The snapshot's segments at its end by device index: ``(address, bytes, pool,
    stream)``; entries that are not plain segment dicts are skipped."""
    out: dict[int, list[tuple[int, int, str, int]]] = defaultdict(list)
    for s in raw:
        if not isinstance(s, dict):
            continue
        try:
            dev, addr, size = int(s.get("device", 0)), int(s["address"]), int(s["total_size"])
        except (KeyError, TypeError, ValueError):
            continue
        kind = s.get("segment_type")
        pool = kind if kind in ("small", "large") else _pool(size)
        out[dev].append((addr, size, pool, int(s.get("stream", 0) or 0)))
    return out


def _alive_before(
    final: list[tuple[int, int, str, int]],
    placed: list[tuple[int, int, int, int]],
    device: str,
    start_ns: int,
) -> list[SegmentRecord]:
    """Each final segment less what the history changed inside it (an expandable segment
    grows in place): what remains was reserved before the history began."""
    out = []
    for addr, size, pool, stream in final:
        changed = sum(z for _, a, z, _ in placed if addr <= a < addr + size)
        before = size - changed
        if before > 0:
            out.append(SegmentRecord(start_ns, device, addr, before, pool, stream))
    return out


def _pool(size: int) -> str:
    return "small" if size <= SMALL_SEGMENT else "large"
