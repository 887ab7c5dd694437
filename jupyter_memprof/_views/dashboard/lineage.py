"""The dashboard's lineage columns: each shown block's story.

Rows come from :func:`jupyter_memprof._analysis.lineage.lineage_steps` (what
:meth:`Profile.lineage` lists); this only orders them by block, converts times and op ids
for display, pools their strings, and picks the ops the op tree must keep so that clicking
a shown block can highlight them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..._analysis import lineage as _lineage
from ..._analysis.schema import Phase, Relation
from .columns import Window, codes_in, int_ids
from .data import Allocations, Ops, nearest_shown

# Relations whose op is highlighted in the op tree when a block is clicked: the op that
# created it, and backward ops that used or freed it.
HIGHLIGHT_RELATIONS = (
    Relation.ALLOCATED.value,
    Relation.USED_IN_BACKWARD.value,
    Relation.FREED.value,
)


_PHASES = Phase.values()
_HIGHLIGHT_CODES = [_lineage.RELATIONS.index(r) for r in HIGHLIGHT_RELATIONS]


def lineage_rows(prof, alloc_ids: list[int]) -> _lineage.LineageSteps:
    """The lineages of the shown blocks, from the analysis (what ``prof.lineage`` lists for
    each), as arrays."""
    return _lineage.lineage_steps(prof.tables, list(alloc_ids))


def _step_phases(prof, lin: _lineage.LineageSteps) -> np.ndarray:
    """The phase of each lineage step's op, as a code into ``Phase.values()`` (-1: none)."""
    out = np.full(len(lin), -1, dtype=np.int64)
    has = lin.op_id >= 0
    if has.any():
        out[has] = codes_in(prof.ops["phase"], _PHASES)[lin.op_id[has]]
    return out


