"""prof.snapshot (CUDA's allocator snapshot, ``profile(snapshot=True)``) saved with the
profile and loaded back, in both formats, and checked on load like every other member. No
GPU here: the snapshot comes from the faked allocator calls of test_snapshot_capture (a real
CPU capture), or is a real ``to_snapshot`` file read back with the no-globals unpickler."""

import json
import os
import zipfile

import pytest
import torch
from IPython.core.error import UsageError
from test_snapshot_capture import OOM_SNAPSHOT

import jupyter_memprof
from jupyter_memprof import CaptureError, ProfileFileError
from jupyter_memprof._producers import cuda_history
from jupyter_memprof._producers.snapshot.unpickle import read_file as read_pickle
from jupyter_memprof._results import snapshot_store

FORMATS = ("zip", "parquet")


def _plain(value):
    """What JSON gives back for ``value`` (tuples become lists)."""
    return json.loads(json.dumps(value))


@pytest.fixture
def oom_profile(monkeypatch):
    """A real CPU capture ended by an out-of-memory error, with the snapshot the faked
    allocator returned at that moment."""
    monkeypatch.setattr(cuda_history, "check_devices", lambda devices: None)
    monkeypatch.setattr(cuda_history, "RECORD", lambda enabled: None)
    monkeypatch.setattr(cuda_history, "TAKE", lambda: OOM_SNAPSHOT)
    ns: dict = {}
    with pytest.raises(torch.OutOfMemoryError):
        with jupyter_memprof.profile(device="cpu", snapshot=True, namespace=ns) as prof:
            ns["kept"] = torch.ones(1024, 256)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return prof


