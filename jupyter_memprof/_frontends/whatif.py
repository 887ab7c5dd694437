"""``what_if()``: a step estimated as it is and with changes.

``what_if(train_step, model, opt, x, y, checkpoint=["model.blocks.*"], autocast=torch.bfloat16)``
runs two estimates (:mod:`.estimate`): the step as it is, and the step on fake copies changed
as asked (:mod:`jupyter_memprof._producers.fake.changes`). It returns the comparison
:func:`jupyter_memprof.compare` returns, ``.a`` as is and ``.b`` changed. Every change is
checked against the real objects before anything runs; a bad one is one
:class:`EstimateError` line. The real objects are only read.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import functools
import inspect
import math
import re
import sys
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch

from .._analysis import schema as S
from .._errors import EstimateError
from .._producers.fake.changes import Request, apply
from .._producers.fake.copy import module_tensors, walk_values
from .._results.comparison import Comparison
from .._vocab import Change
from .estimate import cell_objects, estimate_cell, run_estimate
from .frames import caller_names
from .options import EstimateOptions, raised_as

__all__ = ["what_if"]

#: The dtypes ``torch.autocast`` takes, per device type.
AUTOCAST_DTYPES = {
    "cpu": (torch.bfloat16, torch.float16),
    "cuda": (torch.bfloat16, torch.float16),
}

#: Containers of submodules with no forward of their own: a pattern's match goes on to
#: their children.
_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.ParameterList)


def what_if(fn: Callable, *args: Any, device: str | None = None, **changes: Any) -> Comparison:
    """Estimate ``fn(*args)`` as it is and with ``changes``, without running it.

    Changes (any of them, together):

    - ``checkpoint=["model.blocks.*", ...]``: activation checkpointing (non-reentrant) of
      the modules whose path matches a pattern (``fnmatch``: ``*`` matches anything, dots
      too); a path is the module's name in its tree, with or without the variable it is
      passed as (``blocks.0`` or ``model.blocks.0``). The outermost matches are
      checkpointed; containers (``ModuleList``) hand the match to their children.
    - ``autocast=torch.bfloat16`` (or ``torch.float16``): the forward of every module
      passed runs under ``torch.autocast`` for its device (the loss and backward outside).
    - ``optimizer=``: another optimizer class (or a ``functools.partial`` of one, for its
      keywords), or a dict of keywords for the optimizers passed (``{"foreach": False}``,
      ``{"fused": True}``). A new optimizer keeps each group's hyperparameters it also
      takes; when training is under way (the old one has state or the parameters have
      gradients), the new one starts warmed up: its state is held from the start, as in
      a training loop.
    - ``set_to_none=True/False``: ``zero_grad`` of the optimizers and modules passed.
    - ``batch=2`` (or ``0.5``): the first dimension of every input tensor passed (tensors
      that are not parameters or held by a module or optimizer) scaled; tensors the step
      makes itself are not changed (see :func:`jupyter_memprof.fit`).

    Parameters
    ----------
    fn : callable
        The step; ``fn(*args)`` as in :func:`estimate` (pass the model, the optimizer and
        the batch).
    *args
        What ``fn`` is called with; replaced by fake copies, the real ones only read.
    device : str, optional
        The device to estimate for, as in :func:`estimate`.
    **changes
        The changes above, any of them together.

    Returns
    -------
    Comparison
        ``.a`` as is, ``.b`` changed, ``.diff()``, both timelines in a notebook.

    Raises
    ------
    EstimateError
        An unknown change or a bad value (a pattern matching no module, a dtype autocast
        does not take, a scale that does not divide an input's batch), before anything runs.

    Examples
    --------
    >>> cmp = jupyter_memprof.what_if(train_step, model, opt, x, y, device="cuda:0",
    ...                               checkpoint=["model.blocks.*"])  # doctest: +SKIP
    >>> cmp.diff()  # doctest: +SKIP
    """
    if not callable(fn):
        raise EstimateError(f"what_if() needs a function to call first, not {type(fn).__name__}")
    with raised_as(EstimateError):
        options = EstimateOptions.from_kwargs(device=device)
    caller = caller_names(sys._getframe(1))
    try:
        request = check(changes, args, caller, options.device)
        labels = _label(fn, "as is"), _label(fn, describe(changes))
        a = run_estimate(fn, args, {}, options, names=caller, label=labels[0])
        b = run_estimate(
            fn,
            args,
            {},
            options,
            names=caller,
            label=labels[1],
            prepare=functools.partial(prepare_request, request),
        )
    finally:
        caller.clear()
    a.meta["what_if"] = {}
    b.meta["what_if"] = {k: _plain(v) for k, v in changes.items()}
    return Comparison(a, b)


def prepare_request(request: Request, copier, args, kwargs):
    return apply(request, copier, args, kwargs)


def _label(fn: Callable, what: str) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return f"{name}, {what}"


def _plain(value: Any) -> Any:
    """A change's value as plain data (profile metadata is saved as JSON): classes, dtypes
    and partials as the text that names them."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return _name_of(value)


def _name_of(value: Any) -> str:
    """``torch.optim.SGD``, ``functools.partial(torch.optim.SGD, momentum=0.9)``,
    ``torch.bfloat16``."""
    if isinstance(value, functools.partial):
        kw = "".join(f", {k}={v!r}" for k, v in value.keywords.items())
        return f"functools.partial({_name_of(value.func)}{kw})"
    if isinstance(value, type):
        if getattr(torch.optim, value.__name__, None) is value:
            return f"torch.optim.{value.__name__}"
        return f"{value.__module__}.{value.__qualname__}"
    return str(value)


def describe(changes: dict) -> str:
    """``checkpoint=['model.blocks.*'], autocast=torch.bfloat16``: the changes as the
    keywords that ask for them."""
    parts = []
    for k, v in changes.items():
        text = _name_of(v) if isinstance(v, (type, functools.partial, torch.dtype)) else repr(v)
        parts.append(f"{k}={text}")
    return ", ".join(parts) or "unchanged"


# -- checking the changes against the real objects ----------------------------------------------
def check(changes: dict, args: tuple, names: dict, device: str | None) -> Request:
    """The changes as a :class:`Request` naming the real objects, or one EstimateError line."""
    known = Change.values()
    for key in changes:
        if key not in known:
            raise EstimateError(
                f"what_if() has no change {key!r}: use {', '.join(known)} "
                "(the step's own keyword arguments cannot be passed: bind them with "
                "functools.partial)"
            )
    objects = passed_objects(args)
    modules = [o for o in objects if isinstance(o, torch.nn.Module)]
    optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer)]
    request = Request()
    if Change.CHECKPOINT in changes:
        request.checkpoint = _checkpoint_targets(changes[Change.CHECKPOINT], modules, names)
    if Change.AUTOCAST in changes:
        request.autocast = _autocast_dtype(changes[Change.AUTOCAST], modules, device)
        request.autocast_modules = _outermost(modules)
    if Change.OPTIMIZER in changes:
        request.optimizer = _optimizer_change(changes[Change.OPTIMIZER], optimizers)
        request.optimizers = optimizers
    if Change.SET_TO_NONE in changes:
        value = changes[Change.SET_TO_NONE]
        if not isinstance(value, bool):
            raise EstimateError(f"set_to_none must be True or False, not {value!r}")
        if not optimizers and not modules:
            raise EstimateError("set_to_none: no optimizer or module among the arguments")
        request.set_to_none = value
        request.zero_grad_owners = [*optimizers, *modules]
    if Change.BATCH in changes:
        request.inputs = _inputs(objects, modules, optimizers)
        request.batch = _batch_scale(changes[Change.BATCH], request.inputs, names)
    return request


