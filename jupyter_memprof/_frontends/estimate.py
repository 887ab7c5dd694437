"""Estimate mode: a step's memory on any device, without a run.

``estimate(fn, *args, device="cuda:0", limit="24GiB")`` calls ``fn`` on fake copies of
its arguments (:mod:`jupyter_memprof._producers.fake`) and returns a :class:`Profile` with
the same tables as a real capture, analysed by the same pipeline.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from .._errors import EstimateError
from .._producers.fake.changes import Prepare
from .._producers.fake.copy import holds_torch
from .._producers.fake.dist import fake_world
from .._producers.fake.run import FakeRun, plan
from .._results.profile import Profile
from .estimate_globals import bound, globals_read, names_read, restore_names
from .finish import FinishOptions, fill, register
from .frames import caller_names
from .options import EstimateOptions, raised_as

__all__ = ["checked_options", "estimate", "estimate_with", "run_estimate"]

#: What the x axis of an estimate counts (a fake run has no meaningful duration).
CLOCK = "op sequence"


def estimate(
    fn: Callable,
    *args: Any,
    device: str | None = None,
    limit: Any = None,
    allocator: str | None = None,
    context: Any = None,
    gpu: Any = None,
    world_size: int | None = None,
    **kwargs: Any,
) -> Profile:
    """Estimate the memory of ``fn(*args, **kwargs)`` on ``device`` without running it.

    Every tensor, ``nn.Module`` and optimizer in ``args`` and ``kwargs`` (also in lists,
    tuples and dicts) is replaced by a fake copy: same shapes, dtypes, strides, ``.grad``,
    buffers, shared parameters and optimizer state, no data. Tensors ``fn`` creates are fake
    too; nothing is computed and the real objects are never changed.

    Parameters
    ----------
    fn : callable
        The step. Everything it uses must come in ``args``/``kwargs`` or be made inside it.
    *args, **kwargs
        What ``fn`` is called with: the model, the optimizer, the batch.
    device : str, optional
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (no GPU needed: the step is then computed on
        the CPU path, its blocks attributed to the CUDA device and rounded as CUDA rounds
        them); ``None`` keeps each tensor where it lives.
    limit : int or str, optional
        Bytes (``"24GiB"``): the profile then says where the step would run out of memory
        (``meta["oom"]``). On CUDA it is judged against the caching allocator's reserved
        bytes (modelled: ``prof.segments``) plus the CUDA context.
    allocator : str, optional
        ``PYTORCH_CUDA_ALLOC_CONF`` settings for the allocator's model, e.g.
        ``"expandable_segments:True"``; default: the environment's.
    context : int or str, optional
        Bytes a CUDA device holds outside PyTorch; default 751 MiB (measured on an H100).
    gpu : str or tuple, optional
        For CUDA, the GPU whose kernels the estimate follows: ``"H100"`` (the default),
        ``"A100"``, ``"L4"``, ... or a compute capability (``"sm80"``, ``(8, 6)``).
    world_size : int, optional
        Run ``fn`` as rank 0 of ``world_size`` ranks on torch's fake process group, so
        ``fully_shard`` (FSDP2), DDP and collectives behave as on that many ranks (build the
        model inside ``fn``). A process that has a process group already is refused.

    Returns
    -------
    Profile
        With ``meta["estimate"] = True``; its ``*_ns`` columns count positions in the run.

    Raises
    ------
    EstimateError
        A bad ``device``, ``limit`` or other option, before anything runs; an op a fake run
        cannot do (``.item()``, ``nonzero``) or a real tensor ``fn`` reads that was not
        passed to it, naming the op and the line.
    CaptureError
        A capture or another estimate runs in this process (one at a time).

    Examples
    --------
    >>> est = jupyter_memprof.estimate(train_step, model, opt, x, y,
    ...                                device="cuda:0", limit="24GiB")  # doctest: +SKIP
    >>> est.meta["oom"] is None  # doctest: +SKIP
    True
    """
    options = checked_options(
        "estimate()",
        fn,
        device=device,
        limit=limit,
        allocator=allocator,
        context=context,
        gpu=gpu,
        world_size=world_size,
    )
    return estimate_with(options, fn, args, kwargs, sys._getframe(1))


def checked_options(entry: str, fn: Any, **options: Any) -> EstimateOptions:
    """``options`` of ``entry`` (``"estimate()"``, ``"fit()"``) checked once, with ``fn``
    callable, or one :class:`EstimateError` line."""
    if not callable(fn):
        raise EstimateError(f"{entry} needs a function to call first, not {type(fn).__name__}")
    with raised_as(EstimateError):
        return EstimateOptions.from_kwargs(**options)


def estimate_with(
    options: EstimateOptions, fn: Callable, args: tuple, kwargs: dict, frame=None
) -> Profile:
    """:func:`estimate` with its options checked already (the command line's): the
    variables of ``frame`` (None: none) name the fake copies."""
    caller = caller_names(frame) if frame is not None else {}
    try:
        return run_estimate(fn, args, kwargs, options, names=caller, label=_label(fn, args, kwargs))
    finally:
        caller.clear()


#: How long the arguments part of an estimate's label may grow before it is cut.
_ARGS_CHARS = 40


def _label(fn: Callable, args: tuple = (), kwargs: dict | None = None) -> str:
    """``estimate of step(64x512, 3)``: the function and what it was given (tensors by their
    shape), so estimates of one function with other inputs have labels that tell them apart."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    given = [_argument(a) for a in args]
    given += [f"{k}={_argument(v)}" for k, v in (kwargs or {}).items()]
    text = ", ".join(given)
    if len(text) > _ARGS_CHARS:
        text = text[: _ARGS_CHARS - 1].rstrip(", ") + "…"
    return f"estimate of {name}({text})"


def _argument(value) -> str:
    """A short word for one argument: a tensor's shape, a number's value, else its type."""
    if isinstance(value, torch.Tensor):
        return "x".join(map(str, value.shape)) or "scalar"
    if isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, tuple | list) and len(value) <= 3:
        return "(" + ", ".join(_argument(v) for v in value) + ")"
    return type(value).__name__


