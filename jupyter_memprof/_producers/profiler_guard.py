"""While a capture runs, torch's profiler refuses to start in any other thread.

torch runs one kineto profiler per process but keeps its "enabled" state per thread, so a
second profiler started from another thread while a capture records is not refused by
torch: the process crashes (segmentation fault, exit 139) when the capture stops (measured,
torch 2.13: docs/dev-notes.md, "Threads"). A capture started while another thread's
profiler runs is refused by the capture itself (``recorder._check_no_torch_profiler``);
this module covers the other order.

Every start of torch's profiler from Python goes through three functions of
``torch.autograd.profiler`` (``torch.profiler.profile``, ``torch.autograd.profiler.profile``,
``emit_itt`` and ``emit_nvtx`` alike): ``_prepare_profiler``, ``_run_on_profiler_start`` (which
sets the process-wide flag) and ``_enable_profiler``. While a capture runs they are wrapped:
called from the capture's own thread they run as before (the capture's windows start
profilers there); from any other thread they raise :class:`ProfilerBusy`, before anything of
torch's changes. The wrappers are removed when the capture stops (or is abandoned); a
wrapper that someone else has since wrapped again is left to them, and lets every call
through once its capture is over.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import torch.autograd.profiler as _torch_profiler

#: the functions every Python start of torch's profiler calls, in the order it calls them
GUARDED = ("_prepare_profiler", "_run_on_profiler_start", "_enable_profiler")


class ProfilerBusy(RuntimeError):
    """torch's profiler was started in another thread while a memory capture runs."""


def refuse_other_threads(owner: threading.Thread) -> Callable[[], None]:
    """Make torch's profiler refuse to start outside ``owner`` (the capture's thread);
    returns the function that lifts that again (idempotent)."""
    state = {"on": True}
    wrapped: dict[str, tuple[Callable, Callable]] = {}

    def guard(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            if state["on"] and threading.current_thread() is not owner:
                raise ProfilerBusy(
                    f"jupyter_memprof: a memory capture is running in thread {owner.name!r}; "
                    "torch runs one profiler per process (a second one would crash it): "
                    "start this profiler after the capture has finished"
                )
            return fn(*args, **kwargs)

        return guarded

    for name in GUARDED:
        fn = getattr(_torch_profiler, name, None)
        if fn is not None:
            wrapped[name] = (fn, guard(fn))
            setattr(_torch_profiler, name, wrapped[name][1])

    def lift() -> None:
        state["on"] = False
        for name, (fn, guarded) in wrapped.items():
            if getattr(_torch_profiler, name, None) is guarded:
                setattr(_torch_profiler, name, fn)
        wrapped.clear()

    return lift
