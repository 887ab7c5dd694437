"""prof.steps and prof.leaks(): loops split into steps, and the memory that grows with them.

Every test runs a real loop on a small MLP under the real profiler (or estimate mode); leak
sizes are the storage bytes of the tensors the loop keeps.
"""

import pandas as pd
import pytest
import torch

import jupyter_memprof
from jupyter_memprof._analysis import schema as S

STEPS = 4


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    return model, x, y


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def _live_at_end(prof, device="cpu") -> int:
    tl = prof.timeline[prof.timeline["device"] == device]
    return int(tl.groupby("category", observed=True)["bytes"].last().sum())


# -- steps ------------------------------------------------------------------------------------
def test_a_step_ends_at_each_optimizer_step():
    model, x, y = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with jupyter_memprof.profile() as prof:
        for _ in range(3):
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    steps = prof.steps
    assert list(steps.columns) == list(S.STEPS)
    assert steps["step"].tolist() == [0, 1, 2] and set(steps["device"]) == {"cpu"}
    ends = prof.ops[prof.ops["name"].astype(str).str.startswith("Optimizer.step#")]["end_ns"]
    assert steps["end_ns"].tolist()[:2] == ends.tolist()[:2]
    assert steps["start_ns"].iloc[0] == prof.start_ns
    assert steps["start_ns"].tolist()[1:] == steps["end_ns"].tolist()[:-1]
    # live bytes at the start: every block from before the capture (parameters, x, y)
    pre = prof.allocations[prof.allocations["alloc_ns"].isna()]["size_bytes"].sum()
    assert steps["live_start_bytes"].iloc[0] == pre
    assert steps["live_start_bytes"].tolist()[1:] == steps["live_end_bytes"].tolist()[:-1]
    assert (steps["growth_bytes"] == steps["live_end_bytes"] - steps["live_start_bytes"]).all()
    assert steps["live_end_bytes"].iloc[-1] == _live_at_end(prof)
    assert (steps["peak_bytes"] >= steps[["live_start_bytes", "live_end_bytes"]].max(axis=1)).all()
    # the first step makes the momentum buffers: one per parameter, kept
    momentum = sum(_nbytes(p) for p in model.parameters())
    assert steps["growth_category"].iloc[0] == "optimizer_state"
    assert steps["growth_bytes"].iloc[0] >= momentum
    assert steps["peak_bytes"].max() == prof.peak().attrs["peak_bytes"]
    # live bytes at each step's end are the timeline's state then (docs/tables.md's recipe)
    wide = (
        prof.timeline.pivot_table(
            index="time_ns", columns="category", values="bytes", aggfunc="last", observed=True
        )
        .ffill()
        .fillna(0)
        .sum(axis=1)
    )
    for end, live in zip(steps["end_ns"], steps["live_end_bytes"]):
        assert wide[wide.index <= end].iloc[-1] == live


def test_step_marks_split_a_loop_without_an_optimizer():
    model, x, y = _mlp()
    with torch.no_grad(), jupyter_memprof.profile() as prof:
        for _ in range(STEPS):
            model(x)
            jupyter_memprof.step()
    assert prof.steps["step"].tolist() == list(range(STEPS))
    marks = prof.ops[prof.ops["name"] == "memprof.step"]
    assert len(marks) == STEPS and set(marks["kind"]) == {"annotation"}
    assert (prof.steps["growth_bytes"] == 0).all()  # nothing is kept between steps
    assert prof.leaks().empty


def test_torch_profiler_step_annotations_start_steps():
    model, x, y = _mlp()
    with torch.no_grad(), jupyter_memprof.profile() as prof:
        for i in range(3):  # what torch's profiler.step() records around each step
            with torch.autograd.profiler.record_function(f"ProfilerStep#{i}"):
                model(x)
    assert prof.steps["step"].tolist() == [0, 1, 2]


