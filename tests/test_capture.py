"""Capture and the tables: exact facts on tiny real programs."""

import gc
import os
import pathlib
import re
import time

import numpy as np
import pandas as pd
import pytest
import torch

import jupyter_memprof
from jupyter_memprof._analysis import schema as S
from jupyter_memprof._errors import CaptureError

THIS_FILE = os.path.basename(__file__)
TABLES_DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "tables.md"


def _dtypes(schema):
    return {c: str(S.empty(schema)[c].dtype) for c in schema}


def test_empty_block_gives_empty_typed_tables():
    gc.collect()  # no stray frees of earlier tests' tensors inside the capture
    with jupyter_memprof.profile() as prof:
        pass
    for name, schema in S.TABLES.items():
        df = prof.tables[name]
        assert df.empty, name
        assert list(df.columns) == list(schema), name
        assert {c: str(df[c].dtype) for c in df.columns} == _dtypes(schema), name
    # and the types are the documented ones, rows or not
    sections = _doc_sections()
    for name in ("ops", "allocations"):
        df = prof.tables[name]
        assert {c: str(df[c].dtype) for c in df.columns} == _doc_dtypes(sections[name]), name


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
    assert block.free_ns > block.alloc_ns  # freed by `del t`, after it was made
    # the free happens outside any op: `del` runs no dispatcher op
    assert pd.isna(block.free_op_id)
    assert block.category == "temporary"
    actions = prof.events["action"].astype(str).tolist()
    assert actions == ["create", "destroy"]
    assert prof.timeline["bytes"].tolist() == [4000, 0]


def test_time_zero_is_when_the_profiled_code_starts():
    """Not when torch's trace starts: the profiler's own start-up (tens of ms) is no part
    of the timeline."""
    x = torch.ones(64, 64)
    with jupyter_memprof.profile() as prof:
        code_start = time.time_ns()
        x @ x
    start = prof.meta["start_ns"]
    assert 0 <= code_start - start < 5_000_000  # ns: well under the 30-80 ms start-up
    assert int(prof.ops["start_ns"].min()) >= start
    assert prof.events["time_ns"].min() >= start


def test_our_own_work_stays_out_of_the_capture():
    """Python calls inside the capture are events torch must store, stop and hand back:
    an empty block records only the profiler's own start and stop frames, not ~30k events
    of pandas building the profile's placeholder tables."""
    with jupyter_memprof.profile() as prof:
        pass
    assert prof.meta["event_count"] < 500


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
    a = prof.allocations
    raw = a[a["tensor_id"].isna() & a["name"].isna()]  # not the session's named tensors
    assert len(raw) > 0
    assert raw["size_bytes"].gt(0).all()
    # kernel workspaces: made and freed inside one convolution op
    assert set(raw["category"]) == {"temporary"}
    assert set(raw["reason"]) == {"freed inside the op that made it"}
    ops = prof.ops.set_index("op_id")
    assert set(ops.loc[raw["alloc_op_id"], "name"]) <= {
        "aten::mkldnn_convolution",
        "aten::convolution_backward",
    }


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


@pytest.mark.parametrize("device", [42, [42], b"cpu", ["cpu", None]])
def test_a_device_that_is_not_a_name_is_one_capture_error_line(device):
    """Before: ``device=42`` raised TypeError ('int' object is not iterable), and bytes were
    read as the devices '99', '112', '117'."""
    with pytest.raises(CaptureError) as err:
        jupyter_memprof.profile(device=device)
    assert str(err.value) == (
        f"device must be 'cpu', 'cuda', 'cuda:N' or a list of those, not {device!r}"
    )


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
        pd.testing.assert_frame_equal(back.tables[name], prof.tables[name], check_categorical=True)
    # every piece of meta survives, with its value and type
    assert back.meta == prof.meta

    def kind(v):
        return str if isinstance(v, str) else type(v)  # torch's version is a str subclass

    assert {k: kind(v) for k, v in back.meta.items()} == {k: kind(v) for k, v in prof.meta.items()}
    for key in ("start_ns", "end_ns", "devices", "with_stack", "event_count", "wall_s"):
        assert key in back.meta, key
    # the same numbers; only an unlabelled profile's fallback name ("profile N", from the
    # session it was captured in) is not carried over
    assert prof.meta["label"] is None
    assert {**back.summary(), "label": None} == {**prof.summary(), "label": None}