def run_estimate(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    options: EstimateOptions,
    *,
    names: dict,
    label: str | None,
    prepare: Prepare | None = None,
    remember: bool = True,
    passed: int = 1,
) -> Profile:
    """The work behind :func:`estimate` and ``%%memprofile --estimate``, with its checked
    ``options``: ``names`` are the variables the real objects are known by (they name the
    fake copies). ``prepare(copier, args, kwargs)`` changes the fake copies before the step
    runs and returns the arguments to call it with (:func:`jupyter_memprof.what_if`).
    ``remember=False`` leaves the profile out of the session's list (the probes of
    :func:`jupyter_memprof.fit`). Objects other than tensors, modules and optimizers (a
    scheduler) are copied where they were passed: items of ``args`` (``passed=1``), or items
    of its containers (``passed=2``: the magic passes the notebook's objects in a dict)."""
    where = plan(options.device)
    ns, real_globals = globals_read(fn)
    names = {**real_globals, **names}

    def namespace(fakes: dict[int, Any]) -> dict:
        return {
            k: fakes[id(v)] for k, v in names.items() if id(v) in fakes and not k.startswith("_")
        }

    run = FakeRun(where, namespace, options.gpu)
    t0 = time.perf_counter()
    try:
        with run.slot(), _world(options.world_size):  # the slot first: a busy one is said at once
            fargs = run.convert(args, passed)
            fkwargs = run.convert(kwargs)
            fglobals = run.convert(real_globals)
            if prepare is not None:
                fargs, fkwargs = prepare(run.copier, fargs, fkwargs)
            with bound(ns, fglobals):
                run.run(fn, fargs, fkwargs)
            del fargs, fkwargs, fglobals
        wall_s = time.perf_counter() - t0
        prof = Profile.empty()
        capture = fill(prof, lambda _reading: run.capture(), _ending(options, where.device))
    finally:
        run.release()
        real_globals.clear()
        names.clear()
    prof.meta.setdefault("oom", None)  # no limit: none checked
    meta = _run_meta(run, where, options, list(capture.devices), wall_s)
    return register(prof, remember=remember, label=label, **meta)


def _ending(options: EstimateOptions, device: str | None) -> FinishOptions:
    """How an estimate ends (:func:`.finish.fill`): modelled with its allocator settings,
    its limit (with the CUDA context) checked on ``device`` into ``meta["oom"]``."""
    return FinishOptions(
        allocator=options.allocator, limit=options.limit, context=options.context, device=device
    )


def _run_meta(
    run: FakeRun, where, options: EstimateOptions, devices: list[str], wall_s: float
) -> dict:
    """What an estimate's meta says about its run."""
    gpu, world_size = options.gpu, options.world_size
    return dict(
        estimate=True,
        device=where.device,
        simulated_cuda=where.simulated,
        compute_device=None if where.compute is None else str(where.compute),
        gpu=f"{gpu.name} (sm{gpu.sm})" if any(d.startswith("cuda") for d in devices) else None,
        kernel_memory_not_modelled=dict(sorted(run.recorder.not_modelled.items())),
        data_dependent_scalars=dict(run.recorder.scalars),
        compiled_as_eager=run.compiled_as_eager,
        clock=CLOCK,
        limit=options.limit,
        **({} if options.context is None else {"context": options.context}),
        wall_s=wall_s,
        devices=devices,
        with_stack=True,
        error=None,
        captured_at=time.time_ns(),
        **({} if world_size is None else {"rank": 0, "world_size": world_size}),
    )


def _world(world_size: int | None):
    """The fake process group of ``world_size`` ranks, or nothing."""
    return contextlib.nullcontext() if world_size is None else fake_world(world_size)


# -- the magic's estimate: a cell on fake copies of the notebook's objects -------------------
def cell_objects(shell, code) -> dict:
    """The tensors, modules and optimizers (and containers of them) a compiled cell
    (``magic._Code``) reads from the notebook, by name."""
    ns = shell.user_ns
    wanted = names_read([c for c, _ in code.codes], ns)
    return {k: ns[k] for k in wanted if holds_torch(ns[k])}


def estimate_cell(shell, code, options: EstimateOptions, *, label: str, **more: Any) -> Profile:
    """Run a compiled cell (:class:`.cell.Code`) on fake copies of the tensors, modules and
    optimizers it reads from the notebook, with the checked ``options``; ``more`` are
    :func:`run_estimate`'s ``prepare`` and ``remember``.

    While the cell runs, those names are bound to the fake copies in the notebook namespace
    itself, so notebook functions the cell calls see them too. Afterwards every name is bound
    exactly as before the cell: names the cell assigned or deleted are restored, since
    what it computed is fake. Nothing real is changed.
    """
    ns = shell.user_ns
    real = cell_objects(shell, code)
    before = dict(ns)

    def run_cell(fakes: dict) -> None:
        ns.update(fakes)
        code.run(None)

    try:
        return run_estimate(
            run_cell, (real,), {}, options, names=real, label=label, passed=2, **more
        )
    finally:
        restore_names(ns, before)
        real.clear()
