"""what_if(): each change's estimated peak against a real capture of the same step changed
by hand, on the scenarios of benchmarks/scenarios.py; bad changes; the real objects kept."""

from __future__ import annotations

import functools
import gc
import sys
from pathlib import Path

import pytest
import torch

import jupyter_memprof
from jupyter_memprof import EstimateError, what_if

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from changed_by_hand import (
    autocast_by_hand,
    cells_of,
    checkpoint_by_hand,
    doubled,
    run_closure,
)
from scenarios import (
    CheckpointedMLP,
    checkpointing_sgd,
    cnn_sgd,
    embedding_adagrad,
    inplace_views_sgd,
    mlp_adam,
    transformer_adamw,
)

#: Every change's estimated peak is within this of the real changed step's.
TOLERANCE = 0.02


# -- the same step, changed by hand --------------------------------------------------------------
def estimated(step, ns, **changes):
    """what_if() of a scenario's step; its model is known as ``model`` (patterns use it)."""
    model = ns.get("model")  # noqa: F841 (what_if reads its caller's names)
    return what_if(run_closure, step.__code__, step.__globals__, cells_of(step), **changes)


def real_peak(ns, step, cells=None) -> int:
    """The real peak of ``step`` (with ``cells`` in place of its own); the namespace names
    the objects it runs on (the capture counts what the namespace holds)."""
    if cells is not None:
        swap = {id(old): new for old, new in zip(cells_of(step), cells) if old is not new}
        ns = {k: swap.get(id(v), v) for k, v in ns.items()}
    gc.collect()
    with jupyter_memprof.profile(namespace=ns) as prof:
        if cells is None:
            step()
        else:
            run_closure(step.__code__, step.__globals__, cells)
    return prof.peak().attrs["peak_bytes"]


SCENARIOS = {
    "mlp": (mlp_adam, ["model.2"]),
    "cnn": (cnn_sgd, ["model.conv2", "model.bn2"]),
    "transformer": (transformer_adamw, ["model.self_attn", "model.linear1"]),
    "inplace": (inplace_views_sgd, ["model.fc1"]),
    "embedding": (embedding_adagrad, ["model.emb"]),
}


def _scenario(make):
    ns, step = make()
    step()  # warmed up: gradients and optimizer state exist
    return ns, step


def _check(est_peak: int, real: int) -> None:
    assert abs(est_peak - real) <= TOLERANCE * real, (est_peak, real, (est_peak - real) / real)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_checkpoint_matches_the_step_checkpointed_by_hand(name):
    make, paths = SCENARIOS[name]
    ns, step = _scenario(make)
    cmp = estimated(step, ns, checkpoint=paths)
    assert cmp.a.meta["estimate"] and cmp.b.meta["what_if"] == {"checkpoint": paths}
    checkpoint_by_hand(ns["model"], [p.removeprefix("model.") for p in paths])
    _check(cmp.b.peak().attrs["peak_bytes"], real_peak(ns, step))


def test_checkpoint_of_a_family_matches_a_checkpointed_model():
    """CheckpointedMLP checkpoints its blocks itself; the same model without it, with
    checkpoint=["model.blocks.*"], is estimated as the real checkpointed one runs."""

    class Plain(CheckpointedMLP):
        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    ns, step = _scenario(checkpointing_sgd)
    real = real_peak(ns, step)
    plain = Plain()
    plain.load_state_dict(ns["model"].state_dict())
    cells = [plain if c is ns["model"] else c for c in cells_of(step)]
    opt = ns["opt"]
    opt.param_groups[0]["params"] = list(plain.parameters())
    run_closure(step.__code__, step.__globals__, cells)  # warm
    model = plain  # noqa: F841 (the name the pattern uses)
    cmp = what_if(
        run_closure, step.__code__, step.__globals__, cells, checkpoint=["model.blocks.*"]
    )
    _check(cmp.b.peak().attrs["peak_bytes"], real)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_autocast_bf16_matches_the_step_autocast_by_hand(name):
    make, _ = SCENARIOS[name]
    ns, step = _scenario(make)
    cmp = estimated(step, ns, autocast=torch.bfloat16)
    autocast_by_hand(ns["model"], torch.bfloat16)
    _check(cmp.b.peak().attrs["peak_bytes"], real_peak(ns, step))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_batch_2x_matches_the_step_on_twice_the_batch(name):
    make, _ = SCENARIOS[name]
    ns, step = _scenario(make)
    cmp = estimated(step, ns, batch=2)
    cells = doubled(cells_of(step))
    real = real_peak(ns, step, cells)
    _check(cmp.b.peak().attrs["peak_bytes"], real)
    assert cmp.b.peak().attrs["peak_bytes"] > cmp.a.peak().attrs["peak_bytes"]


