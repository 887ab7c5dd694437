"""The peak in a few groups: what each is for, what could cut it.

The peak explained: the few groups of blocks that make it up, what each is for, and which
changes could cut it.

A pure function of a profile's tables. The blocks live at the peak (:func:`.peak.peak`) are
grouped by category and module family (numbered modules collapse: ``model.blocks.3`` and
``model.blocks.7`` are both ``model.blocks.*``, see :func:`.diff.family`); the largest groups
get a row each and the rest one row, ``everything else``, so that the ``bytes`` of the rows
add up to the peak exactly. Each row says what that memory is for and lists the
:func:`jupyter_memprof.what_if` changes (:class:`~jupyter_memprof._vocab.Change`) that could
cut it, written as the keywords ``what_if`` takes.
"""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd

from .._units import shown
from .._vocab import Category, Change, Phase
from . import schema as S
from .diff import family
from .peak import peak

#: Groups shown one per row; the rest are summed into one last row.
ROWS = 8
OTHER = "everything else"

#: What each category's memory is for (the category vocabulary of docs/tables.md).
WHAT = {
    Category.PARAMETER: "the model's weights",
    Category.OPTIMIZER_STATE: "the optimizer's running state (momentum, Adam's moments)",
    Category.INPUT: "the batch passed to the step",
    Category.TEMPORARY: "intermediate results freed before the step ends",
    Category.ACTIVATION: "forward outputs saved for the backward pass",
    Category.GRADIENT: "the parameters' gradients",
    Category.AUTOGRAD_DETAIL: "autograd's own buffers",
    Category.UNKNOWN: "blocks no rule could place",
}
#: The optimizer's own temporaries (multi-tensor `foreach` buffers): what a temporary of
#: the optimizer phase is for.
WHAT_OPTIMIZER_TEMPORARY = "the optimizer's temporaries (multi-tensor `foreach` buffers)"

#: How a category's group is worded: "activation saved by model.blocks.*".
_LINK = {
    Category.PARAMETER: "of",
    Category.OPTIMIZER_STATE: "for",
    Category.INPUT: "read by",
    Category.TEMPORARY: "made in",
    Category.ACTIVATION: "saved by",
    Category.GRADIENT: "of",
    Category.AUTOGRAD_DETAIL: "in",
    Category.UNKNOWN: "in",
}

# the what_if() keyword of each change, as a suggestion
_AUTOCAST = f"{Change.AUTOCAST.value}=torch.bfloat16"
_BATCH = f"{Change.BATCH.value}=0.5"
_FOREACH_OFF = f"{Change.OPTIMIZER.value}={{'foreach': False}}"
_LIGHTER = f"{Change.OPTIMIZER.value}=torch.optim.SGD"
_SET_TO_NONE = f"{Change.SET_TO_NONE.value}=True"


def changes_for(category: str, phase: str | None, modules: str | None) -> list[str]:
    """The ``what_if`` keywords that could cut a group of ``category`` allocated in
    ``phase`` inside ``modules`` (None: outside any module)."""
    c = Category(category) if category in Category.values() else Category.UNKNOWN
    if c is Category.ACTIVATION:
        out = [f"{Change.CHECKPOINT.value}=[{modules!r}]"] if _checkpointable(modules) else []
        return [*out, _AUTOCAST, _BATCH]
    if c is Category.TEMPORARY:
        if phase == Phase.OPTIMIZER:
            return [_FOREACH_OFF]
        return [_AUTOCAST, _BATCH]
    if c is Category.OPTIMIZER_STATE:
        return [_LIGHTER]
    if c is Category.GRADIENT:
        return [_SET_TO_NONE]
    if c in (Category.INPUT, Category.AUTOGRAD_DETAIL):
        return [_BATCH]
    return []


def _checkpointable(modules: str | None) -> bool:
    """A module below the top of a tree (``model.blocks.*``, not ``model``) can be
    checkpointed on its own."""
    return bool(modules) and "." in modules


