"""Categories, names, lineage and the peak on real training steps."""

import numpy as np
import pandas as pd
import pytest
import scenarios
import torch
from conftest import profile_scenario

import jupyter_memprof


def _blocks_of(prof, tensors):
    """alloc_ids of the blocks holding these live tensors (matched by storage address)."""
    a = prof.allocations
    ptrs = {t.untyped_storage().data_ptr() for t in tensors}
    alive_at_end = a[a["free_ns"].isna() & a["ptr"].isin(ptrs)]
    return alive_at_end


@pytest.fixture(scope="module")
def mlp():
    return profile_scenario(scenarios.mlp_adam)


def test_parameters_gradients_and_adam_state_are_exact(mlp):
    prof, ns = mlp
    model, opt = ns["model"], ns["opt"]
    a = prof.allocations
    named = {f"model.{n}": p for n, p in model.named_parameters()}
    for name, p in named.items():
        rows = a[a["name"] == name]
        assert len(rows) == 1, name
        row = rows.iloc[0]
        assert row["category"] == "parameter" and row["reason"] == "module parameter"
        assert row["size_bytes"] == p.numel() * 4
        # the gradient of this step (the one of the warm-up step, freed by zero_grad, is a
        # block from before the capture under the same name)
        grad = a[(a["name"] == f"{name}.grad") & a["free_ns"].isna()].iloc[0]
        assert grad["category"] == "gradient"
        assert grad["size_bytes"] == p.numel() * 4
        assert grad["ptr"] == p.grad.untyped_storage().data_ptr()
        for key in ("exp_avg", "exp_avg_sq"):
            st = a[a["name"] == f"opt.state[{name}].{key}"].iloc[0]
            assert st["category"] == "optimizer_state" and st["reason"] == "optimizer.state"
            assert st["size_bytes"] == opt.state[p][key].numel() * 4
    assert set(a.loc[a["category"] == "parameter", "name"]) == set(named)


def test_the_batch_is_input(mlp):
    prof, ns = mlp
    a = prof.allocations
    x = a[a["name"] == "x"].iloc[0]
    assert x["category"] == "input" and pd.isna(x["alloc_ns"])
    assert x["size_bytes"] == 64 * 256 * 4
    assert a[a["name"] == "y"].iloc[0]["category"] == "input"


def test_saved_activation_and_its_lineage(mlp):
    prof, _ = mlp
    ops = prof.ops.set_index("op_id")
    a = prof.allocations
    # the first ReLU's output: 64 x 512 floats, made in forward, freed in backward
    relu_ops = prof.ops[(prof.ops["name"] == "aten::relu") & (prof.ops["phase"] == "forward")]
    out = a[a["alloc_op_id"].isin(relu_ops["op_id"] + 1) | a["alloc_op_id"].isin(relu_ops["op_id"])]
    out = out[out["size_bytes"] == 64 * 512 * 4].iloc[0]
    assert out["category"] == "activation" and out["reason"] == "saved for backward"
    assert ops.loc[out["free_op_id"], "phase"] == "backward"
    lin = prof.lineage(int(out["alloc_id"]))
    assert list(lin.columns) == [
        "time_ns", "op_id", "op_name", "relation", "version", "category", "phase", "module", "callsite",
    ]  # fmt: skip
    first = lin.iloc[0]
    assert first["relation"] == "allocated" and first["op_name"] in (
        "aten::clamp_min",
        "aten::relu",
    )
    assert first["phase"] == "forward" and first["module"] == "model.1"
    used = lin[lin["relation"] == "used_in_backward"]
    assert "autograd::engine::evaluate_function: ReluBackward0" in {
        ops.loc[ops.loc[i, "parent_id"], "name"]
        if pd.notna(ops.loc[i, "parent_id"])
        else ops.loc[i, "name"]
        for i in used["op_id"]
    } | set(used["op_name"])
    saved = lin[lin["relation"] == "saved_for_backward"]
    assert "aten::relu" in set(saved["op_name"])
    freed = lin.iloc[-1]
    assert freed["relation"] == "freed" and freed["phase"] == "backward"
    assert lin["time_ns"].is_monotonic_increasing
    text = prof.lineage_text(int(out["alloc_id"]))
    assert "activation (saved for backward)" in text and "freed" in text