def passed_objects(args: tuple) -> list[Any]:
    """The tensors, modules and optimizers passed (also inside containers), once each."""
    seen: dict[int, Any] = {}
    for obj in (args, *walk_values(args)):
        if isinstance(obj, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)):
            seen.setdefault(id(obj), obj)
    return list(seen.values())


def _outermost(modules: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The modules passed that are not inside another module passed."""
    inner = {id(sub) for m in modules for sub in m.modules() if sub is not m}
    return [m for m in modules if id(m) not in inner]


def _checkpoint_targets(patterns: Any, modules: list, names: dict) -> list[tuple]:
    if isinstance(patterns, str):
        patterns = [patterns]
    if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) for p in patterns):
        raise EstimateError(
            f"checkpoint takes a list of module patterns such as ['model.blocks.*'], not {patterns!r}"
        )
    if not modules:
        raise EstimateError("checkpoint: no module among the arguments")
    var: dict[int, list[str]] = {}
    for k, v in names.items():
        if not k.startswith("_"):
            var.setdefault(id(v), []).append(k)
    roots = _outermost(modules)
    paths = []  # (root, relative path, the paths a pattern may spell)
    for root in roots:
        for path, sub in root.named_modules(remove_duplicate=True):
            if not path or isinstance(sub, _CONTAINERS):
                continue
            spelled = [path, *(f"{name}.{path}" for name in var.get(id(root), ()))]
            paths.append((root, path, spelled))
    targets: dict[tuple[int, str], tuple] = {}
    for pattern in patterns:
        hits = [
            (root, path)
            for root, path, spelled in paths
            if any(fnmatch.fnmatchcase(s, pattern) for s in spelled)
        ]
        if not hits:
            some = ", ".join(s[-1] for _, _, s in paths[:6])
            raise EstimateError(
                f"checkpoint: {pattern!r} matches no module (the modules are named like {some})"
            )
        for root, path in hits:
            targets[(id(root), path)] = (root, path)
    chosen = [(root, path) for root, path in targets.values()]
    return [
        (root, path)
        for root, path in chosen
        if not any(
            r is root and o != path and path.startswith(o + ".") for r, o in chosen
        )  # the outermost of nested matches
    ]


def _autocast_dtype(dtype: Any, modules: list, device: str | None) -> torch.dtype:
    if not modules:
        raise EstimateError("autocast: no module among the arguments (its forward is autocast)")
    kinds = {(device.split(":")[0] if device else _device_type(m)) for m in _outermost(modules)}
    for kind in sorted(kinds):
        allowed = AUTOCAST_DTYPES.get(kind, ())
        if dtype not in allowed:
            names = " or ".join(str(d) for d in allowed) or "nothing"
            raise EstimateError(f"autocast on {kind} takes {names}, not {dtype!r}")
    return dtype


def _device_type(module: torch.nn.Module) -> str:
    for t in (*module.parameters(), *module.buffers()):
        return t.device.type
    return "cpu"


def _optimizer_change(change: Any, optimizers: list) -> Any:
    if not optimizers:
        raise EstimateError("optimizer: no optimizer among the arguments")
    if isinstance(change, dict):
        for opt in optimizers:
            unknown = [k for k in change if k not in opt.defaults]
            if unknown:
                raise EstimateError(
                    f"optimizer: {type(opt).__name__} takes no {', '.join(map(repr, unknown))}"
                    f" (it takes {', '.join(sorted(opt.defaults))})"
                )
        return change
    cls = change.func if isinstance(change, functools.partial) else change
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise EstimateError(
            "optimizer takes an optimizer class (torch.optim.SGD), a functools.partial of one, "
            f"or a dict of keywords such as {{'foreach': False}}, not {change!r}"
        )
    if isinstance(change, functools.partial):
        taken = set(inspect.signature(cls.__init__).parameters)
        unknown = [k for k in change.keywords if k not in taken]
        if unknown or change.args:
            raise EstimateError(
                f"optimizer: {cls.__name__} takes no {', '.join(map(repr, unknown)) or 'positional arguments'}"
            )
    return change


def _inputs(objects: list, modules: list, optimizers: list) -> list[torch.Tensor]:
    """The tensors passed that are inputs: not parameters, not held by a module or an
    optimizer passed, with at least one dimension."""
    held = {id(t) for m in modules for t in module_tensors(m)}
    for opt in optimizers:
        for g in opt.param_groups:
            held.update(id(p) for p in g["params"])
        for state in opt.state.values():
            held.update(id(v) for v in walk_values(state) if isinstance(v, torch.Tensor))
    return [
        t
        for t in objects
        if isinstance(t, torch.Tensor)
        and not isinstance(t, torch.nn.Parameter)
        and id(t) not in held
        and t.dim() > 0
    ]


def _batch_scale(scale: Any, inputs: list[torch.Tensor], names: dict) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise EstimateError(f"batch takes a scale of the batch such as 2 or 0.5, not {scale!r}")
    if not math.isfinite(scale):
        raise EstimateError(f"batch takes a finite scale, not {scale!r}")
    if not inputs:
        raise EstimateError("batch: no input tensor among the arguments")
    var = {id(v): k for k, v in names.items() if not k.startswith("_")}
    for t in inputs:
        what = var.get(id(t), f"an input of shape {tuple(t.shape)}")
        n = t.shape[0] * scale
        if n != round(n) or n < 1:
            raise EstimateError(
                f"batch={scale!r} does not divide the batch of {what} ({t.shape[0]} rows)"
            )
        numel = t.untyped_storage().nbytes() // t.element_size()
        span = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
        new_span = span + (round(n) - t.shape[0]) * t.stride(0)
        outermost = t.shape[0] == 1 or t.stride(0) == max(t.stride())
        if not outermost or numel * scale != round(numel * scale) or new_span >= numel * scale:
            raise EstimateError(
                f"batch: {what} is not laid out batch first (its first dimension is not the "
                "outermost of its storage)"
            )
    return float(scale)


# -- the changes prof.explain() suggests, tried on an estimated cell ------------------------------
#: ``prof.explain()``'s suggestions (its ``changes`` column) as changes; checkpoints are read
#: from their text.
SUGGESTED = {
    "autocast=torch.bfloat16": {"autocast": torch.bfloat16},
    "batch=0.5": {"batch": 0.5},
    "optimizer={'foreach': False}": {"optimizer": {"foreach": False}},
    "optimizer=torch.optim.SGD": {"optimizer": torch.optim.SGD},
    "set_to_none=True": {"set_to_none": True},
}
_ONE = re.compile(r", (?=[a-z_]+=)")


def suggestions(table: pd.DataFrame) -> list[tuple[str, dict]]:
    """The distinct changes an explain table suggests, in row order: (text, changes)."""
    out: dict[str, dict] = {}
    for text in table["changes"].dropna():
        for one in _ONE.split(str(text)):
            if one in out:
                continue
            if one.startswith(f"{Change.CHECKPOINT.value}="):
                out[one] = {"checkpoint": ast.literal_eval(one.split("=", 1)[1])}
            elif one in SUGGESTED:
                out[one] = SUGGESTED[one]
    return list(out.items())


def cell_savings(shell, code, prof, options: EstimateOptions) -> pd.DataFrame:
    """Each change ``prof.explain()`` suggests, tried alone on the cell ``code`` estimated
    with ``options`` (its limit left out):
    the peak with it on the device of ``prof``'s peak and the saving, largest first
    (:data:`.schema.SAVINGS`). Changes that do not apply to the cell (a batch that does
    not halve, no optimizer) or that the fake run cannot do are left out."""
    table = prof.explain()
    dev = table.attrs["device"]
    peak = int(table.attrs["peak_bytes"])
    unlimited = dataclasses.replace(options, limit=None)
    rows = []
    for text, changes in suggestions(table):
        real = cell_objects(shell, code)
        try:
            request = check(changes, (real,), real, options.device)
            changed = estimate_cell(
                shell,
                code,
                unlimited,
                label=f"{prof.label}, {text}",
                prepare=functools.partial(prepare_request, request),
                remember=False,
            )
        except (EstimateError, RuntimeError):
            continue
        finally:
            real.clear()
        after = int(changed.peak(dev).attrs["peak_bytes"]) if dev in changed.devices else 0
        rows.append((text, after, peak - after))
    out = pd.DataFrame(rows, columns=list(S.SAVINGS)) if rows else S.empty(S.SAVINGS)
    out = out.sort_values("saving", ascending=False, kind="stable")
    out = S.conform(out, S.SAVINGS, name="savings")
    out.attrs.update(peak_bytes=peak, device=dev)
    return out