def test_round_trip_of_a_labelled_failed_capture_keeps_its_meta(tmp_path):
    gc.collect()
    with pytest.raises(ValueError), jupyter_memprof.profile(label="step <3>", device="cpu") as prof:
        kept = torch.ones(250)
        raise ValueError("bad batch")
    del kept
    back = jupyter_memprof.load(prof.save(tmp_path / "failed.memprof"))
    assert back.meta == prof.meta
    assert back.meta["label"] == back.label == "step <3>"
    assert back.meta["error"] == "ValueError: bad batch"
    assert back.meta["devices"] == ["cpu"]
    assert back.allocations["size_bytes"].tolist() == [1000]


def _doc_sections() -> dict[str, str]:
    """docs/tables.md split by its ``## `prof.NAME` `` headings."""
    text = TABLES_DOC.read_text()
    parts = re.split(r"^## `prof\.(\w+)`.*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _doc_dtypes(section: str) -> dict[str, str]:
    """The ``| column | dtype | meaning |`` table of a section, one entry per column
    (rows like ``| `a`, `b` | category, string |`` give each column its own dtype)."""
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        columns = re.findall(r"`(\w+)`", cells[0])
        dtypes = [d.strip() for d in cells[1].split(",")]
        if len(dtypes) == 1:
            dtypes *= len(columns)
        out.update(zip(columns, dtypes, strict=True))
    return out


def _doc_column_list(section: str) -> list[str] | None:
    """The first backticked comma list of column names in a section (``a, b, c``)."""
    m = re.search(r"`(\w+(?:, \w+)+)`", section)
    return m[1].split(", ") if m else None


# The conventions docs/tables.md states for every table, as dtypes.
def _conventional_dtype(column: str) -> set[str]:
    if column.endswith("_ns"):
        return {"int64", "Int64"}  # integer nanoseconds, <NA> where missing
    if column in ("size_bytes", "bytes", "ptr"):
        return {"int64"}
    if column == "reserved_bytes":
        return {"Int64"}  # <NA> where the allocator recorded no total (the CPU)
    if column == "version":
        return {"int64", "Int64"}  # <NA> for raw blocks, which have no tensor
    if column in ("device", "category", "action", "role", "when", "phase", "kind"):
        return {"category"}  # repeated strings
    if column.endswith("_id") or column == "seq_nr":
        return {"int64", "Int64"}
    if column in ("name", "reason", "module", "module_reason", "callsite"):
        return {"string", "category", "object"}
    if column == "mutated":
        return {"bool"}
    raise AssertionError(f"no documented convention for column {column!r}")


def test_dtypes_of_a_real_profile_are_the_documented_ones(mlp_adam_profile):
    prof, _ = mlp_adam_profile
    sections = _doc_sections()
    assert set(sections) == set(S.TABLES), sorted(sections)
    documented = {name: _doc_dtypes(sections[name]) for name in ("ops", "allocations")}
    for name, dtypes in documented.items():
        df = prof.tables[name]
        assert len(df) > 10, name
        assert list(df.columns) == list(dtypes), name  # every column, in the documented order
        got = {c: str(df[c].dtype) for c in df.columns}
        assert got == dtypes, name
    for name in ("events", "timeline", "flows", "uses", "names"):
        df = prof.tables[name]
        assert len(df) > 0, name
        assert list(df.columns) == _doc_column_list(sections[name]), name
        for c in df.columns:
            assert str(df[c].dtype) in _conventional_dtype(c), (name, c, df[c].dtype)
    versions = prof.versions
    mentioned = set(re.findall(r"`(\w+)`", sections["versions"]))
    assert set(versions.columns) - mentioned == {"tensor_id"}  # "one row per (tensor, version)"
    for c in versions.columns:
        assert str(versions[c].dtype) in _conventional_dtype(c), c
    # every category column is the documented vocabulary, ordered as in the doc's table
    text = TABLES_DOC.read_text()
    table = text[text.index("## Categories") : text.index("## `prof.ops`")]
    vocabulary = re.findall(r"^\| `(\w+)` \| ", table, flags=re.MULTILINE)
    assert len(vocabulary) == 8
    for name in ("allocations", "versions", "events", "timeline"):
        dtype = prof.tables[name]["category"].dtype
        assert list(dtype.categories) == vocabulary and dtype.ordered, name


def test_profile_takes_names_from_the_callers_namespace():
    gc.collect()
    my_lin = torch.nn.Linear(16, 8)
    my_batch = torch.randn(4, 16)
    with jupyter_memprof.profile() as prof:  # no namespace: this function's variables
        my_out = my_lin(my_batch)
    a = prof.allocations
    assert a.loc[a["name"] == "my_batch", "size_bytes"].tolist() == [4 * 16 * 4]
    assert a.loc[a["name"] == "my_lin.weight", "size_bytes"].tolist() == [8 * 16 * 4]
    assert a.loc[a["name"] == "my_lin.bias", "category"].tolist() == ["parameter"]
    assert a.loc[a["name"] == "my_out", "size_bytes"].tolist() == [4 * 8 * 4]
    modules = prof.ops.loc[prof.ops["kind"] == "module", "module"]
    assert modules.tolist() == ["my_lin"]  # the root module is named by its variable
    assert prof.ops["callsite"].dropna().str.startswith(f"{THIS_FILE}:").all()
    del my_out


def test_profile_sees_the_callers_globals_too():
    global MODULE_LEVEL_MODEL  # a module-level variable, only while this test runs
    MODULE_LEVEL_MODEL = torch.nn.Linear(3, 3)
    try:
        with jupyter_memprof.profile() as prof:
            MODULE_LEVEL_MODEL(torch.ones(2, 3))
    finally:
        del MODULE_LEVEL_MODEL
    modules = prof.ops.loc[prof.ops["kind"] == "module", "module"]
    assert modules.tolist() == ["MODULE_LEVEL_MODEL"]
    assert set(prof.names["name"]) == {"MODULE_LEVEL_MODEL.weight", "MODULE_LEVEL_MODEL.bias"}


def test_load_refuses_other_files(tmp_path):
    from jupyter_memprof import ProfileFileError

    p = tmp_path / "x.memprof"
    p.write_bytes(b"not a zip")
    with pytest.raises(ProfileFileError):
        jupyter_memprof.load(p)


def test_empty_profile_round_trips(tmp_path):
    with jupyter_memprof.profile(label="nothing") as prof:
        pass
    back = jupyter_memprof.load(prof.save(tmp_path / "empty.memprof"))
    for name, schema in S.TABLES.items():
        assert list(back.tables[name].columns) == list(schema)
        assert back.tables[name].empty
    assert back.meta["label"] == "nothing"
    assert back.peak().attrs["peak_bytes"] == 0


class _Trainer:
    """Holds a model in an attribute, as training frameworks do."""

    def __init__(self) -> None:
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())