OPTIMIZERS = {
    "SGD momentum": functools.partial(torch.optim.SGD, momentum=0.9),
    "Adam": torch.optim.Adam,
    "SGD": torch.optim.SGD,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("new", list(OPTIMIZERS))
def test_optimizer_swap_matches_the_step_with_the_new_optimizer(name, new):
    make, _ = SCENARIOS[name]
    ns, step = _scenario(make)
    factory = OPTIMIZERS[new]
    cmp = estimated(step, ns, optimizer=factory)
    new_opt = factory(ns["model"].parameters(), lr=1e-3)
    cells = [new_opt if c is ns["opt"] else c for c in cells_of(step)]
    run_closure(step.__code__, step.__globals__, cells)  # warmed up, as what_if's is
    real = real_peak(ns, step, cells)
    _check(cmp.b.peak().attrs["peak_bytes"], real)


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_optimizer_keywords_match_the_step_with_them(name):
    make, _ = SCENARIOS[name]
    ns, step = _scenario(make)
    cmp = estimated(step, ns, optimizer={"foreach": True})
    for group in ns["opt"].param_groups:
        group["foreach"] = True
    real = real_peak(ns, step)
    _check(cmp.b.peak().attrs["peak_bytes"], real)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_set_to_none_false_matches_the_step_that_keeps_gradients(name):
    make, _ = SCENARIOS[name]
    ns, step = _scenario(make)
    cmp = estimated(step, ns, set_to_none=False)
    opt = ns["opt"]
    opt.zero_grad = functools.partial(type(opt).zero_grad, opt, set_to_none=False)
    real = real_peak(ns, step)
    _check(cmp.b.peak().attrs["peak_bytes"], real)
    assert cmp.b.peak().attrs["peak_bytes"] >= cmp.a.peak().attrs["peak_bytes"]


# -- the real objects ----------------------------------------------------------------------------
def _snapshot(model, opt):
    return (
        [p.detach().clone() for p in model.parameters()],
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        [
            {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
            for s in opt.state.values()
        ],
        [dict((k, v) for k, v in g.items() if k != "params") for g in opt.param_groups],
        type(model).forward is model.forward.__func__ and "forward" not in vars(model),
    )


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def test_the_real_objects_are_not_changed():
    ns, step = _scenario(transformer_adamw)
    model, opt, x = ns["model"], ns["opt"], ns["x"]
    before = _snapshot(model, opt)
    x_before = x.clone()
    cmp = estimated(
        step,
        ns,
        checkpoint=["model.self_attn"],
        autocast=torch.bfloat16,
        optimizer=torch.optim.SGD,
        set_to_none=False,
        batch=2,
    )
    assert cmp.b.peak().attrs["peak_bytes"] != cmp.a.peak().attrs["peak_bytes"]
    assert _equal(_snapshot(model, opt), before)
    assert torch.equal(x, x_before) and x.shape == (8, 32, 64)
    assert all("forward" not in vars(m) for m in model.modules())
    assert "zero_grad" not in vars(opt)


def test_comparison_has_both_estimates_and_the_diff():
    ns, step = _scenario(mlp_adam)
    cmp = estimated(step, ns, optimizer=torch.optim.SGD)
    assert cmp.a.label == "run_closure, as is"
    assert cmp.b.label == "run_closure, optimizer=torch.optim.SGD"
    d = cmp.diff("category")
    state = 2 * sum(p.numel() * 4 for p in ns["model"].parameters()) + 4 * 6
    assert d.loc["optimizer_state", "a"] == state  # Adam's two moments and step counters
    assert "optimizer_state" not in d.index or d.loc["optimizer_state", "b"] == 0
    assert cmp.b.meta["what_if"] == {"optimizer": "torch.optim.SGD"}


# -- bad changes: one line, before anything runs --------------------------------------------------
def _fails_before_running(match: str, **changes) -> None:
    ns, step = _scenario(mlp_adam)
    calls = []

    def spy(*args):
        calls.append(args)
        return run_closure(*args)

    model = ns["model"]  # noqa: F841 (what_if reads its caller's names)
    with pytest.raises(EstimateError, match=match) as err:
        what_if(spy, step.__code__, step.__globals__, cells_of(step), **changes)
    assert "\n" not in str(err.value)
    assert calls == []


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"checkpoint": ["model.blocks.*"]}, r"'model.blocks.\*' matches no module"),
        ({"checkpoint": "model.9"}, "matches no module"),
        ({"checkpoint": [3]}, "takes a list of module patterns"),
        ({"autocast": torch.float32}, "autocast on cpu takes torch.bfloat16 or torch.float16"),
        ({"autocast": "bf16"}, "autocast on cpu takes"),
        ({"batch": 0.3}, r"batch=0.3 does not divide the batch of .* \(64 rows\)"),
        ({"batch": 0}, "batch takes a scale"),
        ({"batch": True}, "batch takes a scale"),
        ({"batch": float("inf")}, "finite"),
        ({"optimizer": {"nesterov": True}}, "Adam takes no 'nesterov'"),
        ({"optimizer": "SGD"}, "optimizer takes an optimizer class"),
        (
            {"optimizer": functools.partial(torch.optim.SGD, betas=(0.9, 0.9))},
            "SGD takes no 'betas'",
        ),
        ({"set_to_none": "yes"}, "set_to_none must be True or False"),
        ({"checkpointing": ["model.0"]}, "what_if\\(\\) has no change 'checkpointing'"),
    ],
)
def test_bad_changes_are_one_line_before_anything_runs(changes, match):
    _fails_before_running(match, **changes)


