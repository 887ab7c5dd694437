"""The torch-profiler producer: start and stop torch's profiler and the live-session hooks
around the user's code, then hand the analysis a :class:`~jupyter_memprof._records.Capture`.

:mod:`.torch_profiler` reads torch's event tree; this module owns the profiler's life.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable

import torch

from .._errors import CaptureError
from .._records import Capture
from . import torch_profiler as events
from .live import ModuleHooks, SessionNames

Progress = Callable[[str, int, int], object]


@contextlib.contextmanager
def _quiet_stderr():
    """Silence torch's C++ chatter (kineto start/stop lines) on file descriptor 2.

    Only our own start/stop calls run inside this: the user's code never does.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cell_namer():
    """Map IPython cell file names to ``In[N]`` when running under IPython."""
    ipython = sys.modules.get("IPython")  # not imported: not running under IPython
    if ipython is None:
        return None
    shell = ipython.get_ipython()
    compiler = getattr(shell, "compile", None)
    mapping = getattr(compiler, "_filename_map", None)
    if not isinstance(mapping, dict):
        return None

    def name(filename: str) -> str | None:
        n = mapping.get(filename)
        return f"In[{n}]" if isinstance(n, int) else None

    return name


def _time_zero(code_start_ns: int | None, trace, trace_start_ns: int | None) -> int | None:
    """When the profiled code started, moved earlier only if something was recorded before.

    torch's own trace starts before its profiler has finished starting (tens of ms on a
    small step, more on the first capture of a process); counting from there would show
    that start-up as empty time before the user's code.
    """
    if code_start_ns is None:
        return trace_start_ns
    firsts = [code_start_ns]
    if trace.ops:
        firsts.append(trace.ops[0].start_ns)  # ops are in start-time order
    if trace.memory:
        firsts.append(trace.memory[0].time_ns)
    return min(firsts)


class Recorder:
    """Starts and stops everything a capture records: torch's profiler and the module hooks,
    plus the names the live session gives tensors before and after.

    ``profile()`` is built on it; so are the benchmarks, which need torch's raw result.
    """

    def __init__(self, devices: list[str], with_stack: bool, namespace: Callable[[], dict]):
        self.devices = devices
        self.with_stack = with_stack
        self._namespace = namespace
        self._torch_profiler = None
        self.hooks: ModuleHooks | None = None
        self.start_rows: list = []
        self.stop_s = 0.0
        self.start_ns: int | None = None

    def start(self) -> None:
        events.prepare()
        if events.profiler_running():
            raise CaptureError(
                "a torch profiler is already running: finish its `with` block (or call its "
                "stop()) before profiling memory here"
            )
        self.start_rows = SessionNames(self._namespace(), None).rows("start")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if any(d.startswith("cuda") for d in self.devices):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        tp = torch.profiler.profile(
            activities=activities,
            profile_memory=True,
            record_shapes=True,
            with_stack=self.with_stack,
        )
        burner = torch.empty(1)
        with _quiet_stderr():
            tp.__enter__()
            # torch warns once per process, on file descriptor 2, when a block allocated
            # before the capture is freed inside it. Spend that warning here, silently.
            del burner
        self._torch_profiler = tp
        self.hooks = ModuleHooks()
        self.hooks.install()
        # time zero: the user's code starts now, with the profiler already running (the
        # events' clock is the Unix clock in ns)
        self.start_ns = time.time_ns()

    def stop(self) -> None:
        """Always stops the profiler and removes the hooks, whatever happened before."""
        try:
            if self.hooks is not None:
                self.hooks.remove()
        finally:
            t = time.perf_counter()
            with _quiet_stderr():
                self._torch_profiler.__exit__(None, None, None)
            self.stop_s = time.perf_counter() - t

    @property
    def kineto_results(self):
        return self._torch_profiler.profiler.kineto_results

    def session_names(self) -> tuple[SessionNames, list]:
        """Names as the session knows them now, and every name row (start and end)."""
        names = SessionNames(self._namespace(), self.hooks)
        return names, [*self.start_rows, *names.rows("end")]

    def capture(self, progress: Progress | None = None) -> Capture:
        """Read torch's events into records: the producer's whole output."""
        if progress is not None:
            progress("reading events", 0, 1)
        names, rows = self.session_names()
        results = self.kineto_results
        trace = events.read_trace(results, events.FrameNamer(_cell_namer()))
        modules = names.hooked_modules
        return Capture(
            trace=trace,
            names=rows,
            module_paths=[names.module_path(m) for m in modules],
            module_classes=[type(m).__name__ for m in modules],
            devices=list(self.devices),
            start_ns=_time_zero(self.start_ns, trace, events.trace_start_ns(results)),
        )

    def release(self) -> None:
        """Let go of torch's raw result (it can be large)."""
        if self._torch_profiler is not None:
            self._torch_profiler.profiler = None
        self._torch_profiler = None