def test_a_capture_without_steps_is_one_step(mlp_adam_profile):
    model, x, y = _mlp()
    with torch.no_grad(), jupyter_memprof.profile() as prof:
        model(x)
    assert len(prof.steps) == 1
    row = prof.steps.iloc[0]
    assert row["start_ns"] == prof.start_ns and row["live_end_bytes"] == _live_at_end(prof)
    assert prof.leaks().empty and list(prof.leaks().columns) == list(S.LEAKS)


def test_estimate_records_the_same_steps():
    model, x, y = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train(model, opt, x, y):
        for _ in range(3):
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()

    def evaluate(model, x):
        with torch.no_grad():
            for _ in range(STEPS):
                model(x)
                jupyter_memprof.step()

    est = jupyter_memprof.estimate(train, model, opt, x, y)
    assert est.steps["step"].tolist() == [0, 1, 2]
    assert est.steps["growth_category"].iloc[0] == "optimizer_state"
    est = jupyter_memprof.estimate(evaluate, model, x)
    assert est.steps["step"].tolist() == list(range(STEPS))


def test_steps_survive_save_and_load(tmp_path):
    model, x, y = _mlp()
    with torch.no_grad(), jupyter_memprof.profile() as prof:
        for _ in range(3):
            model(x)
            jupyter_memprof.step()
    for fmt in ("zip", "parquet"):
        back = jupyter_memprof.load(prof.save(tmp_path / f"p.{fmt}", format=fmt))
        pd.testing.assert_frame_equal(back.steps, prof.steps)


def test_a_file_saved_before_steps_existed_loads_with_its_steps_rebuilt(tmp_path):
    import zipfile

    model, x, y = _mlp()
    with torch.no_grad(), jupyter_memprof.profile() as prof:
        for _ in range(3):
            model(x)
            jupyter_memprof.step()
    path = prof.save(tmp_path / "new.zip")
    old = tmp_path / "old.zip"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            if item.filename != "steps.json":
                dst.writestr(item, src.read(item))
    pd.testing.assert_frame_equal(jupyter_memprof.load(old).steps, prof.steps)
    folder = prof.save(tmp_path / "folder", format="parquet")
    (tmp_path / "folder" / "steps.parquet").unlink()
    pd.testing.assert_frame_equal(jupyter_memprof.load(folder).steps, prof.steps)


# -- leaks ------------------------------------------------------------------------------------
def _first(prof) -> pd.Series:
    leaks = prof.leaks()
    assert list(leaks.columns) == list(S.LEAKS)
    assert len(leaks), "no leak found"
    return leaks.iloc[0]


