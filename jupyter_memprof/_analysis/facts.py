"""What the category and module rules read, computed once.

Here: the rules' :class:`Facts`, built once from the tables,
and the small helpers they share. Public within the package; pure functions of arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import schema as S
from .arrays import KIND, OTHER, levels, runs
from .schema import OpKind, Role

__all__ = ["Facts", "Strings", "at", "facts", "inside_module", "named_rows"]

_ROLE_PRIORITY = {"parameter": 0, "buffer": 1, "optimizer_state": 2, "gradient": 3, "variable": 4}


class Strings:
    """Codes for the strings of one column (reasons, module paths): the rules work on codes
    and the column is built once at the end (:func:`schema.taken_strings`)."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self.code: dict[str, int] = {}

    def __call__(self, value: str) -> int:
        c = self.code.get(value)
        if c is None:
            c = self.code[value] = len(self.values)
            self.values.append(value)
        return c

    def codes(self, values) -> np.ndarray:
        """Codes of ``values`` (None or NA: -1)."""
        return np.array([-1 if v is None or v is pd.NA else self(v) for v in values], np.int64)

    def column(self, codes: np.ndarray):
        return S.taken_strings(codes, self.values)


def named_rows(names: pd.DataFrame, alloc_ids: np.ndarray) -> np.ndarray:
    """For each block (by position), the row of ``names`` that names it, or -1: model roles
    beat plain variables; the end of the capture beats its start."""
    out = np.full(len(alloc_ids), -1, dtype=np.int64)
    # tensors only reached through a container or a graph (role "held") name no block
    held = (names["role"].astype(object) == Role.HELD.value).to_numpy()
    rows = np.flatnonzero(names["alloc_id"].notna().to_numpy() & ~held)
    if not len(rows):
        return out
    block = names["alloc_id"].to_numpy(dtype=np.int64, na_value=0)[rows]
    roles = names["role"].astype(object).to_numpy()[rows].tolist()
    priority = np.array([_ROLE_PRIORITY.get(r, len(_ROLE_PRIORITY)) for r in roles], np.int64)
    start = (names["when"].astype(object).to_numpy()[rows] != "end").astype(np.int64)
    order, first = runs((block, priority, start), by=1)
    chosen = order[first]
    pos = pd.Index(alloc_ids).get_indexer(block[chosen])
    ok = pos >= 0
    out[pos[ok]] = rows[chosen[ok]]
    return out


def inside_module(ops: pd.DataFrame) -> np.ndarray:
    """For every op: does it run inside an nn.Module call (a module op among its ancestors)?"""
    n = len(ops)
    inside = ops["kind"].cat.codes.to_numpy() == KIND[OpKind.MODULE.value]
    parent = ops["parent_id"].to_numpy(dtype=np.int64, na_value=-1)
    for level in levels(ops["depth"].to_numpy())[1:] if n else []:
        inside[level] |= inside[parent[level]]
    return inside


def at(arr: np.ndarray, idx: np.ndarray, missing) -> np.ndarray:
    """``arr[idx]``, ``missing`` where ``idx`` is negative."""
    out = np.full(len(idx), missing, dtype=arr.dtype)
    ok = idx >= 0
    out[ok] = arr[idx[ok]]
    return out


@dataclass
class Facts:
    """What the category and module rules read, computed once from the tables: per block
    (by position in ``allocations``) the phase and data-flow node of the ops that made and
    freed it, the row of ``names`` that names it and its role there; per use (row of
    ``uses``) the op, the block and whether the op wrote it."""

    tables: dict[str, pd.DataFrame]
    n: int
    alloc_ids: np.ndarray
    alloc_op: np.ndarray
    free_op: np.ndarray
    before: np.ndarray  # existed before the capture (no alloc_ns)
    kept: np.ndarray  # alive at the end (no free_ns)
    alloc_phase: np.ndarray
    free_phase: np.ndarray
    alloc_node: np.ndarray
    free_node: np.ndarray
    op_phase: np.ndarray
    named: np.ndarray
    role: np.ndarray
    u_ops: np.ndarray
    u_alloc: np.ndarray
    u_mut: np.ndarray
    u_name: np.ndarray
    op_name_list: list

    @property
    def created(self) -> np.ndarray:
        return ~self.before

    def uses_named(self, test) -> np.ndarray:
        """Which uses are by an op whose name passes ``test`` (tested once per name)."""
        wanted = [i for i, nm in enumerate(self.op_name_list) if test(nm)]
        return np.isin(self.u_name, wanted)

    def read_in(self, phase: int) -> np.ndarray:
        """Per block: did an op of ``phase`` read or write it?"""
        out = np.zeros(self.n, dtype=bool)
        if len(self.u_ops):
            hit = (self.op_phase[self.u_ops] == phase) & (self.u_alloc >= 0)
            out[self.u_alloc[hit]] = True
        return out


def facts(tables: dict[str, pd.DataFrame]) -> Facts:
    """The :class:`Facts` of ``tables`` (non-empty ``allocations``)."""
    ops, allocs, uses, names = tables["ops"], tables["allocations"], tables["uses"], tables["names"]
    op_phase = ops["phase"].cat.codes.to_numpy()
    op_node = ops["node_id"].to_numpy(dtype=np.int64, na_value=-1)
    op_names = ops["name"].array
    alloc_op = allocs["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    free_op = allocs["free_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    alloc_ids = allocs["alloc_id"].to_numpy()
    named = named_rows(names, alloc_ids)
    u_ops = uses["op_id"].to_numpy()
    return Facts(
        tables=tables,
        n=len(allocs),
        alloc_ids=alloc_ids,
        alloc_op=alloc_op,
        free_op=free_op,
        before=allocs["alloc_ns"].isna().to_numpy(),
        kept=allocs["free_ns"].isna().to_numpy(),
        alloc_phase=at(op_phase, alloc_op, OTHER),
        free_phase=at(op_phase, free_op, -1),
        alloc_node=at(op_node, alloc_op, -1),
        free_node=at(op_node, free_op, -1),
        op_phase=op_phase,
        named=named,
        role=at(names["role"].cat.codes.to_numpy(), named, -1),
        u_ops=u_ops,
        u_alloc=uses["alloc_id"].to_numpy(dtype=np.int64, na_value=-1),
        u_mut=uses["mutated"].to_numpy(),
        # op names as codes: the rules test a few names, not every row
        u_name=op_names.codes[u_ops],
        op_name_list=op_names.categories.tolist(),
    )
