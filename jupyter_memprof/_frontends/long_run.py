"""Long runs: ``profile(steps=N)`` and ``%%memprofile --steps N``.

A loop of any length is recorded in windows of ``N`` steps
(:class:`~jupyter_memprof._producers.windows.WindowRecorder`). Each window is analysed as
soon as it ends, while the loop waits at that step's end; then only this is kept of it:

- its ``steps`` rows (every step of the run keeps its row in ``prof.steps``);
- the blocks alive at its end (:data:`~jupyter_memprof._analysis.schema.CARRIED`), until a
  later window frees them: from those, the run's ``leaks`` table is what grows over the
  whole run (``prof.leaks()``);
- its full tables, only while it holds a step that matters (``keep``: the first step, the
  one with the highest peak, the last, or step numbers).

So memory follows the window, not the run. The profile's own tables are those of the
window with the highest peak (else the last kept one), its ``steps`` every step of the run,
and ``prof.kept`` maps each kept step to a profile of its window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pandas as pd

from .._analysis import schema as S
from .._analysis import windows as W
from .._analysis.leaks import over_run
from .._producers.recorder import LATER
from .._producers.windows import WindowRecorder
from .._records import Capture
from .._results.profile import Profile
from .._vocab import Vocabulary
from . import interrupts
from .finish import FinishOptions, fill

log = logging.getLogger(__name__)


class KeptStep(Vocabulary):
    """The steps of a long run whose window keeps its full tables."""

    FIRST = "first"
    PEAK = "peak"
    LAST = "last"


#: what a long run keeps when ``keep`` is not given
DEFAULT_KEEP: tuple[str, ...] = (KeptStep.FIRST.value, KeptStep.PEAK.value, KeptStep.LAST.value)


class MissingWhy(Vocabulary):
    """Why a long run has no steps for a window it recorded (``missing_steps``)."""

    INTERRUPTED = "interrupted (Ctrl-C) while its window was analysed"
    NOT_ANALYSED = "not analysed: interrupted (Ctrl-C) before its analysis"


#: what :func:`.finish.fill` notes of the wait after the code: a window analysed inside the
#: loop is no wait (the run's are the tail's, :meth:`LongRun._joined`)
_WAIT_KEYS = ("capture_s", "analysis_s", "event_count")

#: The largest step number (and steps per window) a long run takes.
MAX_STEPS = 10**9


class _Window:
    """One analysed window: its tables and meta, and the run's steps it holds."""

    def __init__(self, tables: dict, meta: dict, first: int, last: int, peak: int) -> None:
        self.tables, self.meta = tables, meta
        self.first, self.last, self.peak = first, last, peak


