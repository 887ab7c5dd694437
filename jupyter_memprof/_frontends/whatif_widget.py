"""A notebook widget to toggle what_if() changes, live.

``what_if_widget(train_step, model, opt, x, y, checkpoint=["model.blocks.*"],
autocast=torch.bfloat16, batch=2)`` shows one checkbox per change offered; ticking them
estimates the step with the ticked changes together (:mod:`.whatif`) against the step as it
is, and shows the diff of the two peaks. Each combination is estimated once.
"""

from __future__ import annotations

import functools
import html
import sys
from collections.abc import Callable
from typing import Any

from .._errors import EstimateError
from .._results.comparison import Comparison
from .._units import format_bytes
from .estimate import run_estimate
from .frames import caller_names
from .options import EstimateOptions, raised_as
from .whatif import check, describe, passed_objects, prepare_request

__all__ = ["WhatIf", "what_if_widget"]


class WhatIf:
    """Checkboxes, one per change offered, and the estimate with the ticked ones against the
    step as it is. ``.comparison``: the comparison shown (None while nothing is ticked);
    ``.boxes``: the checkboxes by change name; ``.widget``: the ipywidgets box."""

    def __init__(
        self, fn: Callable, args: tuple, options: EstimateOptions, changes: dict, names: dict
    ):
        import ipywidgets as widgets

        device = options.device
        self._fn, self._args, self._device, self._options = fn, args, device, options
        self._names = names
        self._changes = changes
        for key, value in changes.items():  # every change checked alone, before anything runs
            check({key: value}, args, names, device)
        self._profiles: dict[frozenset, Any] = {}
        self.as_is = self._estimate({})
        self.comparison: Comparison | None = None
        self.boxes = {
            key: widgets.Checkbox(value=False, description=describe({key: value}), indent=False)
            for key, value in changes.items()
        }
        self.result = widgets.HTML()
        for box in self.boxes.values():
            box.observe(self._update, names="value")
        self.widget = widgets.VBox([widgets.VBox(list(self.boxes.values())), self.result])
        self._update()

    def _estimate(self, chosen: dict):
        key = frozenset(chosen)
        hit = self._profiles.get(key)
        if hit is not None:
            return hit
        prepare = None
        if chosen:
            prepare = functools.partial(
                prepare_request, check(chosen, self._args, self._names, self._device)
            )
        name = getattr(self._fn, "__name__", None) or type(self._fn).__name__
        prof = run_estimate(
            self._fn,
            self._args,
            {},
            self._options,
            names=self._names,
            label=f"{name}, {describe(chosen) if chosen else 'as is'}",
            prepare=prepare,
            remember=False,
        )
        self._profiles[key] = prof
        return prof

    def _update(self, _change: Any = None) -> None:
        chosen = {k: self._changes[k] for k, box in self.boxes.items() if box.value}
        if not chosen:
            self.comparison = None
            peak = self.as_is.peak().attrs["peak_bytes"]
            self.result.value = f"<pre>as is: peak {html.escape(format_bytes(peak))}</pre>"
            return
        self.comparison = Comparison(self.as_is, self._estimate(chosen))
        text = self.comparison.diff("category").text()
        self.result.value = f"<pre>{html.escape(text)}</pre>"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def what_if_widget(fn: Callable, *args: Any, device: str | None = None, **changes: Any) -> WhatIf:
    """A notebook widget with one checkbox per change of :func:`jupyter_memprof.what_if`.

    The step is estimated with the ticked changes together (each combination once) and
    compared with the step as it is; the diff updates below the checkboxes.

    Parameters
    ----------
    fn, *args, device, **changes
        As for :func:`jupyter_memprof.what_if`.

    Returns
    -------
    WhatIf
        The widget; ``.comparison`` holds the current comparison.

    Raises
    ------
    EstimateError
        An unknown change or a bad value, before anything runs (the real objects are only
        read).
    """
    with raised_as(EstimateError):
        options = EstimateOptions.from_kwargs(device=device)
    caller = caller_names(sys._getframe(1))
    try:
        held = {id(o) for o in passed_objects(args)}
        names = {k: v for k, v in caller.items() if id(v) in held}
    finally:
        caller.clear()
    return WhatIf(fn, args, options, changes, names)
