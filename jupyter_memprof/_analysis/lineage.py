"""Lineage: a block's story, from the op that made it to its free.

One row per step, time ordered: ``preexisting`` or ``allocated`` (the op, its module and
Python line), every ``read`` and in-place ``mutated`` write (each write is a new version),
``saved_for_backward`` (the forward op whose autograd node later used it), ``used_in_backward``
(the backward op that read it), and ``freed``.

:func:`lineage_steps` finds the rows as plain arrays (one pass over the tables, no per-row
pandas work), which the dashboard encodes for the page directly; :func:`all_lineages` and
:func:`lineage` turn them into typed tables for users.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import schema as S
from .schema import Category, Phase, Relation

LINEAGES = {"alloc_id": "int64", **S.LINEAGE}
RELATIONS = Relation.values()  # a relation code is its place here (also the sort order)
CATEGORIES = Category.values()
_NONE = -1  # a missing op, version or category in the arrays of LineageSteps
_PREEXISTING, _ALLOCATED, _READ, _MUTATED, _SAVED, _USED_IN_BACKWARD, _FREED = (
    RELATIONS.index(r.value)
    for r in (
        Relation.PREEXISTING,
        Relation.ALLOCATED,
        Relation.READ,
        Relation.MUTATED,
        Relation.SAVED_FOR_BACKWARD,
        Relation.USED_IN_BACKWARD,
        Relation.FREED,
    )
)


@dataclass
class LineageSteps:
    """Lineage rows as arrays, sorted by block, then time (unknown first), then relation.

    ``time_ns`` is only meaningful where ``has_time``; ``op_id``, ``version`` and
    ``category`` (a code into :data:`CATEGORIES`) are -1 where the step has none;
    ``relation`` is a code into :data:`RELATIONS`."""

    alloc_id: np.ndarray
    time_ns: np.ndarray
    has_time: np.ndarray
    op_id: np.ndarray
    relation: np.ndarray
    version: np.ndarray
    category: np.ndarray

    def __len__(self) -> int:
        return len(self.alloc_id)


def _codes(col: pd.Series, categories: list[str]) -> np.ndarray:
    """Codes of a categorical column in ``categories`` (-1 for NA or anything else)."""
    dtype = col.dtype
    if isinstance(dtype, pd.CategoricalDtype) and list(dtype.categories) == categories:
        return col.cat.codes.to_numpy(dtype=np.int64)
    return np.asarray(
        pd.Categorical(col.astype(object), categories=categories).codes, dtype=np.int64
    )


def _ints(col: pd.Series) -> np.ndarray:
    """A nullable integer column as int64, -1 for NA."""
    return col.to_numpy(dtype=np.int64, na_value=_NONE)


def _lookup(keys: np.ndarray, index: np.ndarray, values: np.ndarray, missing) -> np.ndarray:
    """``values`` at the first position of each of ``keys`` in ``index`` (``missing`` where
    ``index`` lacks it)."""
    out = np.full(len(keys), missing, dtype=values.dtype if len(values) else np.int64)
    if not len(index) or not len(keys):
        return out
    order = np.argsort(index, kind="stable")
    at = np.searchsorted(index, keys, sorter=order).clip(0, len(index) - 1)
    pos = order[at]
    hit = index[pos] == keys
    out[hit] = values[pos[hit]]
    return out


def _flow_roots(ops: pd.DataFrame, flows: pd.DataFrame) -> np.ndarray:
    """For every op, the enclosing op that appears as ``backward_op_id`` in flows, or -1."""
    n = len(ops)
    root = np.full(n, -1, dtype=np.int64)
    if n == 0 or flows.empty:
        return root
    b = flows["backward_op_id"].to_numpy()
    root[b] = b
    parent = ops["parent_id"].to_numpy(dtype=np.int64, na_value=-1)
    depth = ops["depth"].to_numpy()
    order = np.argsort(depth, kind="stable")
    for level in np.split(order, np.flatnonzero(np.diff(depth[order])) + 1)[1:]:
        p = parent[level]
        take = root[level] < 0
        root[level[take]] = root[p[take]]
    return root


def _pair_keys(first: np.ndarray, second: np.ndarray, span: int) -> np.ndarray:
    """One int64 per pair (``0 <= second < span``; ids and spans are far below 2**31)."""
    return first * span + second


def lineage_steps(tables: dict[str, pd.DataFrame], alloc_ids=None) -> LineageSteps:
    """The lineage rows of many blocks at once (all of them by default), as arrays."""
    allocs, uses, versions = (tables[k] for k in ("allocations", "uses", "versions"))
    a_id = allocs["alloc_id"].to_numpy(dtype=np.int64)
    u_id = _ints(uses["alloc_id"])
    if alloc_ids is not None:
        wanted = np.asarray(list(alloc_ids), dtype=np.int64)
        keep_a = np.isin(a_id, wanted)
        keep_u = np.isin(u_id, wanted)
    else:
        keep_a = np.ones(len(a_id), dtype=bool)
        keep_u = u_id != _NONE
    a_id = a_id[keep_a]
    alloc_ns = _ints(allocs["alloc_ns"])[keep_a]
    born = allocs["alloc_ns"].notna().to_numpy()[keep_a]
    free_ns = _ints(allocs["free_ns"])[keep_a]
    freed = allocs["free_ns"].notna().to_numpy()[keep_a]
    a_cat = _codes(allocs["category"], CATEGORIES)[keep_a]
    v_id = versions["alloc_id"].to_numpy(dtype=np.int64)
    v_ver = versions["version"].to_numpy(dtype=np.int64)
    v_cat = _codes(versions["category"], CATEGORIES)

    parts = []
    # made before the capture, or allocated in it (in the category of its first version)
    first_cat = _lookup(a_id, v_id, v_cat, _NONE)
    parts.append(
        (
            a_id,
            alloc_ns,
            born,
            _ints(allocs["alloc_op_id"])[keep_a],
            np.where(born, _ALLOCATED, _PREEXISTING),
            np.where(allocs["tensor_id"].notna().to_numpy()[keep_a], 0, _NONE),
            np.where(first_cat != _NONE, first_cat, a_cat),
        )
    )
    # every read and write of a data-flow op; reads in backward are uses in backward
    parts += _use_steps(tables, u_id[keep_u], keep_u, v_id, v_ver, v_cat)
    # freed (in its last version)
    last = len(v_id) - 1 - np.unique(v_id[::-1], return_index=True)[1]  # last row per block
    last_version = _lookup(a_id[freed], v_id[last], v_ver[last], _NONE)
    parts.append(
        (
            a_id[freed],
            free_ns[freed],
            np.ones(int(freed.sum()), bool),
            _ints(allocs["free_op_id"])[keep_a][freed],
            np.full(int(freed.sum()), _FREED),
            last_version,
            a_cat[freed],
        )
    )
    cols = [np.concatenate([np.asarray(p[k]) for p in parts]) for k in range(7)]
    alloc_id, time_ns, has_time, op_id, relation, version, category = cols
    when = np.where(has_time, time_ns, np.iinfo(np.int64).min)  # unknown times first
    order = np.lexsort((relation, when, alloc_id))
    return LineageSteps(
        alloc_id[order].astype(np.int64),
        time_ns[order].astype(np.int64),
        has_time[order].astype(bool),
        op_id[order].astype(np.int64),
        relation[order].astype(np.int8),
        version[order].astype(np.int64),
        category[order].astype(np.int8),
    )


def _use_steps(tables, u_id, keep_u, v_id, v_ver, v_cat) -> list[tuple]:
    """The lineage parts of the kept ``uses`` rows (``keep_u``; their blocks ``u_id``): every
    read and write of a data-flow op, in the category of the version it made or read (a
    read in backward is a use in backward), and what backward saved of them."""
    if not len(u_id):
        return []
    ops, uses, flows = tables["ops"], tables["uses"], tables["flows"]
    node = uses["op_id"].to_numpy(dtype=np.int64)[keep_u]
    mutated = uses["mutated"].to_numpy(dtype=bool)[keep_u]
    seen = uses["version"].to_numpy(dtype=np.int64)[keep_u]
    version = seen + mutated
    backward = _codes(ops["phase"], Phase.values())[node] == Phase.values().index(
        Phase.BACKWARD.value
    )
    rel = np.where(mutated, _MUTATED, np.where(backward, _USED_IN_BACKWARD, _READ))
    span = int(max(version.max(), v_ver.max(initial=0))) + 1
    cats = _lookup(_pair_keys(u_id, version, span), _pair_keys(v_id, v_ver, span), v_cat, _NONE)
    starts = ops["start_ns"].to_numpy(dtype=np.int64)
    parts = [(u_id, starts[node], np.ones(len(u_id), bool), node, rel, version, cats)]
    bw = rel == _USED_IN_BACKWARD
    if bw.any() and not flows.empty:
        parts.append(_saved_for_backward(ops, flows, tables["allocations"], u_id[bw], node[bw],
                                         seen[bw], cats[bw]))  # fmt: skip
    return parts


def _saved_for_backward(ops, flows, allocs, alloc_id, node, version, cats) -> tuple:
    """The forward op whose autograd node read a block in backward saved it for backward
    (when that op returned); only a block that existed then can have been saved by it, not
    one made later (gradients flowing through backward). One row per (block, forward op)."""
    roots = _flow_roots(ops, flows)[node]
    b_ids = flows["backward_op_id"].to_numpy(dtype=np.int64)
    f_ids = flows["forward_op_id"].to_numpy(dtype=np.int64)
    fwd = _lookup(roots, b_ids, f_ids, _NONE)
    fwd[roots < 0] = _NONE
    ok = fwd != _NONE
    alloc_id, fwd, version, cats = alloc_id[ok], fwd[ok], version[ok], cats[ok]
    t = ops["end_ns"].to_numpy(dtype=np.int64)[fwd]
    all_ids = allocs["alloc_id"].to_numpy(dtype=np.int64)
    born = _lookup(alloc_id, all_ids, _ints(allocs["alloc_ns"]), _NONE)
    had_born = _lookup(alloc_id, all_ids, allocs["alloc_ns"].notna().to_numpy(), False)
    ok = ~had_born | (born <= t)
    alloc_id, fwd, version, cats, t = alloc_id[ok], fwd[ok], version[ok], cats[ok], t[ok]
    _, first = np.unique(_pair_keys(alloc_id, fwd, len(ops)), return_index=True)
    first = np.sort(first)
    n = len(first)
    return (alloc_id[first], t[first], np.ones(n, bool), fwd[first], np.full(n, _SAVED),
            version[first], cats[first])  # fmt: skip


def _nullable(values: np.ndarray, present: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(values.astype(np.int64), ~present)


def _op_strings(ops: pd.DataFrame, column: str, op_id: np.ndarray):
    """``ops[column]`` at each op id as a string array (NA where there is no op), taken from
    the column's own storage: no per-row conversion."""
    col = ops[column]
    if isinstance(col.dtype, pd.CategoricalDtype):
        texts = pd.array(col.cat.categories.astype(object), dtype=S.STRING)
        codes = col.cat.codes.to_numpy(dtype=np.int64)
        at = np.where(op_id >= 0, codes[op_id.clip(0)], -1) if len(codes) else op_id
        return texts.take(at, allow_fill=True)
    arr = col.array if str(col.dtype) == str(S.STRING) else pd.array(col.astype(object), S.STRING)
    return arr.take(op_id, allow_fill=True)


