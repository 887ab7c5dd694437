"""Capture: run torch's profiler around a block of code and turn what it saw into a Profile.

``with jupyter_memprof.profile() as prof:`` is the whole API. The profiler is always stopped
and the hooks always removed, also when the block raises or is interrupted; the partial
profile is kept and the exception propagates.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from . import _session
from ._live import ModuleHooks, SessionNames
from ._result import Profile

Progress = Callable[[str, int, int], Any]


class CaptureError(ValueError):
    """The capture cannot start (bad device, another profiler running)."""


def resolve_devices(device: str | Iterable[str] | None) -> list[str]:
    """Normalise the ``device`` option to a list like ``["cpu", "cuda:0"]``.

    ``None`` means the CPU plus every visible CUDA device. ``"cuda"`` means every visible
    CUDA device; ``"cuda:N"`` one of them.
    """
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device is None:
        return ["cpu", *(f"cuda:{i}" for i in range(cuda_count))]
    if isinstance(device, (str, torch.device)):
        wanted = [str(device)]
    else:
        wanted = [str(d) for d in device]
    out: list[str] = []
    for item in (p.strip() for w in wanted for p in w.split(",")):
        if not item:
            continue
        try:
            dev = torch.device(item)
        except RuntimeError:
            raise CaptureError(f"unknown device {item!r}: use 'cpu', 'cuda' or 'cuda:N'") from None
        if dev.type == "cpu":
            names = ["cpu"]
        elif dev.type == "cuda":
            if cuda_count == 0:
                raise CaptureError(
                    f"device {item!r} asked for, but no CUDA device is available here"
                )
            if dev.index is not None and dev.index >= cuda_count:
                raise CaptureError(
                    f"device {item!r} does not exist: {cuda_count} CUDA device(s) visible"
                )
            names = (
                [f"cuda:{dev.index}"]
                if dev.index is not None
                else [f"cuda:{i}" for i in range(cuda_count)]
            )
        else:
            raise CaptureError(f"device {item!r} is not supported: use 'cpu', 'cuda' or 'cuda:N'")
        out.extend(n for n in names if n not in out)
    if not out:
        raise CaptureError("no device given: use 'cpu', 'cuda' or 'cuda:N'")
    return out


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

    def start(self) -> None:
        from . import _torch_events

        _torch_events.prepare()
        if _torch_events.profiler_running():
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

    def tables(self, progress: Progress | None = None) -> tuple[dict, dict]:
        names, rows = self.session_names()
        return build_tables(
            self.kineto_results,
            names=names,
            name_rows=rows,
            devices=self.devices,
            progress=progress,
        )

    def release(self) -> None:
        """Let go of torch's raw result (it can be large)."""
        if self._torch_profiler is not None:
            self._torch_profiler.profiler = None
        self._torch_profiler = None


class profile(contextlib.AbstractContextManager):  # lower case: reads like a function
    """Profile the memory of a block of PyTorch code.

    ``with jupyter_memprof.profile() as prof: ...`` returns a :class:`Profile` that is filled
    with its tables when the block exits.

    Parameters
    ----------
    device:
        ``None`` (the CPU and every visible CUDA device), ``"cpu"``, ``"cuda"``, ``"cuda:N"``,
        or a list of those: which devices' memory to record.
    with_stack:
        Record Python stacks (gives ``callsite`` on every op). Turning it off makes the
        capture cheaper on small-op models; modules are recorded either way.
    namespace:
        Variables used to name things (models, optimizers, tensors). Defaults to the
        caller's globals and locals; the magic passes the notebook's namespace.
    label:
        A name for the profile in summaries and the JupyterLab panel.
    progress:
        ``progress(stage, done, total)``, called while the tables are built.
    """

    def __init__(
        self,
        *,
        device: str | Iterable[str] | None = None,
        with_stack: bool = True,
        namespace: dict | None = None,
        label: str | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.devices = resolve_devices(device)
        self.with_stack = with_stack
        self.label = label
        self.progress = progress
        self._namespace = namespace
        self._frame = None if namespace is not None else sys._getframe(1)
        self._profile: Profile | None = None
        self._recorder: Recorder | None = None

    def _names(self) -> dict:
        if self._namespace is not None:
            return self._namespace
        if self._frame is None:
            return {}
        ns = dict(self._frame.f_globals)
        ns.update(self._frame.f_locals)
        return ns

    def __enter__(self) -> Profile:
        recorder = Recorder(self.devices, self.with_stack, self._names)
        recorder.start()
        self._recorder = recorder
        self._profile = Profile.empty(label=self.label, devices=self.devices)
        self._t0 = time.perf_counter()
        self._start_ns = time.time_ns()
        return self._profile

    def __exit__(self, exc_type, exc, tb) -> bool:
        wall_s = time.perf_counter() - self._t0
        recorder, self._recorder = self._recorder, None
        recorder.stop()
        prof = self._profile
        error = None
        if exc_type is not None:
            error = f"{exc_type.__name__}: {exc}" if str(exc) else exc_type.__name__
        try:
            tables, meta = recorder.tables(self.progress)
            for key, df in tables.items():
                setattr(prof, key, df)
            prof.meta.update(meta)
        except Exception as build_error:  # never mask the user's own exception
            if exc_type is None:
                raise
            prof.meta["analysis_error"] = repr(build_error)
        finally:
            self._frame = None
            recorder.release()
        prof.meta.update(
            label=self.label,
            wall_s=wall_s,
            stop_s=recorder.stop_s,
            devices=self.devices,
            torch_version=torch.__version__,
            with_stack=self.with_stack,
            error=error,
            captured_at=self._start_ns,
        )
        _session.add(prof)
        return False  # never swallow the exception


def build_tables(
    kineto_results,
    *,
    names: SessionNames,
    name_rows: list,
    devices: list[str],
    progress: Progress | None = None,
) -> tuple[dict, dict]:
    """Everything that happens after the profiled code: records, then tables and analysis.

    The cyclic garbage collector is paused meanwhile: the records are millions of small
    acyclic tuples, and collections triggered by their allocation would otherwise cost as
    much as the analysis itself.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build_tables(
            kineto_results, names=names, name_rows=name_rows, devices=devices, progress=progress
        )
    finally:
        if was_enabled:
            gc.enable()


def _build_tables(kineto_results, *, names, name_rows, devices, progress):
    from ._analysis import analyse
    from ._torch_events import FrameNamer, read_trace, trace_start_ns

    progress = progress or (lambda stage, done, total: None)
    t0 = time.perf_counter()
    progress("reading events", 0, 1)
    trace = read_trace(kineto_results, FrameNamer(_cell_namer()))
    t1 = time.perf_counter()
    modules = names.hooked_modules
    tables, meta = analyse(
        trace,
        names=name_rows,
        module_paths=[names.module_path(m) for m in modules],
        module_classes=[type(m).__name__ for m in modules],
        devices=devices,
        start_ns=trace_start_ns(kineto_results),
        progress=progress,
    )
    meta["capture_s"] = t1 - t0
    meta["analysis_s"] = time.perf_counter() - t1  # tables and analyses, after reading
    meta["event_count"] = trace.event_count
    return tables, meta