def _highlighted(relation: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """Lineage steps (their relation and phase codes) whose op the op tree highlights for a
    clicked block: the op that allocated it, and backward ops that used or freed it."""
    backward = phase == _PHASES.index(Phase.BACKWARD.value)
    allocated = relation == _lineage.RELATIONS.index(Relation.ALLOCATED.value)
    return allocated | (backward & np.isin(relation, _HIGHLIGHT_CODES))


def _block_rows(alloc_ids: list[int], lin: _lineage.LineageSteps) -> np.ndarray:
    """For each lineage step, the row of its block among ``alloc_ids`` (-1: not listed)."""
    ids = np.asarray(alloc_ids, dtype=np.int64)
    if not len(ids):
        return np.full(len(lin), -1, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    at = order[np.searchsorted(ids, lin.alloc_id, sorter=order).clip(0, len(ids) - 1)]
    return np.where(ids[at] == lin.alloc_id, at, -1)


def must_show_ops(prof, sel: Allocations, lin: _lineage.LineageSteps, limit: int) -> set[int]:
    """Ops the op tree must keep so clicking a shown block can highlight them: the creating,
    freeing and backward ops of the largest shown blocks, up to ``limit`` ops."""
    a = sel.table
    ranks = np.arange(len(a), dtype=np.int64)
    rank = [ranks, ranks]
    op_ids = [int_ids(a["alloc_op_id"]), int_ids(a["free_op_id"])]
    if len(lin):
        hl = _highlighted(lin.relation, _step_phases(prof, lin))
        rank.append(_block_rows(a["alloc_id"].to_numpy(dtype=np.int64), lin)[hl])
        op_ids.append(lin.op_id[hl])
    rank, op_ids = np.concatenate(rank), np.concatenate(op_ids)
    ok = (rank >= 0) & (op_ids >= 0)
    ordered = op_ids[ok][np.argsort(rank[ok], kind="stable")]
    return {int(i) for i in pd.unique(ordered)[:limit]}


LINEAGE_STRINGS = ("op_name", "relation", "category", "phase", "module", "callsite")
_OP_STRINGS = {"op_name": "name", "module": "module", "callsite": "callsite"}


class _Pool:
    """One list of unique strings that the lineage columns index into."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def codes(self, texts: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Pool indices of ``texts[codes]`` (-1 where a code is -1 or its text is missing);
        the texts used join the pool in the order they first occur."""
        remap = np.full(len(texts) + 1, -1, dtype=np.int32)  # code -1 picks the last
        used = pd.unique(codes)
        used = used[used >= 0]
        index = self.index
        remap[used] = [
            -1 if t is None else index.setdefault(t, len(index)) for t in texts[used].tolist()
        ]
        return remap[codes]


def _op_texts(prof, column: str, ops: np.ndarray) -> np.ndarray:
    """``prof.ops[column]`` at rows ``ops`` as objects, None where missing."""
    values = np.asarray(prof.ops[column].array.take(ops), dtype=object)
    values[pd.isna(values)] = None
    return values


def lineage_columns(
    prof, lin: _lineage.LineageSteps, alloc_ids: list[int], ops: Ops, win: Window
) -> tuple[dict, list[str], list[int], list[int]]:
    """All shown blocks' lineages as one flat table, plus each block's [start, end) rows.

    Rows come from :func:`jupyter_memprof._analysis.lineage.lineage_steps` (the analysis);
    this only orders them by block (keeping their time order) and converts times and op ids
    for display. Strings are stored as indices into one pool of unique strings (returned
    alongside), and versions as integers (-1 for none), so tens of thousands of rows stay
    compact binary arrays; the page turns the clicked block's rows back into text. ``hl``
    marks the rows whose op the op tree highlights: the op that allocated the block and the
    backward ops that used or freed it.
    """
    n_blocks = len(alloc_ids)
    if not n_blocks or not len(lin):
        cols = {
            k: np.zeros(0, dtype=np.int32) for k in (*LINEAGE_STRINGS, "version", "op_row", "hl")
        }
        cols["t"] = np.zeros(0)
        return cols, [], [0] * n_blocks, [0] * n_blocks
    block = _block_rows(alloc_ids, lin)
    order = np.flatnonzero(block >= 0)
    order = order[np.argsort(block[order], kind="stable")]
    block = block[order]
    op_id = lin.op_id[order]
    relation = lin.relation[order].astype(np.int64)
    phase = _step_phases(prof, lin)[order]
    counts = np.bincount(block, minlength=n_blocks)
    ends = np.cumsum(counts)
    starts = ends - counts
    # float32 ms: µs resolution for captures up to ~15 s, plenty for a table cell
    t = win.ms(lin.time_ns[order])
    t[~lin.has_time[order]] = np.nan
    cols: dict[str, np.ndarray] = {"t": t.astype(np.float32)}
    pool = _Pool()
    shown_ops, at = np.unique(op_id, return_inverse=True)  # -1 (no op) first, if any
    at = at.reshape(-1)
    has_op = shown_ops >= 0
    for k in LINEAGE_STRINGS:
        if k in _OP_STRINGS:
            texts = np.full(len(shown_ops), None, dtype=object)
            texts[has_op] = _op_texts(prof, _OP_STRINGS[k], shown_ops[has_op])
            cols[k] = pool.codes(texts, at)
        elif k == "relation":
            cols[k] = pool.codes(np.array(_lineage.RELATIONS, dtype=object), relation)
        elif k == "category":
            cats = np.array(_lineage.CATEGORIES, dtype=object)
            cols[k] = pool.codes(cats, lin.category[order].astype(np.int64))
        else:
            cols[k] = pool.codes(np.array(_PHASES, dtype=object), phase)
    cols["version"] = lin.version[order]
    op_row = nearest_shown(op_id, prof, ops)
    cols["op_row"] = op_row
    cols["hl"] = ((op_row >= 0) & _highlighted(relation, phase)).astype(np.int32)
    return cols, list(pool.index), starts.tolist(), ends.tolist()
