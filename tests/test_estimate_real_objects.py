"""An estimate, a what-if and a fit never change anything real: every attribute and tensor of
the objects a step touches (model, optimizer, learning-rate scheduler, GradScaler, EMA copy,
the user's own counters, the random generators) is compared before and after."""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jupyter_memprof
from jupyter_memprof import EstimateError, estimate, fit, what_if


def state_of(obj, seen: set | None = None, depth: int = 0):
    """Every attribute and tensor reachable from ``obj``: tensors by value, ``.grad``,
    ``requires_grad`` and version counter; functions by identity; other objects through
    their attributes."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        grad = obj.grad if obj.is_leaf else None
        return (
            "tensor",
            obj.detach().clone(),
            obj.requires_grad,
            obj._version,
            None if grad is None else grad.detach().clone(),
        )
    if isinstance(obj, (int, float, str, bool, complex, bytes, type(None), torch.dtype)):
        return obj
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType)):
        return ("id", id(obj))
    if id(obj) in seen or depth > 12:
        return ("seen", id(obj))
    seen.add(id(obj))
    if isinstance(obj, dict):
        return ("dict", {repr(k): state_of(v, seen, depth + 1) for k, v in obj.items()})
    if isinstance(obj, (list, tuple, set, frozenset)):
        return (type(obj).__name__, [state_of(v, seen, depth + 1) for v in obj])
    if isinstance(obj, types.MethodType):
        return ("method", id(obj.__func__), state_of(obj.__self__, seen, depth + 1))
    if hasattr(obj, "__dict__"):
        return (type(obj).__name__, state_of(vars(obj), seen, depth + 1))
    return ("other", repr(obj))


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b))
        )
    return a == b


def rng_state():
    return (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())


class Trainer:
    """The user's own training state: counters, a running loss tensor, the EMA model."""

    def __init__(self, ema):
        self.steps = 0
        self.seen_tokens = 0
        self.running = torch.zeros(())
        self.ema = ema


def make():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=100)
    scaler = torch.amp.GradScaler("cpu")
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.99)
    )
    trainer = Trainer(ema)
    return model, opt, sched, scaler, trainer


def train_step(model, opt, sched, scaler, trainer, batch=16):
    x = torch.randn(batch, 32)  # the data drawn inside the step
    y = torch.randint(0, 8, (batch,))
    _ = random.random() + np.random.rand()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    sched.step()
    opt.zero_grad(set_to_none=True)
    trainer.ema.update_parameters(model)
    trainer.steps += 1
    trainer.seen_tokens += batch
    trainer.running += loss.detach().float()
    return loss


@pytest.fixture(scope="module")
def warm():
    objs = make()
    train_step(*objs)  # warmed up: optimizer state, a scheduled lr, the scaler's scale
    return objs


def _unchanged(objs, run) -> None:
    before = [state_of(o) for o in objs]
    rng = rng_state()
    lr = objs[1].param_groups[0]["lr"]
    run()
    after = [state_of(o) for o in objs]
    for name, a, b in zip(("model", "optimizer", "scheduler", "scaler", "trainer"), before, after):
        assert same(a, b), f"{name} changed"
    assert same(rng[0], torch.get_rng_state()) and rng[1] == random.getstate()
    assert np.array_equal(rng[2], np.random.get_state()[1])
    assert objs[1].param_groups[0]["lr"] == lr


def test_estimate_changes_nothing_real(warm):
    """Before: the real scheduler was stepped (lr 5e-4 -> 3.33e-4 on a one-line step)."""
    prof = None

    def run():
        nonlocal prof
        prof = estimate(train_step, *warm)

    _unchanged(warm, run)
    # the scaler's inf check is a computed scalar: read as 0 (finite: the step is taken)
    assert prof.meta["data_dependent_scalars"]
    assert "optimizer_state" in set(prof.allocations["category"].astype(str))
    assert not jupyter_memprof.Profile.__module__.startswith("torch")