def _train(model, x, y, keep, ns, steps=STEPS):
    """``steps`` Adam steps; ``keep(i, out, loss)`` after each; ``ns``: the variables."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with jupyter_memprof.profile(namespace={**ns, "model": model, "opt": opt}) as prof:
        for i in range(steps):
            out = model(x)
            loss = ((out - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            keep(i, out, loss)
    return prof


def test_a_clean_training_loop_reports_no_leak():
    model, x, y = _mlp()
    running = 0.0

    def keep(i, out, loss):
        nonlocal running
        running += loss.item()  # a number, not the tensor

    prof = _train(model, x, y, keep, locals())
    assert prof.leaks().empty
    # Adam's state is made in the first step only, and kept: not a leak
    assert prof.steps["growth_category"].iloc[0] == "optimizer_state"


def test_a_clean_evaluation_loop_reports_no_leak():
    model, x, y = _mlp()
    total = 0.0
    with torch.no_grad(), jupyter_memprof.profile() as prof:
        for _ in range(STEPS):
            total += ((model(x) - y) ** 2).mean()  # no graph: only one tensor, replaced
            jupyter_memprof.step()
    assert prof.leaks().empty


def test_losses_append_loss_is_found_with_its_list():
    model, x, y = _mlp()
    losses = []
    prof = _train(model, x, y, lambda i, out, loss: losses.append(loss), locals())
    leak = _first(prof)
    assert leak["holder"] == "losses"
    assert leak["bytes_per_step"] == _nbytes(losses[0]) == 4
    assert leak["steps"] == STEPS and len(leak["alloc_ids"]) == STEPS
    assert leak["category"] == "activation"
    assert leak["callsite"].startswith("test_steps.py:")
    assert "losses" in leak["why"]


def test_leaks_are_a_table_found_once_and_saved_with_the_others(tmp_path):
    import zipfile

    model, x, y = _mlp()
    losses = []
    prof = _train(model, x, y, lambda i, out, loss: losses.append(loss), locals())
    table = prof.tables["leaks"]
    assert table is prof.leaks_table and table["holder"].tolist() == ["losses"]
    assert prof.leaks().equals(table) and prof.leaks() is not table  # a copy to change freely
    assert "leaks" not in prof.meta
    for fmt in ("zip", "parquet"):
        path = prof.save(tmp_path / f"p.{fmt}", format=fmt)
        back = jupyter_memprof.load(path)
        pd.testing.assert_frame_equal(back.leaks(), prof.leaks())
        assert back.leaks()["alloc_ids"].tolist() == [sorted(table["alloc_ids"].iloc[0])]
    # a file saved before leaks were a table has none: found again from its other tables
    old = tmp_path / "old.zip"
    with zipfile.ZipFile(tmp_path / "p.zip") as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            if item.filename != "leaks.json":
                dst.writestr(item, src.read(item))
    pd.testing.assert_frame_equal(jupyter_memprof.load(old).leaks(), prof.leaks())
    (tmp_path / "p.parquet" / "leaks.parquet").unlink()
    pd.testing.assert_frame_equal(jupyter_memprof.load(tmp_path / "p.parquet").leaks(), table)


def test_total_plus_equals_loss_outside_no_grad_keeps_every_graph():
    model, x, y = _mlp()
    total = 0
    with jupyter_memprof.profile() as prof:
        for _ in range(STEPS):
            total += ((model(x) - y) ** 2).mean()
            jupyter_memprof.step()
    leak = _first(prof)
    assert leak["holder"] == "total"
    assert leak["why"] == "each step's graph kept alive through `total.grad_fn`"
    # each graph saves relu's output (32 x 128 floats) and the difference (32 x 8 floats)
    assert leak["bytes_per_step"] == (32 * 128 + 32 * 8) * 4
    assert leak["bytes_per_step"] == prof.steps["growth_bytes"].iloc[1]


def test_a_forward_hook_storing_outputs_is_found_on_its_module():
    model, x, y = _mlp()

    def install():
        outputs = []  # reachable only through the hook
        return model[1].register_forward_hook(lambda m, i, o: outputs.append(o))

    handle = install()
    try:
        with torch.no_grad(), jupyter_memprof.profile() as prof:
            for _ in range(STEPS):
                model(x)
                jupyter_memprof.step()
    finally:
        handle.remove()
    leak = _first(prof)
    assert leak["holder"] == "model.1"
    assert leak["bytes_per_step"] == 32 * 128 * 4
    assert leak["steps"] == STEPS
    assert leak["why"] == "a forward hook on `model.1` keeps each call's output"


def test_a_cache_dict_is_found():
    model, x, y = _mlp()
    cache = {}
    with torch.no_grad(), jupyter_memprof.profile() as prof:
        for i in range(STEPS):
            cache[f"batch{i}"] = model(x)
            jupyter_memprof.step()
    leak = _first(prof)
    assert leak["holder"] == "cache"
    assert leak["bytes_per_step"] == _nbytes(cache["batch0"]) == 32 * 8 * 4
    assert leak["why"] == "each step adds an entry to `cache`"


def test_logits_kept_for_metrics_are_found():
    model, x, y = _mlp()
    all_logits = []
    prof = _train(model, x, y, lambda i, out, loss: all_logits.append(out.detach()), locals())
    leak = _first(prof)
    assert leak["holder"] == "all_logits"
    assert leak["bytes_per_step"] == _nbytes(all_logits[0]) == 32 * 8 * 4
    assert leak["steps"] == STEPS


def test_a_list_inside_an_object_is_named_by_its_attribute_path():
    class Tracker:
        def __init__(self):
            self.history = []

    model, x, y = _mlp()
    tracker = Tracker()
    prof = _train(
        model, x, y, lambda i, out, loss: tracker.history.append(out.detach() * 2), locals()
    )
    leak = _first(prof)
    assert leak["holder"] == "tracker.history"
    assert leak["bytes_per_step"] == 32 * 8 * 4


def test_a_leak_no_variable_reaches_still_names_its_line():
    model, x, y = _mlp()
    hidden = []
    prof = _train(model, x, y, lambda i, out, loss: hidden.append(out.detach() + 1), {})
    leak = _first(prof)
    assert pd.isna(leak["holder"])
    assert leak["bytes_per_step"] == 32 * 8 * 4 and leak["steps"] == STEPS
    assert leak["callsite"].startswith("test_steps.py:")
    assert leak["why"].startswith(f"made at {leak['callsite']} in each step and never freed")


def test_a_cache_a_module_keeps_is_named_by_its_module_path():
    class Cached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 8)
            self.cache = {}

        def forward(self, x, key):
            out = self.fc(x)
            self.cache[key] = out  # keeps every batch's output
            return out

    net = Cached()
    x = torch.randn(32, 64)
    with torch.no_grad(), jupyter_memprof.profile() as prof:
        for i in range(STEPS):
            net(x, f"batch{i}")
            jupyter_memprof.step()
    leak = _first(prof)
    assert leak["holder"] == "net.cache"
    assert leak["bytes_per_step"] == _nbytes(net.cache["batch0"]) == 32 * 8 * 4
    assert leak["why"] == "each step adds an entry to `net.cache`"


def test_estimate_finds_the_same_leak():
    model, x, y = _mlp()

    def evaluate(model, x, y):
        losses = []
        for _ in range(STEPS):
            losses.append(((model(x) - y) ** 2).mean())  # no no_grad: graphs kept
            jupyter_memprof.step()
        return losses

    with jupyter_memprof.profile() as real:
        kept = evaluate(model, x, y)
    est = jupyter_memprof.estimate(evaluate, model, x, y)
    leak, real_leak = _first(est), _first(real)
    assert real_leak["holder"] == "kept" and leak["holder"] == "evaluate()"
    # each graph saves relu's output and the difference; the loss is kept too
    assert leak["bytes_per_step"] == real_leak["bytes_per_step"] == (32 * 128 + 32 * 8 + 1) * 4
    assert leak["steps"] == real_leak["steps"] == STEPS
    assert leak["callsite"] == real_leak["callsite"]
    assert len(kept) == STEPS


def test_a_bounded_history_is_not_a_leak():
    model, x, y = _mlp()
    last = []

    def keep(i, out, loss):
        last[:] = [out.detach()]  # only the latest step's output survives

    assert _train(model, x, y, keep, locals(), steps=6).leaks().empty


@pytest.mark.parametrize("n", [1, 2])
def test_too_few_steps_report_nothing(n):
    model, x, y = _mlp()
    kept = []
    prof = _train(model, x, y, lambda i, out, loss: kept.append(out.detach()), locals(), steps=n)
    assert len(prof.steps) == n
    assert len(prof.leaks()) == (n - 1)


@pytest.mark.parametrize("loss_first", [True, False])
def test_the_last_steps_loss_counts_with_its_list_whatever_the_variables_order(loss_first):
    model, x, y = _mlp()
    ns = {"loss": None} if loss_first else {}
    ns.update(losses=[], model=model)
    with jupyter_memprof.profile(namespace=ns) as prof:
        for _ in range(STEPS):
            ns["loss"] = ((model(x) - y) ** 2).mean()
            ns["losses"].append(ns["loss"])  # at the end, `loss` is `losses[-1]`
            jupyter_memprof.step()
    leak = _first(prof)
    assert leak["holder"] == "losses" and leak["steps"] == STEPS
    assert (
        leak["total_bytes"] == STEPS * leak["bytes_per_step"] == STEPS * (32 * 128 + 32 * 8 + 1) * 4
    )
