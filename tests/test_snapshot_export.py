"""Profile.to_snapshot: the torch memory snapshot written from a profile, read by torch's
own readers (``torch.cuda._memory_viz``) and by a pickle reader that refuses every global."""

import io
import pickle
import pickletools

import pytest
import torch.cuda._memory_viz as mv

import jupyter_memprof
from jupyter_memprof._io import WriteRefused
from jupyter_memprof._views.snapshot_export import SEGMENT_GAP, _segments, device_indexes

# the opcodes memory_viz's JavaScript unpickler accepts (see snapshot-facts.md)
MEMORY_VIZ_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT",
    "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SETITEM", "SETITEMS", "APPEND",
    "APPENDS", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "BININT",
    "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "NONE",
    "NEWTRUE", "NEWFALSE",
}  # fmt: skip


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def _read(path):
    with open(path, "rb") as fh:
        return _NoGlobals(fh).load()


def _replay(entries):
    """Live bytes after each entry, and the live entries at the highest total."""
    live, total, best, at_best = {}, 0, 0, {}
    for e in entries:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
        elif e["action"] == "free_completed":
            total -= live.pop(e["addr"])["size"]
        if total > best:
            best, at_best = total, dict(live)
    return best, at_best, live


@pytest.fixture(scope="module")
def written(mlp_adam_profile, tmp_path_factory):
    prof, _ = mlp_adam_profile
    path = prof.to_snapshot(tmp_path_factory.mktemp("snap") / "step.pickle")
    return prof, path, _read(path)


def test_plain_data_at_protocol_4(written):
    _, path, data = written
    with open(path, "rb") as fh:
        raw = fh.read()
    assert raw[:2] == b"\x80\x04"
    ops = {op.name for op, _, _ in pickletools.genops(io.BytesIO(raw))}
    assert ops <= MEMORY_VIZ_OPCODES, ops - MEMORY_VIZ_OPCODES
    assert set(data) == {"segments", "device_traces", "jupyter_memprof"}
    assert data["jupyter_memprof"]["devices"] == ["cpu"]


def test_torchs_readers_accept_it(written):
    _, _, data = written
    summary = mv.segsum(data)  # asserts every segment's blocks fill it
    assert f"segments: {len(data['segments'])}" in summary
    text = mv.trace(data)
    assert text.startswith("Device 0 ----------------")
    assert "# free completed for" in text
    for html in (mv.trace_plot(data), mv.segment_plot(data)):
        assert "snapshot.pickle" in html


def test_entries_add_up_to_the_peak(written):
    prof, _, data = written
    (entries,) = data["device_traces"]
    peak = prof.peak("cpu")
    best, at_best, end = _replay(entries)
    assert best == peak.attrs["peak_bytes"]
    by_cat: dict[str, int] = {}
    for e in at_best.values():
        by_cat[e["category"]] = by_cat.get(e["category"], 0) + e["size"]
    assert by_cat == prof.peak_by("category", device="cpu").to_dict()
    # the blocks alive at the end are the segments' active blocks, at their addresses
    active = {
        b["address"]: b["size"]
        for s in data["segments"]
        for b in s["blocks"]
        if b["state"] == "active_allocated"
    }
    assert active == {a: e["size"] for a, e in end.items()}


def test_entry_fields_and_frames(written):
    prof, _, data = written
    (entries,) = data["device_traces"]
    assert all({"action", "addr", "size", "stream", "time_us", "frames"} <= set(e) for e in entries)
    allocs = [e for e in entries if e["action"] == "alloc"]
    assert all("category" in e for e in allocs)
    assert sum(e["action"] == "free_requested" for e in entries) == sum(
        e["action"] == "free_completed" for e in entries
    )
    times = [e["time_us"] for e in entries]
    assert times == sorted(times)
    # the largest activation, relu's output: clamp_min inside aten::relu inside the model,
    # called from MLP.forward in the conftest
    al = prof.allocations
    block = al[al["category"].astype(str) == "activation"].sort_values("size_bytes").iloc[-1]
    entry = next(
        e for e in allocs if e["addr"] == block["ptr"] and e["size"] == block["size_bytes"]
    )
    names = [f["name"] for f in entry["frames"]]
    op = prof.ops.set_index("op_id").loc[int(block["alloc_op_id"])]
    assert names[0] == op["name"]
    assert names == ["aten::clamp_min", "aten::relu", "nn.Module: MLP", "forward"]
    assert entry["frames"][-1]["filename"].endswith("conftest.py")
    assert entry["frames"][-1]["line"] > 0
    assert entry["category"] == "activation"


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_estimate_writes_a_snapshot(tmp_path, device):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)

    def step(model, x):
        model(x).sum().backward()

    est = jupyter_memprof.estimate(step, model, x, device=device)
    data = _read(est.to_snapshot(tmp_path / "est.pickle"))
    assert device in est.devices
    dev = device
    index = data["jupyter_memprof"]["devices"].index(dev)
    assert index == 0  # cuda:0 at its index; the CPU alone at 0 too
    best, _, _ = _replay(data["device_traces"][index])
    assert best == est.peak(dev).attrs["peak_bytes"]
    mv.segsum(data)
    mv.trace(data)


