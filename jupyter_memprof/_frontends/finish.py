"""How every run ends: records -> tables -> profile -> session.

A capture (:mod:`.capture`, torch's profiler), each window of a long run and its tail
(:mod:`.long_run`), an estimate (:mod:`.estimate`, a run on fake tensors), a memory snapshot
or a trace read from a file (:mod:`.snapshot`, :mod:`.traces`), and the magic's cells, which
drive them, all end here. :func:`fill` reads the producer's records and analyses them
into the profile's tables and meta, with the collector paused and the timings noted, as one
:class:`FinishOptions` says (made once per run, by its entry point: the allocator's
settings, the progress callbacks, a memory limit to check); :func:`register` adds what every
profile's meta says about its run and puts the profile in the session's list (the panel's).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .._analysis.allocator.config import AllocatorConfig, config_from_env, parse_config
from .._analysis.pipeline import Progress, analyse, paused_gc
from .._producers.snapshot.align import with_recorded_segments
from .._records import Capture
from .._results.profile import Profile
from . import session as _session

__all__ = ["FinishOptions", "allocator_config", "distributed_meta", "fill", "register"]

#: reads the producer's records; given a ``reading(fraction)`` callback, or None
Produce = Callable[[Callable[[float], None] | None], Capture]


@dataclasses.dataclass(frozen=True)
class FinishOptions:
    """How a run ends: what :func:`fill` needs besides the records, made once per run by its
    entry point and handed on unchanged (a long run's windows and tail end with the same
    one, :meth:`part` saying which part of the run each is)."""

    #: the caching allocator's settings the CUDA blocks are modelled with (None: torch's)
    allocator: AllocatorConfig | None = None
    #: ``reading(fraction)`` while the records are read, or None
    reading: Callable[[float], None] | None = None
    #: ``analysing(stage, done, total)`` after each stage of the analysis, or None
    analysing: Progress | None = None
    #: a memory limit in bytes: ``meta["oom"]`` says when the run first goes over it
    #: (:func:`jupyter_memprof._analysis.limit.first_over`); None: not checked
    limit: int | None = None
    #: with ``limit``: the CUDA context's bytes counted beside the allocator's, or None
    context: int | None = None
    #: with ``limit``: the device it applies to (None: the one with the highest peak)
    device: str | None = None
    #: whether the records are the run's first and its last part (a long run's windows are
    #: parts: how their ends split steps, :func:`jupyter_memprof._analysis.steps.step_bounds`)
    window: tuple[bool, bool] = (True, True)

    def part(self, first: bool, last: bool) -> FinishOptions:
        """These options for one part of a long run: ``first``, ``last`` as in
        :attr:`window`; progress only for the last (the wait after the loop)."""
        quiet = {} if last else {"reading": None, "analysing": None}
        return dataclasses.replace(self, window=(first, last), **quiet)


def allocator_config(setting: str | AllocatorConfig | None) -> AllocatorConfig:
    """The caching allocator's settings a run is modelled with: ``setting`` (a
    ``PYTORCH_CUDA_ALLOC_CONF`` text) when given, else the environment's, as torch reads it.
    A bad one raises :class:`~jupyter_memprof._errors.AllocatorConfigError` (one line)."""
    return config_from_env(os.environ) if setting is None else parse_config(setting)


def fill(prof: Profile, produce: Produce, options: FinishOptions | None = None) -> Capture:
    """Read the producer's records and analyse them into ``prof`` as ``options`` say (its
    tables, and meta: the analysis' own keys plus ``capture_s``, ``analysis_s`` and
    ``event_count``; ``oom`` with a ``limit``; with a snapshot recorded beside a capture,
    ``prof.snapshot``, the segments it recorded when they match the records:
    :func:`~jupyter_memprof._producers.snapshot.align.with_recorded_segments`). Returns the
    records, which the caller frees when it suits (they can be millions of small objects).
    Raises what reading or the analysis raised; ``prof`` is then as it was."""
    options = FinishOptions() if options is None else options
    with paused_gc():
        t0 = time.perf_counter()
        capture = produce(options.reading)
        recorded: dict[str, Any] = {}
        if isinstance(prof.snapshot, dict):  # snapshot=True: the allocator's own segments
            capture, recorded = with_recorded_segments(capture, prof.snapshot)
        t1 = time.perf_counter()
        tables, meta = analyse(
            capture, progress=options.analysing, allocator=options.allocator, window=options.window
        )
    meta["capture_s"] = t1 - t0
    meta["analysis_s"] = time.perf_counter() - t1  # tables and analyses, after reading
    meta["event_count"] = capture.trace.event_count
    meta.update(recorded)
    if options.limit is not None:
        from .._analysis.limit import first_over

        meta["oom"] = first_over(
            tables,
            options.limit,
            options.device,
            allocator=options.allocator,
            context=options.context,
        )
    prof.set_tables(tables)
    prof.meta.update(meta)
    return capture


def register(prof: Profile, *, remember: bool = True, **meta: Any) -> Profile:
    """Note the run in ``prof.meta`` (``meta``, the torch version, and ``rank`` and
    ``world_size`` under ``torch.distributed``) and, with ``remember``, add the profile to
    the session's list once. Safe to call again."""
    prof.meta.update(meta)
    prof.meta.setdefault("torch_version", _torch_version())
    for key, value in distributed_meta().items():
        prof.meta.setdefault(key, value)
    if remember and prof.session_id is None:
        _session.add(prof)
    return prof


def distributed_meta() -> dict:
    """``rank`` and ``world_size`` when ``torch.distributed`` is initialised, else nothing."""
    torch = sys.modules.get("torch")  # not imported: not initialised either
    dist = getattr(torch, "distributed", None)
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return {}
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size()}


def _torch_version() -> str | None:
    """The version of torch, read without importing it where it is not imported yet (a
    snapshot or a trace opens without torch)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.__version__
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None