def test_what_if_changes_nothing_real(warm):
    _unchanged(warm, lambda: what_if(train_step, *warm, checkpoint=["0"], set_to_none=False))


def test_fit_changes_nothing_real(warm):
    def step(batch, *objs):
        return train_step(*objs, batch=batch)

    result = None

    def run():
        nonlocal result
        result = fit(step, *warm, limit="2MiB", high=4096)

    _unchanged(warm, run)
    assert result.batch is not None


def test_scheduler_copy_steps_its_fake_optimizer(warm):
    """The fake scheduler holds the fake optimizer, and the optimizer's step wrapper (which
    tells the scheduler it was stepped) is the copy's own: no warning about the order."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        estimate(train_step, *warm)


# -- functions that read the model and optimizer as globals ---------------------------------
model_g = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt_g = torch.optim.Adam(model_g.parameters())
sched_g = torch.optim.lr_scheduler.StepLR(opt_g, 1, gamma=0.5)
x_g = torch.randn(8, 16)
steps_g = 0


def global_step():
    global steps_g
    steps_g += 1
    model_g(x_g).square().mean().backward()
    opt_g.step()
    sched_g.step()
    opt_g.zero_grad()


def global_batch_step(batch):
    model_g(torch.randn(batch, 16)).square().mean().backward()
    opt_g.step()
    opt_g.zero_grad()


def test_estimate_of_a_function_reading_globals_fakes_them():
    """Before: FakeTensorMode's raw AssertionError. Now the globals are bound to fake copies
    as the magic binds a cell's, and put back afterwards (the counter too)."""
    objs = (model_g, opt_g, sched_g, x_g)
    before = [state_of(o) for o in objs]
    prof = estimate(global_step)
    assert all(same(a, state_of(o)) for a, o in zip(before, objs))
    assert steps_g == 0 and global_step.__globals__["model_g"] is model_g
    # parameters, gradients and Adam's two moments (exp_avg, exp_avg_sq) of (16*32+32+32*4+4)
    params = (16 * 32 + 32 + 32 * 4 + 4) * 4
    by = prof.peak_by("category")
    assert by["parameter"] == params
    assert by["optimizer_state"] >= 2 * params
    # named after the globals, as in a capture
    assert "model_g.0.weight" in set(prof.names["name"])


def test_fit_of_a_function_reading_globals():
    result = fit(global_batch_step, limit="64KiB", high=10_000)
    assert result.batch is not None and result.batch > 1


def test_a_shape_error_is_one_line_naming_op_shape_and_line():
    model = nn.Linear(16, 4)

    def step(model):
        return model(torch.randn(3, 9))

    with pytest.raises(EstimateError) as err:
        estimate(step, model)
    text = str(err.value)
    line = step.__code__.co_firstlineno + 1
    assert "\n" not in text
    assert text.startswith("aten::addmm on [4], [3, 9], [16, 4] failed at ")
    assert f"test_estimate_real_objects.py:{line} in step" in text
    assert "fix the shapes at that line" in text


def test_an_error_inside_torchs_own_code_is_one_line_naming_the_users_line():
    """Torch's Python code meeting something a fake run lacks raised its own exception
    (FakeTensorMode's AssertionError); now one EstimateError line with the user's line."""
    ns: dict = {}
    code = "def deep(x):\n    assert False, 'Mixing fake modes NYI'\n"
    exec(compile(code, "/venv/site-packages/torch/_subclasses/inner.py", "exec"), ns)

    def step(x):
        return ns["deep"](x * 2)

    with pytest.raises(EstimateError) as err:
        estimate(step, torch.ones(3))
    line = step.__code__.co_firstlineno + 1
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(
        "AssertionError inside torch (_subclasses/inner.py) on fake tensors at "
        f"test_estimate_real_objects.py:{line} in step: Mixing fake modes NYI; "
    )

    def mine(x):
        raise TypeError("the user's own error")

    with pytest.raises(TypeError, match="the user's own error"):
        estimate(mine, torch.ones(3))
