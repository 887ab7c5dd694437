"""Long loops recorded: torch's profiler restarted every N steps.

A capture of a loop keeps every event in torch's profiler until it stops (about 27k events
per step of a 64-block MLP with Python stacks), so a loop of thousands of steps would keep
millions. :class:`WindowRecorder` records the loop in *windows* of a fixed number of steps:
when a window's last step ends, it stops torch's profiler, reads the window's records,
hands them to ``on_window`` (the front end analyses them and keeps only what it needs), and
starts torch's profiler again. The hooks and the capture slot stay in place from the run's
start to its end, as in a plain :class:`~.recorder.Recorder`.

Where a window may end: only outside every annotation torch is recording. A profiler
stopped inside an open ``record_function`` leaves that annotation's end to be written
into the stopped profiler's freed records. So a window never ends inside
``optimizer.step()`` (torch's ``Optimizer.step#`` annotation is open while its hooks run):
each optimizer's ``step`` is wrapped for the run, and the window ends after it returns.
:func:`jupyter_memprof.step` ends one right after its own annotation is closed. Once the
code has marked a step itself, only its marks count, as in the analysis of steps.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import torch

from .._records import Capture
from . import live
from . import torch_profiler as events
from .live import SessionNames
from .recorder import Recorder, cuda_totals, force_stop, quiet_stderr

log = logging.getLogger(__name__)


def _new_profiler(devices: list[str], with_stack: bool):
    """A torch profiler with the flags of a capture (memory, shapes, stacks as asked)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if any(d.startswith("cuda") for d in devices):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities,
        profile_memory=True,
        record_shapes=True,
        with_stack=with_stack,
    )


