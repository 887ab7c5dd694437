"""The fast reader of a snapshot's entries (a field at a time) against the entry-by-entry
one, the file's own objects let go, the caller's dict left alone, and the entries' tags."""

from __future__ import annotations

import copy
import pickle

from test_snapshot import BWD, FWD, MiB, _e, _two_devices

import jupyter_memprof as jm
from jupyter_memprof._producers.snapshot import columns
from jupyter_memprof._producers.snapshot.frames import StackReader
from jupyter_memprof._producers.snapshot.read import _entries_one_by_one, read_snapshot


def _rows(snap, fast: bool):
    stacks = StackReader()
    if fast:
        rows, timed, actions, _ = columns.entries(snap, stacks, lambda d: True)
    else:
        rows, timed, actions = _entries_one_by_one(snap, stacks, lambda d: True)
    return list(rows), timed, actions, stacks.frames


def test_both_readers_make_the_same_rows_on_two_devices_out_of_time_order():
    snap = _two_devices()
    snap["device_traces"][0].append(_e("alloc", (1 << 40) + 12 * MiB, 1000, 5, FWD,
                                       category="activation"))  # fmt: skip
    fast, slow = _rows(snap, True), _rows(snap, False)
    assert fast == slow
    rows = fast[0]
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)  # time ordered
    assert rows[0][0] == 5000 and rows[0][8] == "activation"  # the late entry, first in time


def test_an_entry_that_is_not_plain_goes_entry_by_entry_with_the_same_result():
    snap = _two_devices()
    odd = copy.deepcopy(snap)
    odd["device_traces"][1][0]["time_us"] = float(odd["device_traces"][1][0]["time_us"])
    assert columns.entries(odd, StackReader(), lambda d: True) is None
    a, b = jm.load_snapshot(snap), jm.load_snapshot(odd)
    assert a.allocations[["size_bytes", "alloc_ns", "free_ns", "category"]].equals(
        b.allocations[["size_bytes", "alloc_ns", "free_ns", "category"]]
    )


def test_a_file_is_read_and_let_go_and_a_callers_dict_is_left_alone(tmp_path):
    snap = _two_devices()
    kept = copy.deepcopy(snap)
    from_dict = jm.load_snapshot(snap)
    assert snap == kept  # not emptied: the caller's
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=5))
    from_file = jm.load_snapshot(path)
    assert from_file.allocations.equals(from_dict.allocations)
    # consume=True empties the traces once their columns are read
    own = copy.deepcopy(snap)
    read = read_snapshot(own, consume=True)
    assert own["device_traces"] == [[], []] and len(read.capture.trace.memory) > 0


def test_compile_context_and_user_metadata_are_counted_per_value(tmp_path):
    snap = _two_devices()
    base = 1 << 40
    snap["device_traces"][0] += [
        _e("alloc", base + 12 * MiB, 1024, 20, FWD, compile_context="[0/0] forward graph"),
        _e(
            "alloc",
            base + 13 * MiB,
            2048,
            21,
            FWD,
            compile_context="[0/0] forward graph",
            user_metadata="phase=eval",
        ),  # fmt: skip
        _e("free_completed", base + 12 * MiB, 1024, 22, BWD, compile_context="[0/0] x"),
        _e("alloc", base + 14 * MiB, 512, 23, FWD, compile_context="", user_metadata=None),
    ]
    prof = jm.load_snapshot(snap)
    assert prof.meta["snapshot_tags"] == {
        "compile_context": {"[0/0] forward graph": {"allocs": 2, "requested_bytes": 3072}},
        "user_metadata": {"phase=eval": {"allocs": 1, "requested_bytes": 2048}},
    }
    saved = jm.load(prof.save(tmp_path / "tags.zip"))  # the meta key is checked on load
    assert saved.meta["snapshot_tags"] == prof.meta["snapshot_tags"]
    assert "snapshot_tags" not in jm.load_snapshot(_two_devices()).meta  # none recorded
