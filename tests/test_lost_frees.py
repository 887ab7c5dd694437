"""Frees torch's profiler did not report, found from the CUDA allocator's totals
(``_analysis/lost_frees.py``), on hand-worked streams. The recorded H100 steps are checked
in tests/test_baseline.py."""

from __future__ import annotations

import pandas as pd

from jupyter_memprof import Profile
from jupyter_memprof._analysis.pipeline import analyse
from jupyter_memprof._records import NO_ID, Capture, DeviceTotals, MemoryRecord, Trace

T0 = 1_000
GB = 1 << 30


def _capture(events, start: int, end: int | None, device: str = "cuda:0") -> Capture:
    """``events``: (time, ptr, signed bytes, the allocator's total after) in order; each
    allocation its own id, a free the id of the allocation at its address."""
    memory, ids = [], {}
    for t, ptr, size, total in events:
        aid = ids.setdefault(ptr, len(ids)) if size > 0 else ids.pop(ptr)
        totals = (total, 0) if device.startswith("cuda") else (-1, -1)
        memory.append(MemoryRecord(T0 + t, ptr, size, NO_ID, aid, device, NO_ID, *totals))
    held = {device: DeviceTotals(start, 0, 0, 0)} if device.startswith("cuda") else {}
    done = {device: DeviceTotals(end, 0, 0, 0)} if end is not None else {}
    trace = Trace([], [], memory, [], len(memory))
    return Capture(trace, [], [], [], [device], T0, held, done, [])


def _ends(capture, inferred=None) -> dict[int, int | None]:
    """ptr -> when its block ended (time from T0; None: open), for blocks made in it;
    ``inferred``: what ``meta["inferred_frees"]`` must say."""
    tables, meta = analyse(capture)
    assert meta.get("inferred_frees") == inferred
    a = tables["allocations"]
    made = a[a["alloc_ns"].notna()]
    return {
        int(p): (None if pd.isna(f) else int(f) - T0)
        for p, f in zip(made["ptr"], made["free_ns"].astype(object))
    }


A, B, C, D, E, F = (GB * (i + 1) for i in range(6))


def test_each_gap_gets_the_block_its_bytes_name_and_another_threads_block_is_not_ours():
    events = [
        (10, A, 4096, 5096),  # 1000 held at the start
        (20, B, 1536, 6632),
        # A freed unseen: 4096 less than the events say
        (30, C, 1024, 3560),
        # another thread makes 8192 bytes the profiler does not see
        (40, D, 512, 12264),
        # ... and frees them
        (50, E, 2048, 6120),
        # B freed unseen
        (60, F, 512, 5096),
        # C freed unseen after the last event: the allocator holds 4072 at the stop
    ]
    found = {"cuda:0": {"blocks": 3, "unexplained_bytes": 0}}
    ends = _ends(_capture(events, start=1000, end=4072), found)
    assert ends == {A: 29, B: 59, C: 61, D: None, E: None, F: None}


def test_a_gap_no_blocks_explain_leaves_them_open():
    events = [(10, A, 4096, 5096), (20, B, 1536, 6632), (30, C, 1024, 7000)]  # 656 lost
    cap = _capture(events, start=1000, end=None)
    found = {"cuda:0": {"blocks": 0, "unexplained_bytes": 656}}
    assert _ends(cap, found) == {A: None, B: None, C: None}
    tables, meta = analyse(cap)
    prof = Profile(**tables, meta=meta)
    assert (
        "cuda:0: 0 blocks ended where the allocator's totals say (torch reports no free "
        "outside an op without Python stacks); 656 B freed matched no blocks and is still "
        "counted live"
    ) in str(prof)


def test_blocks_of_one_size_go_latest_made_first_and_a_run_of_the_last_ones_made():
    events = [
        (10, A, 512, 1512),
        (20, B, 512, 2024),
        (30, C, 512, 2024),  # one 512-byte block freed unseen: the latest made, B
        (40, D, 1024, 3048),
        (50, E, 2048, 5096),
        (60, F, 512, 2536),  # 3072 freed unseen: D and E, the last two made
    ]
    ends = _ends(
        _capture(events, start=1000, end=None), {"cuda:0": {"blocks": 3, "unexplained_bytes": 0}}
    )
    assert ends == {A: None, B: 29, C: None, D: 59, E: 59, F: None}


def test_the_cpu_keeps_no_totals_and_nothing_is_inferred():
    events = [(10, A, 4096, -1), (20, B, 1536, -1)]
    cap = _capture(events, start=0, end=None, device="cpu")
    assert _ends(cap) == {A: None, B: None}