def explain(
    tables: dict[str, pd.DataFrame], device: str | None = None, rows: int = ROWS
) -> pd.DataFrame:
    """The blocks live at the peak of ``device`` (default: the highest peak) in at most
    ``rows`` groups plus ``everything else``, largest first; ``bytes`` adds up to the peak.

    Columns: :data:`.schema.EXPLAIN`. ``.attrs``: ``peak_bytes``, ``peak_ns``, ``device``.
    """
    if isinstance(rows, bool) or not isinstance(rows, numbers.Integral):
        raise TypeError(f"explain(rows=...) takes a whole number of rows, not {shown(rows)}")
    if rows < 1:
        raise ValueError(f"explain(rows={shown(rows)}): show at least 1 row")
    rows = int(rows)
    p = peak(tables, device)
    groups = _groups(p, _node_names(tables["ops"], p))
    top, rest = groups.iloc[:rows], groups.iloc[rows:]
    out = [_row(g) for g in top.itertuples()]
    unexplained = p.attrs["peak_bytes"] - int(p["size_bytes"].sum())
    if len(rest) or unexplained:
        out.append(_other(int(rest["bytes"].sum()) + unexplained, int(rest["blocks"].sum())))
    table = pd.DataFrame(out, columns=list(S.EXPLAIN)) if out else S.empty(S.EXPLAIN)
    total = p.attrs["peak_bytes"]
    table["share"] = table["bytes"] / total if total else 0.0
    table = S.conform(table, S.EXPLAIN, name="explain")
    table.attrs.update(p.attrs)
    return table


def _node_names(ops: pd.DataFrame, p: pd.DataFrame) -> np.ndarray:
    """Per peak block, the name of the outermost op around its allocation (the data-flow
    node, ``aten::linear`` rather than the ``aten::empty`` inside it; ``AddmmBackward0`` for
    the autograd engine's node); the allocating op's own name where there is no node,
    ``""`` where there is no op."""
    own = p["op_name"].astype(object).fillna("").to_numpy()
    if not len(ops):
        return own
    op = p["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    node = ops["node_id"].to_numpy(dtype=np.int64, na_value=-1)
    names = ops["name"].astype(object).to_numpy()
    at = np.where(op >= 0, node[op.clip(0)], -1)
    out = np.where(at >= 0, names[at.clip(0)], own)
    return np.array([str(n).removeprefix(_ENGINE) for n in out], dtype=object)


#: How the autograd engine's events name a node it runs (``... AddmmBackward0``).
_ENGINE = "autograd::engine::evaluate_function: "


def _groups(p: pd.DataFrame, ops: np.ndarray) -> pd.DataFrame:
    """One row per (category, module family): bytes, blocks, and the phase and op
    (``ops``, one per block) that allocated most of the bytes; largest first."""
    fam = [None if pd.isna(m) else family(str(m)) for m in p["module"].astype(object)]
    blocks = pd.DataFrame(
        {
            "category": p["category"].astype(object).fillna(Category.UNKNOWN.value).to_numpy(),
            "modules": pd.Series(fam, dtype=object).fillna("").to_numpy(),
            "phase": p["phase"].astype(object).fillna("").to_numpy(),
            "op": ops,
            "bytes": p["size_bytes"].to_numpy(dtype=np.int64),
        }
    )
    key = ["category", "modules"]
    sums = blocks.groupby(key, sort=False)["bytes"].agg(["sum", "size"])
    sums.columns = ["bytes", "blocks"]
    sums["phase"] = _most(blocks, key, "phase")
    sums["op"] = _most(blocks, key, "op")
    sums = sums.reset_index()
    order = np.lexsort((sums["modules"].to_numpy(), sums["category"].to_numpy(), -sums["bytes"]))
    return sums.iloc[order].reset_index(drop=True)


def _most(blocks: pd.DataFrame, key: list[str], col: str) -> pd.Series:
    """Per group, the value of ``col`` holding most bytes (ties: the first in sort order)."""
    by = blocks.groupby([*key, col], sort=True)["bytes"].sum().reset_index()
    by = by.sort_values([*key, "bytes"], ascending=[True, True, False], kind="stable")
    return by.drop_duplicates(key).set_index(key)[col]


def _row(g) -> dict:
    modules = g.modules or None
    category = Category(g.category)
    phase = g.phase or None
    where = f"{_LINK[category]} {modules}" if modules else "outside any module"
    op = f" (mostly {g.op})" if g.op else ""
    what = WHAT[category]
    if category is Category.TEMPORARY and phase == Phase.OPTIMIZER:
        what = WHAT_OPTIMIZER_TEMPORARY
    return {
        "group": f"{category.value} {where}{op}",
        "category": category.value,
        "modules": modules,
        "phase": phase,
        "top_op": g.op or None,
        "blocks": int(g.blocks),
        "bytes": int(g.bytes),
        "share": 0.0,
        "what": what,
        "changes": ", ".join(changes_for(category.value, phase, modules)) or None,
    }


def _other(nbytes: int, blocks: int) -> dict:
    return {
        "group": OTHER,
        "category": None,
        "modules": None,
        "phase": None,
        "top_op": None,
        "blocks": blocks,
        "bytes": nbytes,
        "share": 0.0,
        "what": "the smaller groups together",
        "changes": None,
    }
