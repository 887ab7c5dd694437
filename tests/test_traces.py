"""load_trace / load() on Chrome traces torch's profiler writes with profile_memory=True,
written in this test run (CPU): the same peak and categories as a capture of the same code,
steps, callsites, rank folders, gzip, and hostile files (one ProfileFileError line each)."""

import gzip
import json
import os

import pandas as pd
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

import jupyter_memprof
from jupyter_memprof import ProfileFileError
from jupyter_memprof._producers.kineto import source


def train(ns: dict, steps: int = 2, on_step=None) -> None:
    """Build a small MLP, Adam and a batch, and run ``steps`` training steps (all inside
    the profiled code, so a CPU trace sees every block: it misses blocks older than itself)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    ns.update(model=model, opt=opt, x=x, y=y)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if on_step is not None:
            on_step()


def _torch_profile(**kw):
    return profile(activities=[ProfilerActivity.CPU], profile_memory=True, **kw)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A capture of ``train`` and a trace of the same code, written by export_chrome_trace."""
    ns: dict = {}
    with jupyter_memprof.profile(namespace=ns) as cap:
        train(ns)
    kept: dict = {}
    with _torch_profile(with_stack=True, record_shapes=True) as p:
        train(kept)
    path = str(tmp_path_factory.mktemp("trace") / "step.pt.trace.json")
    p.export_chrome_trace(path)
    return cap, path


@pytest.fixture(scope="module")
def loaded(pair):
    return jupyter_memprof.load_trace(pair[1])


def test_same_peak_and_categories_as_a_capture(pair, loaded):
    cap, _ = pair
    assert loaded.devices == ["cpu"]
    peak = loaded.peak("cpu").attrs["peak_bytes"]
    assert peak == cap.peak("cpu").attrs["peak_bytes"]
    ours, theirs = loaded.peak_by("category", "cpu"), cap.peak_by("category", "cpu")
    same = sum(min(ours.get(c, 0), b) for c, b in theirs.items())
    assert same >= 0.9 * peak
    assert ours.get("unknown", 0) <= 0.05 * peak
    # the parameters, gradients and Adam's state of the model: 38440 bytes each, Adam twice
    params = sum(p.numel() * 4 for p in torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.Linear(128, 10)).parameters())  # fmt: skip
    assert ours["parameter"] == ours["gradient"] == params == 38440
    assert ours["optimizer_state"] == 2 * params + 4 * 4  # exp_avg, exp_avg_sq, 4 steps


def test_meta_says_there_are_no_tensor_ids(loaded):
    assert loaded.meta["tensor_ids"] is False
    assert loaded.meta["trace"]["oom_events"] == []
    assert loaded.meta["trace"]["with_stack"] == 1
    assert loaded.meta["label"] == "step"
    assert "no tensor ids in this file" in repr(loaded)
    assert "no tensor ids in this file" in loaded._repr_html_()
    assert loaded.allocations["tensor_id"].isna().all()


def test_ops_phases_and_callsites(loaded):
    ops = loaded.ops
    phase = dict(zip(ops["name"].astype(str), ops["phase"].astype(str)))
    assert phase["aten::addmm"] == "forward"
    assert phase["autograd::engine::evaluate_function: AddmmBackward0"] == "backward"
    assert phase["Optimizer.step#Adam.step"] == "optimizer"
    # the gradient of the first layer's weight: made by mm in AddmmBackward0, in train()
    grads = loaded.allocations[loaded.allocations["category"].astype(str) == "gradient"]
    big = grads.sort_values("size_bytes").iloc[-1]
    op = ops.set_index("op_id").loc[int(big["alloc_op_id"])]
    assert big["size_bytes"] == 128 * 64 * 4 and op["name"] == "aten::mm"
    assert op["phase"] == "backward"
    assert op["callsite"].endswith(
        "test_traces.py:" + str(train.__code__.co_firstlineno) + " in train"
    )
    # module calls from the Python tracer: the two Linear layers and the ReLU, each step
    mods = ops[ops["kind"].astype(str) == "module"]
    assert {"Linear_0", "Linear_1", "ReLU_0"} <= set(mods["module"].astype(str))
    flows = loaded.flows
    assert len(flows) > 0  # forward ops linked with their backward nodes by sequence number


def test_load_recognises_traces_by_content(pair, loaded, tmp_path):
    _, path = pair
    renamed = tmp_path / "no-suffix"
    renamed.write_bytes(open(path, "rb").read())
    prof = jupyter_memprof.load(renamed)
    assert prof.meta["tensor_ids"] is False
    assert prof.peak().attrs["peak_bytes"] == loaded.peak().attrs["peak_bytes"]
    # a loaded trace saves and loads as any profile (its meta checked)
    back = jupyter_memprof.load(prof.save(tmp_path / "saved.zip"))
    assert back.meta["trace"] == prof.meta["trace"]
    assert back.peak_by().to_dict() == prof.peak_by().to_dict()