def test_peak_lists_the_live_blocks_largest_first(mlp):
    prof, ns = mlp
    pk = prof.peak()
    assert pk.attrs["device"] == "cpu"
    assert pk.attrs["peak_bytes"] == pk["size_bytes"].sum()
    assert pk["size_bytes"].is_monotonic_decreasing
    assert {"op_name", "module", "callsite", "category", "name"} <= set(pk.columns)
    # parameters and Adam state are alive at the peak
    assert {f"model.{n}" for n, _ in ns["model"].named_parameters()} <= set(pk["name"].dropna())
    assert (pk["category"] != "unknown").all()
    by_cat = pk.groupby("category", observed=True)["size_bytes"].sum()
    n_params = sum(p.numel() for p in ns["model"].parameters())
    assert by_cat["parameter"] == n_params * 4
    assert by_cat["optimizer_state"] >= 2 * n_params * 4
    with pytest.raises(ValueError, match="no memory events on device"):
        prof.peak("cuda:3")


def test_cnn_conv_workspace_is_temporary_and_bn_buffers_are_model_state():
    prof, ns = profile_scenario(scenarios.cnn_sgd)
    a = prof.allocations
    # blocks the profiler gave no tensor identity, other than those the session names (a
    # .grad that no op read during the capture can be one of them)
    raw = a[a["tensor_id"].isna() & a["name"].isna()]
    assert len(raw) > 0
    assert (raw["category"] == "temporary").all(), raw[["size_bytes", "category", "reason"]]
    ops = prof.ops.set_index("op_id")
    assert {"aten::mkldnn_convolution", "aten::convolution_backward"} & set(
        ops.loc[raw["alloc_op_id"].dropna(), "name"]
    )
    bn = a[a["name"] == "model.bn1.running_mean"].iloc[0]
    assert bn["category"] == "parameter" and bn["reason"] == "module buffer"
    mom = a[a["name"].fillna("").str.endswith(".momentum_buffer")]
    assert len(mom) == len(list(ns["model"].parameters()))
    assert (mom["category"] == "optimizer_state").all()
    assert (prof.peak()["category"] != "unknown").all()


def test_foreach_intermediates_in_optimizer_step_are_temporary():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters(), foreach=True)
    x = torch.randn(8, 64)
    model(x).sum().backward()
    opt.step()
    ns = {"model": model, "opt": opt, "x": x}
    with jupyter_memprof.profile(namespace=ns) as prof:
        opt.step()
    ops = prof.ops.set_index("op_id")
    a = prof.allocations.dropna(subset=["alloc_op_id"])
    node = ops.loc[a["alloc_op_id"], "node_id"].to_numpy()
    made_by_foreach = a[
        ops.loc[node, "name"].astype(str).str.startswith("aten::_foreach").to_numpy()
    ]
    assert len(made_by_foreach) > 0
    assert (made_by_foreach["category"] == "temporary").all()
    assert set(made_by_foreach["reason"]) <= {
        "made and freed inside the optimizer",
        "freed inside the op that made it",
    }


def test_transformer_adamw_has_no_unknown_and_exact_state():
    prof, ns = profile_scenario(scenarios.transformer_adamw)
    a = prof.allocations
    for name in (f"model.{n}" for n, _ in ns["model"].named_parameters()):
        assert a.loc[a["name"] == name, "category"].unique().tolist() == ["parameter"], name
        assert a.loc[a["name"] == f"{name}.grad", "category"].unique().tolist() == ["gradient"], (
            name
        )
        assert a.loc[a["name"] == f"opt.state[{name}].exp_avg", "category"].tolist() == [
            "optimizer_state"
        ]
    assert (prof.peak()["category"] != "unknown").all()


def test_checkpointing_recomputes_activations_in_backward():
    prof, _ = profile_scenario(scenarios.checkpointing_sgd)
    a = prof.allocations
    re = a[a["reason"] == "recomputed in backward (checkpointing)"]
    assert len(re) > 0 and (re["category"] == "activation").all()
    assert (prof.peak()["category"] != "unknown").all()


def test_bare_parameters_are_named_by_their_variables():
    prof, ns = profile_scenario(scenarios.bare_parameters_rmsprop)
    a = prof.allocations
    for var in ("w1", "b1", "w2"):
        assert a.loc[a["name"] == var, "category"].unique().tolist() == ["parameter"]
        assert a.loc[a["name"] == f"{var}.grad", "category"].unique().tolist() == ["gradient"]
        assert a.loc[a["name"] == f"opt.state[{var}].square_avg", "category"].tolist() == [
            "optimizer_state"
        ]


def test_inplace_writes_through_views_make_versions():
    prof, _ = profile_scenario(scenarios.inplace_views_sgd)
    ops = prof.ops.set_index("op_id")
    bumps = prof.versions[prof.versions["version"] > 0]
    names = set(ops.loc[bumps["op_id"], "name"])
    assert {"aten::mul_", "aten::relu_"} <= names
    h = prof.versions[
        prof.versions["op_id"].isin(
            bumps.loc[ops.loc[bumps["op_id"], "name"].eq("aten::mul_").to_numpy(), "op_id"]
        )
    ]
    assert (h["category"] == "activation").all()
    assert (prof.peak()["category"] != "unknown").all()


