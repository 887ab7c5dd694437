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

Modules: every block also gets the module it belongs to (``module``) and why
(``module_reason``), first rule wins:

1. the module holding it, from the live session: its parameters and buffers ("holds it as a
   parameter", "holds it as a buffer"), their gradients ("holds its parameter (.grad)") and
   the optimizer state of those parameters ("holds its parameter (optimizer state)");
2. the module the allocating op ran in ("allocated inside it"); backward ops count for the
   module of the forward op they differentiate ("allocated by its backward");
3. work of the optimizer: a block made inside ``optimizer.step()`` belongs to the module
   whose block of the same size and device the same op read (``_foreach_sqrt`` of every
   ``exp_avg_sq`` makes one block per parameter, in argument order: the k-th new block of a
   size goes with the k-th block of that size the op read); when no size matches and every
   block the op read belongs to one module, to that module ("optimizer work on its
   parameters");
4. work outside every module on a model's data (the loss on its output, in-place writes
   through views whose backward nodes have no forward op): a data-flow node outside every
   module belongs to the root module (``model``) of the blocks it reads, the one holding
   most of the bytes read when they belong to several; a backward node first takes the
   module its forward node got ("computed outside any module from its blocks");
5. none: data of no module (the batch, your own tensors) and work that reads none of a
   model's blocks.

A parameter held by a notebook variable and by no module is its own owner (its module is
the variable's name), so its gradient, its optimizer state and the work on it count there.
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
    """One (name, role, module) per block: model roles beat plain variables; the end of the
    capture beats its start."""
    n = names.dropna(subset=["alloc_id"])
    if n.empty:
        return pd.DataFrame(
            {
                "name": pd.Series([], dtype=S.STRING),
                "role": pd.Series([], dtype=object),
                "module": pd.Series([], dtype=S.STRING),
            }
        )
    n = n.assign(
        _p=n["role"].astype(object).map(_ROLE_PRIORITY),
        _w=(n["when"].astype(object) == "end").map({True: 0, False: 1}),
    )
    n = n.sort_values(["alloc_id", "_p", "_w"]).drop_duplicates("alloc_id")
    return n.set_index(n["alloc_id"].astype("int64"))[["name", "role", "module"]].assign(
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
    module, module_why = _modules(
        ops, allocs, uses, tables["flows"], bn, role, alloc_phase, alloc_node
    )
    allocs["module"] = pd.array(module, dtype=S.STRING)
    allocs["module_reason"] = pd.array(module_why, dtype=S.STRING)
    return allocs, versions


_OWNER_REASONS = {
    Role.PARAMETER.value: "holds it as a parameter",
    Role.BUFFER.value: "holds it as a buffer",
    Role.GRADIENT.value: "holds its parameter (.grad)",
    Role.OPTIMIZER_STATE.value: "holds its parameter (optimizer state)",
}


def _modules(
    ops: pd.DataFrame,
    allocs: pd.DataFrame,
    uses: pd.DataFrame,
    flows: pd.DataFrame,
    bn: pd.DataFrame,
    role: np.ndarray,
    alloc_phase: np.ndarray,
    alloc_node: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The module each block belongs to, and why (the rules in the module docstring)."""
    n = len(allocs)
    alloc_ids = allocs["alloc_id"].to_numpy()
    module = np.full(n, None, dtype=object)
    why = np.full(n, None, dtype=object)

    # 1. the owner the live session names
    owner = pd.Series(bn["module"].astype(object)).reindex(alloc_ids).to_numpy(dtype=object)
    for r, reason in _OWNER_REASONS.items():
        m = (role == r) & pd.notna(owner)
        module[m] = owner[m]
        why[m] = reason

    # 2. the module the allocating op ran in
    alloc_op = allocs["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    if len(ops):
        op_module = ops["module"].to_numpy(dtype=object, na_value=None)
        m = (module == None) & (alloc_op >= 0)  # noqa: E711 - elementwise
        m[m] = pd.notna(op_module[alloc_op[m]])
        module[m] = op_module[alloc_op[m]]
        bwd = alloc_phase == Phase.BACKWARD.value
        why[m & bwd] = "allocated by its backward"
        why[m & ~bwd] = "allocated inside it"

    unowned = (module == None) & (alloc_node >= 0)  # noqa: E711 - elementwise
    if not unowned.any() or uses.empty:
        return module, why
    size = allocs["size_bytes"].to_numpy()
    device = allocs["device"].to_numpy(dtype=object)
    u_alloc = uses["alloc_id"].to_numpy(dtype=np.int64, na_value=-1)
    keep = u_alloc >= 0
    u_node = uses["op_id"].to_numpy()[keep]
    order = np.argsort(u_node, kind="stable")
    u_node, u_alloc = u_node[order], u_alloc[keep][order]

    def owned_reads(nodes: np.ndarray) -> pd.DataFrame:
        """(node, block, module, root, size) for every block one of ``nodes`` read that
        already has a module."""
        sel = np.isin(u_node, nodes)
        n, a = u_node[sel], u_alloc[sel]
        m = module[a]
        ok = pd.notna(m)
        n, a, m = n[ok], a[ok], m[ok]
        root = np.array([str(x).split(".", 1)[0] for x in m], dtype=object)
        return pd.DataFrame({"node": n, "block": a, "module": m, "root": root, "size": size[a]})

    # 3. the optimizer's work on a module's parameters. Passes: each one settles the nodes
    # whose inputs got their modules in the pass before (sqrt of the state, then the
    # division by that sqrt, ...).
    opt = alloc_phase == Phase.OPTIMIZER.value
    for _ in range(_PASSES):
        pending = (module == None) & opt & (alloc_node >= 0)  # noqa: E711
        if not pending.any():
            break
        rows = np.flatnonzero(pending)
        reads = owned_reads(np.unique(alloc_node[rows]))
        if reads.empty:
            break
        per_node = reads.groupby("node")["module"].agg(["nunique", "first"])
        # one module read: that module (a for-loop optimizer reads one parameter per op)
        single = per_node.loc[per_node["nunique"] == 1, "first"]
        hit = rows[np.isin(alloc_node[rows], single.index.to_numpy())]
        module[hit] = single.reindex(alloc_node[hit]).to_numpy()
        why[hit] = "optimizer work on its parameters"
        # several modules (foreach ops): the k-th new block of a size goes with the k-th
        # block of that size and device the op read
        multi = per_node.index[per_node["nunique"] > 1]
        rest = rows[np.isin(alloc_node[rows], multi.to_numpy())]
        by_node = dict(list(reads[reads["node"].isin(multi)].groupby("node")))
        for node, group in pd.Series(rest).groupby(alloc_node[rest], sort=True):
            r = by_node[node]
            by_size: dict[tuple, list] = {}
            for a, m in zip(r["block"].to_numpy(), r["module"].to_numpy()):
                by_size.setdefault((size[a], device[a]), []).append(m)
            taken: dict[tuple, int] = {}
            for b in group.to_numpy():
                key = (size[b], device[b])
                cands = by_size.get(key)
                if cands:
                    k = taken.get(key, 0)
                    taken[key] = k + 1
                    module[b] = cands[k % len(cands)]
                    why[b] = "optimizer work on its parameters"
        if len(hit) == 0 and not pd.notna(module[rest]).any():
            break

    # 4. work outside every module on a model's blocks: the root module of what it reads
    # (a backward node first takes its forward node's), in passes as above
    fwd_of = pd.Series(dtype="int64")
    if not flows.empty:
        op_node = ops["node_id"].to_numpy(dtype=np.int64, na_value=-1)
        fwd_of = pd.Series(
            op_node[flows["forward_op_id"].to_numpy()],
            index=op_node[flows["backward_op_id"].to_numpy()],
        )
        fwd_of = fwd_of[~fwd_of.index.duplicated()]
    for _ in range(_PASSES):
        pending = (module == None) & ~opt & (alloc_node >= 0)  # noqa: E711
        if not pending.any():
            break
        rows = np.flatnonzero(pending)
        nodes = np.unique(alloc_node[rows])
        fwd = fwd_of.reindex(nodes).to_numpy(dtype="float64")
        reads = owned_reads(np.concatenate([nodes, fwd[~np.isnan(fwd)].astype(np.int64)]))
        if reads.empty:
            break
        weight = reads.groupby(["node", "root"])["size"].sum().reset_index()
        weight = weight.sort_values(["node", "size"], ascending=[True, False], kind="stable")
        root_of = weight.drop_duplicates("node").set_index("node")["root"]
        own = root_of.reindex(nodes).to_numpy(dtype=object)
        via_fwd = root_of.reindex(pd.Series(fwd).fillna(-1).astype(np.int64)).to_numpy(dtype=object)
        found = np.where(pd.notna(via_fwd), via_fwd, own)
        node_root = pd.Series(found, index=nodes)
        got = node_root.reindex(alloc_node[rows]).to_numpy(dtype=object)
        ok = pd.notna(got)
        if not ok.any():
            break
        module[rows[ok]] = got[ok]
        why[rows[ok]] = "computed outside any module from its blocks"
    return module, why


#: Rounds of rules 3 and 4 (each follows one more step of a chain of ops outside modules).
_PASSES = 8
