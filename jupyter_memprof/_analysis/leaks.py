"""Leaks: blocks every step makes and none frees, in groups.

One analysis for every run: :func:`find` takes the ``steps`` rows, the blocks made during
the run and alive at its end (:data:`BLOCKS`: from a capture's ``allocations``,
:func:`alive_blocks`, or from the blocks a long run carried to its end,
:func:`carried_blocks`) and the ``names`` rows that say what holds them. It looks for the
memory that grows with every iteration: blocks made in one step, still alive when the run
ends, made again step after step. Blocks the live session reached at the end through a
variable (a list, a dict, an autograd graph, a module's hook: ``names`` rows of role
``held``) give each group its holder.

The result is the ``leaks`` table (:data:`.schema.LEAKS`), made once when a run is analysed
and stored with the other tables; :func:`from_meta` reads the rows files saved before it
kept in ``meta["leaks"]``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from . import schema as S
from .schema import Category, Role

#: the blocks :func:`find` looks at: made during the run, alive at its end, each with the
#: callsite that made it (``device`` and ``category`` as plain values)
BLOCKS = ("alloc_id", "device", "size_bytes", "alloc_ns", "category", "callsite")

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


def _callsite(own, op_site) -> str | None:
    """A block's own callsite, else its allocating op's (files saved before blocks had one)."""
    if not pd.isna(own):
        return str(own)
    return None if pd.isna(op_site) else str(op_site)


def alive_blocks(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """:data:`BLOCKS` of one capture: its blocks made during it and alive at its end."""
    a = tables["allocations"]
    alive = a[a["free_ns"].isna().to_numpy() & a["alloc_ns"].notna().to_numpy()]
    ops = tables["ops"]
    callsite = pd.Series(ops["callsite"].to_numpy(), index=ops["op_id"].to_numpy())
    site = callsite.reindex(alive["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1))
    own = alive["callsite"].astype(object).to_numpy()
    return pd.DataFrame(
        {
            "alloc_id": alive["alloc_id"].to_numpy(),
            "device": alive["device"].astype(object).to_numpy(),
            "size_bytes": alive["size_bytes"].to_numpy(),
            "alloc_ns": alive["alloc_ns"].to_numpy(dtype=np.int64),
            "category": alive["category"].astype(object).to_numpy(),
            "callsite": [_callsite(o, v) for o, v in zip(own.tolist(), site.tolist())],
        },
        columns=list(BLOCKS),
    )


def carried_blocks(carried: pd.DataFrame, names: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:data:`BLOCKS` of a long run (the blocks it made and carried to its end,
    :data:`.schema.CARRIED`), and ``names`` (the last window's) with each row's ``alloc_id``
    that of the carried block at its device and address."""
    from .windows import block_keys as keys

    made = carried[carried["alloc_ns"].notna().to_numpy()].reset_index(drop=True)
    blocks = pd.DataFrame(
        {
            "alloc_id": made["alloc_id"].to_numpy(),
            "device": made["device"].astype(object).to_numpy(),
            "size_bytes": made["size_bytes"].to_numpy(),
            "alloc_ns": made["alloc_ns"].to_numpy(dtype=np.int64),
            "category": made["category"].astype(object).to_numpy(),
            "callsite": [_callsite(c, None) for c in made["callsite"].astype(object).tolist()],
        },
        columns=list(BLOCKS),
    )
    by_key = pd.Series(made["alloc_id"].to_numpy(), index=keys(made["device"], made["ptr"]))
    held = names.copy()
    matched = by_key.reindex(keys(held["device"], held["ptr"]))
    held["alloc_id"] = pd.array(matched.to_numpy(), dtype="Int64")
    return blocks, held


def _survivors(blocks: pd.DataFrame, names: pd.DataFrame, ends: np.ndarray) -> pd.DataFrame:
    """The :data:`BLOCKS`, one row each: the step that made them, size, device, category,
    callsite, the held path reaching them (None if none) and the group they belong to
    (``key``)."""
    site = blocks["callsite"].tolist()
    ids = blocks["alloc_id"].to_numpy()
    reached = _holding_paths(_held_names(names), set(ids.tolist()))
    paths = [reached.get(i) for i in ids.tolist()]
    holders = [holder_of(p) if p is not None else None for p in paths]
    device = blocks["device"].tolist()
    category = blocks["category"].tolist()
    return pd.DataFrame(
        {
            "alloc_id": ids,
            "step": _step_of(blocks["alloc_ns"].to_numpy(dtype=np.int64), ends),
            "size": blocks["size_bytes"].to_numpy(),
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


def find(steps: pd.DataFrame, blocks: pd.DataFrame, names: pd.DataFrame) -> pd.DataFrame:
    """Groups of ``blocks`` (:data:`BLOCKS`: made during the run, alive at its end) made
    again in most of its ``steps``: one row per group, largest first (see docs/tables.md).
    A group is the blocks one holder keeps (a variable or module the session reached at
    the end, a ``names`` row), else the blocks of one (device, callsite, category). Empty
    for a single step, and for a loop whose only survivors come from one step (the first
    step's optimizer state, a cache filled once). Optimizer state is never a leak: an
    optimizer keeps a bounded state it replaces (LBFGS fills its history over its first
    steps)."""
    n_steps = steps["step"].nunique()
    if n_steps < 2 or blocks.empty:
        return S.empty(S.LEAKS)
    ends = steps.drop_duplicates("step").sort_values("step")["end_ns"].to_numpy()
    survivors = adopt_unheld(_survivors(blocks, names, ends))
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


def leaks(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The ``leaks`` table of one capture (or window), from its tables: :func:`find` over
    its ``steps``, :func:`alive_blocks` and ``names``."""
    if tables["steps"]["step"].nunique() < 2 or tables["allocations"].empty:
        return S.empty(S.LEAKS)
    return find(tables["steps"], alive_blocks(tables), tables["names"])


def over_run(steps: pd.DataFrame, carried: pd.DataFrame, names: pd.DataFrame) -> pd.DataFrame:
    """The ``leaks`` table of a whole long run: :func:`find` over the ``steps`` of every
    window, the blocks carried to its end and the ``names`` of its last window (the held
    tensors, matched to the carried blocks by device and address)."""
    return find(steps, *carried_blocks(carried, names))


def from_meta(rows: list[dict]) -> pd.DataFrame:
    """The ``leaks`` table from the rows a long run saved before the table existed kept in
    ``meta["leaks"]`` (checked on load: ``meta_schema``'s ``leaks``)."""
    if not rows:
        return S.empty(S.LEAKS)
    df = pd.DataFrame(rows, columns=list(S.LEAKS))
    df["category"] = pd.Categorical(df["category"], dtype=S.CATEGORY_DTYPE)
    return S.conform(df, S.LEAKS, name="leaks")
