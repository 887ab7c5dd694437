"""Capture and the tables: exact facts on tiny real programs."""

import gc
import os

import pandas as pd
import pytest
import torch

import jupyter_memprof
from jupyter_memprof._analysis import schema as S
from jupyter_memprof._errors import CaptureError

THIS_FILE = os.path.basename(__file__)


def _dtypes(schema):
    return {c: str(S.empty(schema)[c].dtype) for c in schema}


def test_empty_block_gives_empty_typed_tables():
    gc.collect()  # no stray frees of earlier tests' tensors inside the capture
    with jupyter_memprof.profile() as prof:
        pass
    for name, schema in S.TABLES.items():
        df = getattr(prof, name)
        assert df.empty, name
        assert list(df.columns) == list(schema), name
        assert {c: str(df[c].dtype) for c in df.columns} == _dtypes(schema), name


def test_torch_empty_is_one_4000_byte_block_freed_when_it_dies():
    gc.collect()  # no stray frees of earlier tests' tensors inside the capture
    with jupyter_memprof.profile() as prof:
        t = torch.empty(1000)
        del t
    a = prof.allocations
    assert len(a) == 1
    block = a.iloc[0]
    assert block.size_bytes == 4000
    assert block.device == "cpu"
    assert prof.ops.set_index("op_id").loc[block.alloc_op_id, "name"] == "aten::empty"
    assert pd.notna(block.free_ns) and block.free_ns >= block.alloc_ns
    assert pd.isna(block.free_op_id) or block.free_op_id >= 0
    assert block.category == "temporary"
    actions = prof.events["action"].astype(str).tolist()
    assert actions == ["create", "destroy"]
    assert prof.timeline["bytes"].tolist() == [4000, 0]


def test_inplace_add_bumps_the_version_and_names_the_op():
    gc.collect()  # no stray frees of earlier tests' tensors inside the capture
    with jupyter_memprof.profile() as prof:
        t = torch.zeros(100)
        t.add_(1)
    ops = prof.ops.set_index("op_id")
    block = prof.allocations.query("size_bytes == 400").iloc[0]
    v = prof.versions[prof.versions["alloc_id"] == block.alloc_id]
    assert v["version"].tolist() == [0, 1]
    assert ops.loc[v.iloc[1].op_id, "name"] == "aten::add_"
    assert ops.loc[v.iloc[0].op_id, "name"] in ("aten::zeros", "aten::empty")
    assert (v["alloc_id"] == v["alloc_id"].iloc[0]).all()
    ev = prof.events[prof.events["alloc_id"] == block.alloc_id]
    assert ev["action"].astype(str).tolist() == ["create", "increment_version"]


def test_a_view_adds_no_block_and_writes_through_it_bump_the_base():
    gc.collect()  # no stray frees of earlier tests' tensors inside the capture
    with jupyter_memprof.profile() as prof:
        t = torch.zeros(100)
        view = t[10:20]
        view.mul_(2)
    assert len(prof.allocations.query("size_bytes == 400")) == 1
    assert prof.allocations["size_bytes"].max() == 400
    mut = prof.versions[prof.versions.version > 0]
    assert len(mut) == 1
    assert prof.ops.set_index("op_id").loc[mut.iloc[0].op_id, "name"] == "aten::mul_"


def test_backward_op_is_linked_to_the_forward_op_that_made_its_node():
    w = torch.randn(50, requires_grad=True)
    gc.collect()  # no stray frees of earlier tests' tensors inside the capture
    with jupyter_memprof.profile() as prof:
        y = (w * 3.0).sum()
        y.backward()
    ops = prof.ops.set_index("op_id")
    pairs = {
        (ops.loc[f.forward_op_id, "name"], ops.loc[f.backward_op_id, "name"])
        for f in prof.flows.itertuples()
    }
    assert ("aten::mul", "autograd::engine::evaluate_function: MulBackward0") in pairs
    assert ("aten::sum", "autograd::engine::evaluate_function: SumBackward0") in pairs
    mul = prof.flows.merge(prof.ops, left_on="forward_op_id", right_on="op_id").query(
        "name == 'aten::mul'"
    )
    assert (mul["seq_nr_x"] == mul["seq_nr_y"]).all()
    assert ops.loc[mul.forward_op_id.iloc[0], "phase"] == "forward"
    assert ops.loc[mul.backward_op_id.iloc[0], "phase"] == "backward"
    # w's gradient
    grads = prof.allocations.query("category == 'gradient'")
    assert grads["size_bytes"].tolist() == [200]


def test_record_function_label_is_an_annotation_op_enclosing_its_ops():
    gc.collect()  # no stray frees of earlier tests' tensors inside the capture
    with jupyter_memprof.profile() as prof:
        with torch.profiler.record_function("<b>my step</b>"):
            torch.ones(10) * 2
    ops = prof.ops
    ann = ops[ops["name"] == "<b>my step</b>"]
    assert len(ann) == 1 and ann.iloc[0]["kind"] == "annotation"
    inner = ops[ops["name"] == "aten::mul"]
    assert inner.iloc[0]["parent_id"] == ann.iloc[0]["op_id"]
    assert inner.iloc[0]["depth"] == ann.iloc[0]["depth"] + 1


