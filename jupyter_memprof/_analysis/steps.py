"""Steps: a capture of a loop, split into its iterations.

A step ends at each ``optimizer.step()``; where the code marks its steps itself
(:func:`jupyter_memprof.step`, or torch's ``profiler.step()``), the marks decide instead.
:func:`build_steps` gives one row per (step, device) with the live bytes at the step's start
and end and its peak, read from the ``timeline`` table (so they agree with it exactly).

What survives from step to step (``prof.leaks()``) is :mod:`.leaks`, a pass over these rows
and the blocks alive at the end.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._records import PROFILER_STEP_PREFIX, STEP_MARKER
from . import schema as S
from .schema import OpKind

#: the name every ``optimizer.step()`` op starts with (``Optimizer.step#SGD.step``)
_OPTIMIZER_STEP = "Optimizer.step#"


# -- step boundaries ---------------------------------------------------------------------
def _marks(ops: pd.DataFrame) -> np.ndarray:
    """Times where the code marked a step's end: :data:`STEP_MARKER` annotations (their
    end) and torch's ``ProfilerStep#N`` annotations (their start: each one opens a step)."""
    if ops.empty:
        return np.zeros(0, dtype=np.int64)
    # names are read only for the annotations (a few of the ops)
    at = np.flatnonzero((ops["kind"] == OpKind.ANNOTATION.value).to_numpy())
    name = ops["name"].to_numpy()[at]
    ours = at[[n == STEP_MARKER for n in name.tolist()]]
    torch_steps = at[[str(n).startswith(PROFILER_STEP_PREFIX) for n in name.tolist()]]
    return np.sort(
        np.concatenate(
            [ops["end_ns"].to_numpy()[ours], ops["start_ns"].to_numpy()[torch_steps]]
        ).astype(np.int64)
    )


def _optimizer_steps(ops: pd.DataFrame) -> np.ndarray:
    """The ends of the outermost ``optimizer.step()`` calls."""
    if ops.empty:
        return np.zeros(0, dtype=np.int64)
    optimizer = (ops["kind"] == OpKind.OPTIMIZER.value).to_numpy()
    at = np.flatnonzero(optimizer)  # names are read only for the optimizer's ops
    at = at[[str(n).startswith(_OPTIMIZER_STEP) for n in ops["name"].to_numpy()[at].tolist()]]
    parent = ops["parent_id"].to_numpy(dtype=np.int64, na_value=-1)[at]
    pos = pd.Index(ops["op_id"].to_numpy()).get_indexer(parent)
    inside_optimizer = (pos >= 0) & optimizer[np.maximum(pos, 0)]
    return np.sort(ops["end_ns"].to_numpy()[at[~inside_optimizer]].astype(np.int64))


def step_bounds(
    ops: pd.DataFrame,
    events: pd.DataFrame,
    start_ns: int,
    end_ns: int,
    *,
    first: bool = True,
    last: bool = True,
) -> list[tuple[int, int, bool]]:
    """``(start_ns, end_ns, complete)`` of each step, in order: split at the code's step
    marks, else at each ``optimizer.step()``. A step is complete when it ends at a split.
    The stretch before the first split joins the first step when no block was allocated in
    it. The stretch after the last split (the tail: what ran after the last step ended) is a
    row of its own, not complete, when a block was allocated in it, else it joins the last
    step (frees only: ``opt.zero_grad()`` after ``opt.step()``). Without any split the
    whole capture is one step, not complete.

    A window of a long run starts and ends at step ends: ``first=False`` when its start is
    one (the stretch before its first split is a step), ``last=False`` when its last split
    is its end (what follows it is the profiler stopping, part of the last step)."""
    cuts = _marks(ops)
    if not len(cuts):
        cuts = _optimizer_steps(ops)
    cuts = np.unique(cuts[(cuts > start_ns) & (cuts <= end_ns)])
    if not last and len(cuts):
        cuts = cuts[:-1]  # the window's own end
    ends_at_cut = not last or (len(cuts) and cuts[-1] >= end_ns)
    cuts = cuts[cuts < end_ns]
    edges = [start_ns, *cuts.tolist(), end_ns]
    complete = [True] * len(cuts) + [bool(ends_at_cut)]
    if len(edges) > 2:
        created = events["time_ns"].to_numpy()[(events["action"] == "create").to_numpy()]
        # times belong to the step ending at or after them: (edges[k], edges[k + 1]]
        if first and not ((created > edges[0]) & (created <= edges[1])).any():
            edges.pop(1)
            complete.pop(0)
        if last and len(edges) > 2 and not (created > edges[-2]).any():
            edges.pop(-2)  # the last step ends with its frees (``zero_grad()`` after it)
            complete.pop(-1)
    return list(zip(edges[:-1], edges[1:], complete))