def test_embedding_adagrad_state_and_gradient():
    prof, ns = profile_scenario(scenarios.embedding_adagrad)
    a = prof.allocations
    emb = a[a["name"] == "model.emb.weight"].iloc[0]
    assert emb["category"] == "parameter" and emb["size_bytes"] == 5000 * 64 * 4
    assert a.loc[a["name"] == "model.emb.weight.grad", "category"].unique().tolist() == ["gradient"]
    assert a.loc[a["name"] == "opt.state[model.emb.weight].sum", "category"].tolist() == [
        "optimizer_state"
    ]
    assert a.loc[a["name"] == "tokens", "category"].unique().tolist() == ["input"]
    assert (prof.peak()["category"] != "unknown").all()


def test_a_gradient_is_never_saved_for_backward(mlp):
    prof, _ = mlp
    a = prof.allocations
    grads = a[a["category"] == "gradient"]["alloc_id"]
    from jupyter_memprof._analysis.lineage import all_lineages

    lin = all_lineages(prof.tables, grads)
    assert len(lin) > 0
    assert "saved_for_backward" not in set(lin["relation"].astype(str))
    # and every saved_for_backward row anywhere comes after its block was allocated
    every = all_lineages(prof.tables)
    saved = every[every["relation"] == "saved_for_backward"]
    born = a.set_index("alloc_id")["alloc_ns"].reindex(saved["alloc_id"])
    assert (born.isna().to_numpy() | (born.to_numpy() <= saved["time_ns"].to_numpy())).all()


def test_peak_by_groups_the_peak(mlp):
    prof, ns = mlp
    by_cat = prof.peak_by("category")
    assert by_cat.sum() == prof.peak().attrs["peak_bytes"]
    assert by_cat.is_monotonic_decreasing
    n_params = sum(p.numel() for p in ns["model"].parameters())
    assert by_cat["parameter"] == n_params * 4
    by_name = prof.peak_by("name")
    assert by_name["model.0.weight"] == 256 * 512 * 4
    assert prof.peak_by("module").sum() == by_cat.sum()
    with pytest.raises(ValueError, match="choose one of"):
        prof.peak_by("colour")


def test_lineage_of_an_unknown_block_is_a_clear_error(mlp):
    prof, _ = mlp
    with pytest.raises(KeyError, match="no block with alloc_id=999999"):
        prof.lineage(999999)


def _live_names(ns):
    """What the live objects say: {name: tensor} for parameters and buffers (named as the
    profile names them), and the optimizer."""
    params, buffers = {}, {}
    for var, value in ns.items():
        if isinstance(value, torch.nn.Module):  # names start with the root's variable
            params.update((f"{var}.{n}", t) for n, t in value.named_parameters())
            buffers.update((f"{var}.{n}", t) for n, t in value.named_buffers())
        elif isinstance(value, torch.nn.Parameter):
            params[var] = value
    return params, buffers, ns["opt"]


@pytest.mark.parametrize("scenario", list(scenarios.SCENARIOS))
def test_parameters_gradients_and_optimizer_state_are_exact_in_every_scenario(scenario):
    prof, ns = profile_scenario(scenarios.SCENARIOS[scenario])
    params, buffers, opt = _live_names(ns)
    a = prof.allocations
    alive = a[a["free_ns"].isna()]

    def block(name):
        rows = alive[alive["name"] == name]
        assert len(rows) == 1, (name, rows)
        return rows.iloc[0]

    def nbytes(t):
        return t.untyped_storage().nbytes()

    expected = {"parameter": 0, "gradient": 0, "optimizer_state": 0}
    for name, p in params.items():
        row = block(name)
        assert (row["category"], row["reason"]) == ("parameter", "module parameter"), name
        assert row["size_bytes"] == nbytes(p) and row["ptr"] == p.untyped_storage().data_ptr()
        grad = block(f"{name}.grad")
        assert (grad["category"], grad["size_bytes"]) == ("gradient", nbytes(p.grad)), name
        assert grad["ptr"] == p.grad.untyped_storage().data_ptr()
        expected["parameter"] += nbytes(p)
        expected["gradient"] += nbytes(p.grad)
        # plain SGD keeps no state; every other optimizer here keeps some for each parameter
        state = {k: v for k, v in opt.state[p].items() if torch.is_tensor(v)}
        stateless = type(opt) is torch.optim.SGD and not opt.defaults["momentum"]
        assert bool(state) != stateless, name
        for key, value in state.items():
            row = block(f"opt.state[{name}].{key}")
            assert (row["category"], row["reason"]) == ("optimizer_state", "optimizer.state")
            assert row["size_bytes"] == nbytes(value), (name, key)
            expected["optimizer_state"] += nbytes(value)
    for name, b in buffers.items():
        row = block(name)
        assert (row["category"], row["reason"]) == ("parameter", "module buffer"), name
        assert row["size_bytes"] == nbytes(b)
        expected["parameter"] += nbytes(b)
    # and nothing else is called a parameter, a gradient kept to the end, or optimizer state
    by_category = alive.groupby("category", observed=True)["size_bytes"].sum()
    for category, total in expected.items():
        assert by_category.get(category, 0) == total, category
    # the same bytes are live at the peak (the step neither frees nor grows them)
    at_peak = prof.peak_by("category")
    assert at_peak["parameter"] == expected["parameter"]
    assert at_peak.get("optimizer_state", 0) == expected["optimizer_state"]


