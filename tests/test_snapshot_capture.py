"""profile(..., snapshot=True): CUDA's allocator history recorded with a capture. No GPU
here: the CPU refusal is real; the out-of-memory path runs a real CPU capture with the
allocator's two calls (record on/off, take the snapshot) replaced by fakes that return what
``torch.cuda.memory._snapshot()`` returns at an out-of-memory error."""

import pytest
import torch
from IPython.core.error import UsageError

import jupyter_memprof
from jupyter_memprof import CaptureError
from jupyter_memprof._producers import cuda_history

MiB = 1 << 20

#: what the allocator's snapshot holds after a failed request of 2 GiB on cuda:0: one
#: segment of 20 MiB with 12 MiB in use and two free blocks (6 and 2 MiB)
OOM_SNAPSHOT = {
    "segments": [
        {"device": 0, "address": 1 << 40, "total_size": 20 * MiB, "allocated_size": 12 * MiB,
         "active_size": 12 * MiB, "requested_size": 12 * MiB, "stream": 0,
         "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
         "frames": [],
         "blocks": [
             {"address": 1 << 40, "size": 12 * MiB, "requested_size": 12 * MiB,
              "state": "active_allocated", "frames": []},
             {"address": (1 << 40) + 12 * MiB, "size": 6 * MiB, "requested_size": 0,
              "state": "inactive", "frames": []},
             {"address": (1 << 40) + 18 * MiB, "size": 2 * MiB, "requested_size": 0,
              "state": "inactive", "frames": []},
         ]},
    ],
    "device_traces": [[
        {"action": "alloc", "addr": 1 << 40, "size": 12 * MiB, "stream": 0, "time_us": 1,
         "frames": []},
        {"action": "oom", "size": 2 << 30, "device_free": 3 * MiB, "stream": 0, "time_us": 2,
         "frames": []},
    ]],
}  # fmt: skip


def test_cpu_capture_refuses_in_one_line():
    with pytest.raises(CaptureError) as info:
        jupyter_memprof.profile(device="cpu", snapshot=True)
    text = str(info.value)
    assert "\n" not in text and "no CUDA device" in text
    with jupyter_memprof.profile(device="cpu") as prof:  # nothing was left running
        torch.ones(4)
    assert prof.snapshot is None


@pytest.fixture
def fake_allocator(monkeypatch):
    calls: list = []
    monkeypatch.setattr(cuda_history, "check_devices", lambda devices: None)
    monkeypatch.setattr(cuda_history, "RECORD", calls.append)
    monkeypatch.setattr(cuda_history, "TAKE", lambda: OOM_SNAPSHOT)
    return calls


def test_an_out_of_memory_error_keeps_the_profile_and_the_snapshot(fake_allocator, tmp_path):
    ns: dict = {}
    with pytest.raises(torch.OutOfMemoryError):
        with jupyter_memprof.profile(device="cpu", snapshot=True, namespace=ns) as prof:
            ns["kept"] = torch.ones(1024, 256)  # 1 MiB made before the failure
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert fake_allocator == ["all", None]  # recorded, then turned off
    assert prof.snapshot is OOM_SNAPSHOT
    assert prof.meta["error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert prof.peak("cpu").attrs["peak_bytes"] >= MiB  # the profile up to that point
    assert prof.meta["snapshot_oom"] == {
        "device": "cuda:0", "requested": 2 << 30, "device_free": 3 * MiB,
        "free_bytes": 8 * MiB, "free_blocks": 2, "segments": 1, "largest_free": 6 * MiB,
    }  # fmt: skip
    text = repr(prof)
    assert (
        "out of memory on cuda:0: the request of 2.0 GiB failed: 8.0 MiB free in 1 segments "
        "(2 free blocks), the largest free block 6.0 MiB" in text
    )
    assert "the request of 2.0 GiB failed" in prof._repr_html_()
    back = jupyter_memprof.load(prof.save(tmp_path / "oom.zip"))  # its meta passes the checks
    assert back.meta["snapshot_oom"] == prof.meta["snapshot_oom"]


def test_a_failing_snapshot_keeps_the_capture(fake_allocator, monkeypatch):
    def broken():
        raise RuntimeError("snapshot failed")

    monkeypatch.setattr(cuda_history, "TAKE", broken)
    with jupyter_memprof.profile(device="cpu", snapshot=True, namespace={}) as prof:
        torch.ones(8)
    assert fake_allocator == ["all", None]
    assert prof.snapshot is None
    assert prof.meta["snapshot_error"] == "RuntimeError: snapshot failed"
    assert "snapshot_oom" not in prof.meta


def test_oom_picture_without_an_oom():
    assert cuda_history.oom_picture(None) is None
    assert cuda_history.oom_picture({"segments": [], "device_traces": [[]]}) is None


def test_magic_snapshot_option(shell, run):
    result, out = run("%%memprofile --no-display --device cpu --snapshot\nx_snap = torch.ones(4)")
    assert isinstance(result.error_in_exec, UsageError)
    assert out.strip().splitlines()[-1].startswith("UsageError: snapshot=True records CUDA")
    assert "x_snap" not in shell.user_ns  # nothing ran
    result, out = run("%%memprofile --no-display --estimate --snapshot\nx_snap = 1")
    assert isinstance(result.error_in_exec, UsageError) and "not --estimate" in out
    assert "--snapshot" in shell.find_cell_magic("memprofile").__doc__


def test_magic_snapshot_at_an_oom(shell, run, fake_allocator):
    result, _ = run(
        "%%memprofile --no-display --device cpu --snapshot -o p_oom\n"
        "kept_oom = torch.ones(1024, 256)\n"
        "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')"
    )
    assert isinstance(result.error_in_exec, torch.OutOfMemoryError)
    prof = shell.user_ns["p_oom"]
    assert prof.snapshot is OOM_SNAPSHOT and prof.meta["snapshot_oom"]["requested"] == 2 << 30


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_cuda_capture_takes_its_reserved_memory_from_the_recorded_segments():
    """On a GPU: the segments come from the allocator's own history (recorded, not
    modelled), and the reserved peak is what torch says it was."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU()).cuda()
    x = torch.randn(512, 1024, device="cuda:0")
    with jupyter_memprof.profile(device="cuda:0", snapshot=True) as prof:
        model(x).sum().backward()
        torch.cuda.synchronize()
    assert "snapshot_segments_error" not in prof.meta
    assert prof.meta["snapshot_segments"]["cuda:0"] > 0
    assert set(prof.segments["source"].astype(str)) == {"recorded"}
    reserved = prof.meta["reserved_peak_bytes"]["cuda:0"]
    assert reserved == torch.cuda.max_memory_reserved(0)
