"""No other torch profiler may start while a capture runs.

torch runs one kineto profiler per process but keeps its "enabled" state per thread, so a
second profiler started from another thread while a capture records is not refused by
torch: the process crashes (segmentation fault, exit 139) when the capture stops (measured,
torch 2.13: docs/dev-notes.md, "Threads"). One started in the capture's own thread (a
``torch.profiler.profile()`` inside the profiled cell) takes the recording over: the capture
then came back empty, without a word. A capture started while another profiler runs is
refused by the capture itself (``recorder._check_no_torch_profiler``); this module covers
the other order.

Every start of torch's profiler from Python goes through three functions of
``torch.autograd.profiler`` (``torch.profiler.profile``, ``torch.autograd.profiler.profile``,
``emit_itt`` and ``emit_nvtx`` alike): ``_prepare_profiler``, ``_run_on_profiler_start`` (which
sets the process-wide flag) and ``_enable_profiler``. While a capture runs they are wrapped:
inside :meth:`Guard.starting` (the capture starting its own profiler, in its thread, also
for each window of a long run) they run as before; anywhere else they raise
:class:`ProfilerBusy`, before anything of torch's changes. The wrappers are removed when the
capture stops (or is abandoned); a wrapper that someone else has since wrapped again is left
to them, and lets every call through once its capture is over.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator

import torch.autograd.profiler as _torch_profiler

from .._errors import ProfilerBusy

#: the functions every Python start of torch's profiler calls, in the order it calls them
GUARDED = ("_prepare_profiler", "_run_on_profiler_start", "_enable_profiler")


class Guard:
    """torch's profiler refused outside the capture of thread ``owner`` until :meth:`lift`."""

    def __init__(self, owner: threading.Thread) -> None:
        self.owner = owner
        self._on = True
        self._ours = False
        self._wrapped: dict[str, tuple[Callable, Callable]] = {}
        for name in GUARDED:
            fn = getattr(_torch_profiler, name, None)
            if fn is not None:
                self._wrapped[name] = (fn, self._guard(fn))
                setattr(_torch_profiler, name, self._wrapped[name][1])

    def _guard(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            if self._on and not (self._ours and threading.current_thread() is self.owner):
                raise ProfilerBusy(self._refusal())
            return fn(*args, **kwargs)

        return guarded

    def _refusal(self) -> str:
        if threading.current_thread() is self.owner:
            return (
                "jupyter_memprof: a memory capture is running in this thread; torch runs one "
                "profiler at a time (another one started here would take its recording "
                "over): start this profiler outside the capture"
            )
        return (
            f"jupyter_memprof: a memory capture is running in thread {self.owner.name!r}; "
            "torch runs one profiler per process (a second one would crash it): "
            "start this profiler after the capture has finished"
        )

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """The capture starting its own profiler (in its thread)."""
        self._ours = True
        try:
            yield
        finally:
            self._ours = False

    def lift(self) -> None:
        """Let torch's profiler start anywhere again (idempotent)."""
        self._on = False
        for name, (fn, guarded) in self._wrapped.items():
            if getattr(_torch_profiler, name, None) is guarded:
                setattr(_torch_profiler, name, fn)
        self._wrapped.clear()
