"""The torch-profiler producer: the profiler and hooks -> Capture.

Here torch's profiler and the live-session hooks start and stop
around the user's code, then hand the analysis a :class:`~jupyter_memprof._records.Capture`.

:mod:`.torch_profiler` reads torch's event tree; this module owns the profiler's life.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable

import torch

from .._errors import CaptureError
from .._records import Capture, DeviceTotals, UnnamedStorage, WatchedFree
from . import profiler_guard, unnamed
from . import torch_profiler as events
from .live import ModuleHooks, SessionNames, held_rows, modules_by_id
from .slot import SLOT, Claim

log = logging.getLogger(__name__)


# -- torch's raw results, freed when nobody waits ---------------------------------------------
class _Later:
    """Large things a capture is done with, whose freeing waits until the user is no longer
    waiting: torch's raw results and the records read from them.

    Freeing a capture's raw result is one C++ destructor that holds the GIL (about 2 ms per
    1,000 events; a thread does not help); freeing its records (millions of small tuples on
    a long capture) about 0.3 ms per 1,000 events. Inside IPython with the extension loaded,
    the extension frees them after each cell (``post_run_cell``), once the cell's output is
    out; elsewhere nothing is handed over and they are freed at once. The next capture, and
    :func:`jupyter_memprof.release`, free them too.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[object] = []
        self.enabled = False  # set while a shell frees them after each cell

    def hand_over(self, raw: object) -> bool:
        """Keep ``raw`` for :meth:`free`; False (nothing kept) when nobody would free it."""
        if not self.enabled:
            return False
        with self._lock:
            self._items.append(raw)
        return True

    def __len__(self) -> int:
        return len(self._items)

    def free(self, *_: object) -> None:
        """Free everything handed over (an IPython event callback: arguments ignored)."""
        with self._lock:
            items, self._items = self._items, []
        items.clear()


LATER = _Later()


def _run_all(*steps: Callable[[], object]) -> None:
    """Run every step even when one fails; then raise the first failure (an interrupt
    during one step does not skip the others either)."""
    first: BaseException | None = None
    for step in steps:
        try:
            step()
        except BaseException as err:
            if first is None:
                first = err
    if first is not None:
        raise first


@contextlib.contextmanager
def quiet_stderr():
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


def force_stop(tp) -> None:
    """Stop torch's profiler ``tp``; if torch's own stop fails before turning it off, turn
    it off anyway (its results are then lost), so no later capture finds it running."""
    try:
        with quiet_stderr():
            tp.__exit__(None, None, None)
    finally:
        if events.profiler_running():
            with contextlib.suppress(Exception), quiet_stderr():
                events.force_off()
        elif events.running_profiler() is not None:  # stopped, but torch's flag left set
            events.clear_running_flag()


def cell_namer():
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


def _drop_burner(memory: list, ptr: int | None, code_start_ns: int | None) -> None:
    """Remove the free of the start's warning burner from ``memory``, if torch recorded it.

    torch's CPU allocator remembers the size of every block allocated while memory is being
    profiled, and forgets it only when the block is freed while memory is being profiled.
    A block made in one capture and freed outside any leaves a stale entry behind; when a
    later block that happens to get the same address is freed inside a capture, torch
    reports that free, with the stale size. The burner is such a block whenever it lands on
    a stale address, and its free is our work, not the user's. Memory records are in time
    order, so only those before the user's code are looked at.
    """
    if ptr is None or code_start_ns is None:
        return
    for i, m in enumerate(memory):
        if m.time_ns >= code_start_ns:
            return
        if m.ptr == ptr and m.size < 0 and m.device == "cpu":
            del memory[i]
            return


def cuda_totals(devices: list[str]) -> dict[str, DeviceTotals]:
    """The allocator's and the driver's counters of every CUDA device in ``devices`` that
    this process already uses. Never initialises CUDA, nor makes a context on a device that
    has none (that alone would take hundreds of MB there)."""
    if not any(d.startswith("cuda") for d in devices):
        return {}
    try:
        if not torch.cuda.is_initialized():
            return {}
        current = torch.cuda.current_device()
    except Exception:
        return {}
    out: dict[str, DeviceTotals] = {}
    for name in devices:
        if not name.startswith("cuda"):
            continue
        try:
            dev = torch.device(name)
            reserved = torch.cuda.memory_reserved(dev)
            if reserved == 0 and dev.index != current:
                continue  # no memory of ours there: possibly no context either
            free, total = torch.cuda.mem_get_info(dev)
            out[name] = DeviceTotals(torch.cuda.memory_allocated(dev), reserved, free, total)
        except Exception:  # a device that went away, a driver error: no totals for it
            continue
    return out


