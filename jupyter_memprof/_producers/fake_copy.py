"""Fake copies of the user's objects: tensors, modules and optimizers that have the shapes,
dtypes, strides and structure of the real ones but no data.

A copy is built once per real object (a memo keyed by ``id``), so what is shared stays
shared: tied weights are one fake parameter, an optimizer's ``param_groups`` and ``state``
point at the fake model's parameters, and two views of one storage stay views of one fake
storage (torch's :meth:`FakeTensorMode.from_tensor` keeps storage identity). The real objects
are only read: nothing here writes to them.

Modules and optimizers are copied with :func:`copy.deepcopy` and a memo pre-seeded with the
fake copy of every tensor they hold (parameters, buffers, ``.grad``, plain tensor attributes,
optimizer state), so ``deepcopy`` never copies real data. ``.grad`` is carried explicitly:
``deepcopy`` of a parameter drops it, and steps that keep gradients (accumulation,
``zero_grad(set_to_none=False)``) depend on it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

_CONTAINERS = (list, tuple, dict)


class FakeCopier:
    """Turns real tensors, modules and optimizers (also inside lists, tuples and dicts) into
    fake ones bound to one :class:`FakeTensorMode`, computing on ``compute`` (``None``: where
    each real tensor lives)."""

    def __init__(self, mode, compute: torch.device | None):
        self.mode = mode
        self.compute = compute
        self.memo: dict[int, Any] = {}  # id(real) -> fake, every object copied
        self.fakes: dict[int, Any] = {}  # id(real) -> fake, the objects passed (for naming)
        self._keep: list[Any] = []  # the real objects, so their ids stay theirs
        self.cpu_scalars: list[torch.Tensor] = []  # fake scalars kept on the CPU

    # -- tensors ------------------------------------------------------------------------
    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        hit = self.memo.get(id(t))
        if hit is not None:
            return hit
        scalar = t.dim() == 0 and not t.requires_grad and not t.is_meta
        if scalar:
            # Scalars (an optimizer's step counter) keep their value: code reads it with
            # `.item()`, which a fake tensor without a value cannot answer. The value is a
            # private clone: the real tensor is never written. They also stay on their
            # device when that is the CPU: torch keeps a step counter there for parameters on
            # any device (unless `capturable` or `fused`, which put it on the parameter's
            # device: such a scalar moves with the parameters).
            value = t.detach().clone()
            if self.compute is not None and value.device.type != "cpu":
                value = value.to(self.compute)
            converter = self.mode.fake_tensor_converter
            fake = converter.from_real_tensor(self.mode, value, make_constant=True)
            if fake.device.type == "cpu":
                self.cpu_scalars.append(fake)
        else:
            fake = self.mode.from_tensor(t, static_shapes=True)
        if self.compute is not None and fake.device != self.compute and not scalar:
            with self.mode, torch.no_grad():
                moved = fake.to(self.compute)
            if isinstance(t, torch.nn.Parameter):
                moved = torch.nn.Parameter(moved, requires_grad=t.requires_grad)
            else:
                moved.requires_grad_(t.requires_grad)
            fake = moved
        grad = t.grad if t.is_leaf else None
        if grad is not None:
            fake.grad = self.tensor(grad)
        self._remember(t, fake)
        return fake

    def _remember(self, real: Any, fake: Any) -> None:
        self.memo[id(real)] = fake
        self._keep.append(real)

    def copied(self) -> list[Any]:
        """Every fake object made so far."""
        return list(self.memo.values())

    def forget_copies(self) -> None:
        """Drop the references to fake copies the memo holds: from now on a fake tensor lives
        only as long as the fake objects that hold it (a fake ``.grad`` that ``zero_grad``
        drops is freed, as the real one would be)."""
        self.memo.clear()

    # -- modules and optimizers ---------------------------------------------------------
    def module(self, m: torch.nn.Module) -> torch.nn.Module:
        hit = self.memo.get(id(m))
        if hit is not None:
            return hit
        for t in _module_tensors(m):
            self.tensor(t)
        fake = copy.deepcopy(m, self.memo)
        self._remember(m, fake)
        return fake

    def optimizer(self, opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
        hit = self.memo.get(id(opt))
        if hit is not None:
            return hit
        for group in opt.param_groups:
            for p in group["params"]:
                self.tensor(p)
        for state in opt.state.values():
            for value in _walk(state):
                if isinstance(value, torch.Tensor):
                    self.tensor(value)
        fake = copy.deepcopy(opt, self.memo)
        self._remember(opt, fake)
        return fake

    # -- anything ----------------------------------------------------------------------
    def convert(self, obj: Any) -> Any:
        """``obj`` with every tensor, module and optimizer replaced by its fake copy; lists,
        tuples (named ones too) and dicts are rebuilt, everything else is passed as is."""
        fake = self._convert(obj)
        for real, f in ((obj, fake), *zip(_walk(obj), _walk(fake))):
            if isinstance(real, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)):
                self.fakes[id(real)] = f
        return fake

    def _convert(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, torch.nn.Module):
            return self.module(obj)
        if isinstance(obj, torch.optim.Optimizer):
            return self.optimizer(obj)
        if isinstance(obj, _CONTAINERS) and holds_torch(obj):
            if isinstance(obj, dict):
                return type(obj)((k, self._convert(v)) for k, v in obj.items())
            items = [self._convert(v) for v in obj]
            if isinstance(obj, tuple) and hasattr(obj, "_fields"):
                return type(obj)(*items)
            return type(obj)(items)
        return obj

    def release(self) -> None:
        self.memo.clear()
        self.fakes.clear()
        self._keep.clear()


def _walk(obj: Any, depth: int = 0) -> Iterator[Any]:
    """Values inside nested lists, tuples and dicts (a few levels deep)."""
    if depth > 4:
        return
    if isinstance(obj, dict):
        for v in obj.values():
            yield v
            yield from _walk(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield v
            yield from _walk(v, depth + 1)


def holds_torch(obj: Any) -> bool:
    """Is ``obj`` a tensor, module or optimizer, or a container holding one?"""
    kinds = (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)
    if isinstance(obj, kinds):
        return True
    return isinstance(obj, _CONTAINERS) and any(isinstance(v, kinds) for v in _walk(obj))


def _module_tensors(m: torch.nn.Module) -> Iterator[torch.Tensor]:
    """Every tensor a module tree holds: parameters, buffers and plain tensor attributes."""
    for sub in m.modules():
        for p in sub._parameters.values():
            if p is not None:
                yield p
        for b in sub._buffers.values():
            if b is not None:
                yield b
        for key, value in vars(sub).items():
            if key.startswith("_"):
                continue
            for v in (value, *_walk(value)):
                if isinstance(v, torch.Tensor):
                    yield v
