"""Progress shown for the work after a capture's code ends.

:func:`progress_for` gives the ``progress(stage, done, total)`` callable that
:func:`jupyter_memprof.profile` calls from the end of the code until the tables are built
(just before torch's profiler stops, now and then while its events are read, after each
analysis stage). In a notebook it is a small ipywidgets progress bar; elsewhere there is
nothing to show it on, so there is no callable.

The bar stays hidden for the first second (:data:`DELAY_S`): most of that work finishes
sooner, and a bar that flashes up and vanishes is noise. It is shown by the first call made
after that second (torch's stop makes no calls: after a long stop, the first call of the
reading shows it), updated in place by later calls, and removed by
:meth:`Progress.close`. A failure to draw it switches it off: progress reporting never
breaks a capture.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Seconds of analysis before the bar appears.
DELAY_S = 1.0


def in_kernel(shell: Any) -> bool:
    """True when ``shell`` runs in a Jupyter kernel (there is a frontend to draw widgets)."""
    return getattr(shell, "kernel", None) is not None


class Progress:
    """A progress bar for ``profile(progress=...)`` that appears only when the work is slow.

    ``clock`` and ``delay`` exist so the timing rule can be checked without waiting.
    """

    def __init__(self, *, delay: float = DELAY_S, clock: Callable[[], float] = time.monotonic):
        self.delay = delay
        self._clock = clock
        self._t0: float | None = None
        self._widget = None
        self._bar = None
        self._text = None
        self._handle = None
        self._broken = False
        self.closed = False

    @property
    def shown(self) -> bool:
        """Whether the bar is on screen now."""
        return self._widget is not None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.closed or self._broken:
            return
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
        try:
            if self._widget is None:
                if now - self._t0 < self.delay:
                    return
                self._build()
                self._update(stage, done, total, now - self._t0)
                self._show()  # drawn with its first values, never as an empty bar
            else:
                self._update(stage, done, total, now - self._t0)
        except Exception:
            # Drawing progress must never break the analysis it reports on.
            self._broken = True
            self._remove()

    def close(self) -> None:
        """Remove the bar (if it was shown); later calls do nothing."""
        self.closed = True
        self._remove()

    # -- drawing -------------------------------------------------------------------------
    def _build(self) -> None:
        import ipywidgets as w

        self._bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, bar_style="info")
        self._text = w.Label(value="")
        self._widget = w.HBox(
            [w.Label(value="analysing memory"), self._bar, self._text],
            layout=w.Layout(align_items="center"),
        )

    def _show(self) -> None:
        from IPython.display import display

        # The widget view alone, with no text form: a front end that cannot draw widgets
        # (a console, a notebook saved without widget state) shows nothing rather than
        # the widget's repr, and the removal below leaves nothing behind either.
        bundle = {"application/vnd.jupyter.widget-view+json": self._widget.get_view_spec()}
        self._handle = display(bundle, raw=True, display_id=True)

    def _update(self, stage: str, done: int, total: int, elapsed: float) -> None:
        fraction = min(max(done / total, 0.0), 1.0) if total > 0 else 0.0
        self._bar.value = fraction
        self._text.value = f"{stage} ({elapsed:.0f} s)"

    def _remove(self) -> None:
        widget, handle = self._widget, self._handle
        self._widget = self._bar = self._text = self._handle = None
        if widget is None:
            return
        try:
            # Replace the output by nothing first, so no "widget closed" stub stays behind
            # in the notebook, then close the widget models.
            if handle is not None:
                handle.update({"text/plain": ""}, raw=True)
        except Exception:
            pass
        for child in getattr(widget, "children", ()):
            try:
                child.close()
            except Exception:
                pass
        try:
            widget.close()
        except Exception:
            pass


def progress_for(shell: Any) -> Progress | None:
    """The progress callable to use under ``shell``: a :class:`Progress` (shown after
    :data:`DELAY_S`) in a notebook kernel, ``None`` in terminals and plain shells, where there
    is nothing to draw it on."""
    if not in_kernel(shell):
        return None
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return None
    return Progress(delay=DELAY_S)
