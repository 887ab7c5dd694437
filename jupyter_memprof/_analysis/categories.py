"""Categories: what every block and every tensor version is for, and why we think so.

A pure function of the tables. Rules run from the most certain to the least; the first rule
that decides a block wins, and its name is the ``reason`` column.

1. The live session (the ``names`` table, read from the objects themselves):
   a model's parameters and buffers are ``parameter`` ("module parameter", "module buffer");
   optimizer state is ``optimizer_state`` ("optimizer.state"); a parameter's ``.grad`` is
   ``gradient`` (".grad of a parameter"). These are exact.
2. Autograd's own bookkeeping: the tensor an ``AccumulateGrad`` node stores or adds into is
   a ``gradient`` ("accumulated into .grad"), even when nothing names it.
   Distributed data parallel: a block that a collective reduces across ranks during
   backward (``c10d::allreduce_``, reduce-scatter) is a gradient bucket: DDP's reducer
   copies the gradients into it, all-reduces it and copies it back into ``.grad``
   (``gradient``, "gradient bucket, reduced across ranks in backward").
   Activation checkpointing: forward work replayed inside an autograd node (module calls
   during backward) makes ``activation`` ("recomputed in backward (checkpointing)").
3. Short lives: a block freed inside the data-flow op that allocated it is ``temporary``
   ("freed inside the op that made it"); this covers raw blocks with no tensor identity
   (convolution workspaces). A block made and freed inside ``optimizer.step()`` /
   ``zero_grad()`` is ``temporary`` too ("made and freed inside the optimizer"): foreach
   intermediates, scalar wrappers.
4. The phase that made the block (see ``ops.phase``):
   - forward: ``activation`` ("saved for backward" when a backward op later reads it or it
     is freed during backward, else "created in forward");
   - backward: ``autograd_detail`` ("created in backward"): gradients flowing between autograd
     nodes, masks, buffers of backward kernels;
   - optimizer, still alive at the end: ``optimizer_state`` ("created by the optimizer, kept").
5. Data: a block that existed before the capture, or was made outside the model, and is read
   by the forward pass is ``input`` ("existed before the capture, read by forward", "made
   outside the model, read by forward"). Made outside the model from forward results
   (``out.argmax(-1)``): ``activation`` ("computed from forward results"). Made and freed
   outside the model: ``temporary``. Made outside the model and kept (the next batch, a
   buffer of your own): ``input`` ("made outside the model, kept"), as torch defines inputs:
   data that is not part of the forward-backward-update loop.
6. Otherwise ``unknown`` ("no rule applies").

Versions: an ``input`` written in place by a forward op becomes an ``activation`` from that
version on ("input written in place by forward"); every other version keeps the category of
the tensor. A block's category is the category of its last version.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import schema as S
from .schema import Category, Phase, Role

C = Category

_ROLE_RULES = {
    Role.PARAMETER.value: (C.PARAMETER, "module parameter"),
    Role.BUFFER.value: (C.PARAMETER, "module buffer"),
    Role.OPTIMIZER_STATE.value: (C.OPTIMIZER_STATE, "optimizer.state"),
    Role.GRADIENT.value: (C.GRADIENT, ".grad of a parameter"),
}
_ROLE_PRIORITY = {"parameter": 0, "buffer": 1, "optimizer_state": 2, "gradient": 3, "variable": 4}


def block_names(names: pd.DataFrame) -> pd.DataFrame:
    """One (name, role) per block: model roles beat plain variables; the end of the capture
    beats its start."""
    n = names.dropna(subset=["alloc_id"])
    if n.empty:
        return pd.DataFrame(
            {"name": pd.Series([], dtype=S.STRING), "role": pd.Series([], dtype=object)}
        )
    n = n.assign(
        _p=n["role"].astype(object).map(_ROLE_PRIORITY),
        _w=(n["when"].astype(object) == "end").map({True: 0, False: 1}),
    )
    n = n.sort_values(["alloc_id", "_p", "_w"]).drop_duplicates("alloc_id")
    return n.set_index(n["alloc_id"].astype("int64"))[["name", "role"]].assign(
        role=lambda d: d["role"].astype(object)
    )


def _inside_module(ops: pd.DataFrame) -> np.ndarray:
    """For every op: does it run inside an nn.Module call (a module op among its ancestors)?"""
    n = len(ops)
    inside = ops["kind"].to_numpy(dtype=object) == "module"
    parent = ops["parent_id"].to_numpy(dtype=np.int64, na_value=-1)
    depth = ops["depth"].to_numpy()
    order = np.argsort(depth, kind="stable")
    for level in np.split(order, np.flatnonzero(np.diff(depth[order])) + 1)[1:] if n else []:
        inside[level] |= inside[parent[level]]
    return inside


def categorise(tables: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (allocations, versions) with ``category``, ``reason`` and ``name`` filled."""
    ops, allocs, versions = tables["ops"], tables["allocations"], tables["versions"]
    uses, names = tables["uses"], tables["names"]
    n = len(allocs)
    allocs = allocs.copy()
    versions = versions.copy()
    if n == 0:
        return allocs, versions

    cat = np.full(n, None, dtype=object)
    why = np.full(n, None, dtype=object)

    def decide(mask: np.ndarray, category: Category, reason: str) -> None:
        m = mask & (cat == None)  # noqa: E711 - elementwise
        cat[m] = category.value
        why[m] = reason

    # lookups on ops
    op_phase = ops["phase"].to_numpy(dtype=object)
    op_node = ops["node_id"].to_numpy(dtype=np.int64, na_value=-1)
    op_names = ops["name"].to_numpy(dtype=object)

    def at(arr: np.ndarray, idx: np.ndarray, missing):
        out = np.full(len(idx), missing, dtype=arr.dtype)
        ok = idx >= 0
        out[ok] = arr[idx[ok]]
        return out

    alloc_op = allocs["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    free_op = allocs["free_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    alloc_ns_na = allocs["alloc_ns"].isna().to_numpy()
    free_ns_na = allocs["free_ns"].isna().to_numpy()
    alloc_phase = at(op_phase, alloc_op, Phase.OTHER.value)
    free_phase = at(op_phase, free_op, None)
    alloc_node = at(op_node, alloc_op, -1)
    free_node = at(op_node, free_op, -1)
    alloc_ids = allocs["alloc_id"].to_numpy()

    # 1. the live session
    bn = block_names(names)
    role = pd.Series(bn["role"]).reindex(alloc_ids).to_numpy(dtype=object)
    for r, (category, reason) in _ROLE_RULES.items():
        decide(role == r, category, reason)

    # 2. AccumulateGrad targets: the tensor it writes in place, else the one it stores
    if not uses.empty:
        u_node_name = op_names[uses["op_id"].to_numpy()]
        acc = uses[u_node_name == "torch::autograd::AccumulateGrad"]
        if not acc.empty:
            has_mut = acc.groupby("op_id")["mutated"].transform("any").to_numpy()
            target = (
                acc[(acc["mutated"].to_numpy()) | ~has_mut]["alloc_id"].dropna().astype("int64")
            )
            decide(np.isin(alloc_ids, target.to_numpy()), C.GRADIENT, "accumulated into .grad")

    # gradient buckets: what a collective reduces across ranks during backward
    if not uses.empty:
        u_ops = uses["op_id"].to_numpy()
        u_name = op_names[u_ops].astype(str)
        reduced = (
            np.char.startswith(u_name, "c10d::")
            & (np.char.find(u_name, "reduce") >= 0)
            & (op_phase[u_ops] == Phase.BACKWARD.value)
        )
        bucket = uses["alloc_id"][reduced].dropna().astype("int64").to_numpy()
        decide(
            np.isin(alloc_ids, bucket),
            C.GRADIENT,
            "gradient bucket, reduced across ranks in backward",
        )

    # forward work replayed inside backward (activation checkpointing) makes activations,
    # even though the autograd node that replays it frees them before it returns
    created = ~alloc_ns_na
    recomputed = (
        created & (alloc_phase == Phase.BACKWARD.value) & at(_inside_module(ops), alloc_op, False)
    )
    decide(recomputed, C.ACTIVATION, "recomputed in backward (checkpointing)")

    # 3. short lives
    same_node = (alloc_node >= 0) & (alloc_node == free_node)
    same_op = (alloc_node < 0) & (alloc_op >= 0) & (alloc_op == free_op)
    decide(same_node | same_op, C.TEMPORARY, "freed inside the op that made it")
    in_opt = (alloc_phase == Phase.OPTIMIZER.value) & (free_phase == Phase.OPTIMIZER.value)
    decide(in_opt, C.TEMPORARY, "made and freed inside the optimizer")

    # 4. the phase that made it
    used_in_bwd = np.zeros(n, dtype=bool)
    read_by_fwd = np.zeros(n, dtype=bool)
    if not uses.empty:
        u_phase = op_phase[uses["op_id"].to_numpy()]
        ua = uses["alloc_id"].to_numpy(dtype=np.int64, na_value=-1)
        used_in_bwd[ua[(u_phase == Phase.BACKWARD.value) & (ua >= 0)]] = True
        read_by_fwd[ua[(u_phase == Phase.FORWARD.value) & (ua >= 0)]] = True
    created = ~alloc_ns_na
    fwd = created & (alloc_phase == Phase.FORWARD.value)
    decide(
        fwd & (used_in_bwd | (free_phase == Phase.BACKWARD.value)),
        C.ACTIVATION,
        "saved for backward",
    )
    decide(fwd, C.ACTIVATION, "created in forward")
    decide(
        created & (alloc_phase == Phase.BACKWARD.value), C.AUTOGRAD_DETAIL, "created in backward"
    )
    decide(
        created & (alloc_phase == Phase.OPTIMIZER.value) & free_ns_na,
        C.OPTIMIZER_STATE,
        "created by the optimizer, kept",
    )

    # 5. data
    decide(alloc_ns_na & read_by_fwd, C.INPUT, "existed before the capture, read by forward")
    decide(
        created & (alloc_phase == Phase.OTHER.value) & read_by_fwd,
        C.INPUT,
        "made outside the model, read by forward",
    )
    # outside the model but computed from forward results (`out.argmax(-1)`, a metric)
    from_fwd = np.zeros(n, dtype=bool)
    if not uses.empty:
        fwd_ids = alloc_ids[fwd]
        ua = uses["alloc_id"].to_numpy(dtype=np.int64, na_value=-1)
        reading = np.unique(uses["op_id"].to_numpy()[np.isin(ua, fwd_ids)])
        from_fwd = np.isin(alloc_node, reading) & (alloc_node >= 0)
    decide(
        created & (alloc_phase == Phase.OTHER.value) & from_fwd,
        C.ACTIVATION,
        "computed from forward results",
    )
    decide(
        created & (alloc_phase == Phase.OTHER.value) & ~free_ns_na,
        C.TEMPORARY,
        "made and freed outside the model",
    )
    decide(
        alloc_ns_na & ~free_ns_na & ~np.isin(role, ["variable"]),
        C.UNKNOWN,
        "existed before the capture, freed during it",
    )
    decide(alloc_ns_na, C.INPUT, "existed before the capture")
    decide(created & (alloc_phase == Phase.OTHER.value), C.INPUT, "made outside the model, kept")
    decide(np.ones(n, dtype=bool), C.UNKNOWN, "no rule applies")

    # versions: inputs written in place by forward become activations
    if not versions.empty:
        pos = pd.Series(np.arange(n), index=alloc_ids)
        vpos = pos.reindex(versions["alloc_id"].to_numpy()).to_numpy()
        vcat = cat[vpos].copy()
        vwhy = why[vpos].copy()
        vop = versions["op_id"].to_numpy(dtype=np.int64, na_value=-1)
        vphase = at(op_phase, vop, None)
        later = versions["version"].to_numpy() > 0
        became = later & (vcat == C.INPUT.value) & (vphase == Phase.FORWARD.value)
        # from the first such write on, the tensor holds activations
        if became.any():
            tid = versions["tensor_id"].to_numpy()
            first = (
                pd.Series(np.where(became, versions["version"].to_numpy(), np.iinfo(np.int64).max))
                .groupby(tid)
                .transform("min")
                .to_numpy()
            )
            flip = (versions["version"].to_numpy() >= first) & (vcat == C.INPUT.value)
            vcat[flip] = C.ACTIVATION.value
            vwhy[flip] = "input written in place by forward"
        versions["category"] = pd.Categorical(vcat, dtype=S.CATEGORY_DTYPE)
        versions["reason"] = pd.array(vwhy, dtype=S.STRING)
        last = versions.drop_duplicates("alloc_id", keep="last")
        lpos = pos.reindex(last["alloc_id"].to_numpy()).to_numpy()
        cat[lpos] = last["category"].astype(object).to_numpy()
        why[lpos] = last["reason"].astype(object).to_numpy()

    allocs["category"] = pd.Categorical(cat, dtype=S.CATEGORY_DTYPE)
    allocs["reason"] = pd.array(why, dtype=S.STRING)
    allocs["name"] = pd.array(
        pd.Series(bn["name"]).reindex(alloc_ids).to_numpy(dtype=object), dtype=S.STRING
    )
    return allocs, versions
