"""Training loops written as users write them with the frameworks people train with
(benchmarks/framework_loops.py), profiled for real: categories checked against the live
objects, unknown at most 1% of the peak, activations wherever a forward ran."""

import gc

import framework_loops as L
import numpy as np
import pandas as pd
import pytest
import torch

import jupyter_memprof


def profile_loop(loop: L.Loop):
    # what earlier tests left for the collector is not freed during this capture (blocks
    # from before a capture, freed during it, are unknown: no rule knows what they were)
    gc.collect()
    with jupyter_memprof.profile(namespace=loop.ns) as prof:
        loop.run()
    return prof


def alive_bytes(prof) -> dict[str, int]:
    """Bytes of each category alive at the end of the capture."""
    a = prof.allocations
    alive = a[a["free_ns"].isna().to_numpy()]
    return alive.groupby("category", observed=True)["size_bytes"].sum().astype(int).to_dict()


def check_exact(prof, loop: L.Loop) -> None:
    """Parameters, gradients and optimizer state equal to the live objects' bytes, unknown
    at most 1% of the peak (and no byte over the run), activations present, no leak."""
    live = L.live_bytes(loop)
    alive = alive_bytes(prof)
    for category, nbytes in live.items():
        assert alive.get(category, 0) == nbytes, (category, alive)
    peak = prof.peak_by("category")
    assert peak.get("unknown", 0) <= 0.01 * peak.sum(), peak
    cats = prof.allocations.groupby("category", observed=True)["size_bytes"].sum()
    assert cats.get("activation", 0) > 0, cats
    assert cats.get("unknown", 0) == 0, prof.allocations[prof.allocations["category"] == "unknown"]
    assert prof.leaks().empty, prof.leaks()  # no false leak


# -- closure optimizers ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def closure_run():
    loop = L.closure_sgd()
    loop.run()  # the momentum buffers exist before the capture, as in a loop's later steps
    return profile_loop(loop), loop


def test_closure_forward_and_backward_are_forward_and_backward(closure_run):
    prof, loop = closure_run
    check_exact(prof, loop)
    ops = prof.ops
    # every module call and every linear is forward, though optimizer.step() encloses it
    mods = ops[ops["kind"] == "module"]
    assert len(mods) == 4 * loop.steps and (mods["phase"] == "forward").all()
    assert (ops.loc[ops["name"] == "aten::mse_loss", "phase"] == "forward").all()
    assert set(ops.loc[ops["kind"] == "backward", "phase"]) == {"backward"}
    # what the optimizer runs itself is still the optimizer's
    sgd = ops[ops["name"].astype(str).str.startswith("Optimizer.")]
    assert set(sgd["phase"]) == {"optimizer"}
    a = prof.allocations
    # the hidden layer's output: 32 x 256 floats, saved for tanh's backward
    hidden = a[(a["size_bytes"] == 32 * 256 * 4) & (a["reason"] == "saved for backward")]
    assert len(hidden) >= loop.steps
    assert not (a["reason"] == "made and freed inside the optimizer").any()


def test_closure_loss_is_forward_work(closure_run):
    prof, loop = closure_run
    # the loss each closure returns is forward work, not optimizer state
    loss = prof.allocations[prof.allocations["alloc_op_id"].isin(
        prof.ops.loc[prof.ops["name"] == "aten::mse_loss", "op_id"]
    )]  # fmt: skip
    assert len(loss) and set(loss["category"]) <= {"activation", "temporary"}


def test_closure_own_work_outside_modules_is_the_users():
    """Work a closure does outside any module without autograd (a copy of the batch, a
    logged loss) is the user's step, not optimizer state."""
    model = L.mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    logged = []

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x * 2.0), y)
        loss.backward()
        logged.append(loss.detach().clone())
        return loss

    with jupyter_memprof.profile(namespace={"model": model, "opt": opt, "x": x}) as prof:
        for _ in range(3):
            opt.step(closure)
    a = prof.allocations
    assert not (a["category"] == "optimizer_state").any()
    muls = prof.ops.loc[prof.ops["name"] == "aten::mul", ["op_id", "phase"]]
    assert len(muls) == 3 and set(muls["phase"]) == {"other"}
    scaled = a[a["alloc_op_id"].isin(muls["op_id"])]
    assert len(scaled) == 3 and set(scaled["reason"]) == {"made outside the model, read by forward"}
    marks = prof.ops[prof.ops["name"] == "memprof.closure"]
    assert len(marks) == 3 and set(marks["phase"]) == {"other"}


