"""Lineage: the story of a block, from the op that made it to the op that freed it.

One row per step, time ordered: ``preexisting`` or ``allocated`` (the op, its module and
Python line), every ``read`` and in-place ``mutated`` write (each write is a new version),
``saved_for_backward`` (the forward op whose autograd node later used it), ``used_in_backward``
(the backward op that read it), and ``freed``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._units import format_bytes, format_time
from . import schema as S
from .schema import Phase, Relation
from .tables import op_context

LINEAGES = {"alloc_id": "int64", **S.LINEAGE}
_ORDER = {r.value: i for i, r in enumerate(Relation)}


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


def all_lineages(tables: dict[str, pd.DataFrame], alloc_ids=None) -> pd.DataFrame:
    """Lineage rows for many blocks at once (all of them by default), with ``alloc_id``."""
    ops, allocs, uses, versions, flows = (
        tables[k] for k in ("ops", "allocations", "uses", "versions", "flows")
    )
    if alloc_ids is not None:
        wanted = np.asarray(list(alloc_ids), dtype=np.int64)
        allocs = allocs[allocs["alloc_id"].isin(wanted)]
        uses = uses[uses["alloc_id"].isin(wanted)]
    parts = []
    pre = allocs["alloc_ns"].isna()
    first_cat = versions.drop_duplicates("alloc_id").set_index("alloc_id")["category"]
    cat0 = first_cat.reindex(allocs["alloc_id"].to_numpy()).astype(object).to_numpy()
    cat0 = np.where(pd.isna(cat0), allocs["category"].astype(object).to_numpy(), cat0)
    has_t = allocs["tensor_id"].notna().to_numpy()
    parts.append(
        pd.DataFrame(
            {
                "alloc_id": allocs["alloc_id"].to_numpy(),
                "time_ns": allocs["alloc_ns"].to_numpy(),
                "op_id": allocs["alloc_op_id"].to_numpy(),
                "relation": np.where(pre, Relation.PREEXISTING.value, Relation.ALLOCATED.value),
                "version": np.where(has_t, 0, None),
                "category": cat0,
            }
        )
    )
    if not uses.empty:
        u = uses.dropna(subset=["alloc_id"])
        node = u["op_id"].to_numpy()
        phase = ops["phase"].astype(object).to_numpy()[node]
        mutated = u["mutated"].to_numpy()
        version = np.where(mutated, u["version"].to_numpy() + 1, u["version"].to_numpy())
        rel = np.where(
            mutated,
            Relation.MUTATED.value,
            np.where(
                phase == Phase.BACKWARD.value, Relation.USED_IN_BACKWARD.value, Relation.READ.value
            ),
        )
        vcat = versions.set_index(["alloc_id", "version"])["category"]
        cats = (
            vcat.reindex(
                pd.MultiIndex.from_arrays([u["alloc_id"].to_numpy(dtype=np.int64), version])
            )
            .astype(object)
            .to_numpy()
        )
        starts = ops["start_ns"].to_numpy()
        parts.append(
            pd.DataFrame(
                {
                    "alloc_id": u["alloc_id"].to_numpy(dtype=np.int64),
                    "time_ns": starts[node],
                    "op_id": node,
                    "relation": rel,
                    "version": version,
                    "category": cats,
                }
            )
        )
        # the forward op whose autograd node read it in backward saved it for backward
        bw = rel == Relation.USED_IN_BACKWARD.value
        if bw.any() and not flows.empty:
            roots = _flow_roots(ops, flows)[node[bw]]
            fwd_of = flows.drop_duplicates("backward_op_id").set_index("backward_op_id")[
                "forward_op_id"
            ]
            fwd = fwd_of.reindex(roots).to_numpy()
            ok = ~pd.isna(fwd)
            if ok.any():
                fwd = fwd[ok].astype(np.int64)
                s = pd.DataFrame(
                    {
                        "alloc_id": u["alloc_id"].to_numpy(dtype=np.int64)[bw][ok],
                        # autograd saves what a node needs when the forward op returns
                        "time_ns": ops["end_ns"].to_numpy()[fwd],
                        "op_id": fwd,
                        "relation": Relation.SAVED_FOR_BACKWARD.value,
                        "version": u["version"].to_numpy()[bw][ok],
                        "category": cats[bw][ok],
                    }
                )
                # only a block that existed when the forward op returned can have been saved
                # by it; blocks made later (gradients flowing through backward) were not
                born = (
                    tables["allocations"]
                    .set_index("alloc_id")["alloc_ns"]
                    .reindex(s["alloc_id"].to_numpy())
                    .to_numpy(dtype=np.int64, na_value=np.iinfo(np.int64).min)
                )
                s = s[born <= s["time_ns"].to_numpy(dtype=np.int64)]
                parts.append(s.drop_duplicates(["alloc_id", "op_id"]))
    freed = allocs[allocs["free_ns"].notna()]
    last = versions.drop_duplicates("alloc_id", keep="last").set_index("alloc_id")["version"]
    parts.append(
        pd.DataFrame(
            {
                "alloc_id": freed["alloc_id"].to_numpy(),
                "time_ns": freed["free_ns"].to_numpy(),
                "op_id": freed["free_op_id"].to_numpy(),
                "relation": Relation.FREED.value,
                "version": last.reindex(freed["alloc_id"].to_numpy()).to_numpy(),
                "category": freed["category"].astype(object).to_numpy(),
            }
        )
    )
    parts = [p for p in parts if len(p)]
    if not parts:
        return S.empty(LINEAGES)
    out = pd.concat(parts, ignore_index=True)
    out = out.astype({"time_ns": "Int64", "op_id": "Int64", "version": "Int64"})
    for col, values in op_context(ops, out["op_id"]).items():
        out[col] = values
    out["_o"] = out["relation"].map(_ORDER)
    out = out.sort_values(["alloc_id", "time_ns", "_o"], na_position="first", kind="stable").drop(
        columns="_o"
    )
    return S.conform(out.reset_index(drop=True), LINEAGES, name="lineage")


def lineage(tables: dict[str, pd.DataFrame], alloc_id: int) -> pd.DataFrame:
    a = tables["allocations"]
    if not (a["alloc_id"] == alloc_id).any():
        raise KeyError(f"no block with alloc_id={alloc_id} (valid: 0..{len(a) - 1})")
    out = all_lineages(tables, [alloc_id]).drop(columns="alloc_id")
    return S.conform(out, S.LINEAGE, name="lineage")


def lineage_text(
    tables: dict[str, pd.DataFrame], alloc_id: int, start_ns: int, *, clock: str | None = None
) -> str:
    """A readable account of one block for a terminal; times in ms since ``start_ns`` (the
    capture's start, :attr:`Profile.start_ns`). ``clock``: an estimate's ``meta["clock"]``,
    whose times count records of the fake run, shown as positions ("record #12"), not ms."""
    a = tables["allocations"].set_index("alloc_id").loc[alloc_id]
    t0 = start_ns
    label = a["name"] if pd.notna(a["name"]) else f"block {alloc_id}"
    head = f"{label}: {format_bytes(int(a['size_bytes']))} on {a['device']}, {a['category']} ({a['reason']})"
    lines = [head]
    for r in lineage(tables, alloc_id).itertuples(index=False):
        if pd.isna(r.time_ns):
            when = "  before capture"
        elif clock:
            when = format_time((r.time_ns - t0) / 1e6, records=True).rjust(14)
        else:
            when = f"{(r.time_ns - t0) / 1e6:9.3f} ms"
        op = r.op_name if isinstance(r.op_name, str) else "-"
        where = " ".join(
            x
            for x in (
                f"[{r.module}]" if isinstance(r.module, str) else "",
                r.callsite if isinstance(r.callsite, str) else "",
            )
            if x
        )
        v = "" if pd.isna(r.version) else f" v{r.version}"
        lines.append(
            f"  {when}  {r.relation:<18} {op}{v} ({r.phase if isinstance(r.phase, str) else '-'}) {where}".rstrip()
        )
    return "\n".join(lines)