@pytest.mark.parametrize("with_stack", [True, False])
def test_modules_are_named_alike_with_and_without_python_stacks(with_stack):
    """With stacks, module calls come from torch's Python tracer (no forward hooks); without,
    from our hooks' annotations. Either way: a model held in an attribute of a variable (named
    by that path), one held by no variable, and one made and dropped inside the block get the
    same paths."""
    from torch.nn.modules import module as nn_module

    trainer = _Trainer()
    hidden = [torch.nn.Sequential(torch.nn.Linear(8, 4))]  # a private name: not in the namespace
    x = torch.randn(2, 8)
    ns = {"trainer": trainer, "x": x, "_hidden": hidden}
    with jupyter_memprof.profile(namespace=ns, with_stack=with_stack) as prof:
        hooked = len(nn_module._global_forward_pre_hooks)
        trainer.model(x)
        hidden[0](x)
        torch.nn.Linear(8, 2)(x)  # made and dropped inside the block
    assert hooked == (0 if with_stack else 1)
    mods = prof.ops.loc[prof.ops["kind"] == "module", ["name", "module"]]
    assert mods.astype(str).values.tolist() == [
        ["nn.Module: Sequential", "trainer.model"],
        ["nn.Module: Linear", "trainer.model.0"],
        ["nn.Module: ReLU", "trainer.model.1"],
        ["nn.Module: Sequential", "Sequential"],
        ["nn.Module: Linear", "Sequential.0"],
        ["nn.Module: Linear", "Linear"],
    ]
    weights = prof.names.loc[prof.names["name"].str.endswith(".weight"), "name"]
    assert {"trainer.model.0.weight", "Sequential.0.weight"} <= set(weights)