def test_lbfgs_history_is_optimizer_state():
    loop = L.lbfgs()
    prof = profile_loop(loop)
    check_exact(prof, loop)
    a = prof.allocations
    alive = a[a["free_ns"].isna()]
    state = alive[alive["category"] == "optimizer_state"]
    # d, prev_flat_grad and three directions and steps of history: 74,784 bytes each
    assert (state["size_bytes"] == 74_784).sum() == 8
    assert "opt.state[model.0.weight].old_dirs[2]" in set(state["name"])
    assert set(state["reason"]) == {"optimizer.state"}
    # twelve closures, each a forward and a backward
    assert (prof.ops["name"] == "memprof.closure").sum() == 12
    assert (prof.ops.loc[prof.ops["kind"] == "module", "phase"] == "forward").all()


# -- DataLoader workers -----------------------------------------------------------------------
def _batches(prof):
    """The blocks of x (16 x 64 floats) and y (16 x 8) made during the capture outside
    the model."""
    a = prof.allocations
    made = a[a["alloc_ns"].notna().to_numpy() & a["module"].isna().to_numpy()]
    return made[made["size_bytes"] == 16 * 64 * 4], made[made["size_bytes"] == 16 * 8 * 4]


def _read_after_free(prof) -> pd.DataFrame:
    """Uses of a block by an op that started after the block was freed."""
    u = prof.uses.dropna(subset=["alloc_id"])
    a = prof.allocations.set_index("alloc_id")
    start = prof.ops.set_index("op_id")["start_ns"]
    free = a["free_ns"].reindex(u["alloc_id"].astype(int)).to_numpy(dtype=float, na_value=np.inf)
    return u[start.reindex(u["op_id"]).to_numpy() > free]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_batches_are_blocks_of_their_own(workers):
    loop = L.dataloader(num_workers=workers)
    prof = profile_loop(loop)
    check_exact(prof, loop)
    xs, ys = _batches(prof)
    assert len(xs) == 8 and len(ys) == 8
    assert set(xs["category"]) == set(ys["category"]) == {"input"}
    reason = "batch from a DataLoader worker, through shared memory"
    if workers:
        assert set(xs["reason"]) == set(ys["reason"]) == {reason}
    else:
        assert set(xs["reason"]) == {"made outside the model, read by forward"}
    # every batch is read by its own step's forward: one linear per x, one loss per y
    u = prof.uses.merge(prof.ops[["op_id", "name", "phase"]], on="op_id")
    fwd = u[u["phase"] == "forward"]
    for blocks, op in ((xs, "aten::linear"), (ys, "aten::mse_loss")):
        reads = fwd[fwd["alloc_id"].isin(blocks["alloc_id"]) & (fwd["name"] == op)]
        assert reads.groupby("alloc_id").size().to_dict() == dict.fromkeys(blocks["alloc_id"], 1)
    assert _read_after_free(prof).empty


# -- steps: one capture and a long run agree; complete steps ---------------------------------
_SAME = ["step", "device", "peak_bytes", "live_start_bytes", "live_end_bytes", "growth_bytes",
         "growth_category", "complete"]  # fmt: skip


@pytest.mark.parametrize(("make", "window"), [("grad_scaler", 2), ("ema", 4), ("closure_sgd", 4)])
def test_a_long_run_and_one_capture_give_the_same_steps(make, window):
    one = profile_loop(getattr(L, make)(steps=6))
    loop = getattr(L, make)(steps=6)
    with jupyter_memprof.profile(namespace=loop.ns, steps=window) as long:
        loop.run()
    pd.testing.assert_frame_equal(long.steps[_SAME], one.steps[_SAME])
    steps = one.steps
    # a step that grew by nothing names no category
    assert steps.loc[steps["growth_bytes"] <= 0, "growth_category"].isna().all()
    assert steps["complete"].sum() == 6
    assert one.summary()["steps"]["complete"] == 6
    assert long.meta["long_run"]["steps"] == 6


def test_the_tail_after_the_last_step_is_not_complete():
    """The EMA update after the last ``opt.step()`` allocates: a row of its own, not a
    step; the summary says 3 steps."""
    prof = profile_loop(L.ema(steps=3))
    assert prof.steps["complete"].tolist() == [True, True, True, False]
    assert prof.summary()["steps"] == {"complete": 3, "rows": 4}
    assert "3 steps, then what ran after the last one" in repr(prof)
    # frees alone after the last step (zero_grad after step) end the last step
    prof = profile_loop(L.grad_scaler(steps=3))
    assert prof.steps["complete"].tolist() == [True, True, True]
    assert "  3 steps\n" in repr(prof)