class _OptimizerEnds:
    """Calls ``on_end`` after each ``optimizer.step()`` returns, outside torch's
    ``Optimizer.step#`` annotation: every optimizer in the namespace at the start, and every
    one seen stepping later, gets a ``step`` attribute of its own for the run (an optimizer
    first seen stepping is caught from its next step on). :meth:`remove` puts each back."""

    def __init__(self, on_end: Callable[[], object]) -> None:
        self._on_end = on_end
        #: (optimizer, its wrapper, the instance's own step before it or None)
        self._wrapped: list[tuple[torch.optim.Optimizer, Any, Any]] = []
        self._seen: set[int] = set()
        self._handle = None

    def install(self, namespace: dict) -> None:
        from torch.optim import optimizer as optim_module

        for value in list(namespace.values()):
            if isinstance(value, torch.optim.Optimizer):
                self.wrap(value)
        self._handle = optim_module.register_optimizer_step_pre_hook(self._pre)

    def _pre(self, optimizer, args, kwargs) -> None:
        if id(optimizer) not in self._seen:
            self.wrap(optimizer)

    def wrap(self, optimizer: torch.optim.Optimizer) -> None:
        """Give ``optimizer`` a ``step`` that calls ``on_end`` after the real one returns: a
        bound method, as torch's LR schedulers expect to find (they wrap it in turn)."""
        if id(optimizer) in self._seen:
            return
        self._seen.add(id(optimizer))
        before = optimizer.__dict__.get("step")  # an instance's own step (an LR scheduler's)
        inner = optimizer.step
        on_end = self._on_end

        def step(_optimizer, *args, **kwargs):
            out = inner(*args, **kwargs)
            on_end()
            return out

        functools.update_wrapper(step, inner)
        optimizer.step = types.MethodType(step, optimizer)
        self._wrapped.append((optimizer, step, before))

    def remove(self) -> None:
        """Remove the hook and every wrapper this run installed (a wrapper something else has
        wrapped since stays, and only passes calls on)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()
        wrapped, self._wrapped = self._wrapped, []
        self._on_end = _nothing
        for optimizer, step, before in wrapped:
            if getattr(optimizer.__dict__.get("step"), "__func__", None) is step:
                if before is None:
                    del optimizer.__dict__["step"]
                else:
                    optimizer.step = before


def _nothing() -> None:
    return None


class WindowRecorder(Recorder):
    """A :class:`Recorder` whose torch profiler restarts every ``steps`` steps.

    ``on_window(read)`` is called at each finished window's end while the profiler is off;
    ``read()`` gives the window's :class:`Capture` (the front end reads it when it suits it,
    with the collector paused); the run's last window is read by :meth:`capture` after :meth:`stop`, with the
    session's held tensors (what keeps blocks alive at the end). Only steps that end in the
    thread that started the run end windows (torch's profiler belongs to that thread).
    A failure of ours between two windows never reaches the user's loop: it is noted in
    :attr:`failures` and the run goes on (without recording, if the profiler could not start
    again).
    """

    def __init__(
        self,
        devices: list[str],
        with_stack: bool,
        namespace: Callable[[], dict],
        steps: int,
        on_window: Callable[[Callable[[], Capture]], object],
    ) -> None:
        super().__init__(devices, with_stack, namespace)
        self.steps_per_window = steps
        self.on_window = on_window
        self._count = 0  # steps ended in this window
        self._marked = False  # the code marks its steps itself: only marks count
        self._ends: _OptimizerEnds | None = None
        self._window_tp = None  # the stopped profiler of the window being read
        #: windows finished and handed over while the run went on
        self.windows = 0
        #: what failed between two windows (``Type: message``)
        self.failures: list[str] = []
        #: the stopped profiler of a window an interrupt kept from being read
        self.unread = None
        self._thread = threading.current_thread()

    # -- start and stop -------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.current_thread()
        super().start()
        try:
            self._ends = _OptimizerEnds(self._optimizer_end)
            self._ends.install(self._namespace())
            live.STEP_LISTENERS.append(self._marked_end)
        except BaseException:
            self._remove_listeners()
            self.stop()
            raise

    def stop(self) -> None:
        try:
            self._remove_listeners()
            if self.unread is not None and events.profiler_running():  # stopped half-way
                with contextlib.suppress(Exception):
                    force_stop(self.unread)
        finally:
            super().stop()

    def _remove_listeners(self) -> None:
        ends, self._ends = self._ends, None
        if self._marked_end in live.STEP_LISTENERS:
            live.STEP_LISTENERS.remove(self._marked_end)
        if ends is not None:
            ends.remove()

    # -- step ends ------------------------------------------------------------------------
    def _optimizer_end(self) -> None:
        if not self._marked:
            self._step_ended()

    def _marked_end(self) -> None:
        self._marked = True
        self._step_ended()

    def _step_ended(self) -> None:
        if not self._running or self._torch_profiler is None:
            return
        if threading.current_thread() is not self._thread:
            return
        self._count += 1
        if self._count >= self.steps_per_window:
            self._count = 0
            try:
                self._next_window()
            except Exception as err:  # ours: the user's loop goes on
                log.warning("switching windows of a long run failed", exc_info=True)
                self.failures.append(f"{type(err).__name__}: {err}")

    def _next_window(self) -> None:
        """End this window and start the next: stop torch's profiler, hand the window's
        records over, start a new profiler. An interrupt or failure on the way leaves the
        profiler off (the run's stop then has nothing of torch's to stop); an interrupt
        before the window's records were read keeps them in :attr:`unread`, for
        :meth:`read_unread` at the run's end."""
        tp, self._torch_profiler = self._torch_profiler, None
        self._window_tp = tp
        read = False

        def read_window() -> Capture:
            nonlocal read
            capture = self.capture(held=False)
            read = True
            return capture

        try:
            force_stop(tp)
            self.totals_end = cuda_totals(self.devices)
            watch, self._watch = self._watch, None
            if watch is not None:  # frees of blocks named at the run's start: first window
                self.watched_frees = watch.close()
            self.windows += 1
            self.on_window(read_window)
        except BaseException as err:
            if not read and not isinstance(err, Exception):  # Ctrl-C: read at the end
                self.unread = tp
            raise
        finally:
            if self.unread is not tp:
                self._window_tp = None
                tp.profiler = None  # torch's raw result: not kept
        # the next window: the session's names at its start (so blocks from before it are
        # named as in one capture), no burner nor watched frees of its own (frees of blocks
        # made while an earlier window recorded are reported), no survey of unnamed storages
        # (the run's start has it)
        self.start_rows = SessionNames(self._namespace()).rows("start")
        self._burner_ptr, self.watched_frees, self.unnamed = None, [], []
        self.totals_start = cuda_totals(self.devices)
        tp = _new_profiler(self.devices, self.with_stack)
        try:
            with quiet_stderr(), self._starting():
                tp.__enter__()
            self._torch_profiler = tp
        except BaseException:  # a failed start, or Ctrl-C inside it: nothing stays on
            if self._torch_profiler is not tp:
                with contextlib.suppress(Exception):
                    force_stop(tp)
            raise
        self.start_ns = time.time_ns()

    def _starting(self):
        """The guard's permission for the run's own profiler to start (none: no guard)."""
        return self._guard.starting() if self._guard is not None else contextlib.nullcontext()

    @property
    def kineto_results(self):
        tp = self._window_tp if self._window_tp is not None else self._torch_profiler
        return tp.profiler.kineto_results

    def read_unread(self) -> Capture | None:
        """The records of the window an interrupt kept from being read in the loop (after
        :meth:`stop`), or None when there is none."""
        tp, self.unread = self.unread, None
        if tp is None:
            return None
        self._window_tp = tp
        try:
            return self.capture(held=False)
        finally:
            self._window_tp = None
            tp.profiler = None

    @property
    def steps_in_window(self) -> int:
        """The steps ended in the window being recorded (the last one, after the stop)."""
        return self._count

    @property
    def has_last_window(self) -> bool:
        """Whether a last window was recorded (False when the run stopped between windows)."""
        return self._torch_profiler is not None
