"""The snapshot replay a column at a time (_producers/snapshot/replay.py) against the rules
it states, an entry at a time; the records it hands over as columns read as records are."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_memprof._analysis.tables import memory_columns, memory_table
from jupyter_memprof._producers.snapshot.read import read_snapshot
from jupyter_memprof._records import NO_ID, MemoryColumns, MemoryRecord, Trace

MiB = 2**20
BASE = 1 << 40
FRAMES = [{"filename": "/home/u/train.py", "line": 3, "name": "step"}]


def _e(action: str, addr: int, size: int, t: int) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": FRAMES}  # fmt: skip


def _records(snap: dict) -> list[tuple]:
    """``(time_ns, ptr, size, allocation_id, device)`` of every record the reader makes."""
    memory = read_snapshot(snap).capture.trace.memory
    assert isinstance(memory, MemoryColumns)
    c = memory_columns(memory)
    return list(zip(*(c[k].tolist() for k in ("time_ns", "ptr", "size", "allocation_id")),
                    c["device"].tolist()))  # fmt: skip


def _rounded(size: int) -> int:
    return max(512, -(-size // 512) * 512)


def _one_at_a_time(traces: list[list[dict]]) -> list[tuple]:
    """The rules of replay.py's docstring, an entry at a time (small blocks: no layout)."""
    entries = sorted(
        (e["time_us"] * 1000, order, dev, e)
        for order, (dev, e) in enumerate((d, e) for d, t in enumerate(traces) for e in t)
    )
    opened: dict = {}
    pending: dict = {}
    out: list = []
    next_id = 0
    for t, order, dev, e in entries:
        key, act, name = (dev, e["addr"]), e["action"], f"cuda:{dev}"
        if act == "alloc":
            if key in opened:  # its free fell out of the record
                aid, size = opened.pop(key)
                out.append((t, e["addr"], -size, aid, name))
            opened[key] = (next_id, _rounded(e["size"]))
            out.append((t, e["addr"], _rounded(e["size"]), next_id, name))
            next_id += 1
        elif act in ("free_completed", "free"):
            pending.pop(key, None)
            if key in opened:
                aid, size = opened.pop(key)
                out.append((t, e["addr"], -size, aid, name))
            else:  # older than the history
                out.append((t, e["addr"], -_rounded(e["size"]), next_id, name))
                next_id += 1
        elif act == "free_requested":
            pending[key] = (order, t)
    end = entries[-1][0] if entries else 0
    for key, (_, t) in sorted(pending.items(), key=lambda kv: kv[1][0]):
        if key in opened:  # the history ended before its stream work did
            aid, size = opened.pop(key)
            out.append((max(t, end), key[1], -size, aid, f"cuda:{key[0]}"))
    return out


_ENTRY = st.tuples(
    st.sampled_from(["alloc", "alloc", "free_completed", "free_requested", "free", "oom_"]),
    st.integers(0, 3),  # the address
    st.integers(1, 4 * 512),  # the request
    st.integers(0, 3),  # time since the entry before
    st.integers(0, 1),  # the device
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ENTRY, max_size=40))
def test_the_column_replay_follows_its_rules_entry_by_entry(spec):
    traces: list[list[dict]] = [[], []]
    t = 0
    for action, addr, size, dt, dev in spec:
        t += dt
        action = "snapshot" if action == "oom_" else action  # an action it only counts
        traces[dev].append(_e(action, BASE + addr * MiB, size, t))
    snap = {"device_traces": traces, "segments": []}
    assert _records(snap) == _one_at_a_time(traces)


def test_edge_cases_give_exact_records():
    a, b, c = BASE, BASE + MiB, BASE + 2 * MiB
    trace = [
        _e("free_requested", c, 700, 1),  # in use before the history: freed, never made
        _e("alloc", a, 1000, 2),
        _e("alloc", a, 3000, 3),  # its free fell out of the record: the first ends here
        _e("free_completed", c, 700, 4),
        _e("free_completed", b, 100, 5),  # freed, never made: older than the history
        _e("alloc", b, 600, 6),
        _e("free_requested", b, 600, 7),  # the history ends first: ended at its end
        _e("free_completed", a, 3000, 9),
    ]
    snap = {"device_traces": [trace], "segments": []}
    assert _records(snap) == [
        (2000, a, 1024, 0, "cuda:0"),
        (3000, a, -1024, 0, "cuda:0"),
        (3000, a, 3072, 1, "cuda:0"),
        (4000, c, -1024, 2, "cuda:0"),
        (5000, b, -512, 3, "cuda:0"),
        (6000, b, 1024, 4, "cuda:0"),
        (9000, a, -3072, 1, "cuda:0"),
        (9000, b, -1024, 4, "cuda:0"),
    ]


def test_a_large_request_takes_the_whole_cached_block_when_the_rest_is_too_small():
    seg = BASE
    trace = [
        _e("segment_alloc", seg, 20 * MiB, 1),
        _e("alloc", seg, 19 * MiB + 512, 2),  # the rest (1 MiB - 512) is not split off
        _e("free_completed", seg, 19 * MiB + 512, 3),
        _e("alloc", seg, 8 * MiB, 4),  # the rest (12 MiB) is split off
    ]
    snap = {"device_traces": [trace], "segments": []}
    got = _records(snap)
    assert [r[2] for r in got] == [20 * MiB, -20 * MiB, 8 * MiB]
    capture = read_snapshot(snap).capture
    assert capture.trace.memory.fields["total_reserved"].tolist() == [20 * MiB] * 3


def test_records_and_columns_make_the_same_memory_table():
    recs = [
        MemoryRecord(10, 4096, 512, NO_ID, 0, "cuda:1", 3, NO_ID, 2 * MiB),
        MemoryRecord(20, 8192, 1024, 7, 1, "cuda:0", NO_ID),
        MemoryRecord(30, 4096, -512, NO_ID, 0, "cuda:1", NO_ID, NO_ID, 2 * MiB),
    ]
    cols = MemoryColumns(
        ["cuda:0", "cuda:1"],
        **{
            f: np.array([getattr(r, f) for r in recs])
            for f in MemoryRecord._fields
            if f != "device"
        },
        device=np.array([1, 0, 1]),
    )
    devices = ["cuda:0", "cuda:1"]
    from_records = memory_table(Trace([], [], recs, [], 3), devices)
    from_columns = memory_table(Trace([], [], cols, [], 3), devices)
    assert from_columns.equals(from_records)
    assert from_columns["tensor_id"].isna().tolist() == [True, False, True]
    assert len(cols) == 3
    cols.clear()
    assert len(cols) == 0
