"""Changes made to a step's fake copies, for ``what_if()``.

Each change is made to the fake copies only (the real objects are only read) after
:class:`~.copy.FakeCopier` made them and before the step runs:

- ``checkpoint``: the forward of each named submodule of a fake module runs under
  :func:`torch.utils.checkpoint.checkpoint` (non-reentrant);
- ``autocast``: the forward of each fake module passed to the step runs under
  :class:`torch.autocast` for the device its parameters compute on;
- ``optimizer``: a fake optimizer's groups get keywords (``foreach``, ``fused``), or the
  optimizer is replaced by another class on the same fake parameters, its state warmed up
  by one step on zero gradients when training is under way (the real optimizer has state
  or its parameters have gradients: a training loop's steady state), before anything is
  recorded;
- ``set_to_none``: ``zero_grad`` of the fake optimizers and modules passed uses it;
- ``batch``: the fake inputs are remade with their first dimension scaled, views of one
  storage staying views of one (larger or smaller) storage.

The requests name real objects (:class:`Request`); the caller has checked them against the
real objects already (:mod:`jupyter_memprof._frontends.whatif`), so what fails here is a
bug, not a bad request.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from .copy import FakeCopier, walk_values


@dataclass
class Request:
    """The changes, naming the real objects they apply to."""

    checkpoint: list[tuple[torch.nn.Module, str]] = field(default_factory=list)  # root, path
    autocast: torch.dtype | None = None
    autocast_modules: list[torch.nn.Module] = field(default_factory=list)
    optimizer: Any = None  # an optimizer class (or a partial of one), or a dict of keywords
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    set_to_none: bool | None = None
    zero_grad_owners: list[Any] = field(default_factory=list)  # optimizers and modules
    batch: float | None = None
    inputs: list[torch.Tensor] = field(default_factory=list)


def apply(request: Request, copier: FakeCopier, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """Make the changes on the fake copies ``copier`` made; returns ``args`` and
    ``kwargs`` with replaced fakes (a swapped optimizer, remade inputs) put in."""
    replaced: dict[int, Any] = {}
    for root, path in request.checkpoint:
        _checkpoint(copier.memo[id(root)].get_submodule(path))
    if request.autocast is not None:
        for m in request.autocast_modules:
            _autocast(copier.memo[id(m)], request.autocast)
    if request.optimizer is not None:
        for opt in request.optimizers:
            old = copier.memo[id(opt)]
            new = _changed_optimizer(copier, opt, old, request.optimizer)
            if new is not old:
                replaced[id(old)] = new
    if request.set_to_none is not None:
        for owner in request.zero_grad_owners:
            fake = replaced.get(id(copier.memo[id(owner)]), copier.memo[id(owner)])
            fake.zero_grad = functools.partial(
                type(fake).zero_grad, fake, set_to_none=request.set_to_none
            )
    if request.batch is not None:
        replaced.update(_scaled_inputs(copier, request.inputs, request.batch))
    if not replaced:
        return args, kwargs
    for real_id, fake in list(copier.fakes.items()):
        if id(fake) in replaced:
            copier.fakes[real_id] = replaced[id(fake)]
    return _put(args, replaced), _put(kwargs, replaced)


# -- checkpoint and autocast ------------------------------------------------------------------
def _checkpoint(module: torch.nn.Module) -> None:
    """``module``'s forward runs under non-reentrant activation checkpointing."""
    forward = module.forward

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = checkpointed