def _fixed_blocks(prof) -> pd.DataFrame:
    """Parameters, buffers, gradients and optimizer state alive at the end: name, category,
    reason and size, one row per block, sorted by name."""
    a = prof.allocations
    a = a[a["free_ns"].isna() & a["category"].isin(["parameter", "gradient", "optimizer_state"])]
    cols = ["name", "category", "reason", "size_bytes"]
    out = a[cols].astype({"name": object, "category": object, "reason": object})
    return out.sort_values("name", kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("scenario", list(scenarios.SCENARIOS))
def test_parameters_gradients_and_optimizer_state_are_exact_without_stacks(scenario):
    # README: exact "either way" (with_stack=False / %%memprofile --no-stack): the same names,
    # categories, reasons and sizes as a capture with Python stacks of the same step
    ns, step = scenarios.SCENARIOS[scenario]()
    step()
    profs = {}
    for with_stack in (True, False):
        with jupyter_memprof.profile(namespace=ns, with_stack=with_stack) as prof:
            step()
        profs[with_stack] = prof
    assert profs[False].meta["with_stack"] is False and profs[True].meta["with_stack"] is True
    assert profs[False].ops["callsite"].isna().all()  # no stacks were recorded
    fast, full = _fixed_blocks(profs[False]), _fixed_blocks(profs[True])
    assert len(full) and full["name"].notna().all()
    assert set(full["category"]) >= {"parameter", "gradient"}
    pd.testing.assert_frame_equal(fast, full)
    # and so the fixed costs at the peak
    for category in ("parameter", "optimizer_state"):
        got = [p.peak_by("category").get(category, 0) for p in (profs[False], profs[True])]
        assert got[0] == got[1], category


def test_the_categories_benchmark_captures_as_profile_does():
    """benchmarks/bench_categories.py (run by hand, not in CI) still runs its capture path:
    it once called a Recorder method that had gone."""
    import bench_categories

    prof, results = bench_categories.capture(scenarios.mlp_adam)
    assert results is not None  # torch's raw result, for its MemoryProfile
    exact, _ = profile_scenario(scenarios.mlp_adam)
    assert prof.peak_by("category").to_dict() == exact.peak_by("category").to_dict()


def test_each_rule_runs_alone_on_the_tables(mlp):
    """The category rules are named passes over one set of facts: run alone, the session
    rule decides exactly the blocks the session names as model state, and the module rules
    alone put every parameter in its module."""
    from jupyter_memprof._analysis import categories as cats
    from jupyter_memprof._analysis import modules as mods
    from jupyter_memprof._analysis.facts import facts

    prof, ns = mlp
    f = facts(prof.tables)
    d = cats.Decisions(f.n)
    cats.session_rule(f, d)
    decided = d.cat >= 0
    reasons = {d.reasons.values[c] for c in d.why[decided]}
    assert reasons == {"module parameter", "optimizer.state", ".grad of a parameter"}
    a = prof.allocations
    by_rule = set(a["alloc_id"][decided])
    final = (
        a["reason"]
        .astype(object)
        .map(lambda r: isinstance(r, str) and r.startswith(tuple(reasons)))
    )
    assert by_rule == set(a["alloc_id"][final.to_numpy(dtype=bool)])

    owners = mods.Owners(f)
    mods.owner_rule(owners)
    module, why = owners.columns()
    weight = int(
        np.flatnonzero((a["name"] == "model.0.weight").to_numpy(dtype=bool, na_value=False))[0]
    )
    assert module[weight] == "model.0" and why[weight] == "holds it as a parameter"
    assert cats.RULES[0] is cats.unreachable_rule and cats.RULES[-1] is cats.fallback_rule