class _FreeWatch:
    """Weak references on the storages the session names at the start: when one is freed
    during the capture, its time is noted (torch does not report the free of a CPU block
    allocated before the profiler started). Each storage is watched once; :meth:`close`
    drops every reference, so frees after the capture are not noted."""

    def __init__(self) -> None:
        self._refs: dict[tuple[str, int], weakref.ref] = {}
        self.frees: list[WatchedFree] = []

    def __call__(self, tensor: torch.Tensor, storage: tuple[str, int, int]) -> None:
        key = (storage[0], storage[1])
        if key in self._refs:
            return
        try:
            st = tensor.untyped_storage()
            frees = self.frees

            def gone(_ref, key=key) -> None:
                frees.append(WatchedFree(key[0], key[1], time.time_ns()))

            self._refs[key] = weakref.ref(st, gone)
        except (TypeError, RuntimeError, NotImplementedError):  # no storage to watch
            pass

    def close(self) -> list[WatchedFree]:
        self._refs.clear()
        return list(self.frees)


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


def _check_no_torch_profiler() -> None:
    """Refuse to start while a torch profiler runs anywhere in the process (one line)."""
    where = events.running_profiler()
    if where == "in this thread":
        raise CaptureError(
            "a torch profiler is already running: finish its `with` block (or call "
            "its stop()) before profiling memory here"
        )
    if where is not None:
        raise CaptureError(
            "a torch profiler is already running in another thread: torch runs one profiler "
            "per process (a second one crashes it); profile memory after that one has stopped"
        )


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
        self._burner_ptr: int | None = None
        self._claim: Claim | None = None
        self._running = False
        self._watch: _FreeWatch | None = None
        self.totals_start: dict[str, DeviceTotals] = {}
        self.totals_end: dict[str, DeviceTotals] = {}
        self.watched_frees: list[WatchedFree] = []
        self.unnamed: list[UnnamedStorage] = []
        self._guard: profiler_guard.Guard | None = None

    def start(self) -> None:
        """Start torch's profiler and the hooks. Exception safe: when anything fails (or an
        interrupt lands) after the profiler started, everything started is undone again."""
        if self._running:
            raise CaptureError("this recorder is already running")
        SLOT.claim("capture", owner=self, abandon=self._abandon)
        LATER.free()  # an earlier capture's raw result: not inside this one
        try:
            events.prepare()
            _check_no_torch_profiler()
            # from here on, torch's profiler starts only as the capture's own
            self._guard = profiler_guard.Guard(threading.current_thread())
            self._watch = _FreeWatch()
            self.start_rows = self._start_names()
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
            self._burner_ptr = burner.data_ptr()
            # the baseline on CUDA: read just before the profiler records
            self.totals_start = cuda_totals(self.devices)
            self._torch_profiler = tp  # before it starts: a failed start is stopped again
            with quiet_stderr(), self._guard.starting():
                tp.__enter__()
                # torch warns once per process, on file descriptor 2, when a block allocated
                # before the capture is freed inside it. Spend that warning here, silently.
                # (Its free can still be recorded: see _drop_burner.)
                del burner
            # with stacks, torch's Python tracer records module calls (see read_trace)
            self.hooks = ModuleHooks(modules=not self.with_stack)  # a partial install is undone
            self.hooks.install()
            self._running = True
        except BaseException:
            try:
                self._undo()
            finally:
                self._torch_profiler, self.hooks, self._watch = None, None, None
                self._release_slot()
            raise
        # time zero: the user's code starts now, with the profiler already running (the
        # events' clock is the Unix clock in ns)
        self.start_ns = time.time_ns()

    def _abandon(self) -> None:
        """Undo what this capture left behind when its thread ended without finishing it
        (called by the slot, from another thread): its global hooks, and torch's profiler
        state (see ``settle_after_lost_thread``)."""
        self._running = False

        def remove_hooks() -> None:
            if self.hooks is not None:
                self.hooks.remove()

        def settle_profiler() -> None:
            if self._torch_profiler is not None:
                with quiet_stderr():
                    events.settle_after_lost_thread()

        def drop_watch() -> None:
            watch, self._watch = self._watch, None
            if watch is not None:
                watch.close()

        _run_all(self._lift, remove_hooks, settle_profiler, drop_watch)

    def _undo(self) -> None:
        """Remove the hooks and stop the profiler if this start got that far."""
        hooks, tp = self.hooks, self._torch_profiler

        def remove_hooks() -> None:
            if hooks is not None:
                hooks.remove()

        def stop_profiler() -> None:
            if tp is not None and events.profiler_running():  # it was off before start
                force_stop(tp)

        _run_all(remove_hooks, stop_profiler, self._lift)

    def _start_names(self) -> list:
        """The session's names at the start: its variables' tensors (watched for frees)
        and the tensors their autograd graphs saved (held only by those graphs); and on the
        CPU the storages no name reaches (:attr:`unnamed`, watched too: CUDA's allocator
        counts those itself)."""
        namespace = self._namespace()
        names = SessionNames(namespace)
        rows = names.rows("start", watch=self._watch)
        named = {(r.device, r.ptr) for r in rows}
        rows += [
            r for r in held_rows(names, namespace, when="start") if (r.device, r.ptr) not in named
        ]
        if "cpu" in self.devices and unnamed.ENABLED:
            named = {(r.device, r.ptr) for r in rows}
            self.unnamed = unnamed.unnamed_storages(named, watch=self._watch).storages
        return rows

    def stop(self) -> None:
        """Always stops the profiler and removes every hook, whatever happened before (each
        step runs even when another fails; the first failure is raised afterwards), and
        frees the capture slot. Stopping a recorder that is not running does nothing."""

        def remove_hooks() -> None:
            if self.hooks is not None:
                self.hooks.remove()

        def stop_profiler() -> None:
            if self._torch_profiler is None:
                return
            t = time.perf_counter()
            try:
                force_stop(self._torch_profiler)
            finally:
                self.stop_s = time.perf_counter() - t

        def read_end() -> None:
            watch, self._watch = self._watch, None
            if watch is not None:
                self.watched_frees = watch.close()
            self.totals_end = cuda_totals(self.devices)

        if not self._running:
            return
        self._running = False
        try:
            _run_all(remove_hooks, stop_profiler, self._lift, read_end)
        finally:
            self._release_slot()

    def _lift(self) -> None:
        """Let torch's profiler start anywhere again (once the capture's has stopped)."""
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.lift()

    def _release_slot(self) -> None:
        claim, self._claim = self._claim, None
        if claim is not None:
            claim.release()

    @property
    def kineto_results(self):
        return self._torch_profiler.profiler.kineto_results

    def capture(
        self, progress: Callable[[float], object] | None = None, *, held: bool = True
    ) -> Capture:
        """Read torch's events into records: the producer's whole output. ``progress``
        gets the fraction read now and then (see ``read_trace``); ``held=False`` leaves out
        the tensors the session's graphs and containers hold (a long run's inner windows)."""
        results = self.kineto_results
        trace = events.read_trace(
            results,
            events.FrameNamer(cell_namer()),
            tracer_modules=self.with_stack,
            progress=progress,
        )
        _drop_burner(trace.memory, self._burner_ptr, self.start_ns)
        namespace = self._namespace()
        hooks = self.hooks
        if self.with_stack:  # modules from the Python tracer: (id, class) pairs
            classes = [cls for _, cls in trace.module_calls]
            found = modules_by_id(trace.module_calls, namespace)  # None: gone
        else:
            found = hooks.modules if hooks is not None else []
            classes = [type(m).__name__ for m in found]
        names = SessionNames(
            namespace,
            [m for m in found if m is not None],
            hooks.optimizers if hooks is not None else [],
        )
        return Capture(
            trace=trace,
            names=[
                *self.start_rows,
                *names.rows("end"),
                *(held_rows(names, namespace) if held else ()),
            ],
            module_paths=[
                names.module_path(m) if m is not None else cls for m, cls in zip(found, classes)
            ],
            module_classes=classes,
            devices=list(self.devices),
            start_ns=_time_zero(self.start_ns, trace, events.trace_start_ns(results)),
            totals_start=dict(self.totals_start),
            totals_end=dict(self.totals_end),
            watched_frees=list(self.watched_frees),
            unnamed=list(self.unnamed),
        )

    def release(self, now: bool = False) -> None:
        """Let go of torch's raw result (it can be large): freed now, or after the cell when
        a shell frees results then (:data:`LATER`), unless ``now``."""
        tp, self._torch_profiler = self._torch_profiler, None
        if tp is None:
            return
        raw, tp.profiler = tp.profiler, None
        if raw is not None and not now and LATER.hand_over(raw):
            return
        del raw