def _save(prof, tmp_path, fmt):
    return prof.save(tmp_path / f"p.{fmt}", format=fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_recorded_snapshot_is_saved_and_loads_back(oom_profile, tmp_path, fmt):
    path = _save(oom_profile, tmp_path, fmt)
    back = jupyter_memprof.load(path)
    assert back.snapshot == _plain(OOM_SNAPSHOT)
    assert back.snapshot["segments"][0]["segment_pool_id"] == [0, 0]  # a tuple, as a list
    assert back.snapshot["device_traces"][0][1]["action"] == "oom"
    assert back.meta["snapshot_oom"] == oom_profile.meta["snapshot_oom"]
    assert back.peak("cpu").attrs["peak_bytes"] == oom_profile.peak("cpu").attrs["peak_bytes"]
    again = jupyter_memprof.load(back.save(tmp_path / f"again.{fmt}", format=fmt))
    assert again.snapshot == back.snapshot


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_to_snapshot_file_read_without_globals_round_trips(mlp_adam_profile, tmp_path, fmt):
    real, _ = mlp_adam_profile
    data = read_pickle(real.to_snapshot(tmp_path / "s.pickle"))
    assert data["device_traces"] and data["segments"]
    prof = jupyter_memprof.load(real.save(tmp_path / f"base.{fmt}", format=fmt))
    prof.snapshot = data
    back = jupyter_memprof.load(_save(prof, tmp_path, fmt))
    assert back.snapshot == _plain(data)
    entries = back.snapshot["device_traces"][len(back.snapshot["device_traces"]) - 1]
    assert sum(e["size"] for e in entries if e["action"] == "alloc") > 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_snapshot_no_member(mlp_adam_profile, tmp_path, fmt):
    path = mlp_adam_profile[0].save(tmp_path / f"p.{fmt}", format=fmt)
    if fmt == "zip":
        assert snapshot_store.MEMBER not in zipfile.ZipFile(path).namelist()
    else:
        assert not os.path.exists(os.path.join(path, snapshot_store.MEMBER))
    assert jupyter_memprof.load(path).snapshot is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_snapshot_that_is_not_plain_data_is_refused_before_writing(oom_profile, tmp_path, fmt):
    oom_profile.snapshot = {"segments": [], "device_traces": [[{"frames": [object()]}]]}
    with pytest.raises(TypeError, match=r"holds a object at snapshot\['device_traces'\]"):
        _save(oom_profile, tmp_path, fmt)
    assert not os.path.exists(tmp_path / f"p.{fmt}")
    oom_profile.snapshot = {"segments": [], "device_traces": [[{"time_us": float("nan")}]]}
    with pytest.raises(TypeError, match="which JSON cannot hold"):
        _save(oom_profile, tmp_path, fmt)
    oom_profile.snapshot = {1: "int key"}
    with pytest.raises(TypeError, match="not text"):
        _save(oom_profile, tmp_path, fmt)


def _with_member(path, tmp_path, fmt, data: bytes, name: str):
    """A copy of the saved profile at ``path`` whose snapshot member holds ``data``."""
    if fmt == "parquet":
        with open(os.path.join(path, snapshot_store.MEMBER), "wb") as fh:
            fh.write(data)
        return path
    out = str(tmp_path / name)
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename != snapshot_store.MEMBER:
                dst.writestr(info.filename, src.read(info))
        dst.writestr(snapshot_store.MEMBER, data)
    return out


def _refused(path) -> str:
    with pytest.raises(ProfileFileError) as info:
        jupyter_memprof.load(path)
    text = str(info.value)
    assert "\n" not in text and len(text) < 400
    return text


CRAFTED = [
    (b"not json", "snapshot.json is not JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1, 2]", "is list, not a snapshot"),
    (b'{"segments": {"a": 1}}', "segments that are not a list of objects"),
    (b'{"segments": [{"blocks": [{"size": "big"}]}]}', "block whose size is not an integer"),
    (b'{"device_traces": [[{"action": 3}]]}', "action is not text"),
    (b'{"device_traces": [[{"addr": 1.5}]]}', "addr is not an integer"),
    (b'{"x": ' + b"[" * 40 + b"]" * 40 + b"}", "nests deeper than 16"),
    (b'{"x": ' + b"[" * 100000 + b"]" * 100000 + b"}", "snapshot.json"),
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_crafted_snapshot_member_is_one_line(oom_profile, tmp_path, fmt):
    oom_profile.snapshot = None
    for i, (data, expected) in enumerate(CRAFTED):
        saved = oom_profile.save(tmp_path / f"p{i}.{fmt}", format=fmt)
        path = _with_member(saved, tmp_path, fmt, data, f"c{i}.zip")
        assert expected in _refused(path), data[:40]


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_oversized_snapshot_is_one_line(oom_profile, tmp_path, monkeypatch, fmt):
    path = _save(oom_profile, tmp_path, fmt)
    monkeypatch.setattr(snapshot_store, "MAX_SNAPSHOT_BYTES", 64)
    assert "a snapshot may hold" in _refused(path)
    monkeypatch.setattr(snapshot_store, "MAX_SNAPSHOT_BYTES", 1 << 20)
    monkeypatch.setattr(snapshot_store, "MAX_SNAPSHOT_VALUES", 10)
    assert "JSON values" in _refused(path)


def test_a_zip_snapshot_counts_in_the_files_size_budget(oom_profile, tmp_path):
    """A snapshot member that inflates past the zip's size rule is refused before it is
    decompressed."""
    path = _with_member(
        _save(oom_profile, tmp_path, "zip"),
        tmp_path,
        "zip",
        b'{"segments": [], "pad": "' + b" " * (40 << 20) + b'"}',
        "bomb.zip",
    )
    assert os.path.getsize(path) < 1 << 20
    assert "refusing to decompress" in _refused(path)


# -- written where asked: profile(snapshot=PATH), %%memprofile --snapshot PATH -------------
@pytest.fixture
def fake_allocator(monkeypatch):
    monkeypatch.setattr(cuda_history, "check_devices", lambda devices: None)
    monkeypatch.setattr(cuda_history, "RECORD", lambda enabled: None)
    monkeypatch.setattr(cuda_history, "TAKE", lambda: OOM_SNAPSHOT)


def test_profile_writes_the_snapshot_at_an_oom(fake_allocator, tmp_path):
    target = tmp_path / "oom.pickle"
    with pytest.raises(torch.OutOfMemoryError):
        with jupyter_memprof.profile(device="cpu", snapshot=target, namespace={}) as prof:
            torch.ones(64)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert prof.meta["snapshot_path"] == str(target)
    data = read_pickle(target)  # the no-globals unpickler
    assert data == OOM_SNAPSHOT  # tuples stay tuples, as torch's own _dump_snapshot writes
    assert [e["action"] for e in data["device_traces"][0]] == ["alloc", "oom"]
    assert not [n for n in os.listdir(tmp_path) if n != "oom.pickle"]  # no temporary left
    back = jupyter_memprof.load(prof.save(tmp_path / "p.zip"))
    assert back.meta["snapshot_path"] == str(target)
    with jupyter_memprof.profile(device="cpu", snapshot=str(target), namespace={}):
        torch.ones(8)  # a snapshot there is replaced
    assert read_pickle(target) == OOM_SNAPSHOT


def test_profile_checks_the_path_before_anything_runs(fake_allocator, tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    for target, expected in (
        (mine, "exists"),
        (tmp_path / "none" / "s.pickle", "does not exist"),
        (tmp_path, "folder"),
    ):
        with pytest.raises(CaptureError) as info:
            jupyter_memprof.profile(device="cpu", snapshot=target)
        text = str(info.value)
        assert "\n" not in text and expected in text and text.startswith("snapshot=")
    assert mine.read_text() == "mine"


def test_profile_snapshot_path_on_the_cpu_is_the_same_line(tmp_path):
    with pytest.raises(CaptureError) as info:
        jupyter_memprof.profile(device="cpu", snapshot=tmp_path / "s.pickle")
    text = str(info.value)
    assert "\n" not in text and "records no CUDA device" in text
    assert not os.listdir(tmp_path)


def test_magic_snapshot_path(shell, run, fake_allocator, tmp_path):
    target = tmp_path / "cell.pickle"
    result, _ = run(
        f"%%memprofile --no-display --device cpu --snapshot {target} -o p_snap\n"
        "x_snap_path = torch.ones(16)"
    )
    assert result.error_in_exec is None
    assert shell.user_ns["p_snap"].meta["snapshot_path"] == str(target)
    assert read_pickle(target) == OOM_SNAPSHOT
    # the line magic: the word after --snapshot is the statement, --snapshot=PATH a path
    line = tmp_path / "line.pickle"
    result, _ = run(f"%memprofile --no-display --device cpu --snapshot={line} y_snap = 1")
    assert result.error_in_exec is None and shell.user_ns["y_snap"] == 1
    assert read_pickle(line) == OOM_SNAPSHOT
    result, _ = run("%memprofile --no-display --device cpu --snapshot z_snap = 2")
    assert result.error_in_exec is None and shell.user_ns["z_snap"] == 2


def test_magic_snapshot_path_is_checked_before_the_cell(shell, run, tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    result, out = run(f"%%memprofile --no-display --device cpu --snapshot {mine}\nw_snap = 1")
    assert isinstance(result.error_in_exec, UsageError)
    assert out.strip().splitlines()[-1].startswith("UsageError: snapshot=")
    assert "w_snap" not in shell.user_ns and mine.read_text() == "mine"
    result, out = run(
        f"%%memprofile --no-display --device cpu --snapshot {tmp_path / 's.pickle'}\nw_snap = 1"
    )
    assert isinstance(result.error_in_exec, UsageError)
    assert out.strip().splitlines()[-1].startswith("UsageError: snapshot=True records CUDA")
    assert "w_snap" not in shell.user_ns and not (tmp_path / "s.pickle").exists()
