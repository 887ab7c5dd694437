"""A snapshot recorded beside a capture (``profile(snapshot=True)``): its segments placed on
the capture's clock by the order of the two histories (``_producers/snapshot/align.py``),
checked on H100 recordings where torch's profiler and the allocator's history recorded the
same step: after every event of the profiler, the reserved bytes the placed segments give
equal the ``Total Reserved`` torch's profiler recorded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from jupyter_memprof._analysis.allocator.model import reserved_timeline
from jupyter_memprof._analysis.recorded_segments import recorded_segments
from jupyter_memprof._producers.snapshot.align import segments_on_capture
from jupyter_memprof._records import NO_ID, MemoryRecord

H100 = Path(__file__).parent / "data" / "h100"
RECORDINGS = sorted(H100.glob("*.json"))


def _recorded_pair(path: Path) -> tuple[dict, list[MemoryRecord], list[int]]:
    """The step's allocator history as a snapshot (its final segments: those at the step's
    start plus the ones the step allocated), the profiler's events of the same step as the
    capture's records, and the profiler's reserved total after each."""
    d = json.loads(path.read_text())
    actions, (first, end) = d["actions"], d["step"]
    entries = [
        {"action": actions[a], "addr": addr, "size": size, "stream": stream}
        for a, addr, size, stream in d["trace"][first:end]
    ]
    segments = [
        {"device": 0, "address": addr, "total_size": size, "stream": stream, "segment_type": kind}
        for addr, size, stream, kind, _ in d["segments_at_step_start"]
    ]
    segments += [
        {"device": 0, "address": e["addr"], "total_size": e["size"], "stream": e["stream"]}
        for e in entries
        if e["action"] == "segment_alloc"
    ]
    memory = [
        MemoryRecord(t, ptr, size, NO_ID, i, "cuda:0", NO_ID, allocated, reserved)
        for i, (t, ptr, size, allocated, reserved, _) in enumerate(d["profiler"])
    ]
    snapshot = {"segments": segments, "device_traces": [entries]}
    return snapshot, memory, [m.total_reserved for m in memory]


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_reserved_after_every_event_equals_the_profilers_total(path):
    snapshot, memory, want = _recorded_pair(path)
    start = memory[0].time_ns - 1
    aligned = segments_on_capture(snapshot, memory, start)
    assert aligned.matched == {"cuda:0": len(memory)} and aligned.unmatched == {"cuda:0": 0}
    table = reserved_timeline(recorded_segments(aligned.segments, start), "cuda:0")
    times = table["time_ns"].to_numpy()
    at = np.searchsorted(times, [m.time_ns for m in memory], side="right") - 1
    got = table["reserved_bytes"].to_numpy()[at]
    assert got.tolist() == want


def test_the_two_recordings_with_segments_grow_during_the_step():
    """fragment and the quickstart model allocate segments inside the step (14 and 2): the
    reserved total rises there, exactly as the profiler saw it."""
    grown = {}
    for path in RECORDINGS:
        snapshot, memory, want = _recorded_pair(path)
        grown[path.stem.split("__")[0]] = want[-1] - want[0]
    assert grown["fragment"] > 0 and grown["quickstart_tinylm_adamw"] > 0
    assert grown["mlp_adam"] == 0 and grown["lstm_adam"] == 0


def _ev(t, ptr, size):
    return MemoryRecord(t, ptr, size, NO_ID, t, "cuda:0", NO_ID)


def test_a_segment_freed_to_make_room_and_one_older_than_the_history():
    """A cached segment given back inside a malloc (``segment_free`` before the ``alloc``
    whose event follows), a segment older than the history freed in it, and one that
    survives: each on the capture's clock; entries before the capture are unmatched."""
    mib = 1 << 20
    entries = [
        {"action": "alloc", "addr": 1, "size": 512, "stream": 0},  # before the capture
        {"action": "segment_free", "addr": 100 * mib, "size": 20 * mib, "stream": 0},
        {"action": "segment_alloc", "addr": 200 * mib, "size": 40 * mib, "stream": 0},
        {"action": "alloc", "addr": 200 * mib, "size": 40 * mib, "stream": 0},
        {"action": "free_requested", "addr": 200 * mib, "size": 40 * mib, "stream": 0},
        {"action": "free_completed", "addr": 200 * mib, "size": 40 * mib, "stream": 0},
        {"action": "segment_free", "addr": 200 * mib, "size": 40 * mib, "stream": 0},
    ]
    snapshot = {
        "segments": [{"device": 0, "address": 300 * mib, "total_size": 2 * mib}],
        "device_traces": [entries],
    }
    memory = [_ev(10, 200 * mib, 40 * mib), _ev(20, 200 * mib, -40 * mib)]
    aligned = segments_on_capture(snapshot, memory, 5)
    assert aligned.unmatched == {"cuda:0": 1} and aligned.matched == {"cuda:0": 2}
    got = sorted((s.time_ns, s.address // mib, s.size // mib, s.pool) for s in aligned.segments)
    assert got == [(5, 300, 2, "small"), (10, 100, -20, "large"), (10, 200, 40, "large"),
                   (20, 200, -40, "large")]  # fmt: skip
    table = recorded_segments(aligned.segments, 5)
    assert sorted(table["size_bytes"].tolist()) == [2 * mib, 20 * mib, 40 * mib]


def test_an_expandable_segment_that_grew_counts_its_older_part_from_the_start():
    mib = 1 << 20
    entries = [
        {"action": "segment_map", "addr": 1000 * mib + 20 * mib, "size": 20 * mib},
        {"action": "alloc", "addr": 1000 * mib + 20 * mib, "size": 20 * mib},
    ]
    snapshot = {
        "segments": [{"device": 0, "address": 1000 * mib, "total_size": 40 * mib}],
        "device_traces": [entries],
    }
    aligned = segments_on_capture(snapshot, [_ev(7, 1020 * mib, 20 * mib)], 0)
    got = sorted((s.time_ns, s.address // mib, s.size // mib) for s in aligned.segments)
    assert got == [(0, 1000, 20), (7, 1020, 20)]


def _capture(memory, devices=("cuda:0",)):
    from jupyter_memprof._records import Capture, Trace

    return Capture(Trace([], [], memory, [], len(memory)), [], [], [], list(devices), 0)


def test_a_capture_takes_the_recorded_segments_only_when_every_event_matched():
    """``with_recorded_segments``: a full match gives ``Capture.segments`` (reserved memory
    recorded) and says so in meta; an event missing from the history (a wrapped ring buffer)
    keeps the model's segments and says why."""
    from jupyter_memprof._analysis.meta_schema import problem
    from jupyter_memprof._producers.snapshot.align import with_recorded_segments

    path = H100 / "quickstart_tinylm_adamw__default.json"
    snapshot, memory, _ = _recorded_pair(path)
    capture, meta = with_recorded_segments(_capture(memory), snapshot)
    assert meta == {"snapshot_segments": {"cuda:0": len(memory)}}
    assert sum(s.size for s in capture.segments) == memory[-1].total_reserved
    assert problem(meta) is None
    snapshot["device_traces"][0] = snapshot["device_traces"][0][10:]  # the first 10 lost
    capture, meta = with_recorded_segments(_capture(memory), snapshot)
    assert capture.segments is None
    assert meta["snapshot_segments_error"].startswith(
        f"allocator events not in the recorded history: 5 of the {len(memory)} on cuda:0 ("
    )
    assert problem(meta) is None
    assert with_recorded_segments(_capture(memory, ["cpu"]), snapshot) == (
        _capture(memory, ["cpu"]),
        {},
    )