def test_empty_profile(tmp_path):
    data = _read(jupyter_memprof.Profile.empty().to_snapshot(tmp_path / "e.pickle"))
    assert data["segments"] == [] and data["device_traces"] == []
    assert "segments: 0" in mv.segsum(data)


def test_replaces_only_snapshots(written, tmp_path):
    prof, _, _ = written
    target = tmp_path / "notes.pickle"
    target.write_bytes(b"my own notes")
    with pytest.raises(WriteRefused):
        prof.to_snapshot(target)
    assert target.read_bytes() == b"my own notes"
    prof.to_snapshot(target, overwrite=True)
    prof.to_snapshot(target)  # a snapshot is replaced without asking
    assert _read(target)["device_traces"]


def test_device_indexes_put_the_cpu_after_cuda():
    assert device_indexes(["cpu"]) == {"cpu": 0}
    assert device_indexes(["cuda:1", "cpu", "cuda:0"]) == {"cuda:0": 0, "cuda:1": 1, "cpu": 2}
    assert device_indexes(["cuda:2", "cpu"]) == {"cuda:2": 2, "cpu": 3}


def test_segments_cut_at_gaps_and_overlaps():
    def e(addr, size):
        return {"addr": addr, "size": size, "frames": [], "category": "activation"}

    live = {1: e(0, 100), 2: e(164, 36), 3: e(164 + SEGMENT_GAP + 100, 8), 4: e(170, 10)}
    segs = _segments(live, {1: 0, 2: 0, 3: 0, 4: 0})
    assert [(s["address"], s["total_size"], s["allocated_size"]) for s in segs] == [
        (0, 200, 136),
        (170, 10, 10),
        (164 + SEGMENT_GAP + 100, 8, 8),
    ]
    assert [b["state"] for b in segs[0]["blocks"]] == [
        "active_allocated", "inactive", "active_allocated",
    ]  # fmt: skip
    mv.segsum({"segments": segs})


def test_load_snapshot_reads_it_back_to_the_same_peak_and_categories(written):
    prof, path, _ = written
    back = jupyter_memprof.load_snapshot(path)
    assert back.devices == prof.devices == ["cpu"]  # named by the file, not cuda:0
    assert back.peak().attrs["peak_bytes"] == prof.peak().attrs["peak_bytes"] == 227_776
    assert back.peak_by("category").to_dict() == prof.peak_by("category").to_dict()
    assert back.allocations["size_bytes"].sum() == prof.allocations["size_bytes"].sum()
    assert back.segments.empty  # drawn from the blocks when written: nothing was recorded
    assert "reserved_peak_bytes" not in back.meta or "cpu" not in back.meta["reserved_peak_bytes"]
    reasons = back.allocations["reason"].dropna().unique().tolist()
    assert reasons == ["the category the file records"]
    assert jupyter_memprof.load(path).peak().attrs["peak_bytes"] == 227_776


@pytest.mark.parametrize("device", ["cuda:0", "cuda:1"])
def test_an_estimates_snapshot_reads_back_on_its_device(tmp_path, device):
    import torch

    model = torch.nn.Linear(256, 512)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x):
        model(x).sum().backward()
        opt.step()

    est = jupyter_memprof.estimate(step, model, opt, torch.randn(32, 256), device=device)
    back = jupyter_memprof.load_snapshot(est.to_snapshot(tmp_path / "est.pickle"))
    assert device in back.devices
    peak, got = est.peak(device).attrs["peak_bytes"], back.peak(device).attrs["peak_bytes"]
    assert got == peak
    assert (
        back.peak_by("category", device=device).to_dict()
        == est.peak_by("category", device=device).to_dict()
    )
