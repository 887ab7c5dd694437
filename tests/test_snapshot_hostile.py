"""Snapshot files that are damaged or crafted: one ProfileFileError line each, no code run,
bounded time and memory (docs/snapshots.md, "Safety")."""

from __future__ import annotations

import json
import pickle
import pickletools
import struct
import time

import pytest

import jupyter_memprof as jm
from jupyter_memprof._errors import ProfileFileError


def _snap(**extra) -> dict:
    frames = [{"filename": "/home/u/train.py", "line": 3, "name": "main"}]
    trace = [
        {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1, "frames": frames},
        {"action": "free_completed", "addr": 4096, "size": 512, "stream": 0, "time_us": 2, "frames": frames},
    ]  # fmt: skip
    return {"segments": [], "device_traces": [trace], **extra}


def _refused(tmp_path, data: bytes, match: str) -> str:
    path = tmp_path / "bad.pickle"
    path.write_bytes(data)
    with pytest.raises(ProfileFileError, match=match) as info:
        jm.load_snapshot(path)
    text = str(info.value)
    assert "\n" not in text and text.startswith("bad.pickle: ")
    return text


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_protocol_loads(tmp_path, protocol):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snap(), protocol=protocol))
    prof = jm.load(path)  # told apart from a saved profile by its content
    assert prof.meta["producer"] == "snapshot"
    assert prof.allocations["size_bytes"].tolist() == [512]
    assert prof.allocations["alloc_ns"].tolist() == [1000]
    assert prof.allocations["free_ns"].tolist() == [2000]


def test_json_form_loads(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_snap()))
    prof = jm.load(path)
    assert prof.allocations["ptr"].tolist() == [4096]


def test_a_global_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    # GLOBAL os.system, then REDUCE: what a plain pickle.load would run
    data = b"\x80\x02cos\nsystem\nq\x00X" + struct.pack("<I", 11 + len(str(marker)))
    data += f"touch {marker} ".encode()[: 11 + len(str(marker))] + b"\x85R."
    _refused(tmp_path, data, "refused: it names os.system")
    assert not marker.exists()


def test_stack_global_and_build_are_refused(tmp_path):
    data = pickle.dumps(_snap(), protocol=4)
    # STACK_GLOBAL of builtins.eval
    crafted = b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c\x041+1\x85R."
    _refused(tmp_path, crafted, "refused: it names builtins.eval")
    # BUILD on a plain dict: no class to set the state of
    built = data[:-1] + b"}b."
    _refused(tmp_path, built, "not a readable pickle")


def test_extension_codes_and_persistent_ids_are_refused(tmp_path):
    _refused(tmp_path, b"\x80\x02\x82\x01.", "not a readable pickle")
    _refused(tmp_path, b"\x80\x02X\x01\x00\x00\x00aQ.", "persistent id")


def test_truncated_garbage_and_wrong_protocols(tmp_path):
    data = pickle.dumps(_snap(), protocol=4)
    _refused(tmp_path, data[: len(data) // 2], "truncated|not a readable pickle")
    _refused(tmp_path, b"\x80\x09}.", "protocol 9")
    _refused(tmp_path, b"hello", "not a memory snapshot")
    _refused(tmp_path, b"", "empty")
    _refused(tmp_path, b'{"segments": [', "not readable JSON")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s["device_traces"][0][0].update(size=-512), "alloc size out of range"),
        (lambda s: s["device_traces"][0][0].update(addr=2**80), "alloc address out of range"),
        (lambda s: s["device_traces"][0][0].update(size="512"), "alloc size must be an int"),
        (lambda s: s["device_traces"][0][0].update(action=3), "action must be text"),
        (lambda s: s["device_traces"][0][0].update(frames="x"), "frames must be a list"),
        (lambda s: s["device_traces"][0][0].update(frames=[[1]]), "a frame must be a dict"),
        (lambda s: s["device_traces"][0][0].update(time_us=float("nan")), "time_us"),
        (lambda s: s["device_traces"][0][0].update(time_us=2**61), "time_us out of range"),
        (lambda s: s["device_traces"][0][0].update(size=2**63 - 1), "alloc size out of range"),
        (lambda s: s.update(device_traces={}), "device_traces must be a list"),
        (lambda s: s.update(segments=[{"address": -1}]), "address out of range"),
        (lambda s: (s.pop("segments"), s.pop("device_traces")), "not a memory snapshot"),
    ],
)
def test_wrong_types_and_values_are_one_line(tmp_path, change, match):
    snap = _snap()
    change(snap)
    _refused(tmp_path, pickle.dumps(snap, protocol=4), match)


def test_not_a_dict(tmp_path):
    _refused(tmp_path, pickle.dumps([1, 2], protocol=2), "must be a dict")


def test_shared_frame_lists_are_read_once(tmp_path):
    """60 levels of a list holding the previous level twice: 2**60 frames if expanded, a
    few KiB in the file; refused (frames hold frame dicts, not lists) in milliseconds."""
    frame = {"filename": "/home/u/a.py", "line": 1, "name": "f"}
    level: list = [frame]
    for _ in range(60):
        level = [level, level]
    snap = _snap()
    snap["device_traces"][0][0]["frames"] = level
    data = pickle.dumps(snap, protocol=4)
    assert len(data) < 4096
    t = time.perf_counter()
    _refused(tmp_path, data, "a frame must be a dict")
    assert time.perf_counter() - t < 2


def test_one_frame_list_shared_by_many_entries_is_read_once(tmp_path):
    frames = [{"filename": "/home/u/train.py", "line": i, "name": "f"} for i in range(2000)]
    trace = [
        {"action": "alloc", "addr": 4096 * (i + 1), "size": 512, "stream": 0, "time_us": i,
         "frames": frames}
        for i in range(5000)
    ]  # fmt: skip
    data = pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4)
    path = tmp_path / "s.pickle"
    path.write_bytes(data)
    t = time.perf_counter()
    prof = jm.load_snapshot(path)
    assert time.perf_counter() - t < 20
    assert len(prof.allocations) == 5000
    # the file refers to the one list 5000 times through the memo
    gets = [op.name for op, _, _ in pickletools.genops(data) if "GET" in op.name]
    assert len(gets) >= 4999
