"""``profile()``: torch's profiler around a block of code -> Profile.

``with jupyter_memprof.profile() as prof:`` is the whole API. The profiler is always stopped
and the hooks always removed, also when the block raises or is interrupted; the partial
profile is kept and the exception propagates. One capture or estimate runs at a time in a
process (any thread): a second one raises CaptureError. When our own part fails (stopping,
the analysis, Ctrl-C during the analysis), the profile is still registered, its meta says
what failed, and the user's own exception is never replaced.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable

from .._analysis.allocator.config import AllocatorConfig
from .._analysis.pipeline import Progress
from .._errors import CaptureError, MemoryBudgetExceeded
from .._producers.recorder import LATER, Recorder
from .._records import Capture
from .._results.profile import Profile
from . import long_run as _long_run
from .budget import Watchdog
from .finish import FinishOptions, fill, register
from .frames import caller_names
from .interrupts import held as _interrupts_held
from .options import CaptureOptions, raised_as

__all__ = ["CaptureError", "build_tables", "profile", "step"]


def step() -> None:
    """Mark the end of one step of a loop.

    For loops without an optimizer (evaluation, inference): ``prof.steps`` and
    ``prof.leaks()`` split the capture here instead of at each ``optimizer.step()``. It costs
    next to nothing, and does nothing outside a capture or an estimate.

    Examples
    --------
    >>> with jupyter_memprof.profile() as prof:  # doctest: +SKIP
    ...     for x in batches:
    ...         outputs.append(model(x))
    ...         jupyter_memprof.step()
    """
    from .._producers.live import mark_step

    mark_step()


class profile(contextlib.AbstractContextManager):  # lower case: reads like a function
    """Profile the memory of a block of PyTorch code.

    ``with jupyter_memprof.profile() as prof:`` gives a :class:`Profile` that is filled with
    its tables when the block exits (also when it raises: the error is noted in
    ``meta["error"]`` and propagates). The code runs exactly as it would without it.

    Parameters
    ----------
    device : str or list of str, optional
        Which devices' memory to record: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, or a list of
        those. Default: the CPU and every visible CUDA device.
    with_stack : bool, default True
        Record Python stacks (``callsite`` on every op). Off, the capture is cheaper on
        small-op models; modules are recorded either way.
    namespace : dict, optional
        Variables used to name models, optimizers and tensors. Default: the caller's
        globals and locals (the magic passes the notebook's namespace).
    label : str, optional
        The profile's name in summaries and the JupyterLab panel.
    progress : callable, optional
        ``progress(stage, done, total)``, called after the code while torch's profiler
        stops, its events are read and the tables are built.
    allocator : str, optional
        ``PYTORCH_CUDA_ALLOC_CONF`` settings for the model of CUDA's caching allocator that
        gives ``prof.segments`` and the reserved peaks (``"expandable_segments:True"`` shows
        what that setting would change). Default: the environment's.
    steps : int, optional
        A long run: record the loop in windows of this many steps, each analysed as it
        ends, so memory does not grow with the loop. Every step keeps its row in
        ``prof.steps``; ``prof.leaks()`` covers the whole run.
    keep : str or list, optional
        With ``steps``: the steps whose window keeps its full tables (``prof.kept``):
        ``"first"``, ``"peak"``, ``"last"`` (the default: all three) and step numbers.
    snapshot : bool or str or os.PathLike, default False
        CUDA only: also record the caching allocator's own history during the capture
        (``torch.cuda.memory._record_memory_history``); ``prof.snapshot`` then holds its
        snapshot (``torch.cuda.memory._snapshot()``), taken when the block ends, also when
        it raised: after a ``torch.OutOfMemoryError`` it is the moment of the error, and
        ``meta["snapshot_oom"]`` the segment picture of the failed request. A path also
        writes it there as the pickle memory_viz opens (atomically; an existing file is
        replaced only when it is a snapshot; checked before anything runs), and
        ``meta["snapshot_path"]`` names it (a failure to write: ``meta["snapshot_error"]``
        and a warning).
    memory_budget : str, int or False, optional
        A plain capture (no ``steps``) stops the code once the process has grown by more
        than this since the start (``"8GiB"``, bytes), and in any case before the machine's
        available memory falls under a tenth of it (``False``: never), raising
        :class:`~jupyter_memprof._errors.MemoryBudgetExceeded`; the profile keeps what was
        recorded until then (see docs/reliability.md).

    Returns
    -------
    Profile
        From ``with ... as prof`` (or :meth:`start`), filled when the block exits.

    Raises
    ------
    CaptureError
        A bad device or allocator setting, or ``snapshot=True`` on a capture of no CUDA
        device, before anything runs; another capture or
        estimate running in this process, or torch's profiler already running.
    ProfilerBusy
        Raised *inside* the block (where it is started) when the profiled code, or another
        thread, starts torch's profiler while the capture runs.

    Examples
    --------
    >>> with jupyter_memprof.profile(label="step") as prof:  # doctest: +SKIP
    ...     train_step()
    >>> prof.peak_by("category")  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        device: str | Iterable[str] | None = None,
        with_stack: bool = True,
        namespace: dict | None = None,
        label: str | None = None,
        progress: Progress | None = None,
        allocator: str | AllocatorConfig | None = None,
        steps: int | None = None,
        keep: str | Iterable[str | int] | None = None,
        snapshot: bool | str | os.PathLike = False,
        memory_budget: int | str | bool | None = None,
    ) -> None:
        with raised_as(CaptureError):
            options = CaptureOptions.from_kwargs(
                device=device,
                allocator=allocator,
                with_stack=with_stack,
                steps=steps,
                keep=keep,
                snapshot=snapshot,
                memory_budget=memory_budget,
            )
        self._use(options, namespace, label, progress, sys._getframe(1))

    @classmethod
    def from_options(
        cls,
        options: CaptureOptions,
        *,
        namespace: dict | None = None,
        label: str | None = None,
        progress: Progress | None = None,
    ) -> profile:
        """A capture of options checked already (the magic's, read from its line)."""
        capture = cls.__new__(cls)
        capture._use(options, namespace, label, progress, sys._getframe(1))
        return capture

    def _use(self, options: CaptureOptions, namespace, label, progress, caller) -> None:
        self.options = options
        self.devices = list(options.devices)
        self.allocator = options.allocator
        self.with_stack = options.with_stack
        self._snapshot_path = options.snapshot if isinstance(options.snapshot, str) else None
        self._history = None
        if options.snapshot is not False:
            from .._producers.cuda_history import History

            self._history = History()
        #: how the run ends (:func:`.finish.fill`), made once: a long run's windows too
        self._finishing = finish_options(self.allocator, progress)
        self._long = _long_run.plan(options.steps, options.keep, self._finishing)
        self._budget = options.memory_budget
        self._watchdog: Watchdog | None = None
        self.label = label
        self.progress = progress
        self._namespace = namespace
        self._frame = None if namespace is not None else caller
        self._profile: Profile | None = None
        self._recorder: Recorder | None = None
        #: the step of ours that failed in :meth:`finish` (None: none did)
        self.failed_step: str | None = None

    def _names(self) -> dict:
        if self._namespace is not None:
            return self._namespace
        return caller_names(self._frame)

    def __enter__(self) -> Profile:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.finish(exc)
        return False  # never swallow the exception

    def start(self) -> Profile:
        """Start recording; returns the Profile that :meth:`finish` fills."""
        # built before the profiler starts, so its cost stays out of the capture
        self._profile = Profile.empty(label=self.label, devices=self.devices)
        if self._long is None:
            recorder = Recorder(self.devices, self.with_stack, self._names)
        else:
            recorder = self._long.recorder(self.devices, self.with_stack, self._names)
        # the budget's watchdog before the profiler: its start stays out of the capture
        if self._budget is not False:
            self._watchdog = Watchdog(None if self._budget is True else self._budget).start()
        try:
            recorder.start()  # undoes itself when it fails
        except BaseException:
            self._end_watchdog(None)
            raise
        try:
            if self._history is not None:
                self._history.start()
            self._recorder = recorder
            self._t0 = time.perf_counter()
            self._start_ns = time.time_ns()
            if self._watchdog is not None:
                self._watchdog.arm()
        except BaseException:  # an interrupt right after the start: nothing stays on
            self._recorder = None
            if self._history is not None:
                self._history.stop()
            self._end_watchdog(None)
            recorder.stop()
            raise
        return self._profile

    def finish(self, exc: BaseException | None = None) -> Profile:
        """Stop recording and build the tables. ``exc`` is the exception the profiled code
        raised, if any: it is noted in ``meta["error"]``.

        Whatever fails here, the profile is registered in the session with its meta: a
        failure to stop is kept in ``meta["stop_error"]``, an analysis that failed or was
        interrupted (Ctrl-C) in ``meta["analysis_error"]`` (and ``meta["analysis_interrupted"]
        = True`` for an interrupt). Our failure is then raised, but only when the profiled
        code raised nothing: the user's own exception is never replaced. :attr:`failed_step`
        says which step failed (None when none did)."""
        code_end = time.perf_counter()
        self._end_watchdog(exc)
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            raise CaptureError("this capture is not running (not started, or finished)")
        t_finish = code_end
        wall_s = t_finish - self._t0
        prof = self._profile
        if self._history is not None:  # first: at an out-of-memory error, that moment
            _keep_snapshot(prof, self._history, self._snapshot_path)
        error = _reason(exc) if exc is not None else None
        failure: BaseException | None = None
        try:
            try:
                try:  # torch's stop can take seconds: the bar's clock starts here
                    if self.progress is not None:
                        self.progress("stopping torch's profiler", 0, _STEPS)
                finally:
                    recorder.stop()  # stops everything, even when a step of it raises
            except BaseException as stop_error:
                failure, self.failed_step = stop_error, "stopping the profiler"
                prof.meta["stop_error"] = _reason(stop_error)
            if isinstance(failure, (Exception, type(None))):  # not when interrupted stopping
                try:
                    if self._long is None:
                        _fill(prof, recorder, self._finishing)
                    else:  # its windows, then its tail, with the options it was planned with
                        self._long.fill(prof, recorder)
                except BaseException as build_error:  # Ctrl-C included: keep the profile
                    if failure is None:
                        failure, self.failed_step = build_error, "building its memory tables"
                    prof.meta["analysis_error"] = _reason(build_error)
                    if not isinstance(build_error, Exception):
                        prof.meta["analysis_interrupted"] = True
            else:
                prof.meta["analysis_error"] = _reason(failure)
                prof.meta["analysis_interrupted"] = True
                if self._long is not None:  # the windows analysed in the loop stay
                    self._long.fill_interrupted(prof, recorder, failure)
        finally:
            try:
                with _interrupts_held():  # Ctrl-C now waits until the profile is registered
                    self._register(prof, recorder, wall_s, error, t_finish)
            finally:  # an interrupt that came before it was held
                if prof.session_id is None:
                    self._register(prof, recorder, wall_s, error, t_finish)
        if failure is not None and exc is None:
            raise failure
        return prof

    def _end_watchdog(self, exc: BaseException | None) -> None:
        """Stop the memory budget's watchdog (first thing when the code is done); its
        verdict goes to ``meta["memory_budget"]``."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.stop(delivered=isinstance(exc, MemoryBudgetExceeded))
            if self._profile is not None:
                self._profile.meta["memory_budget"] = watchdog.meta()

    def _register(
        self, prof: Profile, recorder: Recorder, wall_s: float, error, t_finish: float
    ) -> None:
        """The profile's meta, and its place in the session (and so in the panel); safe to
        run again. ``finish_s``: the wait after the code, which ``stop_s``, ``capture_s``,
        ``analysis_s`` and ``free_s`` (torch's raw result freed, unless a shell frees it
        after the cell) add up to."""
        self._frame = None
        t = time.perf_counter()
        recorder.release()
        free_s = time.perf_counter() - t
        register(
            prof,
            label=self.label,
            wall_s=wall_s,
            stop_s=recorder.stop_s,
            free_s=free_s,
            finish_s=time.perf_counter() - t_finish,
            devices=self.devices,
            with_stack=self.with_stack,
            error=error,
            captured_at=self._start_ns,
        )


def _keep_snapshot(prof: Profile, history, path: str | None = None) -> None:
    """The allocator's snapshot into ``prof.snapshot``, and its out-of-memory picture into
    ``meta["snapshot_oom"]`` (a failure to take it in ``meta["snapshot_error"]``); written
    to ``path`` when one was given (``meta["snapshot_path"]``; a failure to write it in
    ``meta["snapshot_error"]`` and a warning: the capture is kept)."""
    from .._producers.cuda_history import oom_picture

    prof.snapshot = history.take()
    if history.error:
        prof.meta["snapshot_error"] = history.error
    picture = oom_picture(prof.snapshot)
    if picture is not None:
        prof.meta["snapshot_oom"] = picture
    if path is not None and prof.snapshot is not None:
        from .._results.snapshot_store import write_pickle

        try:
            prof.meta["snapshot_path"] = write_pickle(prof.snapshot, path)
        except (OSError, TypeError) as err:  # a full disk, a file put there meanwhile
            prof.meta["snapshot_error"] = f"not written to {path}: {type(err).__name__}: {err}"
            warnings.warn(f"the snapshot was {prof.meta['snapshot_error']}", stacklevel=3)


def _reason(err: BaseException) -> str:
    """How an exception is noted in meta (the user's, or a failure of ours, whether or not
    the user's code raised too): ``Type: message``, only the type when there is no message.
    An exception whose message cannot be made is noted by its type alone."""
    try:
        message = str(err)
    except Exception:
        message = ""
    return f"{type(err).__name__}: {message}" if message else type(err).__name__


#: one progress bar for all the work after the code, in this many steps: the stop (step 0),
#: reading torch's events (the first :data:`_READING_SHARE` of it, about the share reading
#: takes on long captures), then the analysis stages
_STEPS = 1000
_READING_SHARE = 0.75


def finish_options(
    allocator: AllocatorConfig | None, progress: Progress | None = None
) -> FinishOptions:
    """How a capture ends (:func:`.finish.fill`): the allocator's settings, and reading and
    the analysis stages as ``progress(stage, done, _STEPS)`` on one bar."""
    if progress is None:
        return FinishOptions(allocator=allocator)

    def reading(fraction: float) -> None:
        progress("reading events", int(fraction * _READING_SHARE * _STEPS), _STEPS)

    def analysing(stage: str, done: int, total: int) -> None:
        share = _READING_SHARE + (1 - _READING_SHARE) * done / max(total, 1)
        progress(stage, int(share * _STEPS), _STEPS)

    return FinishOptions(allocator=allocator, reading=reading, analysing=analysing)


def _fill(prof: Profile, recorder: Recorder, options: FinishOptions) -> None:
    """Everything that happens after the profiled code: records, then tables and analysis.
    A capture stopped at its memory budget puts memory before time: torch's raw result
    (about five times what recording grew) is freed as soon as it is read, before the
    analysis, and the records once analysed, not after the cell."""
    over = bool((prof.meta.get("memory_budget") or {}).get("exceeded"))

    def read_then_free(fraction: Callable[[float], None] | None) -> Capture:
        try:
            return recorder.capture(fraction)
        finally:
            recorder.release(now=True)

    capture = fill(prof, read_then_free if over else recorder.capture, options)
    # millions of small records on a long capture: freeing them takes as long as a tenth of
    # the analysis, so in a notebook it waits for the cell's end like torch's raw result
    if not over:
        LATER.hand_over(capture)


def build_tables(
    recorder: Recorder,
    progress: Progress | None = None,
    allocator: AllocatorConfig | None = None,
) -> tuple[dict, dict]:
    """The tables and meta of a stopped recorder (what :meth:`profile.finish` puts in its
    profile), for scripts that drive a :class:`Recorder` themselves."""
    prof = Profile.empty()
    _fill(prof, recorder, finish_options(allocator, progress))
    return prof.tables, prof.meta
