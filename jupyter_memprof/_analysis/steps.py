"""Steps and leaks: a capture of a loop, split into iterations.

A step ends at each ``optimizer.step()``; where the code marks its steps itself
(:func:`jupyter_memprof.step`, or torch's ``profiler.step()``), the marks decide instead.
:func:`build_steps` gives one row per (step, device) with the live bytes at the step's start
and end and its peak, read from the ``timeline`` table (so they agree with it exactly).

:func:`leaks` looks for blocks made in one step that are still alive when the capture ends,
made again step after step: the memory that grows with every iteration. Blocks the live
session reached at the end through a variable (a list, a dict, an autograd graph, a module's
hook: ``names`` rows of role ``held``) give each group its holder.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .._records import PROFILER_STEP_PREFIX, STEP_MARKER
from . import schema as S
from .schema import Category, OpKind, Role

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


# -- leaks --------------------------------------------------------------------------------
#: where a held path stops naming its holder: an index, a key, a graph, a hook
_HOLDER_END = re.compile(r"\[|\.grad_fn|\.<")
_INDEX = re.compile(r"\[(\d+)\]")


def holder_of(path: str) -> str:
    """The variable (or module path) at the root of a held path: ``losses[3]`` ->
    ``losses``, ``model.blocks.3.<forward_hooks 0>.<closure>.out[0]`` -> ``model.blocks.3``,
    ``net.cache['a']`` -> ``net.cache``."""
    m = _HOLDER_END.search(path)
    return path[: m.start()] if m else path


def _why(holder: str | None, paths: list[str], callsite: str | None) -> str:
    """A short sentence saying how the holder keeps each step's blocks."""
    if holder is None:
        where = f"at {callsite}" if callsite else "by the same code"
        return f"made {where} in each step and never freed; no variable reaching them was found"
    graph = [p for p in paths if ".grad_fn" in p]
    if graph:
        via = _INDEX.sub("[i]", graph[0].split(".grad_fn")[0]) + ".grad_fn"
        return f"each step's graph kept alive through `{via}`"
    if any(".<forward_hooks " in p for p in paths):
        return f"a forward hook on `{holder}` keeps each call's output"
    rest = paths[0][len(holder) :] if paths else ""
    if rest.startswith("[") and rest[1:2] in ("'", '"'):
        return f"each step adds an entry to `{holder}`"
    if rest.startswith("["):
        return f"each step adds a tensor to `{holder}`"
    return f"`{holder}` keeps each step's tensors"


def _holding_paths(held: pd.DataFrame, alive: set[int]) -> dict[int, str]:
    """For each block some ``held`` row reaches: the path through the holder that reaches
    the most blocks (a list of every step's losses, rather than the variable holding the
    last one), the first path found (the shortest) among that holder's."""
    paths: dict[int, list[str]] = {}
    for i, path in zip(held["alloc_id"].astype(np.int64).tolist(), held["name"].tolist()):
        if i in alive:
            paths.setdefault(i, []).append(path)
    holder = {p: holder_of(p) for options in paths.values() for p in options}
    reach: dict[str, int] = {}
    for options in paths.values():
        for h in {holder[p] for p in options}:
            reach[h] = reach.get(h, 0) + 1
    best: dict[int, str] = {}
    for i, options in paths.items():
        top = options[0]
        for p in options[1:]:  # the first of the holders reaching most (ties: found first)
            if reach[holder[p]] > reach[holder[top]]:
                top = p
        best[i] = top
    return best


