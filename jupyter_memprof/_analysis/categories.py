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
from .schema import Category, OpKind, Role
from .tables import _KIND, BACKWARD, FORWARD, OPTIMIZER, OTHER, _find, _levels, _runs

C = Category

_ROLE_RULES = {
    Role.PARAMETER.value: (C.PARAMETER, "module parameter"),
    Role.BUFFER.value: (C.PARAMETER, "module buffer"),
    Role.OPTIMIZER_STATE.value: (C.OPTIMIZER_STATE, "optimizer.state"),
    Role.GRADIENT.value: (C.GRADIENT, ".grad of a parameter"),
}
_ROLE_PRIORITY = {"parameter": 0, "buffer": 1, "optimizer_state": 2, "gradient": 3, "variable": 4}
_CATEGORY = S.codes_of(S.CATEGORY_DTYPE)
_ROLE = S.codes_of(S.ROLE_DTYPE)


class _Strings:
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


def _named(names: pd.DataFrame, alloc_ids: np.ndarray) -> np.ndarray:
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
    order, first = _runs((block, priority, start), by=1)
    chosen = order[first]
    pos = pd.Index(alloc_ids).get_indexer(block[chosen])
    ok = pos >= 0
    out[pos[ok]] = rows[chosen[ok]]
    return out


def _inside_module(ops: pd.DataFrame) -> np.ndarray:
    """For every op: does it run inside an nn.Module call (a module op among its ancestors)?"""
    n = len(ops)
    inside = ops["kind"].cat.codes.to_numpy() == _KIND[OpKind.MODULE.value]
    parent = ops["parent_id"].to_numpy(dtype=np.int64, na_value=-1)
    for level in _levels(ops["depth"].to_numpy())[1:] if n else []:
        inside[level] |= inside[parent[level]]
    return inside


#: The reason of the baseline's remainder on a CUDA device (one block of address 0).
UNREACHABLE_REASON = "allocated before the capture, reachable from nothing the session knows"
_UNTOUCHED = "existed before the capture, untouched"


def _untouched(alloc_ns_na: np.ndarray, free_ns_na: np.ndarray, u_alloc: np.ndarray, n: int):
    """Blocks from before the capture that no op read or wrote, still alive at the end."""
    used = np.zeros(n, dtype=bool)
    used[u_alloc[u_alloc >= 0]] = True
    return alloc_ns_na & ~used & free_ns_na


def _mark_untouched(untouched: np.ndarray, why: np.ndarray, reasons: _Strings) -> None:
    """Say so in the reason of untouched blocks that a rule named for what they are (a
    parameter, a gradient, optimizer state): ``.grad of a parameter; existed before the
    capture, untouched``."""
    for code in np.unique(why[untouched]).tolist():
        text = reasons.values[code]
        if text != _UNTOUCHED:
            why[untouched & (why == code)] = reasons(f"{text}; {_UNTOUCHED}")


def _at(arr: np.ndarray, idx: np.ndarray, missing) -> np.ndarray:
    """``arr[idx]``, ``missing`` where ``idx`` is negative."""
    out = np.full(len(idx), missing, dtype=arr.dtype)
    ok = idx >= 0
    out[ok] = arr[idx[ok]]
    return out


