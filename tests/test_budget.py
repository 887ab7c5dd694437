"""A plain capture of a cell that never ends stops at its memory budget, keeps what it
recorded and says so (issue 37, item 10: before, it grew about 2 GB a second until the
machine ran out)."""

from __future__ import annotations

import sys
import time

import pytest
import torch

import jupyter_memprof
from jupyter_memprof._errors import MemoryBudgetExceeded
from jupyter_memprof._frontends.budget import rss_bytes
from jupyter_memprof._frontends.options import check_memory_budget

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or rss_bytes() is None, reason="needs /proc"
)


def test_a_never_ending_capture_stops_at_its_budget(tmp_path):
    x = torch.ones(10)
    t0 = time.perf_counter()
    caught = 0
    with pytest.raises(MemoryBudgetExceeded):
        with jupyter_memprof.profile(memory_budget="8MiB", namespace={"x": x}) as prof:
            while True:  # never ends: only the budget stops it
                try:
                    y = x * 2
                    del y
                except Exception:  # does not hold it back
                    caught += 1
    assert caught == 0
    assert time.perf_counter() - t0 < 120
    budget = prof.meta["memory_budget"]
    assert budget["bytes"] == 8 * 2**20 and budget["exceeded"] is True
    assert budget["reason"] == "budget" and budget["floor_bytes"] >= 0
    assert budget["grown_bytes"] > 8 * 2**20
    assert prof.meta["error"] == "MemoryBudgetExceeded"
    mul = prof.ops[prof.ops["name"] == "aten::mul"]
    assert len(mul) > 100  # what was recorded is kept
    assert set(
        prof.allocations.loc[prof.allocations["alloc_op_id"].isin(mul["op_id"]), "size_bytes"]
    ) == {40}
    text = str(prof)
    assert "recording stopped: the process grew by" in text
    assert "over the capture's memory budget of 8.0 MiB" in text
    loaded = jupyter_memprof.load(prof.save(tmp_path / "p.memprof"))
    assert loaded.meta["memory_budget"] == budget
    with jupyter_memprof.profile(namespace={}) as again:  # the next capture works
        torch.ones(10)
    assert again.meta["memory_budget"] == {
        "bytes": None,
        "exceeded": False,
        "floor_bytes": again.meta["memory_budget"]["floor_bytes"],
    }


@pytest.mark.parametrize("value", ["lots", -1, 0, "9" * 400, 10**30])
def test_bad_budgets_are_one_line(value):
    with pytest.raises(jupyter_memprof.CaptureError) as info:
        jupyter_memprof.profile(memory_budget=value)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("memory_budget") and len(msg) < 200


def test_default_budget_and_none():
    assert check_memory_budget(None) is True  # the machine's floor only
    assert check_memory_budget(False) is False
    assert check_memory_budget("1GiB") == 2**30
    with jupyter_memprof.profile(memory_budget=False, namespace={}) as prof:
        torch.ones(10)
    assert "memory_budget" not in prof.meta


def test_the_machine_floor_stops_the_code_too():
    """Without a budget, the watchdog stops the code before the machine runs out: here its
    floor is set above the memory available, so it stops at its first reading."""
    x = torch.ones(10)
    cap = jupyter_memprof.profile(namespace={"x": x})
    prof = cap.start()
    cap._watchdog.floor = 2**62
    err = None
    try:
        while True:
            y = x * 2
            del y
    except MemoryBudgetExceeded as exc:
        err = exc
    cap.finish(err)
    budget = prof.meta["memory_budget"]
    assert budget["exceeded"] is True and budget["reason"] == "machine"
    assert "recording stopped: the process grew by" in str(prof)
    assert "the machine's available memory fell under" in str(prof)
    assert len(prof.ops[prof.ops["name"] == "aten::mul"]) >= 1


def test_a_capture_stopped_at_its_budget_frees_torchs_result_before_the_analysis():
    """Memory before time: torch's raw result (about five times what recording grew) and
    the records are freed at once, also where a shell would free them after the cell."""
    from jupyter_memprof._producers.recorder import LATER

    x = torch.ones(10)
    LATER.free()
    was, LATER.enabled = LATER.enabled, True  # as in a notebook: freed after the cell
    try:
        with pytest.raises(MemoryBudgetExceeded):
            with jupyter_memprof.profile(memory_budget="8MiB", namespace={"x": x}) as prof:
                while True:
                    x * 2
        assert len(LATER) == 0 and prof.meta["memory_budget"]["exceeded"] is True
        assert (prof.ops["name"] == "aten::mul").sum() > 100
        with jupyter_memprof.profile(namespace={"x": x}) as plain:
            x * 2
        assert len(LATER) == 2  # a plain capture's raw result and records: after the cell
        assert (plain.ops["name"] == "aten::mul").sum() == 1
    finally:
        LATER.free()
        LATER.enabled = was