def _autocast(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """``module``'s forward runs under ``torch.autocast`` for the device it computes on."""
    forward = module.forward
    device_type = compute_type(module)

    def autocast(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            return forward(*args, **kwargs)

    module.forward = autocast


def compute_type(module: torch.nn.Module) -> str:
    """The device type ``module``'s first parameter or buffer computes on (``cpu``
    without any)."""
    for t in (*module.parameters(), *module.buffers()):
        return t.device.type
    return "cpu"


# -- optimizers -------------------------------------------------------------------------------
def _changed_optimizer(
    copier: FakeCopier, real: torch.optim.Optimizer, fake: torch.optim.Optimizer, change: Any
) -> torch.optim.Optimizer:
    """``fake`` with the keywords set on every group, or a new optimizer of another class
    on its parameters (its state warmed up when ``real`` had state)."""
    if isinstance(change, dict):
        for group in fake.param_groups:
            group.update(change)
        fake.defaults.update(change)
        return fake
    new = change(_groups_for(change, fake))
    for state in real.state.values():  # the old state is not held any more
        for value in walk_values(state):
            if isinstance(value, torch.Tensor):
                copier.memo.pop(id(value), None)
    copier.memo[id(real)] = new
    if _under_way(real):
        _warm_up(copier, new)
    return new


def _under_way(opt: torch.optim.Optimizer) -> bool:
    """Has training begun: does ``opt`` hold state, or do its parameters have gradients?"""
    if any(opt.state.values()):
        return True
    return any(p.grad is not None for g in opt.param_groups for p in g["params"])


def _groups_for(factory: Any, fake: torch.optim.Optimizer) -> list[dict]:
    """``fake``'s parameter groups, with the hyperparameters the new class also takes
    (the learning rate, weight decay)."""
    cls = factory.func if isinstance(factory, functools.partial) else factory
    taken = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    if isinstance(factory, functools.partial):
        taken -= set(factory.keywords)
    keep = taken - {"foreach", "fused", "capturable", "differentiable"}
    return [
        {"params": g["params"], **{k: v for k, v in g.items() if k in keep}}
        for g in fake.param_groups
    ]


def _warm_up(copier: FakeCopier, opt: torch.optim.Optimizer) -> None:
    """One step on zero gradients, on fake tensors and before anything is recorded, so that
    ``opt`` holds its state from the start as a warmed-up optimizer does."""
    params = [p for g in opt.param_groups for p in g["params"]]
    grads = [p.grad for p in params]
    with copier.mode:
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step()
    for p, g in zip(params, grads):
        p.grad = g
    for state in opt.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                copier.memo[id(value)] = value  # held from the start
                if value.dim() == 0 and value.device.type == "cpu":
                    copier.cpu_scalars.append(value)  # a step counter: a CPU block


# -- batch ------------------------------------------------------------------------------------
def _scaled_inputs(copier: FakeCopier, inputs: list[torch.Tensor], factor: float) -> dict:
    """The fake inputs remade with their first dimension times ``factor``: inputs that
    share a storage share one new storage, ``factor`` times as large, each at its old
    offset and strides. Returns ``id(old fake) -> new fake``."""
    fakes = [copier.memo[id(t)] for t in inputs]
    by_storage: dict[int, list[int]] = {}
    for i, f in enumerate(fakes):
        by_storage.setdefault(f.untyped_storage()._cdata, []).append(i)
    out = {}
    with copier.mode, torch.no_grad():
        for members in by_storage.values():
            first = fakes[members[0]]
            numel = first.untyped_storage().nbytes() // first.element_size()
            base = torch.empty(round(numel * factor), dtype=first.dtype, device=first.device)
            for i in members:
                old = fakes[i]
                shape = (round(old.shape[0] * factor), *old.shape[1:])
                new = base.as_strided(shape, old.stride(), old.storage_offset())
                if old.requires_grad:
                    new = new.detach().requires_grad_()
                out[id(old)] = new
                copier.memo[id(inputs[i])] = new
    return out


def _put(obj: Any, replaced: dict[int, Any]) -> Any:
    """``obj`` with the objects in ``replaced`` (by id) swapped in, also inside lists,
    tuples (named ones too) and dicts."""
    hit = replaced.get(id(obj))
    if hit is not None:
        return hit
    if isinstance(obj, dict):
        return type(obj)((k, _put(v, replaced)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        items = [_put(v, replaced) for v in obj]
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*items)
        return type(obj)(items)
    return obj


Prepare = Callable[[FakeCopier, Any, Any], tuple[Any, Any]]