def test_a_preexisting_block_whose_address_is_reused_ends_at_the_exact_reuse_time():
    """torch does not report frees of blocks from before the capture; a new block at the same
    address ends the old one at its own allocation time, to the nanosecond (Unix-clock times
    are above 2**53: a float64 on the way would round them), also when another
    pre-existing block of the device finds no reuse."""
    from jupyter_memprof._analysis.blocks import infer_invisible_frees

    t0 = 1_795_367_596_159_732_873  # an odd time in ns, as the events carry
    has_alloc = np.array([False, False, True])
    alloc_ns = np.array([0, 0, t0])
    has_free = np.array([False, False, False])
    free_ns = np.zeros(3, dtype=np.int64)
    device = np.array(["cpu", "cpu", "cpu"], dtype=object)
    ptr = np.array([0x1000, 0x2000, 0x1000])  # block 0's address is handed out again
    infer_invisible_frees(has_alloc, alloc_ns, has_free, free_ns, device, ptr)
    assert has_free.tolist() == [True, False, False]
    assert free_ns[0] == t0


def test_a_block_freed_at_a_stale_address_gets_its_true_size():
    """torch's CPU allocator remembers the size of a block made while memory is profiled
    until that block is freed while memory is profiled. Freed between captures, the entry
    stays; a later block that gets the same address and is freed inside a capture is then
    reported with the old size. A storage the session named at the start has its true
    size."""
    gc.collect()

    def block_at_a_stale_address():
        with jupyter_memprof.profile(device="cpu"):
            old = torch.ones(250)  # 1000 bytes, recorded
        stale = old.data_ptr()
        del old  # outside any capture: torch keeps "1000 bytes" for that address
        spare = []  # held until the address comes back (malloc's reuse varies: try again)
        for _ in range(1000):
            b = torch.empty(200)  # 800 bytes
            if b.data_ptr() == stale:
                return b, stale
            spare.append(b)
        return None, stale

    for _ in range(20):
        b, stale = block_at_a_stale_address()
        if b is not None:
            break
    else:
        pytest.fail("the allocator never handed a freed address out again")
    with jupyter_memprof.profile(device="cpu") as prof:
        del b
    a = prof.allocations
    assert a[["ptr", "size_bytes"]].values.tolist() == [[stale, 800]]
    assert a["alloc_ns"].isna().all() and a["free_ns"].notna().all()
    assert a["name"].tolist() == ["b"]
    assert prof.peak().attrs["peak_bytes"] == 800


def test_the_burners_free_is_dropped_and_nothing_else():
    """The start's burner (a block freed just after torch's profiler starts, to spend
    torch's one warning about blocks of unknown size) is recorded when it lands on a stale
    address (see the test above); only that free, before the user's code, is dropped."""
    from jupyter_memprof._producers.recorder import _drop_burner
    from jupyter_memprof._records import MemoryRecord

    def rec(t, ptr, size, device="cpu"):
        return MemoryRecord(t, ptr, size, -1, t, device, -1)

    memory = [
        rec(10, 0xA0, 64),  # another thread's allocation at that address
        rec(11, 0xB0, -8, "cuda:0"),
        rec(12, 0xB0, -1000),  # the burner, reported with a stale size
        rec(30, 0xB0, 4),  # the user's code, from time 20
        rec(31, 0xB0, -4),
    ]
    kept = [memory[i] for i in (0, 1, 3, 4)]
    _drop_burner(memory, 0xB0, 20)
    assert memory == kept
    _drop_burner(memory, 0xB0, 20)  # nothing more to drop
    _drop_burner(memory, None, 20)
    assert memory == kept


class _Hostile:
    """A notebook object whose attribute lookup runs code that raises."""

    def __getattribute__(self, name):
        raise RuntimeError(f"no {name} here")


def test_a_hostile_object_in_the_namespace_does_not_stop_the_module_lookup():
    """With stacks, modules no variable holds are looked up through the variables' attributes
    and then the garbage collector's objects: an object that raises on any attribute is
    passed over, and the model held by no variable is still found with its submodules."""
    hidden = [torch.nn.Sequential(torch.nn.Linear(4, 4))]
    x = torch.randn(2, 4)
    with jupyter_memprof.profile(namespace={"odd": _Hostile(), "x": x, "_h": hidden}) as prof:
        hidden[0](x)
    mods = prof.ops.loc[prof.ops["kind"] == "module", "module"].astype(str).tolist()
    assert mods == ["Sequential", "Sequential.0"]
    assert prof.meta.get("analysis_error") is None
    assert "Sequential.0.weight" in set(prof.names["name"])
