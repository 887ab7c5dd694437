"""Fake copies of the user's tensors, modules and optimizers.

Each has the shapes,
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
import functools
import types
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from ..._errors import EstimateError

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
        self.known = None  # fake_known.KnownValues: the values of integer inputs

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
        if self.known is not None and not scalar:
            self.known.seed(t, fake)
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
        for t in module_tensors(m):
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
            for value in walk_values(state):
                if isinstance(value, torch.Tensor):
                    self.tensor(value)
        fake = copy.deepcopy(opt, self.memo)
        _rewrap_scheduled_step(opt, fake)
        self._remember(opt, fake)
        return fake

    def other(self, obj: Any) -> Any:
        """A fake copy of any other object that holds tensors, modules or optimizers (a
        learning-rate scheduler, a ``GradScaler``, an EMA helper, the user's own trainer
        state): every torch object it reaches is copied first, then the object itself with
        :func:`copy.deepcopy` and that memo, so its references point at the fake copies
        (a scheduler steps the fake optimizer) and no real data is copied. Its plain
        attributes (counters, the scheduler's ``last_epoch``) are the copy's own."""
        hit = self.memo.get(id(obj))
        if hit is not None:
            return hit
        for value in _reach(obj):
            self._convert(value)
        try:
            fake = copy.deepcopy(obj, self.memo)
        except Exception as exc:  # an object deepcopy cannot copy (locks, handles, C state)
            raise EstimateError(
                f"estimate() could not copy the {type(obj).__name__} it was given ("
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): pass "
                "the tensors, modules and optimizers it holds instead"
            ) from None
        self._remember(obj, fake)
        return fake

    # -- anything ----------------------------------------------------------------------
    def convert(self, obj: Any, passed: int = 1) -> Any:
        """``obj`` with every tensor, module and optimizer replaced by its fake copy; lists,
        tuples (named ones too) and dicts are rebuilt. Other objects that reach torch objects
        (:meth:`other`) are copied where they were passed themselves: ``obj``, or an item of
        containers at most ``passed`` levels down (the arguments tuple: 1); everything else
        is passed as is."""
        fake = self._convert(obj, passed)
        for real, f in ((obj, fake), *zip(walk_values(obj), walk_values(fake))):
            if isinstance(real, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)):
                self.fakes[id(real)] = f
        return fake

    def _convert(self, obj: Any, passed: int = -1) -> Any:
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, torch.nn.Module):
            return self.module(obj)
        if isinstance(obj, torch.optim.Optimizer):
            return self.optimizer(obj)
        if isinstance(obj, _CONTAINERS) and (holds_torch(obj) or passed > 0 and _reaches(obj)):
            if isinstance(obj, dict):
                return type(obj)((k, self._convert(v, passed - 1)) for k, v in obj.items())
            items = [self._convert(v, passed - 1) for v in obj]
            if isinstance(obj, tuple) and hasattr(obj, "_fields"):
                return type(obj)(*items)
            return type(obj)(items)
        if passed >= 0 and _is_instance(obj) and holds_torch(obj):
            return self.other(obj)  # passed itself (not found inside a container)
        return obj

    def release(self) -> None:
        self.memo.clear()
        self.fakes.clear()
        self._keep.clear()


def walk_values(obj: Any, depth: int = 0) -> Iterator[Any]:
    """Values inside nested lists, tuples and dicts (a few levels deep)."""
    if depth > 4:
        return
    if isinstance(obj, dict):
        for v in obj.values():
            yield v
            yield from walk_values(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield v
            yield from walk_values(v, depth + 1)


_KINDS = (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)


def holds_torch(obj: Any) -> bool:
    """Is ``obj`` a tensor, module or optimizer, a container holding one, or an object whose
    attributes reach one (a scheduler holds its optimizer; a ``GradScaler`` its scale)?"""
    if isinstance(obj, _KINDS):
        return True
    if isinstance(obj, _CONTAINERS):
        return any(isinstance(v, _KINDS) for v in walk_values(obj))
    return _is_instance(obj) and any(isinstance(v, _KINDS) for v in _reach(obj))


#: Types whose instances are never copied as "other objects": values, code, and torch's own
#: objects that are not state (devices, dtypes, generators).
_NOT_STATE = (
    type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
    functools.partial, str, bytes, int, float, complex, bool, type(None), range, slice,
    torch.device, torch.dtype, torch.Generator, torch.Size,
)  # fmt: skip


def _reaches(obj: Any) -> bool:
    """Whether a container holds an object whose attributes reach torch objects."""
    return any(_is_instance(v) and holds_torch(v) for v in walk_values(obj, 3))


def _is_instance(obj: Any) -> bool:
    """Whether ``obj`` is an object with its own attributes that a step may change (not a
    value, class, module, function or torch descriptor)."""
    return not isinstance(obj, _NOT_STATE) and hasattr(obj, "__dict__")


def _reach(obj: Any, depth: int = 0) -> Iterator[Any]:
    """Torch objects (tensors, modules, optimizers) an object's attributes reach, through
    containers and other objects' attributes, a few levels deep."""
    if depth > 3:
        return
    try:
        values = list(vars(obj).values())
    except TypeError:
        return
    for value in values:
        for v in (value, *walk_values(value)):
            if isinstance(v, _KINDS):
                yield v
            elif _is_instance(v):
                yield from _reach(v, depth + 1)


def _rewrap_scheduled_step(real: torch.optim.Optimizer, fake: torch.optim.Optimizer) -> None:
    """A learning-rate scheduler wraps its optimizer's ``step`` in an instance attribute
    whose closure holds a weak reference to *that* optimizer (a deep copy drops it, or would
    keep stepping the real one). The copy gets its own wrapper, for itself, so the fake
    scheduler sees its optimizer stepped as the real one would."""
    step = vars(real).get("step")
    if step is None or not getattr(step, "_wrapped_by_lr_sched", False):
        return
    owner = weakref.ref(fake)
    func = type(fake).step

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        opt = owner()
        opt._opt_called = True
        return func(opt, *args, **kwargs)

    wrapper._wrapped_by_lr_sched = True
    fake.step = wrapper


def module_tensors(m: torch.nn.Module) -> Iterator[torch.Tensor]:
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
            for v in (value, *walk_values(value)):
                if isinstance(v, torch.Tensor):
                    yield v