def test_model_step_tables(mlp_adam_profile):
    prof, ns = mlp_adam_profile
    ops, a = prof.ops, prof.allocations
    # modules with dotted paths, ops nested under them
    linear = ops[ops["name"] == "nn.Module: Linear"]
    assert sorted(linear["module"]) == ["model.fc1", "model.fc2"]
    addmm = ops[(ops["name"] == "aten::addmm") & (ops["phase"] == "forward")]
    assert sorted(addmm["module"]) == ["model.fc1", "model.fc2"]
    fc1_addmm = addmm[addmm["module"] == "model.fc1"].iloc[0]
    assert fc1_addmm["flops"] == 2 * 32 * 64 * 128
    assert fc1_addmm["input_shapes"][1] == [32, 64]
    parent = ops.set_index("op_id").loc[fc1_addmm["parent_id"]]
    assert parent["name"] == "aten::linear"
    assert fc1_addmm["callsite"].startswith("conftest.py:")
    # self/total bytes: the fc1 output, 32 x 128 floats
    assert fc1_addmm["self_alloc_bytes"] == 32 * 128 * 4
    assert parent["total_alloc_bytes"] >= fc1_addmm["total_alloc_bytes"]
    # blocks from before the capture (parameters, the batch) have no alloc time
    w = a[a["name"] == "model.fc1.weight"].iloc[0]
    assert pd.isna(w["alloc_ns"]) and w["size_bytes"] == 128 * 64 * 4
    assert a[a["name"] == "x"].iloc[0]["size_bytes"] == 32 * 64 * 4
    # phases
    phases = set(ops["phase"].astype(str))
    assert {"forward", "backward", "optimizer"} <= phases
    assert (
        ops[ops["name"].astype(str).str.startswith("Optimizer.step")]["phase"] == "optimizer"
    ).all()
    # every flow joins a forward op to a backward op
    f = prof.flows.merge(ops[["op_id", "phase"]], left_on="backward_op_id", right_on="op_id")
    assert (f["phase"] == "backward").all() and len(f) >= 4


def test_timeline_agrees_with_allocations(mlp_adam_profile):
    prof, _ = mlp_adam_profile
    a, tl = prof.allocations, prof.timeline
    start = prof.events["time_ns"].min()
    for t in prof.events["time_ns"].drop_duplicates().sample(40, random_state=0, replace=True):
        state = (
            tl[tl["time_ns"] <= t]
            .groupby(["device", "category"], observed=True)["bytes"]
            .last()
            .sum()
        )
        born = a["alloc_ns"].fillna(start) <= t
        alive = born & ~(a["free_ns"].fillna(t + 1) <= t)
        assert state == a.loc[alive, "size_bytes"].sum(), t


def test_raw_blocks_without_tensor_identity_are_kept():
    conv = torch.nn.Conv2d(3, 8, 3)
    x = torch.randn(2, 3, 16, 16)
    with jupyter_memprof.profile(namespace={"conv": conv, "x": x}) as prof:
        conv(x).sum().backward()
    raw = prof.allocations[prof.allocations["tensor_id"].isna()]
    assert len(raw) > 0
    assert raw["size_bytes"].gt(0).all()
    assert (raw["category"] != "unknown").all()


def test_no_stack_capture_still_has_modules_but_no_callsites(mlp_adam_profile):
    _, ns = mlp_adam_profile
    model, x = ns["model"], ns["x"]
    with jupyter_memprof.profile(with_stack=False, namespace=ns) as prof:
        model(x)
    assert prof.ops["callsite"].isna().all()
    assert set(prof.ops.loc[prof.ops["kind"] == "module", "module"]) == {
        "model",
        "model.fc1",
        "model.fc2",
    }


def test_cuda_on_a_machine_without_it_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(CaptureError, match="no CUDA device"):
        jupyter_memprof.profile(device="cuda")
    with pytest.raises(CaptureError, match="unknown device"):
        jupyter_memprof.profile(device="tpu:7x")


def test_a_running_torch_profiler_is_refused_and_left_alone():
    with torch.profiler.profile():
        with pytest.raises(CaptureError, match="already running"):
            with jupyter_memprof.profile():
                pass
    gc.collect()  # no stray frees of earlier tests' tensors inside the capture
    with jupyter_memprof.profile() as prof:
        torch.ones(3)
    assert len(prof.allocations) == 1


def test_exception_keeps_partial_profile_and_stops_the_profiler():
    gc.collect()  # no stray frees of earlier tests' tensors inside the capture
    with pytest.raises(ZeroDivisionError), jupyter_memprof.profile() as prof:
        keep = torch.ones(250)
        raise ZeroDivisionError("division by zero")
    assert prof.meta["error"].startswith("ZeroDivisionError")
    assert prof.allocations["size_bytes"].tolist() == [1000]
    del keep
    from jupyter_memprof._producers.torch_profiler import profiler_running

    assert not profiler_running()


def test_save_and_load_round_trip(tmp_path, mlp_adam_profile):
    prof, _ = mlp_adam_profile
    path = prof.save(tmp_path / "step.memprof")
    back = jupyter_memprof.load(path)
    for name in S.TABLES:
        pd.testing.assert_frame_equal(
            getattr(back, name), getattr(prof, name), check_categorical=True
        )
    assert back.meta["label"] == prof.meta["label"]


def test_load_refuses_other_files(tmp_path):
    from jupyter_memprof._storage import ProfileFileError

    p = tmp_path / "x.memprof"
    p.write_bytes(b"not a zip")
    with pytest.raises(ProfileFileError):
        jupyter_memprof.load(p)


def test_empty_profile_round_trips(tmp_path):
    with jupyter_memprof.profile(label="nothing") as prof:
        pass
    back = jupyter_memprof.load(prof.save(tmp_path / "empty.memprof"))
    for name, schema in S.TABLES.items():
        assert list(getattr(back, name).columns) == list(schema)
        assert getattr(back, name).empty
    assert back.meta["label"] == "nothing"
    assert back.peak().attrs["peak_bytes"] == 0
