"""``fit()``: the largest batch that fits, from a few estimates.

``fit(train_step, model, opt, limit="24GiB", device="cuda:0")`` estimates the step
(:mod:`.estimate`) at batch sizes chosen by :func:`search` and returns the largest that
fits, with the table of the sizes tried and their estimated peaks.

What is compared with the limit is what ``estimate(limit=...)`` judges: on a CUDA device
the caching allocator's reserved peak (modelled, ``meta["reserved_peak_bytes"]``) plus the
CUDA context (:func:`jupyter_memprof._analysis.limit.context_bytes`); elsewhere the peak of
allocated bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import pandas as pd

from .._analysis.limit import context_bytes, first_over, reserved_within
from .._devices import is_cuda
from .._errors import EstimateError
from .._results.fit import Fit
from .._results.profile import Profile
from . import session as _session
from .estimate import checked_options, run_estimate
from .frames import caller_names
from .options import EstimateOptions

__all__ = ["Fit", "fit", "fit_with", "search"]

#: Largest batch tried when ``high`` is not given.
MAX_BATCH = 2**31
#: While growing, a step goes at most this many times further than the largest size that
#: fits (small sizes' peaks are mostly fixed costs: their line says little).
GROWTH = 256


def search(
    peak_of: Callable[[int], int],
    limit: int,
    low: int,
    high: int | None,
    fits_of: Callable[[int], bool] | None = None,
) -> int | None:
    """The largest batch in ``[low, high]`` whose ``peak_of(batch)`` is at most ``limit``,
    assuming the peak grows with the batch; None when ``low`` does not fit.

    Memory grows about linearly with the batch, so after ``low`` the sizes tried are where
    the line through the two largest sizes that fit meets the limit (doubling while no line
    rises, at most :data:`GROWTH` times further per step), and once a size that does not fit is known, where the line between the two
    bracketing sizes meets it; a step that does not halve the bracket is followed by a
    halving, so the search ends in a few more estimates than a bisection at worst.

    ``fits_of(batch)`` (after ``peak_of(batch)``) is the judgement, when it is not
    ``peak <= limit``. The answer ``B`` is checked: ``B + 1`` (within ``high``) does not fit;
    where it does (peaks that do not grow with the batch everywhere), the search goes on
    from there.
    """
    peaks: dict[int, int] = {}
    judged: dict[int, bool] = {}

    def fits(b: int) -> bool:
        if b not in judged:
            peaks[b] = peak_of(b)
            judged[b] = peaks[b] <= limit if fits_of is None else bool(fits_of(b))
        return judged[b]

    top = MAX_BATCH if high is None else high
    best = _search(fits, peaks, limit, low, high)
    while best is not None and best < top and fits(best + 1):
        best = _search(fits, peaks, limit, best + 1, high)
    return best


def _search(fits, peaks: dict[int, int], limit: int, low: int, high: int | None) -> int | None:
    """One search from ``low`` (:func:`search`)."""
    top = MAX_BATCH if high is None else high
    if not fits(low):
        return None
    lo, hi = low, None
    if high is not None and high > low:
        if fits(high):
            return high
        hi = high
    crept = False  # the last step grew by less than a sixteenth and still fit
    while hi is None:  # grow: no size over the limit yet
        if lo >= top:
            return lo
        guess = _towards(peaks, lo, limit)
        nxt = guess if guess is not None and guess > lo else 2 * lo
        small = max(1, lo // 16)
        if crept and nxt - lo < small:  # the line is flat near the limit: find a bracket
            nxt = lo + 2 * small
        nxt = min(top, GROWTH * lo, nxt)
        if fits(nxt):
            crept = nxt - lo < small
            lo = nxt
        else:
            hi = nxt
    halve = flat = False
    creeps = 0
    while hi - lo > 1:  # narrow the bracket
        if halve or flat:
            nxt = (lo + hi) // 2
        else:
            slope = (peaks[hi] - peaks[lo]) / (hi - lo)
            nxt = lo + int((limit - peaks[lo]) / slope) if slope > 0 else (lo + hi) // 2
            nxt = min(hi - 1, max(lo + 1, nxt))
        width = hi - lo
        # line steps that twice in a row move an end by less than a sixteenth: the bytes
        # compared are flat near the limit (the allocator's cache given back), the line
        # says little, so the rest is halved
        line = not (halve or flat)
        ok = fits(nxt)
        moved = nxt - lo if ok else hi - nxt
        if ok:
            lo = nxt
        else:
            hi = nxt
        if line:
            creeps = creeps + 1 if moved * 16 < width else 0
            flat = creeps >= 2
        halve = not halve and (hi - lo) * 2 > width
    return lo


def _towards(peaks: dict[int, int], lo: int, limit: int) -> int | None:
    """Where the line through the two largest sizes tried meets ``limit`` (None without a
    rising line)."""
    sizes = sorted(peaks)
    if len(sizes) < 2:
        return None
    a, b = sizes[-2], sizes[-1]
    slope = (peaks[b] - peaks[a]) / (b - a)
    if slope <= 0:
        return None
    return b + int((limit - peaks[b]) / slope)


def fit(
    fn: Callable,
    *args: Any,
    limit: Any = None,
    device: str | None = None,
    low: int = 1,
    high: int | None = None,
    allocator: str | None = None,
    context: Any = None,
    gpu: Any = None,
    world_size: int | None = None,
) -> Fit:
    """The largest batch size for which ``fn(batch, *args)`` fits in ``limit`` on
    ``device``, found by estimates (nothing runs for real).

    Parameters
    ----------
    fn : callable
        The step, called as ``fn(batch, *args)``: its first argument is the batch size,
        and it makes its batch itself.
    *args
        Everything else ``fn`` uses (the model, the optimizer), replaced by fake copies.
    limit : int or str
        The memory limit (``"24GiB"``). On a CUDA device the modelled reserved peak plus
        the CUDA context is compared with it, elsewhere the peak of allocated bytes.
    device : str, optional
        As in :func:`estimate`; default: the device with the highest peak.
    low, high : int, optional
        Bounds of the sizes tried (``high=None``: no bound).
    allocator, context, gpu, world_size : optional
        As in :func:`estimate`, for every estimate (``context`` also in the judgement).

    Returns
    -------
    Fit
        ``.batch`` (None when even ``low`` does not fit), ``.tried`` (batch, peak_bytes,
        fits, in the order estimated) and ``.profile`` (the estimate at ``.batch``).

    Raises
    ------
    EstimateError
        A bad limit, device or bound, before anything runs. An error of ``fn`` propagates.

    Examples
    --------
    >>> def step_at(batch, model, opt):  # doctest: +SKIP
    ...     train_step(model, opt, torch.randn(batch, 512))
    >>> jupyter_memprof.fit(step_at, model, opt, limit="24GiB", device="cuda:0").batch
    """
    options = checked_options(
        "fit()",
        fn,
        device=device,
        limit=limit,
        allocator=allocator,
        context=context,
        gpu=gpu,
        world_size=world_size,
    )
    if options.limit is None:
        raise EstimateError("fit() needs a limit, such as limit='24GiB'")
    return fit_with(options, fn, args, low, high, sys._getframe(1))


def fit_with(
    options: EstimateOptions, fn: Callable, args: tuple, low: int, high: int | None, frame=None
) -> Fit:
    """:func:`fit` with its options checked already (the command line's; a limit given):
    the variables of ``frame`` (None: none) name the fake copies."""
    _check_bounds(low, high)
    probes = _Probes(fn, args, options, caller_names(frame) if frame is not None else {})
    try:
        best = search(probes.peak_of, options.limit, low, high, probes.judged.__getitem__)
    finally:
        probes.names.clear()
    tried = pd.DataFrame(probes.order, columns=["batch", "peak_bytes", "fits"])
    chosen = probes.largest.get(best) if best is not None else None
    if chosen is not None:
        _session.add(chosen)
    return Fit(best, tried, options.limit, options.device, chosen)


class _Probes:
    """The estimates :func:`fit` makes: each batch's peak and verdict, in the order made,
    and the estimate of the largest batch that fits so far."""

    def __init__(self, fn: Callable, args: tuple, options: EstimateOptions, names: dict):
        self.fn, self.args, self.names, self.options = fn, args, names, options
        self.unlimited = dataclasses.replace(options, limit=None)  # judged here instead
        self.largest: dict[int, Profile] = {}
        self.order: list[tuple[int, int, bool]] = []
        self.judged: dict[int, bool] = {}

    def peak_of(self, batch: int) -> int:
        """Estimate the step at ``batch``; the bytes compared with the limit."""
        prof = run_estimate(
            functools.partial(self.fn, batch),
            self.args,
            {},
            self.unlimited,
            names=self.names,
            label=f"{getattr(self.fn, '__name__', 'step')}, batch {batch}",
            remember=False,
        )
        opts = self.options
        fits, peak = judge(prof, opts.limit, opts.device, opts.allocator, opts.context)
        self.judged[batch] = fits
        if fits and all(batch > b for b in self.largest):
            self.largest.clear()
            self.largest[batch] = prof
        self.order.append((batch, peak, fits))
        return peak


def judge(
    prof: Profile, limit: int, device: str | None, allocator=None, context: int | None = None
) -> tuple[bool, int]:
    """Whether the estimate fits ``limit`` as ``estimate(limit=...)`` judges it
    (:func:`jupyter_memprof._analysis.limit.first_over`), and the bytes compared: on a CUDA
    ``device`` the caching allocator replayed within the limit (it gives back its cached
    segments before it fails), its reserved peak plus the CUDA context when it fits, and
    when it does not the reserved peak with nothing limiting it plus the context
    (:func:`footprint`); elsewhere (``device=None``: any device) the peak of live bytes.
    ``context``: the CUDA context's bytes (None: the default)."""
    if device is not None and device not in prof.devices:
        return True, 0
    if device is not None and is_cuda(device):
        within = reserved_within(prof.tables, limit, device, allocator=allocator, context=context)
        if within is None:
            return False, footprint(prof, device, context)
        return True, within
    fits = first_over(prof.tables, limit, device, allocator=allocator, context=context) is None
    return fits, max(int(prof.peak(d).attrs["peak_bytes"]) for d in prof.devices)


def footprint(prof: Profile, device: str | None, context: int | None = None) -> int:
    """The reserved peak plus the CUDA context (``context`` bytes, None: the default) on a
    CUDA ``device`` (default: the device with the highest peak) with nothing limiting the
    cache, else the allocated peak."""
    if device is not None and device not in prof.devices:
        return 0
    point = prof.peak(device).attrs
    dev = point["device"]
    reserved = (prof.meta.get("reserved_peak_bytes") or {}).get(dev)
    if dev is not None and dev.startswith("cuda") and reserved is not None:
        return int(reserved) + context_bytes(dev, context)
    return int(point["peak_bytes"])


def _check_bounds(low: Any, high: Any) -> None:
    if isinstance(low, bool) or not isinstance(low, int) or low < 1:
        raise EstimateError(f"fit(low=...) must be a batch size of at least 1, not {low!r}")
    if high is None:
        return
    if isinstance(high, bool) or not isinstance(high, int) or high < low:
        raise EstimateError(
            f"fit(high=...) must be a batch size of at least low={low}, not {high!r}"
        )