def _step_of(alloc_ns: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The step each time falls in: steps are ``(start, end]``, the first from the start."""
    return np.minimum(np.searchsorted(ends, alloc_ns, side="left"), len(ends) - 1)


def _held_names(names: pd.DataFrame) -> pd.DataFrame:
    """The ``names`` rows that say what holds a block at the end: tensors reached through a
    container, attribute, closure or hook (``losses[3]``), and those an autograd graph keeps
    (role ``held``)."""
    role = names["role"].astype(object).to_numpy()
    name = names["name"].astype(object).to_numpy()
    inside = np.array([isinstance(n, str) and not n.isidentifier() for n in name], dtype=bool)
    end = (names["when"].astype(object) == "end").to_numpy()
    keep = (role == Role.HELD.value) | ((role == Role.VARIABLE.value) & end & inside)
    return names[keep & names["alloc_id"].notna().to_numpy()]


def _survivors(tables: dict[str, pd.DataFrame], ends: np.ndarray) -> pd.DataFrame:
    """The blocks made during the capture and alive at its end, one row each: the step that
    made them, size, device, category, callsite, the held path reaching them (None if
    none) and the group they belong to (``key``)."""
    a = tables["allocations"]
    alive = a[a["free_ns"].isna().to_numpy() & a["alloc_ns"].notna().to_numpy()]
    ops = tables["ops"]
    # the block's own callsite; files saved before blocks had one: its allocating op's
    callsite = pd.Series(ops["callsite"].to_numpy(), index=ops["op_id"].to_numpy())
    site = callsite.reindex(alive["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1))
    own = alive["callsite"].astype(object).to_numpy()
    site = [
        str(o) if not pd.isna(o) else None if pd.isna(v) else str(v)
        for o, v in zip(own.tolist(), site.tolist())
    ]
    held = _held_names(tables["names"])
    ids = alive["alloc_id"].to_numpy()
    reached = _holding_paths(held, set(ids.tolist()))
    paths = [reached.get(i) for i in ids.tolist()]
    holders = [holder_of(p) if p is not None else None for p in paths]
    device = alive["device"].astype(object).tolist()
    category = alive["category"].astype(object).tolist()
    return pd.DataFrame(
        {
            "alloc_id": ids,
            "step": _step_of(alive["alloc_ns"].to_numpy(dtype=np.int64), ends),
            "size": alive["size_bytes"].to_numpy(),
            "device": device,
            "category": category,
            "callsite": site,
            "holder": pd.Series(holders, dtype=object),
            "path": pd.Series(paths, dtype=object),
            # one holder's blocks, else one (callsite, category, device)'s
            "key": [
                ("holder", h, d) if h is not None else ("site", c, cat, d)
                for h, c, cat, d in zip(holders, site, category, device)
            ],
        }
    )


def adopt_unheld(survivors: pd.DataFrame) -> pd.DataFrame:
    """Survivors no held path reaches, made by a line in the same steps as the blocks one
    holder keeps from that line on that device, are given that holder: one object keeps
    them through references the session cannot walk (a gradient-checkpointed forward's RNG
    state lives in a frame that only autograd's C++ saved-tensor hooks reach; one ``del``
    frees both). Only where exactly one holder has blocks from that line and device, and
    in every step the unheld blocks were made."""
    if survivors.empty or survivors["holder"].isna().all() or survivors["holder"].notna().all():
        return survivors
    held = survivors[survivors["holder"].notna()]
    steps_of = {
        (site, dev): (set(g["holder"]), set(g["step"]))
        for (site, dev), g in held.groupby(["callsite", "device"], dropna=True)
    }
    out = survivors.copy()
    for (site, dev), g in survivors[survivors["holder"].isna()].groupby(
        ["callsite", "device"], dropna=True
    ):
        holders, steps = steps_of.get((site, dev), (set(), set()))
        if len(holders) != 1 or not set(g["step"]) <= steps:
            continue
        holder = next(iter(holders))
        out.loc[g.index, "holder"] = holder
        out.loc[g.index, "key"] = pd.Series([("holder", holder, dev)] * len(g), index=g.index)
    return out


def _leak_row(key: tuple, g: pd.DataFrame) -> dict:
    """One row of :func:`leaks` from the survivors of one group."""
    per_step = g.groupby("step")["size"].sum()
    by_site = g.groupby("callsite", dropna=True)["size"].sum()
    callsite = str(by_site.idxmax()) if len(by_site) else None
    holder = key[1] if key[0] == "holder" else None
    return {
        "holder": holder,
        "callsite": callsite,
        "category": str(g.groupby("category")["size"].sum().idxmax()),
        "device": g["device"].iloc[0],
        "bytes_per_step": int(round(float(per_step.median()))),
        "steps": len(per_step),
        "total_bytes": int(g["size"].sum()),
        "alloc_ids": sorted(g["alloc_id"].tolist()),
        "why": _why(holder, [p for p in g["path"] if isinstance(p, str)], callsite),
    }


def leaks(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Groups of blocks made in one step that are alive when the capture ends, made again in
    most steps: one row per group, largest first (see docs/tables.md). A group is the blocks
    one holder keeps (a variable or module the session reached at the end), else the blocks
    of one (device, callsite, category). Empty for a single step, and for a loop whose only
    survivors come from one step (the first step's optimizer state, a cache filled once).
    Optimizer state is never a leak: an optimizer keeps a bounded state it replaces (LBFGS
    fills its history over its first steps)."""
    steps = tables["steps"]
    n_steps = steps["step"].nunique()
    if n_steps < 2 or tables["allocations"].empty:
        return S.empty(S.LEAKS)
    ends = steps.drop_duplicates("step").sort_values("step")["end_ns"].to_numpy()
    survivors = adopt_unheld(_survivors(tables, ends))
    # what an optimizer keeps is bounded by its design (a state per parameter, LBFGS's
    # history_size) and replaced step after step: filling it over the first steps is no leak
    survivors = survivors[(survivors["category"] != Category.OPTIMIZER_STATE.value).to_numpy()]
    rows = [
        _leak_row(key, g)
        for key, g in survivors.groupby("key", sort=False)
        # made in one step (state, a cache filled once), or only now and then: not growth
        if g["step"].nunique() >= max(2, (n_steps - 1) / 2)
    ]
    if not rows:
        return S.empty(S.LEAKS)
    df = pd.DataFrame(rows).sort_values(
        ["total_bytes", "bytes_per_step"], ascending=False, kind="stable"
    )
    df["category"] = pd.Categorical(df["category"], dtype=S.CATEGORY_DTYPE)
    return S.conform(df, S.LEAKS, name="leaks")


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
