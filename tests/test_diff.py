"""diff() and module attribution on tiny real training steps."""

import gc
import json
import zipfile

import numpy as np
import pandas as pd
import pytest
import scenarios
import torch
from conftest import profile_scenario
from torch import nn

import jupyter_memprof


class Encoder(nn.Module):
    """A token classifier on a two-layer TransformerEncoder (activations dominate)."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.encoder(x))


def _encoder_step(model, opt, batch):
    torch.manual_seed(1)
    x, y = torch.randn(batch, 64, 32), torch.randint(0, 10, (batch * 64,))

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x).flatten(0, 1), y).backward()
        opt.step()

    return {"model": model, "opt": opt, "x": x, "y": y}, step


def _profile(ns, step, label):
    step()
    gc.collect()
    with jupyter_memprof.profile(namespace=ns, label=label) as prof:
        step()
    return prof


@pytest.fixture(scope="module")
def batches():
    torch.manual_seed(0)
    model = Encoder()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    a = _profile(*_encoder_step(model, opt, 32), "batch 32")
    b = _profile(*_encoder_step(model, opt, 64), "batch 64")
    return a, b, model


def test_batch_32_against_64_grows_activations_only(batches):
    a, b, model = batches
    d = jupyter_memprof.diff(a, b)
    assert list(d.columns) == ["a", "b", "delta", "ratio"]
    assert d.index.name == "category"
    assert d["delta"].abs().is_monotonic_decreasing
    assert d.index[0] == "activation"
    act = d.loc["activation"]
    assert act["delta"] > 0 and 1.6 < act["ratio"] < 2.4, act
    n_params = sum(p.numel() for p in model.parameters())
    assert d.loc["parameter", "a"] == d.loc["parameter", "b"] == n_params * 4
    assert d.loc["parameter", "delta"] == 0
    if "optimizer_state" in d.index:
        assert d.loc["optimizer_state", "delta"] == 0
    assert d.attrs["peak_a"] == a.peak().attrs["peak_bytes"]
    assert d.attrs["peak_b"] == b.peak().attrs["peak_bytes"]
    assert d["a"].sum() == d.attrs["peak_a"] and d["b"].sum() == d.attrs["peak_b"]
    assert (d["delta"] == d["b"] - d["a"]).all()
    assert d.attrs["label_a"] == "batch 32" and d.attrs["label_b"] == "batch 64"


def test_the_summary_names_the_peak_change_and_its_main_cause(batches):
    a, b, _ = batches
    d = jupyter_memprof.diff(a, b)
    change = d.attrs["peak_b"] - d.attrs["peak_a"]
    pct = f"{change / d.attrs['peak_a']:+.0%}"
    summary = d.attrs["summary"]
    assert summary.startswith(f"peak +{jupyter_memprof._units.format_bytes(change)} ({pct}): ")
    assert "activation +" in summary and "mostly model.encoder.layers.*" in summary, summary


def test_diff_by_module_puts_the_growth_in_the_encoder_layers(batches):
    a, b, _ = batches
    d = jupyter_memprof.diff(a, b, by="module")
    assert d.index.name == "module"
    grown = d[d["delta"] > 0]
    assert grown.index.str.startswith("model.encoder.layers.").any()
    # parameters, their gradients and Adam's state belong to their modules: head.weight and
    # friends count for model.head, never for "(none)"
    head = d.loc["model.head"]
    w = a.allocations.set_index("name")
    assert head["a"] >= w.loc["model.head.weight", "size_bytes"]


def test_diff_prints_for_a_terminal(batches):
    a, b, _ = batches
    text = str(jupyter_memprof.diff(a, b))
    lines = text.splitlines()
    assert lines[0].startswith("peak +")
    assert lines[1].startswith("a = batch 32 (peak ") and "b = batch 64 (peak " in lines[1]
    assert lines[2].split() == ["category", "a", "b", "delta", "ratio"]
    act = next(line for line in lines if line.startswith("activation"))
    assert "MiB" in act and "+" in act and act.rstrip().endswith("x")
    assert "<table" in jupyter_memprof.diff(a, b)._repr_html_()


def test_diff_by_op_and_name_and_bad_key(batches):
    a, b, _ = batches
    by_op = jupyter_memprof.diff(a, b, by="op")
    assert by_op.index.name == "op" and by_op["b"].sum() == by_op.attrs["peak_b"]
    by_name = jupyter_memprof.diff(a, b, by="name")
    assert by_name.loc["model.head.weight", "delta"] == 0
    with pytest.raises(ValueError, match="choose one of category, module, op, name"):
        jupyter_memprof.diff(a, b, by="colour")
    with pytest.raises(TypeError, match="must be a Profile or the path"):
        jupyter_memprof.diff(a, 3)


def test_a_profile_against_its_saved_copy_differs_nowhere(batches, tmp_path):
    # a saved and reloaded profile of the same step differs nowhere (an estimate against the
    # real capture: test_an_estimate_against_the_real_capture)
    a, _, _ = batches
    path = a.save(tmp_path / "a.memprof")
    for by in ("category", "module", "op", "name"):
        d = jupyter_memprof.diff(a, path, by=by)
        assert (d["delta"] == 0).all(), by
        assert (d["ratio"] == 1).all()
    assert jupyter_memprof.diff(path, a).attrs["summary"].startswith("peak unchanged")


def test_new_and_gone_keys(batches):
    a, _, _ = batches
    empty = jupyter_memprof.Profile.empty(label="nothing")
    d = jupyter_memprof.diff(empty, a)
    assert np.isinf(d["ratio"]).all() and (d["a"] == 0).all()
    assert "new" in str(d)
    back = jupyter_memprof.diff(a, empty)
    assert (back["ratio"] == 0).all() and "gone" in str(back)
    assert back.attrs["summary"].startswith("peak -")


def test_checkpointing_makes_activations_fall():
    torch.manual_seed(0)
    plain = scenarios.CheckpointedMLP()
    ckpt = scenarios.CheckpointedMLP()
    ckpt.load_state_dict(plain.state_dict())
    plain.forward = lambda x: plain.head(nn.Sequential(*plain.blocks)(x))  # no checkpointing
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
    profs = []
    for model in (plain, ckpt):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ns = {"model": model, "opt": opt, "x": x, "y": y}
        profs.append(_profile(ns, scenarios.classification_step(model, opt, x, y), "run"))
    d = jupyter_memprof.diff(*profs)
    assert d.loc["activation", "delta"] < 0
    assert d.loc["parameter", "delta"] == 0
    assert d.attrs["peak_b"] < d.attrs["peak_a"]
    assert d.attrs["summary"].startswith("peak -") and "activation -" in d.attrs["summary"]


def _gan():
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 64))
    D = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    opt_g = torch.optim.Adam(G.parameters())
    opt_d = torch.optim.Adam(D.parameters())
    z = torch.randn(64, 16)

    def step():
        opt_g.zero_grad()
        opt_d.zero_grad()
        D(G(z)).mean().backward()
        opt_g.step()
        opt_d.step()

    return {"G": G, "D": D, "opt_g": opt_g, "opt_d": opt_d, "z": z}, step


def test_two_models_in_one_step_never_share_a_name():
    ns, step = _gan()
    prof = _profile(ns, step, "gan")
    ops = prof.ops
    fwd = ops[(ops["name"] == "aten::addmm") & (ops["phase"] == "forward")]
    assert sorted(fwd["module"]) == ["D.0", "D.2", "G.0", "G.2"]
    assert set(ops.loc[ops["kind"] == "module", "module"]) == {
        "G", "G.0", "G.1", "G.2", "D", "D.0", "D.1", "D.2",
    }  # fmt: skip
    a = prof.allocations
    params = a[a["category"] == "parameter"]
    assert sorted(params["name"]) == sorted(
        [f"{m}.{i}.{w}" for m in "GD" for i in (0, 2) for w in ("weight", "bias")]
    )
    assert a.loc[a["name"] == "opt_d.state[D.0.weight].exp_avg", "module"].tolist() == ["D.0"]
    assert set(a.loc[a["name"] == "G.2.bias.grad", "module"]) == {"G.2"}  # this step's, the last's
    # both models' bytes are attributed at the peak
    by_module = prof.peak_by("module")
    assert any(k.startswith("G.") for k in by_module.index)
    assert any(k.startswith("D.") for k in by_module.index)
    pk = prof.peak()
    none = pk.loc[pk["module"].isna(), "size_bytes"].sum()
    assert none <= 64 * 16 * 4 + 0.01 * pk.attrs["peak_bytes"]


def test_models_outside_the_namespace_are_named_by_class_and_numbered():
    ns, step = _gan()
    step()
    gc.collect()
    with jupyter_memprof.profile(namespace={}) as prof:
        step()
    mods = set(prof.ops.loc[prof.ops["kind"] == "module", "module"])
    assert mods == {
        "Sequential", "Sequential.0", "Sequential.1", "Sequential.2",
        "Sequential_2", "Sequential_2.0", "Sequential_2.1", "Sequential_2.2",
    }  # fmt: skip
    names = prof.names.dropna(subset=["alloc_id"])
    per_block = names.groupby("alloc_id")["name"].nunique()
    assert (per_block == 1).all()
    assert "Sequential_2.0.weight" in set(names["name"])


def test_a_submodule_in_a_variable_does_not_rename_its_model(mlp_adam_profile):
    _, ns = mlp_adam_profile
    model, x = ns["model"], ns["x"]
    fc1 = model.fc1  # a part of model, in the namespace before it
    with jupyter_memprof.profile(namespace={"fc1": fc1, "model": model, "x": x}) as prof:
        model(x).sum().backward()
    assert set(prof.ops.loc[prof.ops["kind"] == "module", "module"]) == {
        "model",
        "model.fc1",
        "model.fc2",
    }
    assert "model.fc1.weight" in set(prof.allocations["name"].dropna())


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_every_byte_at_the_peak_has_a_module_but_the_data(name):
    prof, _ = profile_scenario(scenarios.SCENARIOS[name])
    pk = prof.peak()
    peak_bytes = pk.attrs["peak_bytes"]
    no_module = pk[pk["module"].isna()]
    inputs = no_module.loc[no_module["category"] == "input", "size_bytes"].sum()
    assert no_module["size_bytes"].sum() <= inputs + 0.01 * peak_bytes, no_module[
        ["size_bytes", "category", "reason", "op_name", "name"]
    ]
    by_module = prof.peak_by("module")
    assert by_module.sum() == peak_bytes
    owned = pk[pk["category"].isin(["parameter", "gradient", "optimizer_state"])]
    assert owned["module_reason"].str.startswith("holds").all()


def test_files_saved_before_module_columns_still_load(batches, tmp_path):
    a, _, _ = batches
    path = tmp_path / "old.memprof"
    a.save(path)
    old = tmp_path / "older.memprof"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.namelist():
            data = src.read(item)
            if item in ("allocations.json", "names.json"):
                doc = json.loads(data)
                for col in ("module", "module_reason"):
                    doc["data"].pop(col, None)
                    if col in doc["columns"]:
                        doc["columns"].remove(col)
                data = json.dumps(doc).encode()
            dst.writestr(item, data)
    loaded = jupyter_memprof.load(old)
    assert loaded.allocations["module"].isna().all()
    pd.testing.assert_frame_equal(
        loaded.allocations.drop(columns=["module", "module_reason"]),
        a.allocations.drop(columns=["module", "module_reason"]),
    )


def test_names_are_the_same_from_the_magic_and_from_profile(ipython_shell):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    x = torch.randn(4, 8)
    ip = ipython_shell
    ip.run_cell("%load_ext jupyter_memprof")
    try:
        ip.user_ns.update(model=model, x=x)
        result = ip.run_cell("%%memprofile -o magic_prof --no-display\nmodel(x).sum().backward()")
        assert result.success
        from_magic = ip.user_ns.pop("magic_prof")
    finally:
        ip.run_cell("%unload_ext jupyter_memprof")
        for k in ("model", "x"):
            ip.user_ns.pop(k, None)
    with jupyter_memprof.profile(namespace={"model": model, "x": x}) as from_script:
        model(x).sum().backward()
    for prof in (from_magic, from_script):
        names = set(prof.allocations["name"].dropna())
        assert {"model.0.weight", "model.2.bias", "model.0.weight.grad"} <= names, names
        assert set(prof.ops.loc[prof.ops["kind"] == "module", "module"]) == {
            "model", "model.0", "model.1", "model.2",
        }  # fmt: skip


def test_the_dashboard_lists_a_parameter_under_its_module(mlp_adam_profile):
    from jupyter_memprof._views.dashboard.page import build

    prof, _ = mlp_adam_profile
    data = build(prof).allocs.data
    row = list(data["name"]).index("model.fc1.weight")
    assert data["module"][row] == "model.fc1"


def real_and_estimate(batch: int):
    """A real capture of a warmed-up step and an estimate of the same step on fake tensors
    (``device="cpu"``)."""
    torch.manual_seed(0)
    model = Encoder()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ns, step = _encoder_step(model, opt, batch)
    real = _profile(ns, step, "real")

    def train(model, opt, x, y):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x).flatten(0, 1), y).backward()
        opt.step()

    return real, jupyter_memprof.estimate(train, model, opt, ns["x"], ns["y"], device="cpu")


def test_an_estimate_against_the_real_capture(tmp_path):
    real, est = real_and_estimate(16)
    assert est.meta["estimate"] is True
    d = jupyter_memprof.diff(real, est)
    for cat in ("parameter", "gradient", "optimizer_state"):
        assert d.loc[cat, "a"] > 0 and d.loc[cat, "delta"] == 0, (cat, d)
    assert abs(d.attrs["peak_b"] - d.attrs["peak_a"]) <= 0.02 * d.attrs["peak_a"], d
    # per tensor too: every parameter, gradient and optimizer state, by its (prefixed) name
    by_name = jupyter_memprof.diff(real, est, by="name")
    fixed = [k for k in by_name.index if k.startswith(("model.", "opt.state["))]
    assert any(k.endswith(".grad") for k in fixed) and any("exp_avg" in k for k in fixed)
    assert (by_name.loc[fixed, "delta"] == 0).all(), by_name.loc[fixed]
    # and from a saved estimate
    assert jupyter_memprof.diff(real, est.save(tmp_path / "est.memprof")).equals(d)


EVIL = '<img id="memprof-evil" src=x onerror="alert(1)">'


def test_the_html_of_a_diff_escapes_labels_that_are_markup(batches):
    import dataclasses
    import html
    from html.parser import HTMLParser

    class Tags(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags = []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)

    a, b, _ = batches
    evil = dataclasses.replace(b, meta={**b.meta, "label": EVIL})
    page = jupyter_memprof.diff(a, evil)._repr_html_()
    parser = Tags()
    parser.feed(page)
    parser.close()
    assert "img" not in parser.tags and "table" in parser.tags
    assert "&lt;img id=&quot;memprof-evil&quot;" in page
    assert f"b = {EVIL} (peak " in html.unescape(page)