def test_bad_device_and_function():
    with pytest.raises(EstimateError, match="needs a function"):
        what_if(3)
    with pytest.raises(EstimateError):
        what_if(lambda: None, device="tpu")


def test_batch_needs_batch_first_inputs():
    model = torch.nn.Linear(8, 8)
    x = torch.randn(8, 16).t()  # its first dimension is the inner one

    def step(model, x):
        model(x).sum().backward()

    with pytest.raises(EstimateError, match="not laid out batch first"):
        what_if(step, model, x, batch=2)
    with pytest.raises(EstimateError, match="no input tensor"):
        what_if(step, model, batch=2)


# -- a transformers model from a config (random weights, nothing downloaded) ----------------------
def _gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=500,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 500, (4, 32))
    return model, opt, ids


def lm_step(model, opt, ids):
    opt.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()


def _real_lm_peak(model, opt, ids) -> int:
    gc.collect()
    with jupyter_memprof.profile() as prof:
        lm_step(model, opt, ids)
    return prof.peak().attrs["peak_bytes"]


@pytest.mark.parametrize("change", ["checkpoint", "autocast", "batch", "optimizer"])
def test_a_transformers_model_changed_by_hand(change):
    model, opt, ids = _gpt2()
    lm_step(model, opt, ids)  # warmed up
    changes = {
        "checkpoint": {"checkpoint": ["model.transformer.h.*"]},
        "autocast": {"autocast": torch.bfloat16},
        "batch": {"batch": 2},
        "optimizer": {"optimizer": torch.optim.SGD},
    }[change]
    cmp = what_if(lm_step, model, opt, ids, **changes)
    if change == "checkpoint":
        checkpoint_by_hand(model, ["transformer.h.0", "transformer.h.1"])
    elif change == "autocast":
        autocast_by_hand(model, torch.bfloat16)
    elif change == "batch":
        ids = torch.cat([ids, ids])
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        lm_step(model, opt, ids)
    real = _real_lm_peak(model, opt, ids)
    _check(cmp.b.peak().attrs["peak_bytes"], real)
    assert cmp.b.peak().attrs["peak_bytes"] != cmp.a.peak().attrs["peak_bytes"]


# -- the widget -----------------------------------------------------------------------------------
def test_widget_toggles_changes_and_estimates_each_combination_once():
    from jupyter_memprof import what_if_widget

    ns, step = _scenario(transformer_adamw)
    model = ns["model"]  # noqa: F841 (the pattern's name)
    w = what_if_widget(
        run_closure,
        step.__code__,
        step.__globals__,
        cells_of(step),
        checkpoint=["model.self_attn"],
        autocast=torch.bfloat16,
    )
    as_is = w.as_is.peak().attrs["peak_bytes"]
    assert w.comparison is None and "as is: peak" in w.result.value
    w.boxes["checkpoint"].value = True
    one = w.comparison.b.peak().attrs["peak_bytes"]
    w.boxes["autocast"].value = True
    both = w.comparison.b.peak().attrs["peak_bytes"]
    assert one < as_is and both < as_is and both != one
    assert (
        w.comparison.b.label
        == "run_closure, checkpoint=['model.self_attn'], autocast=torch.bfloat16"
    )
    w.boxes["autocast"].value = False
    assert w.comparison.b.peak().attrs["peak_bytes"] == one
    assert len(w._profiles) == 3  # as is, checkpoint, both: the second checkpoint alone was kept
    cmp = estimated(step, ns, checkpoint=["model.self_attn"])
    assert cmp.b.peak().attrs["peak_bytes"] == one
    assert w.result.value.startswith("<pre>peak ")


def test_widget_checks_every_change_before_anything_runs():
    from jupyter_memprof import what_if_widget

    calls = []
    model = torch.nn.Linear(4, 4)

    def step(model):
        calls.append(1)

    with pytest.raises(EstimateError, match="matches no module"):
        what_if_widget(step, model, checkpoint=["nothing"], autocast=torch.bfloat16)
    assert calls == []


def test_the_changed_estimate_saves_and_loads_with_its_changes(tmp_path):
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def step(model, opt, x):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    cmp = what_if(step, model, opt, x, optimizer=torch.optim.Adam, batch=2, autocast=torch.bfloat16)
    want = {"optimizer": "torch.optim.Adam", "batch": 2, "autocast": "torch.bfloat16"}
    for fmt in ("zip", "parquet"):
        loaded = jupyter_memprof.load(cmp.b.save(tmp_path / f"b.{fmt}", format=fmt))
        assert loaded.meta["what_if"] == want
        assert loaded.peak().attrs["peak_bytes"] == cmp.b.peak().attrs["peak_bytes"]