class LongRun:
    """A long run's state between its windows, and the profile it makes at the end."""

    def __init__(self, steps: int, keep: tuple, options: FinishOptions) -> None:
        self.steps_per_window = steps
        self.keep = keep
        #: how the run ends (:func:`.finish.fill`): each window and the tail, as one part
        self.options = options
        self._steps: list[pd.DataFrame] = []
        self.carried = S.empty(S.CARRIED)
        self._next_step = 0
        self._next_id = 0
        self._windows = 0
        self._peak = -1
        self.kept: dict[str | int, _Window] = {}
        #: events in each window's trace (a run's memory follows the largest)
        self.window_events: list[int] = []
        self.window_errors: list[str] = []
        self._last_meta: dict = {}  # the last window's meta: the wait after the loop
        #: steps whose window was lost: ``{"first", "last", "why"}`` (``meta["long_run"]``)
        self.missing: list[dict] = []
        #: a window's records that an interrupt kept from being analysed in the loop
        self._pending: Capture | None = None
        #: the interrupt that stopped the analysis after the loop (raised again by fill)
        self.interrupt: BaseException | None = None

    def recorder(self, devices, with_stack, namespace) -> WindowRecorder:
        return WindowRecorder(devices, with_stack, namespace, self.steps_per_window, self.add)

    # -- each window ----------------------------------------------------------------------
    def add(self, read: Callable[[], Capture]) -> None:
        """Read and analyse one finished window (called at a step's end, inside the loop),
        the collector paused as for one capture (the records are many small objects). A
        failure of ours is noted in meta and the run goes on: never raised into the user's
        loop. An interrupt (Ctrl-C) is passed on to the loop, and the window's records, once
        read, wait for the end of the run to be analysed (:meth:`build`): nothing recorded
        is lost."""
        held: list[Capture] = []
        windows = self._windows
        try:
            self._analyse(read, held)
        except Exception as err:  # the window is lost, the run and the user's loop go on
            log.warning("analysing a window of a long run failed", exc_info=True)
            self.window_errors.append(f"{type(err).__name__}: {err}")
            self._lose(self.steps_per_window, f"its analysis failed ({type(err).__name__})")
        except BaseException:  # Ctrl-C: the loop stops, what was recorded stays
            if self._windows == windows and held:  # read, not absorbed
                self._pending = held[0]  # (not read: the recorder keeps it, ``unread``)
            raise

    def _analyse(self, read: Callable[[], Capture], held: list | None = None) -> None:
        """Read one window inside the loop and end it as every run ends (:func:`.finish.fill`,
        a part of the run that is not its last), then keep what the run needs of it;
        ``held`` gets the records once read."""

        def produce(_reading) -> Capture:
            capture = read()
            if held is not None:
                held.append(capture)
            return capture

        part = Profile.empty()
        capture = fill(part, produce, self.options.part(self._windows == 0, False))
        meta = {k: v for k, v in part.meta.items() if k not in _WAIT_KEYS}
        self.absorb(part.tables, meta, capture.trace.event_count)

    def _lose(self, steps: int, why: str) -> None:
        """``steps`` steps from the next one are missing (their numbers are kept); none when
        the window ended no step (the stretch after a run's last step is no step)."""
        if steps <= 0:
            return
        first = self._next_step
        self.missing.append({"first": first, "last": first + steps - 1, "why": why})
        self._next_step += steps
        self._windows += 1

    def absorb(self, tables: dict, meta: dict, events: int, *, tail: bool = False) -> None:
        """Keep what the run needs of one analysed window (see the module's docstring).
        ``tail``: the run's last window; when it allocated nothing (the loop ended with the
        window before) it is no step of its own, as the stretch after a capture's last step
        is not: its frees end the last step."""
        if tail and self._windows > 0 and not tables["allocations"]["alloc_ns"].notna().any():
            carried = W.forget_freed(self.carried, tables)
            last = W.fold_tail(self._steps[-1], tables["steps"]) if self._steps else None
            with interrupts.held():
                self.carried, self._last_meta = carried, meta
                if last is not None:
                    self._steps[-1] = last
            return
        # everything computed before anything changes: a failure leaves the run as it was
        offset = W.live_offset(self.carried, tables)
        steps = W.window_steps(tables, self._next_step, offset)
        new = W.survivors(tables, self._next_step, self._next_id, before_run=self._windows == 0)
        carried = W.join([W.forget_freed(self.carried, tables), new], S.CARRIED, "carried")
        next_id = W.next_id_offset(tables, self._next_id)
        if len(steps):
            first, last = int(steps["step"].min()), int(steps["step"].max())
            peak = int(steps["peak_bytes"].max())
        else:
            first = last = self._next_step
            peak = -1
        window = _Window({**tables, "steps": steps}, meta, first, last, peak)
        with interrupts.held():  # all of it or nothing: Ctrl-C waits for the few lines
            self.carried = carried
            self._next_id = next_id
            self._steps.append(steps)
            self._last_meta = meta
            self.window_events.append(int(events))
            self._next_step = last + 1 if len(steps) else self._next_step
            self._keep(window)
            self._windows += 1

    def _keep(self, window: _Window) -> None:
        """Keep the window's full tables for each kept step it holds (and drop the window it
        takes the place of)."""
        for what in self.keep:
            if what == KeptStep.FIRST.value:
                hit = self._windows == 0
            elif what == KeptStep.PEAK.value:
                hit = window.peak > self._peak
            elif what == KeptStep.LAST.value:
                hit = True
            else:
                hit = window.first <= what <= window.last
            if hit:
                self.kept[what] = window
        self._peak = max(self._peak, window.peak)

    # -- the end --------------------------------------------------------------------------
    def build(self, recorder: WindowRecorder) -> tuple[dict, dict]:
        """The run's tables and meta once the recorder has stopped: a window whose analysis
        an interrupt stopped inside the loop, then the last window (if one was recorded),
        analysed and joined to the others. An interrupt (or a failure) while analysing them
        loses only their steps, noted in ``meta["long_run"]["missing_steps"]``; the
        interrupt is kept in :attr:`interrupt` for the caller to pass on."""
        names = S.empty(S.NAMES)
        self.window_errors += recorder.failures
        pending, self._pending = self._pending, None
        if pending is not None:
            self._guarded(lambda: self._analyse(lambda: pending), self.steps_per_window)
        elif recorder.unread is not None:
            self._guarded(lambda: self._analyse(recorder.read_unread), self.steps_per_window)
        if recorder.has_last_window:
            ended = recorder.steps_in_window  # the last window's complete steps
            if self.interrupt is not None:
                self._lose(ended, MissingWhy.NOT_ANALYSED.value)
            else:
                names = self._guarded(lambda: self._last(recorder), ended)
        out: tuple[dict, dict] = ({}, {})
        try:
            with interrupts.held():  # joining what was done: Ctrl-C waits for it
                out = self._joined(S.empty(S.NAMES) if names is None else names)
        except KeyboardInterrupt as err:  # it came while joining: passed on by fill
            self.interrupt = self.interrupt or err
        return out

    def _last(self, recorder: WindowRecorder) -> pd.DataFrame:
        """End the run's last window as every run ends (:func:`.finish.fill`: the last part,
        with progress; its start is a step's end unless it is the only one), into the run;
        returns its names."""
        part = Profile.empty()
        capture = fill(part, recorder.capture, self.options.part(self._windows == 0, True))
        LATER.hand_over(capture)  # freed when the user no longer waits, as a capture's
        tables, meta = part.tables, part.meta
        self.absorb(tables, meta, meta.get("event_count", 0), tail=True)
        return tables["names"]

    def _guarded(self, analyse: Callable[[], Any], steps: int) -> Any:
        """``analyse()``; when it fails or is interrupted, its ``steps`` steps are noted as
        missing (and the interrupt kept), and None is returned."""
        windows = self._windows
        try:
            return analyse()
        except Exception as err:
            log.warning("analysing a window of a long run failed", exc_info=True)
            self.window_errors.append(f"{type(err).__name__}: {err}")
            why = f"its analysis failed ({type(err).__name__})"
        except BaseException as err:  # Ctrl-C: what was done stays, the interrupt is passed on
            self.interrupt = err
            why = MissingWhy.INTERRUPTED.value
        if self._windows == windows:  # not absorbed
            self._lose(steps, why)
        return None

    def _joined(self, names: pd.DataFrame) -> tuple[dict, dict]:
        steps = W.join(self._steps, S.STEPS, "steps")
        main = self._main()
        out_tables = dict(main.tables) if main is not None else {}
        out_tables["steps"] = steps
        out_tables["leaks"] = over_run(steps, self.carried, names)
        out_meta = dict(main.meta) if main is not None else {}
        for key in ("capture_s", "analysis_s", "event_count", "stage_s"):  # the wait
            if key in self._last_meta:
                out_meta[key] = self._last_meta[key]
        complete = int(steps.drop_duplicates("step")["complete"].sum())
        out_meta["long_run"] = self.run_meta(complete)
        return out_tables, out_meta

    def fill(self, prof: Profile, recorder: WindowRecorder) -> None:
        """:meth:`build` into ``prof``: its tables, meta and :attr:`Profile.kept`; then an
        interrupt that stopped the analysis is raised again (the profile keeps what was
        done)."""
        tables, meta = self.build(recorder)
        with interrupts.held():
            prof.set_tables(tables)
            prof.meta.update(meta)
            self.attach(prof)
        interrupt, self.interrupt = self.interrupt, None
        if interrupt is not None:
            raise interrupt

    def fill_interrupted(
        self, prof: Profile, recorder: WindowRecorder, interrupt: BaseException
    ) -> None:
        """:meth:`fill` after an interrupt stopped the recorder's stop: the windows analysed
        so far, the last one noted as missing. Raises nothing (the caller passes the
        interrupt on)."""
        self.interrupt = interrupt
        try:
            self.fill(prof, recorder)
        except BaseException:  # the same interrupt, or another Ctrl-C: the caller raises
            log.debug("a long run's end was interrupted", exc_info=True)

    def _main(self) -> _Window | None:
        """The window whose tables the profile shows: the peak's, else the last kept."""
        if KeptStep.PEAK.value in self.kept:
            return self.kept[KeptStep.PEAK.value]
        return next(reversed(self.kept.values()), None)

    def run_meta(self, n_steps: int) -> dict:
        """``meta["long_run"]`` (see docs/tables.md)."""
        main = self._main()
        return {
            "steps_per_window": self.steps_per_window,
            "windows": self._windows,
            "steps": n_steps,
            "tables_steps": [main.first, main.last] if main is not None else None,
            "kept": {str(k): [w.first, w.last] for k, w in self.kept.items()},
            "window_events_max": max(self.window_events, default=0),
            "carried_blocks": len(self.carried),
            **({"window_errors": list(self.window_errors)} if self.window_errors else {}),
            **({"missing_steps": [dict(m) for m in self.missing]} if self.missing else {}),
        }

    def attach(self, prof: Profile) -> None:
        """``prof.kept``: a profile of each kept step's window (its own steps and tables)."""
        made: dict[int, Profile] = {}
        kept: dict[str | int, Profile] = {}
        for what, window in self.kept.items():
            if id(window) not in made:
                p = Profile(**{k: window.tables[k] for k in S.TABLES}, meta=dict(window.meta))
                p.meta.update(label=f"{prof.label} · steps {window.first}-{window.last}")
                made[id(window)] = p
            kept[what] = made[id(window)]
        prof.kept = kept


def plan(steps: int | None, keep: tuple, options: FinishOptions) -> LongRun | None:
    """The long run of a capture's checked options (``steps`` and ``keep`` of
    :class:`.options.CaptureOptions`), or None for a plain capture. ``options``: how its
    windows and its tail end (:func:`.finish.fill`), given once."""
    return None if steps is None else LongRun(steps, keep, options)
