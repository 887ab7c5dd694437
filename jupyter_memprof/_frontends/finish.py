"""How every run ends: records -> tables -> profile -> session.

Both producers end here: a capture (:mod:`.capture`, torch's profiler) and an estimate
(:mod:`.estimate`, a run on fake tensors), and so do the magic's cells, which drive them.
:func:`fill` reads the producer's records and analyses them into the profile's tables and
meta, with the collector paused and the timings noted; :func:`register` adds what every
profile's meta says about its run and puts the profile in the session's list (the panel's).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .._analysis.allocator.config import AllocatorConfig, config_from_env, parse_config
from .._analysis.pipeline import Progress, analyse, paused_gc
from .._records import Capture
from .._results.profile import Profile
from . import session as _session

__all__ = ["allocator_config", "distributed_meta", "fill", "register"]

#: reads the producer's records; given a ``reading(fraction)`` callback, or None
Produce = Callable[[Callable[[float], None] | None], Capture]


def allocator_config(setting: str | AllocatorConfig | None) -> AllocatorConfig:
    """The caching allocator's settings a run is modelled with: ``setting`` (a
    ``PYTORCH_CUDA_ALLOC_CONF`` text) when given, else the environment's, as torch reads it.
    A bad one raises :class:`~jupyter_memprof._errors.AllocatorConfigError` (one line)."""
    return config_from_env(os.environ) if setting is None else parse_config(setting)


def fill(
    prof: Profile,
    produce: Produce,
    *,
    allocator: AllocatorConfig | None = None,
    reading: Callable[[float], None] | None = None,
    analysing: Progress | None = None,
) -> Capture:
    """Read the producer's records and analyse them into ``prof`` (its tables, and meta:
    the analysis' own keys plus ``capture_s``, ``analysis_s`` and ``event_count``).
    Returns the records, which the caller frees when it suits (they can be millions of
    small objects). Raises what reading or the analysis raised; ``prof`` is then as it was."""
    with paused_gc():
        t0 = time.perf_counter()
        capture = produce(reading)
        t1 = time.perf_counter()
        tables, meta = analyse(capture, progress=analysing, allocator=allocator)
    meta["capture_s"] = t1 - t0
    meta["analysis_s"] = time.perf_counter() - t1  # tables and analyses, after reading
    meta["event_count"] = capture.trace.event_count
    for key, df in tables.items():
        setattr(prof, key, df)
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