def test_a_file_saved_before_complete_existed_loads_with_complete_steps(tmp_path):
    import json
    import zipfile

    prof = profile_loop(L.closure_sgd(steps=3))
    path = prof.save(tmp_path / "new.zip")
    old = tmp_path / "old.zip"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "steps.json":
                doc = json.loads(data)
                del doc["data"]["complete"]
                doc["columns"].remove("complete")
                data = json.dumps(doc)
            dst.writestr(item, data)
    back = jupyter_memprof.load(old)
    assert back.steps["complete"].dtype == bool and back.steps["complete"].all()
    pd.testing.assert_frame_equal(back.steps, prof.steps)


# -- the wait after the code ------------------------------------------------------------------
def test_the_summary_says_where_the_wait_after_the_code_went():
    import time

    loop = L.closure_sgd()
    with jupyter_memprof.profile(namespace=loop.ns) as prof:
        loop.run()
        left = time.perf_counter()
    waited = time.perf_counter() - left
    m = prof.meta
    parts = m["stop_s"] + m["capture_s"] + m["analysis_s"] + m["free_s"]
    assert parts <= m["finish_s"] <= waited
    assert waited - m["finish_s"] < 0.05  # leaving the block is the finish, nothing else
    assert m["finish_s"] - parts <= 0.1 * m["finish_s"] + 0.02
    text = repr(prof)
    assert "then " in text and "stopping torch's profiler" in text and "analysis" in text
    assert prof.summary()["finish_s"] == m["finish_s"]


# -- GradScaler, EMA --------------------------------------------------------------------------
def test_grad_scaler_on_the_cpu():
    loop = L.grad_scaler()
    loop.run()
    prof = profile_loop(loop)
    check_exact(prof, loop)
    # scaler.step(opt) runs opt.step(): one step each
    assert prof.steps["complete"].tolist() == [True] * 3
    # under autocast, forward casts the weights to bfloat16: forward work, not the optimizer's
    casts = prof.ops[(prof.ops["name"] == "aten::_to_copy") & (prof.ops["phase"] == "forward")]
    assert len(casts) >= 4 * 3
    assert prof.leaks().empty


def test_ema_copy_is_parameters_of_its_own_module():
    """``AveragedModel`` deep-copies the model: its weights are module parameters of the
    copy (``ema_model.module.0.weight``), held by that module, and its ``n_averaged`` a
    buffer; the training model's parameters, gradients and Adam's state stay exact."""
    loop = L.ema()
    loop.run()
    prof = profile_loop(loop)
    check_exact(prof, loop)
    ema = loop.extra["ema_model"]
    model = sum(p.untyped_storage().nbytes() for p in loop.model.parameters())
    copy = sum(p.untyped_storage().nbytes() for p in ema.parameters())
    assert copy == model
    assert alive_bytes(prof)["parameter"] == model + copy + 8  # n_averaged: one int64
    a = prof.allocations
    rows = a[a["name"].astype(str).str.startswith("ema_model.")].set_index("name")
    w = rows.loc["ema_model.module.0.weight"]
    assert (w["category"], w["reason"], w["module"]) == (
        "parameter",
        "module parameter",
        "ema_model.module.0",
    )
    assert w["size_bytes"] == 256 * 64 * 4
    assert rows.loc["ema_model.n_averaged", "reason"] == "module buffer"
    assert prof.peak_by("category").get("unknown", 0) == 0
    assert prof.leaks().empty


# -- HuggingFace Trainer ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        {},
        {"gradient_accumulation_steps": 2},
        {"bf16": True},
        {"activation_checkpointing": True},
    ],
    ids=["plain", "accumulation", "bf16", "checkpointing"],
)
def test_hf_trainer(args):
    pytest.importorskip("accelerate")
    loop = L.hf_trainer(**args)
    prof = profile_loop(loop)
    loop.optimizer = L.trainer_optimizer(loop)
    check_exact(prof, loop)
    # the steps are found through accelerate's optimizer wrapper
    assert prof.steps["complete"].sum() == 3
    ops = prof.ops
    forwards = ops[(ops["kind"] == "module") & (ops["module"] == "model")]
    accumulate = args.get("gradient_accumulation_steps", 1)
    assert len(forwards) == 3 * accumulate and (forwards["phase"] == "forward").all()
    a = prof.allocations
    if args.get("activation_checkpointing"):
        assert (a["reason"] == "recomputed in backward (checkpointing)").any()
    if args.get("bf16"):
        cast = ops[(ops["name"] == "aten::_to_copy") & (ops["phase"] == "forward")]
        assert len(cast) > 0
    assert prof.leaks().empty