def all_lineages(tables: dict[str, pd.DataFrame], alloc_ids=None) -> pd.DataFrame:
    """Lineage rows for many blocks at once (all of them by default), with ``alloc_id``."""
    steps = lineage_steps(tables, alloc_ids)
    if not len(steps):
        return S.empty(LINEAGES)
    ops = tables["ops"]
    op_id = steps.op_id if len(ops) else np.full(len(steps), _NONE, dtype=np.int64)
    has_op = op_id != _NONE
    phase = np.full(len(steps), -1, dtype=np.int64)
    if len(ops):
        phase[has_op] = _codes(ops["phase"], Phase.values())[op_id[has_op]]
    out = pd.DataFrame(
        {
            "alloc_id": steps.alloc_id,
            "time_ns": _nullable(steps.time_ns, steps.has_time),
            "op_id": _nullable(steps.op_id, steps.op_id != _NONE),
            "op_name": _op_strings(ops, "name", op_id),
            "relation": pd.Categorical.from_codes(steps.relation, dtype=S.RELATION_DTYPE),
            "version": _nullable(steps.version, steps.version != _NONE),
            "category": pd.Categorical.from_codes(steps.category, dtype=S.CATEGORY_DTYPE),
            "phase": pd.Categorical.from_codes(phase, dtype=S.PHASE_DTYPE),
            "module": _op_strings(ops, "module", op_id),
            "callsite": _op_strings(ops, "callsite", op_id),
        }
    )
    return S.conform(_block_callsites(out, tables["allocations"]), LINEAGES, name="lineage")