def test_our_own_chrome_export_is_told_apart(loaded, tmp_path):
    path = loaded.export(tmp_path / "ours.trace.json")
    with pytest.raises(ProfileFileError, match="jupyter_memprof exported"):
        jupyter_memprof.load(path)


def test_to_snapshot_of_a_trace(loaded, tmp_path):
    import pickle

    import torch.cuda._memory_viz as mv

    with open(loaded.to_snapshot(tmp_path / "t.pickle"), "rb") as fh:
        data = pickle.load(fh)
    mv.segsum(data)
    live = best = 0
    for e in data["device_traces"][0]:
        live += (
            e["size"]
            if e["action"] == "alloc"
            else -e["size"]
            if e["action"] == "free_completed"
            else 0
        )
        best = max(best, live)
    assert best == loaded.peak().attrs["peak_bytes"]


@pytest.fixture(scope="module")
def handler_traces(tmp_path_factory):
    """Two "ranks" written by tensorboard_trace_handler (gzip), two active steps each."""
    folder = tmp_path_factory.mktemp("tb")
    for rank in (0, 1):
        with _torch_profile(
            schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
            on_trace_ready=tensorboard_trace_handler(
                str(folder), worker_name=f"rank{rank}", use_gzip=True
            ),
        ) as p:
            train({}, steps=3, on_step=p.step)
    return folder


def test_tensorboard_handler_gzip_and_steps(handler_traces):
    files = sorted(os.listdir(handler_traces))
    assert len(files) == 2 and all(f.endswith(".pt.trace.json.gz") for f in files)
    prof = jupyter_memprof.load(handler_traces / files[0])
    names = set(prof.ops["name"].astype(str))
    assert {"ProfilerStep#1", "ProfilerStep#2"} <= names
    assert prof.steps["step"].tolist() == [0, 1]  # one row per ProfilerStep
    assert prof.meta["rank"] == 0


def test_load_many_on_a_folder_of_rank_traces(handler_traces):
    ranks = jupyter_memprof.load_many(handler_traces, panel=False)
    assert type(ranks).__name__ == "ProfileSet"
    assert ranks.ranks == [0, 1]
    peaks = [p.peak().attrs["peak_bytes"] for p in ranks.profiles]
    assert peaks[0] == peaks[1] > 0


def test_rank_from_distributed_info(pair, tmp_path):
    _, path = pair
    doc = json.load(open(path))
    doc["distributedInfo"] = {"backend": "gloo", "rank": 3, "world_size": 4}
    target = tmp_path / "worker.json"
    target.write_text(json.dumps(doc))
    prof = jupyter_memprof.load_trace(target)
    assert (prof.meta["rank"], prof.meta["world_size"]) == (3, 4)


# -- CUDA fields, out of memory, frees of older blocks: a trace written by hand ------------
def _mem(ts, addr, size, total, reserved, dev=1, name="[memory]"):
    args = {"Device Type": dev, "Device Id": 0, "Bytes": size, "Total Allocated": total,
            "Total Reserved": reserved, "Ev Idx": 0}  # fmt: skip
    if addr is not None:
        args["Addr"] = addr
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": name, "pid": 1,
            "tid": 7, "ts": ts, "args": args}  # fmt: skip


def _op(name, ts, dur, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 7, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def _write(path, events, **top):
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 0, **top}))
    return path


def test_cuda_totals_older_blocks_and_out_of_memory(tmp_path):
    events = [
        _op("ProfilerStep#4", 10.0, 100.0, cat="user_annotation"),
        _op("aten::empty", 11.0, 5.0),
        _mem(12.0, 4096, 1024, 1024 + 5000, 2 << 20),
        _op("aten::add", 20.0, 5.0),
        _mem(21.0, 8192, 512, 1536 + 5000, 2 << 20),
        _mem(22.0, 999, -5000, 1536, 2 << 20),  # older than the trace
        _mem(30.0, 8192, -512, 1024, 2 << 20),
        _mem(40.0, None, 1 << 40, 1024, 2 << 20, name="[OutOfMemory]"),
    ]
    prof = jupyter_memprof.load_trace(_write(tmp_path / "cuda.json", events))
    assert prof.devices == ["cuda:0"]
    (oom,) = prof.meta["trace"]["oom_events"]
    assert oom["bytes"] == 1 << 40 and oom["device"] == "cuda:0"
    assert "1 out-of-memory event recorded" in repr(prof)
    al = prof.allocations.set_index("ptr")
    assert al.loc[4096, "size_bytes"] == 1024 and pd.isna(al.loc[4096, "free_ns"])
    assert al.loc[999, "size_bytes"] == 5000  # the older block, known from its free
    assert prof.peak("cuda:0").attrs["peak_bytes"] == 1536 + 5000
    assert int(prof.events["reserved_bytes"].max()) == 2 << 20
    aten = prof.ops.set_index("op_id")
    assert aten.loc[int(al.loc[8192, "alloc_op_id"]), "name"] == "aten::add"
    assert prof.steps["step"].tolist() == [0]