# -- Lightning --------------------------------------------------------------------------------
def test_lightning_automatic_optimisation():
    """Lightning runs every training step in a closure ``optimizer.step`` calls: forward and
    backward are still forward and backward, the logged loss is no optimizer state."""
    pytest.importorskip("lightning")
    loop = L.lightning()
    prof = profile_loop(loop)
    loop.optimizer = L.lightning_optimizer(loop)
    check_exact(prof, loop)
    assert prof.steps["complete"].sum() == 3
    ops = prof.ops
    assert (ops["name"] == "memprof.closure").sum() == 3
    assert (ops.loc[ops["kind"] == "module", "phase"] == "forward").all()
    a = prof.allocations
    state = a[(a["category"] == "optimizer_state") & a["free_ns"].isna()]
    assert state["name"].notna().all()  # Adam's exp_avg, exp_avg_sq, step: nothing else
    assert "unknown" not in set(prof.explain()["category"].astype(str))


def test_a_parquet_folder_saved_before_complete_existed_loads_with_complete_steps(tmp_path):
    import pyarrow.parquet as pq

    prof = profile_loop(L.closure_sgd(steps=3))
    folder = prof.save(tmp_path / "folder", format="parquet")
    path = tmp_path / "folder" / "steps.parquet"
    pq.write_table(pq.read_table(path).drop(["complete"]), path)
    back = jupyter_memprof.load(folder)
    assert back.steps["complete"].dtype == bool and back.steps["complete"].all()
    pd.testing.assert_frame_equal(back.steps, prof.steps)


# -- torch.multiprocessing queues ---------------------------------------------------------------
def _produce(q, n: int, done) -> None:
    for i in range(n):
        q.put(torch.full((16, 64), float(i)))
    q.put(None)
    done.wait()  # the receiver takes each storage's file descriptor from this process


def test_tensors_from_a_multiprocessing_queue_are_blocks_of_their_own():
    """Each tensor received through a ``torch.multiprocessing`` queue is rebuilt on shared
    memory (its storage made outside any op): a block of its own, read by its own op."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")
    q, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_produce, args=(q, 4, done))
    child.start()
    w = torch.randn(64, 8)
    try:
        with jupyter_memprof.profile(namespace={"w": w}) as prof:
            while (t := q.get(timeout=60)) is not None:
                (t @ w).sum().item()
    finally:
        done.set()
        child.join(timeout=60)
    a = prof.allocations
    got = a[(a["size_bytes"] == 16 * 64 * 4).to_numpy() & a["alloc_ns"].notna().to_numpy()]
    assert len(got) == 4 and got["tensor_id"].nunique() == 4
    u = prof.uses.merge(prof.ops[["op_id", "name"]], on="op_id")
    reads = u[u["alloc_id"].isin(got["alloc_id"]) & (u["name"] == "aten::matmul")]
    assert reads.groupby("alloc_id").size().to_dict() == dict.fromkeys(got["alloc_id"], 1)
    assert _read_after_free(prof).empty


# -- estimate mode ------------------------------------------------------------------------------
def test_estimate_of_a_closure_loop_keeps_its_phases():
    """Estimate mode records the closure's annotation too: forward is forward, the
    closure's own work outside modules is the user's, nothing is unknown."""

    def train(model, opt, x, y):
        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x * 2.0), y)
            loss.backward()
            return loss

        for _ in range(3):
            opt.step(closure)

    model = L.mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    est = jupyter_memprof.estimate(train, model, opt, torch.randn(32, 64), torch.randn(32, 8))
    ops = est.ops
    marks = ops[ops["name"] == "memprof.closure"]
    assert len(marks) == 3 and set(marks["phase"]) == {"other"}
    assert (ops.loc[ops["kind"] == "module", "phase"] == "forward").all()
    assert set(ops.loc[ops["name"] == "aten::mul", "phase"]) == {"other"}
    a = est.allocations
    assert not (a["category"] == "unknown").any()
    assert (a["reason"] == "saved for backward").any()
    assert est.steps["complete"].sum() == 3