def categorise(tables: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (allocations, versions) with ``category``, ``reason`` and ``name`` filled."""
    ops, allocs, versions = tables["ops"], tables["allocations"], tables["versions"]
    uses, names = tables["uses"], tables["names"]
    n = len(allocs)
    if n == 0:
        return allocs.copy(), versions.copy()

    # categories and reasons as codes (-1: not decided yet)
    cat = np.full(n, -1, dtype=np.int8)
    why = np.full(n, -1, dtype=np.int64)
    reasons = _Strings()

    def decide(mask: np.ndarray, category: Category, reason: str) -> None:
        m = mask & (cat < 0)
        cat[m] = _CATEGORY[category.value]
        why[m] = reasons(reason)

    # lookups on ops
    op_phase = ops["phase"].cat.codes.to_numpy()
    op_node = ops["node_id"].to_numpy(dtype=np.int64, na_value=-1)
    op_names = ops["name"].array

    alloc_op = allocs["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    free_op = allocs["free_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    alloc_ns_na = allocs["alloc_ns"].isna().to_numpy()
    free_ns_na = allocs["free_ns"].isna().to_numpy()
    alloc_phase = _at(op_phase, alloc_op, OTHER)
    free_phase = _at(op_phase, free_op, -1)
    alloc_node = _at(op_node, alloc_op, -1)
    free_node = _at(op_node, free_op, -1)
    alloc_ids = allocs["alloc_id"].to_numpy()

    # 0. the baseline's remainder: what the allocator held at the start that nothing names
    unreachable = (
        alloc_ns_na & (allocs["ptr"].to_numpy() == 0) & allocs["tensor_id"].isna().to_numpy()
    )
    decide(unreachable, C.UNKNOWN, UNREACHABLE_REASON)

    # 1. the live session
    named = _named(names, alloc_ids)
    role = _at(names["role"].cat.codes.to_numpy(), named, -1)
    for r, (category, reason) in _ROLE_RULES.items():
        decide(role == _ROLE[r], category, reason)

    u_ops = uses["op_id"].to_numpy()
    u_alloc = uses["alloc_id"].to_numpy(dtype=np.int64, na_value=-1)
    u_mut = uses["mutated"].to_numpy()
    # op names as codes: the rules below test a few names, not every row
    u_name = op_names.codes[u_ops]
    op_name_list = op_names.categories.tolist()

    def with_name(test) -> np.ndarray:
        return np.isin(u_name, [i for i, nm in enumerate(op_name_list) if test(nm)])

    # 2. AccumulateGrad targets: the tensor it writes in place, else the one it stores
    if len(u_ops):
        acc = with_name(lambda nm: nm == "torch::autograd::AccumulateGrad")
        if acc.any():
            has_mut = np.isin(u_ops, u_ops[acc & u_mut])
            target = u_alloc[acc & (u_mut | ~has_mut) & (u_alloc >= 0)]
            decide(np.isin(alloc_ids, target), C.GRADIENT, "accumulated into .grad")

    # gradient buckets: what a collective reduces across ranks during backward
    if len(u_ops):
        reduced = with_name(lambda nm: nm.startswith("c10d::") and "reduce" in nm) & (
            op_phase[u_ops] == BACKWARD
        )
        bucket = u_alloc[reduced & (u_alloc >= 0)]
        decide(
            np.isin(alloc_ids, bucket),
            C.GRADIENT,
            "gradient bucket, reduced across ranks in backward",
        )

    # forward work replayed inside backward (activation checkpointing) makes activations,
    # even though the autograd node that replays it frees them before it returns
    created = ~alloc_ns_na
    recomputed = created & (alloc_phase == BACKWARD) & _at(_inside_module(ops), alloc_op, False)
    decide(recomputed, C.ACTIVATION, "recomputed in backward (checkpointing)")

    # 3. short lives
    same_node = (alloc_node >= 0) & (alloc_node == free_node)
    same_op = (alloc_node < 0) & (alloc_op >= 0) & (alloc_op == free_op)
    decide(same_node | same_op, C.TEMPORARY, "freed inside the op that made it")
    in_opt = (alloc_phase == OPTIMIZER) & (free_phase == OPTIMIZER)
    decide(in_opt, C.TEMPORARY, "made and freed inside the optimizer")

    # 4. the phase that made it
    used_in_bwd = np.zeros(n, dtype=bool)
    read_by_fwd = np.zeros(n, dtype=bool)
    if len(u_ops):
        u_phase = op_phase[u_ops]
        used_in_bwd[u_alloc[(u_phase == BACKWARD) & (u_alloc >= 0)]] = True
        read_by_fwd[u_alloc[(u_phase == FORWARD) & (u_alloc >= 0)]] = True
    fwd = created & (alloc_phase == FORWARD)
    decide(fwd & (used_in_bwd | (free_phase == BACKWARD)), C.ACTIVATION, "saved for backward")
    decide(fwd, C.ACTIVATION, "created in forward")
    decide(created & (alloc_phase == BACKWARD), C.AUTOGRAD_DETAIL, "created in backward")
    decide(
        created & (alloc_phase == OPTIMIZER) & free_ns_na,
        C.OPTIMIZER_STATE,
        "created by the optimizer, kept",
    )

    # 5. data
    outside = created & (alloc_phase == OTHER)
    decide(alloc_ns_na & read_by_fwd, C.INPUT, "existed before the capture, read by forward")
    decide(outside & read_by_fwd, C.INPUT, "made outside the model, read by forward")
    # outside the model but computed from forward results (`out.argmax(-1)`, a metric)
    from_fwd = np.zeros(n, dtype=bool)
    if len(u_ops):
        reading = np.unique(u_ops[np.isin(u_alloc, alloc_ids[fwd])])
        from_fwd = np.isin(alloc_node, reading) & (alloc_node >= 0)
    decide(outside & from_fwd, C.ACTIVATION, "computed from forward results")
    decide(outside & ~free_ns_na, C.TEMPORARY, "made and freed outside the model")
    decide(
        alloc_ns_na & ~free_ns_na & (role != _ROLE[Role.VARIABLE.value]),
        C.UNKNOWN,
        "existed before the capture, freed during it",
    )
    untouched = _untouched(alloc_ns_na, free_ns_na, u_alloc, n) & ~unreachable
    decide(alloc_ns_na & untouched, C.INPUT, "existed before the capture, untouched")
    decide(alloc_ns_na, C.INPUT, "existed before the capture")
    decide(outside, C.INPUT, "made outside the model, kept")
    decide(np.ones(n, dtype=bool), C.UNKNOWN, "no rule applies")
    _mark_untouched(untouched, why, reasons)

    # versions: inputs written in place by forward become activations
    if not versions.empty:
        pos = pd.Index(alloc_ids).get_indexer(versions["alloc_id"].to_numpy())
        vcat = cat[pos]
        vwhy = why[pos]
        vop = versions["op_id"].to_numpy(dtype=np.int64, na_value=-1)
        vphase = _at(op_phase, vop, -1)
        version = versions["version"].to_numpy()
        is_input = vcat == _CATEGORY[C.INPUT.value]
        became = (version > 0) & is_input & (vphase == FORWARD)
        # from the first such write on, the tensor holds activations
        if became.any():
            tid = versions["tensor_id"].to_numpy()
            first = (
                pd.Series(np.where(became, version, np.iinfo(np.int64).max))
                .groupby(tid)
                .transform("min")
                .to_numpy()
            )
            flip = (version >= first) & is_input
            vcat[flip] = _CATEGORY[C.ACTIVATION.value]
            vwhy[flip] = reasons("input written in place by forward")
        # a block's category is its last version's
        back = pos[::-1]
        _, last = np.unique(back, return_index=True)
        last = len(pos) - 1 - last
        cat[pos[last]] = vcat[last]
        why[pos[last]] = vwhy[last]
        versions = versions.assign(
            category=pd.Categorical.from_codes(vcat, dtype=S.CATEGORY_DTYPE),
            reason=reasons.column(vwhy),
        )
    else:
        versions = versions.copy()

    module, module_why = _modules(
        ops, allocs, uses, tables["flows"], names, named, role, alloc_phase, alloc_node
    )
    allocs = allocs.assign(
        category=pd.Categorical.from_codes(cat, dtype=S.CATEGORY_DTYPE),
        reason=reasons.column(why),
        name=S.taken_strings(named, names["name"].to_numpy(dtype=object, na_value=None)),
        module=module,
        module_reason=module_why,
    )
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
    names: pd.DataFrame,
    named: np.ndarray,
    role: np.ndarray,
    alloc_phase: np.ndarray,
    alloc_node: np.ndarray,
):
    """The module each block belongs to, and why (the rules in the module docstring), as
    :data:`schema.STRING` arrays."""
    n = len(allocs)
    paths = _Strings()  # module paths (and their roots) as codes
    reasons = _Strings()
    module = np.full(n, -1, dtype=np.int64)
    why = np.full(n, -1, dtype=np.int64)

    def result():
        return paths.column(module), reasons.column(why)

    # 1. the owner the live session names
    owner = _at(paths.codes(names["module"].to_numpy(dtype=object, na_value=None)), named, -1)
    for r, reason in _OWNER_REASONS.items():
        m = (role == _ROLE[r]) & (owner >= 0)
        module[m] = owner[m]
        why[m] = reasons(reason)

    # 2. the module the allocating op ran in
    alloc_op = allocs["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    if len(ops):
        m = (module < 0) & (alloc_op >= 0)
        rows = np.flatnonzero(m)
        codes, uniques = pd.factorize(ops["module"].array.take(alloc_op[rows]))
        mod = _at(paths.codes(uniques.to_numpy(dtype=object, na_value=None)), codes, -1)
        m[rows] = mod >= 0
        module[rows[mod >= 0]] = mod[mod >= 0]
        bwd = alloc_phase == BACKWARD
        why[m & bwd] = reasons("allocated by its backward")
        why[m & ~bwd] = reasons("allocated inside it")

    unowned = (module < 0) & (alloc_node >= 0)
    if not unowned.any() or uses.empty:
        return result()
    size = allocs["size_bytes"].to_numpy()
    device = allocs["device"].cat.codes.to_numpy()
    u_alloc = uses["alloc_id"].to_numpy(dtype=np.int64, na_value=-1)
    keep = u_alloc >= 0
    u_node = uses["op_id"].to_numpy()[keep]
    order = np.argsort(u_node, kind="stable")
    u_node, u_alloc = u_node[order], u_alloc[keep][order]
    roots: dict[int, int] = {}  # path code -> code of its root module

    def root_of(codes: np.ndarray) -> np.ndarray:
        for c in np.unique(codes).tolist():
            if c not in roots:
                roots[c] = paths(str(paths.values[c]).split(".", 1)[0])
        return np.array([roots[c] for c in codes.tolist()], dtype=np.int64)

    def owned_reads(nodes: np.ndarray):
        """(node, block, module) for every block one of ``nodes`` read that already has a
        module, by node (ties in the order of ``uses``)."""
        sel = np.isin(u_node, nodes)
        r_node, r_block = u_node[sel], u_alloc[sel]
        m = module[r_block]
        ok = m >= 0
        return r_node[ok], r_block[ok], m[ok]

    # 3. the optimizer's work on a module's parameters. Passes: each one settles the nodes
    # whose inputs got their modules in the pass before (sqrt of the state, then the
    # division by that sqrt, ...).
    opt = alloc_phase == OPTIMIZER
    settled = reasons("optimizer work on its parameters")
    for _ in range(_PASSES):
        pending = (module < 0) & opt & (alloc_node >= 0)
        if not pending.any():
            break
        rows = np.flatnonzero(pending)
        r_node, r_block, r_mod = owned_reads(np.unique(alloc_node[rows]))
        if not len(r_node):
            break
        # per node read: the number of modules, and the first
        starts = np.flatnonzero(np.r_[True, r_node[1:] != r_node[:-1]])
        o, new = _runs((r_node, r_mod), by=2)
        distinct = np.add.reduceat(new.astype(np.int64), starts)  # r_node is sorted
        nodes, first = r_node[starts], r_mod[starts]
        # one module read: that module (a for-loop optimizer reads one parameter per op)
        single = distinct == 1
        k = np.searchsorted(nodes, alloc_node[rows])
        k = np.minimum(k, len(nodes) - 1)
        known = nodes[k] == alloc_node[rows]
        hit = known & single[k]
        module[rows[hit]] = first[k[hit]]
        why[rows[hit]] = settled
        hit = rows[hit]
        # several modules (foreach ops): the k-th new block of a size goes with the k-th
        # block of that size and device the op read
        rest = rows[known & ~single[k]]
        multi = set(nodes[~single].tolist())
        by_node: dict[int, dict[tuple, list]] = {}
        for nd, a, m in zip(r_node.tolist(), r_block.tolist(), r_mod.tolist()):
            if nd in multi:
                by_node.setdefault(nd, {}).setdefault((size[a], device[a]), []).append(m)
        rest = rest[np.argsort(alloc_node[rest], kind="stable")]
        taken: dict[tuple, int] = {}
        for b, nd in zip(rest.tolist(), alloc_node[rest].tolist()):
            key = (size[b], device[b])
            cands = by_node[nd].get(key)
            if cands:
                c = taken.get((nd, *key), 0)
                taken[(nd, *key)] = c + 1
                module[b] = cands[c % len(cands)]
                why[b] = settled
        if len(hit) == 0 and not (module[rest] >= 0).any():
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
    computed = reasons("computed outside any module from its blocks")
    for _ in range(_PASSES):
        pending = (module < 0) & ~opt & (alloc_node >= 0)
        if not pending.any():
            break
        rows = np.flatnonzero(pending)
        nodes = np.unique(alloc_node[rows])
        fwd = fwd_of.reindex(nodes).to_numpy(dtype="float64")
        r_node, r_block, r_mod = owned_reads(
            np.concatenate([nodes, fwd[~np.isnan(fwd)].astype(np.int64)])
        )
        if not len(r_node):
            break
        # the root holding most of the bytes read; on a tie the first root by name
        r_root = root_of(r_mod)
        by_name = sorted(np.unique(r_root).tolist(), key=paths.values.__getitem__)
        rank = np.zeros(len(paths.values), dtype=np.int64)
        rank[by_name] = np.arange(len(by_name))
        rank = rank[r_root]
        o, new = _runs((r_node, rank), by=2)
        starts = np.flatnonzero(new)
        w_node, w_root = r_node[o[starts]], r_root[o[starts]]
        w_size = np.add.reduceat(size[r_block[o]], starts) if len(starts) else np.zeros(0)
        o = np.lexsort((-w_size, w_node))
        best = np.r_[True, w_node[o][1:] != w_node[o][:-1]]
        root_node, root = w_node[o][best], w_root[o][best]
        j, hit = _find(root_node, nodes)
        own = np.where(hit, root[j], -1)
        j, hit = _find(root_node, np.where(np.isnan(fwd), -1, fwd).astype(np.int64))
        via_fwd = np.where(hit, root[j], -1)
        found = np.where(via_fwd >= 0, via_fwd, own)
        got = found[np.searchsorted(nodes, alloc_node[rows])]
        ok = got >= 0
        if not ok.any():
            break
        module[rows[ok]] = got[ok]
        why[rows[ok]] = computed
    return result()


#: Rounds of rules 3 and 4 (each follows one more step of a chain of ops outside modules).
_PASSES = 8