# -- the steps table ----------------------------------------------------------------------
class _Live:
    """One device's live bytes over time, from the ``timeline`` rows of that device: the
    total after each row, and each category's bytes after any number of rows."""

    def __init__(self, timeline: pd.DataFrame, device: str) -> None:
        rows = timeline[(timeline["device"] == device).to_numpy()]
        self.times = rows["time_ns"].to_numpy()
        cat = rows["category"].cat.codes.to_numpy()
        value = rows["bytes"].to_numpy().astype(np.int64)
        # each row holds its category's new bytes: the change is the difference to the last
        # row of that category
        order = np.argsort(cat, kind="stable")
        by_cat, by_value = cat[order], value[order]
        before = np.zeros(len(value), dtype=np.int64)
        before[1:] = by_value[:-1]
        before[1:][by_cat[1:] != by_cat[:-1]] = 0
        change = np.empty(len(value), dtype=np.int64)
        change[order] = by_value - before
        #: total live bytes after the first k rows, k = 0..n
        self.total = np.zeros(len(value) + 1, dtype=np.int64)
        np.cumsum(change, out=self.total[1:])
        self._rows = {c: (order[by_cat == c], by_value[by_cat == c]) for c in np.unique(cat)}

    def after(self, t: np.ndarray) -> np.ndarray:
        """How many rows happened at or before each time in ``t``."""
        return np.searchsorted(self.times, t, side="right")

    def categories(self, k: np.ndarray) -> np.ndarray:
        """Bytes of every category (columns: the category codes) after the first ``k`` rows."""
        out = np.zeros((len(k), len(S.CATEGORY_DTYPE.categories)), dtype=np.int64)
        for c, (positions, values) in self._rows.items():
            j = np.searchsorted(positions, k, side="left") - 1  # its last row among them
            out[:, c] = np.where(j >= 0, values[np.maximum(j, 0)], 0)
        return out


def build_steps(
    ops: pd.DataFrame,
    events: pd.DataFrame,
    timeline: pd.DataFrame,
    start_ns: int,
    end_ns: int,
    *,
    first: bool = True,
    last: bool = True,
) -> pd.DataFrame:
    """One row per (step, device): see the module's docstring and docs/tables.md
    (``first``, ``last``: see :func:`step_bounds`)."""
    if timeline.empty:
        return S.empty(S.STEPS)
    end_ns = max(int(end_ns), int(timeline["time_ns"].max()), int(start_ns))
    bounds = step_bounds(ops, events, int(start_ns), end_ns, first=first, last=last)
    starts = np.array([b[0] for b in bounds], dtype=np.int64)
    ends = np.array([b[1] for b in bounds], dtype=np.int64)
    categories = np.asarray(S.CATEGORY_DTYPE.categories, dtype=object)
    out = []
    for device in sorted(timeline["device"].dropna().unique().tolist(), key=str):
        live = _Live(timeline, device)
        total = live.total
        # the state at t is after every row at or before t
        at_start, at_end = live.after(starts), live.after(ends)
        growth = live.categories(at_end) - live.categories(at_start)
        for k in range(len(bounds)):
            top = int(np.argmax(growth[k]))
            grew = int(total[at_end[k]] - total[at_start[k]])
            out.append(
                (
                    k,
                    str(device),
                    int(starts[k]),
                    int(ends[k]),
                    int(total[at_start[k] : at_end[k] + 1].max()),
                    int(total[at_start[k]]),
                    int(total[at_end[k]]),
                    grew,
                    # only a step that grew names what grew: a step that made one block and
                    # freed another of the same size grew by nothing
                    categories[top] if grew > 0 and growth[k, top] > 0 else None,
                    bounds[k][2],
                )
            )
    df = pd.DataFrame(out, columns=list(S.STEPS))
    df["growth_category"] = pd.Categorical(df["growth_category"], dtype=S.CATEGORY_DTYPE)
    return S.conform(df, S.STEPS, name="steps")


def step_boundaries(
    steps: pd.DataFrame, device: str, within: tuple[int | None, int | None] | None = None
) -> np.ndarray:
    """Where one step of the ``steps`` table ends and the next begins on ``device``: the end
    (``end_ns``) of every step but the last, as int64 nanoseconds. ``within=(start, end)``
    keeps those strictly inside (a long run's steps outside the window its tables hold are
    not on its timeline)."""
    ends = steps[(steps["device"].astype(object) == device).to_numpy()]["end_ns"].to_numpy()
    ends = ends[:-1].astype(np.int64)
    if within is not None and within[0] is not None and within[1] is not None:
        ends = ends[(ends > within[0]) & (ends < within[1])]
    return ends