# -- hostile files ----------------------------------------------------------------------
def _refused(path) -> str:
    with pytest.raises(ProfileFileError) as info:
        jupyter_memprof.load_trace(path)
    text = str(info.value)
    assert "\n" not in text and len(text) < 400
    return text


def test_hostile_traces_are_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": [' + "[" * 100000 + "]" * 100000 + "]}")
    assert "nested too deeply" in _refused(deep) or "not an object" in _refused(deep)
    huge = tmp_path / "huge.json"
    huge.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1' + "0" * 5000 + "}]}")
    assert "not JSON" in _refused(huge)
    big_addr = _mem(1.0, 1 << 70, 16, 16, 0)
    assert "Addr" in _refused(_write(tmp_path / "addr.json", [big_addr]))
    text = '{"traceEvents": [{"ph": "i", "name": "[memory]", "ts": Infinity, "args": {}}]}'
    (tmp_path / "inf.json").write_text(text)
    assert "ts" in _refused(tmp_path / "inf.json")
    wrong = [_op("aten::add", "soon", 1.0)]
    assert "ts" in _refused(_write(tmp_path / "wrong.json", wrong))
    assert "name" in _refused(_write(tmp_path / "name.json", [_op(["x"], 1.0, 1.0)]))
    (tmp_path / "obj.json").write_text('{"traceEvents": {"ph": "X"}}')
    assert "not a trace" in _refused(tmp_path / "obj.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    assert "not an object" in _refused(tmp_path / "list.json")
    (tmp_path / "text.json").write_text("not json at all")
    assert "not JSON" in _refused(tmp_path / "text.json")
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}')[:-6])
    assert "not a readable trace" in _refused(tmp_path / "cut.json.gz")
    assert "folder" in _refused(tmp_path)
    no_memory = [_op("aten::add", 1.0, 1.0)]
    assert "profile_memory=True" in _refused(_write(tmp_path / "nomem.json", no_memory))


def test_ops_that_touch_are_siblings(tmp_path):
    events = [
        _op("aten::a", 10.0, 0.5),
        _op("aten::b", 10.5, 0.5),  # starts where a ends
        _op("aten::c", 10.5, 0.2),  # inside b
        _mem(10.5, 64, 16, 16, 0, 0),  # at a's last instant and b's first: b's (c's)
    ]
    prof = jupyter_memprof.load_trace(_write(tmp_path / "touch.json", events))
    ops = prof.ops.set_index("name")
    assert pd.isna(ops.loc["aten::b", "parent_id"])
    assert ops.loc["aten::c", "parent_id"] == ops.loc["aten::b", "op_id"]
    assert prof.allocations["alloc_op_id"].tolist() == [ops.loc["aten::c", "op_id"]]


def test_odd_input_dims_are_left_out(tmp_path):
    deep = [[1, 2], [[3], [4]], [[[5]]], [1 << 70], "x"]
    events = [_op("aten::cat", 1.0, 5.0, **{"Input Dims": deep}), _mem(2.0, 64, 16, 16, 0, 0)]
    prof = jupyter_memprof.load_trace(_write(tmp_path / "dims.json", events))
    assert prof.ops["input_shapes"].tolist() == [[[1, 2], [[3], [4]], [], [], []]]


def test_gzip_bomb_stops_at_the_cap(tmp_path, monkeypatch):
    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb") as fh:
        fh.write(b'{"traceEvents": [' + b" " * (8 << 20) + b"]}")
    assert bomb.stat().st_size < 64 << 10
    monkeypatch.setattr(source, "MAX_JSON_BYTES", 1 << 20)
    assert "decompresses to over" in _refused(bomb)


def test_a_trace_written_as_a_snapshot_loads_back_to_the_same_peak(loaded, tmp_path):
    back = jupyter_memprof.load_snapshot(loaded.to_snapshot(tmp_path / "trace.pickle"))
    assert back.peak().attrs["peak_bytes"] == loaded.peak().attrs["peak_bytes"]
    assert back.devices == loaded.devices == ["cpu"]
    # the category each entry records is read back
    assert back.peak_by("category").to_dict() == loaded.peak_by("category").to_dict()
    assert back.allocations["size_bytes"].sum() == loaded.allocations["size_bytes"].sum()