def _block_callsites(rows: pd.DataFrame, allocations: pd.DataFrame) -> pd.DataFrame:
    """The block's own callsite on its ``allocated`` row where no op gives one (a
    snapshot's blocks: the line comes from the recorded stack, not from an op)."""
    made = (rows["relation"] == Relation.ALLOCATED.value).to_numpy() & rows["callsite"].isna()
    if not made.any():
        return rows
    own = pd.Series(allocations["callsite"].array, index=allocations["alloc_id"].to_numpy())
    site = rows["callsite"].array.copy()
    site[made] = own.reindex(rows["alloc_id"].to_numpy()[made]).array
    return rows.assign(callsite=site)


def check_block(tables: dict[str, pd.DataFrame], alloc_id) -> int:
    """``alloc_id`` as an int when ``allocations`` holds that block; else KeyError (one
    line) naming the valid ids."""
    ids = tables["allocations"]["alloc_id"]
    ok = isinstance(alloc_id, (int, np.integer)) and not isinstance(alloc_id, bool)
    if ok and -(2**63) <= int(alloc_id) < 2**63 and bool((ids == int(alloc_id)).any()):
        return int(alloc_id)
    valid = f"0..{len(ids) - 1}" if len(ids) else "none"
    raise KeyError(f"no block with alloc_id={alloc_id!r} (valid: {valid})")


def lineage(tables: dict[str, pd.DataFrame], alloc_id: int) -> pd.DataFrame:
    alloc_id = check_block(tables, alloc_id)
    out = all_lineages(tables, [alloc_id]).drop(columns="alloc_id")
    return S.conform(out, S.LINEAGE, name="lineage")
