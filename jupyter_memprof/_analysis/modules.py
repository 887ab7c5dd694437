"""Modules: the module every block belongs to, and why.

A pure function of the tables, read through :class:`~.facts.Facts`. The rules (see
:mod:`.categories` for the whole story) run in order; a block keeps the first module a rule
gives it:

1. :func:`owner_rule`: the module the live session says holds it (a parameter or buffer,
   its ``.grad``, its optimizer state);
   :func:`fsdp_module_rule`: the module FSDP2 unsharded a parameter for, or reduce-scatters
   the gradients of (:mod:`.distributed`), in backward too;
2. :func:`allocating_op_rule`: the module the allocating op ran in (backward ops count for
   the module of the forward op they differentiate);
3. :func:`optimizer_work_rule`: work of the optimizer on a module's parameters;
4. :func:`outside_work_rule`: work outside every module on a model's blocks (the loss), the
   root module of what it reads;
5. otherwise none.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import schema as S
from .arrays import BACKWARD, OPTIMIZER, find, runs
from .distributed import MODULE_REASONS, fsdp_steps
from .facts import Facts, Strings, at
from .schema import Role

__all__ = ["RULES", "attribute_modules"]

_OWNER_REASONS = {
    Role.PARAMETER.value: "holds it as a parameter",
    Role.BUFFER.value: "holds it as a buffer",
    Role.GRADIENT.value: "holds its parameter (.grad)",
    Role.OPTIMIZER_STATE.value: "holds its parameter (optimizer state)",
}
_ROLE = S.codes_of(S.ROLE_DTYPE)
#: Rounds of rules 3 and 4 (each follows one more step of a chain of ops outside modules).
_PASSES = 8


class Owners:
    """The module of every block as codes of module paths (-1: none yet), why, and the
    uses sorted by op for the rules that follow reads."""

    def __init__(self, f: Facts) -> None:
        self.f = f
        self.paths = Strings()  # module paths (and their roots) as codes
        self.reasons = Strings()
        self.module = np.full(f.n, -1, dtype=np.int64)
        self.why = np.full(f.n, -1, dtype=np.int64)
        allocs = f.tables["allocations"]
        self.size = allocs["size_bytes"].to_numpy()
        self.device = allocs["device"].cat.codes.to_numpy()
        keep = f.u_alloc >= 0
        u_node = f.u_ops[keep]
        order = np.argsort(u_node, kind="stable")
        self.u_node, self.u_alloc = u_node[order], f.u_alloc[keep][order]
        self._roots: dict[int, int] = {}  # path code -> code of its root module

    def columns(self):
        """``module`` and ``module_reason`` as :data:`schema.STRING` arrays."""
        return self.paths.column(self.module), self.reasons.column(self.why)

    def root_of(self, codes: np.ndarray) -> np.ndarray:
        """The code of the root module (``model`` of ``model.fc``) of each path code."""
        for c in np.unique(codes).tolist():
            if c not in self._roots:
                self._roots[c] = self.paths(str(self.paths.values[c]).split(".", 1)[0])
        return np.array([self._roots[c] for c in codes.tolist()], dtype=np.int64)

    def owned_reads(self, nodes: np.ndarray):
        """(node, block, module) for every block one of ``nodes`` read that already has a
        module, by node (ties in the order of ``uses``)."""
        sel = np.isin(self.u_node, nodes)
        r_node, r_block = self.u_node[sel], self.u_alloc[sel]
        m = self.module[r_block]
        ok = m >= 0
        return r_node[ok], r_block[ok], m[ok]


def owner_rule(o: Owners) -> None:
    """1. The owner the live session names: the module holding the parameter or buffer, and
    the parameter's module for its ``.grad`` and optimizer state."""
    f, names = o.f, o.f.tables["names"]
    owner = at(o.paths.codes(names["module"].to_numpy(dtype=object, na_value=None)), f.named, -1)
    for r, reason in _OWNER_REASONS.items():
        m = (f.role == _ROLE[r]) & (owner >= 0)
        o.module[m] = owner[m]
        o.why[m] = o.reasons(reason)


def fsdp_module_rule(o: Owners) -> None:
    """1b. FSDP's unsharded parameters and the gradients it reduce-scatters belong to the
    module it did that for, whichever module's call (or none: backward's prefetch) made
    them."""
    f = o.f
    fsdp = fsdp_steps(f.tables["ops"])
    if not fsdp.labels:
        return
    step = at(fsdp.step, f.alloc_op, -1)
    for k, (category, _, path) in enumerate(fsdp.labels):
        if path is None:  # DDP's buckets: every module's gradients
            continue
        m = (o.module < 0) & (step == k)
        o.module[m] = o.paths(path)
        o.why[m] = o.reasons(MODULE_REASONS[category])


def allocating_op_rule(o: Owners) -> None:
    """2. The module the allocating op ran in ("allocated inside it"); backward ops count
    for the module of the forward op they differentiate ("allocated by its backward")."""
    f, ops = o.f, o.f.tables["ops"]
    if not len(ops):
        return
    m = (o.module < 0) & (f.alloc_op >= 0)
    rows = np.flatnonzero(m)
    codes, uniques = pd.factorize(ops["module"].array.take(f.alloc_op[rows]))
    mod = at(o.paths.codes(uniques.to_numpy(dtype=object, na_value=None)), codes, -1)
    m[rows] = mod >= 0
    o.module[rows[mod >= 0]] = mod[mod >= 0]
    bwd = f.alloc_phase == BACKWARD
    o.why[m & bwd] = o.reasons("allocated by its backward")
    o.why[m & ~bwd] = o.reasons("allocated inside it")


def optimizer_work_rule(o: Owners) -> None:
    """3. A block made inside ``optimizer.step()`` belongs to the module whose block of the
    same size and device the same op read (the k-th new block of a size goes with the k-th
    block of that size read: foreach ops), or, when the op read one module's blocks only, to
    that module. In rounds: each settles the ops whose inputs got their modules in the round
    before (sqrt of the state, then the division by that sqrt, ...)."""
    f = o.f
    opt = f.alloc_phase == OPTIMIZER
    settled = o.reasons("optimizer work on its parameters")
    for _ in range(_PASSES):
        pending = (o.module < 0) & opt & (f.alloc_node >= 0)
        if not pending.any():
            break
        rows = np.flatnonzero(pending)
        r_node, r_block, r_mod = o.owned_reads(np.unique(f.alloc_node[rows]))
        if not len(r_node):
            break
        if not _optimizer_round(o, rows, r_node, r_block, r_mod, settled):
            break


def _optimizer_round(o: Owners, rows, r_node, r_block, r_mod, settled: int) -> bool:
    """One round of :func:`optimizer_work_rule`; False when it settled nothing."""
    f = o.f
    # per node read: the number of modules, and the first
    starts = np.flatnonzero(np.r_[True, r_node[1:] != r_node[:-1]])
    _, new = runs((r_node, r_mod), by=2)
    distinct = np.add.reduceat(new.astype(np.int64), starts)  # r_node is sorted
    nodes, first = r_node[starts], r_mod[starts]
    # one module read: that module (a for-loop optimizer reads one parameter per op)
    single = distinct == 1
    k = np.minimum(np.searchsorted(nodes, f.alloc_node[rows]), len(nodes) - 1)
    known = nodes[k] == f.alloc_node[rows]
    hit = known & single[k]
    o.module[rows[hit]] = first[k[hit]]
    o.why[rows[hit]] = settled
    hit = rows[hit]
    # several modules (foreach ops): the k-th new block of a size goes with the k-th
    # block of that size and device the op read
    rest = rows[known & ~single[k]]
    multi = set(nodes[~single].tolist())
    by_node: dict[int, dict[tuple, list]] = {}
    for nd, a, m in zip(r_node.tolist(), r_block.tolist(), r_mod.tolist()):
        if nd in multi:
            by_node.setdefault(nd, {}).setdefault((o.size[a], o.device[a]), []).append(m)
    rest = rest[np.argsort(f.alloc_node[rest], kind="stable")]
    taken: dict[tuple, int] = {}
    for b, nd in zip(rest.tolist(), f.alloc_node[rest].tolist()):
        key = (o.size[b], o.device[b])
        cands = by_node[nd].get(key)
        if cands:
            c = taken.get((nd, *key), 0)
            taken[(nd, *key)] = c + 1
            o.module[b] = cands[c % len(cands)]
            o.why[b] = settled
    return len(hit) > 0 or bool((o.module[rest] >= 0).any())


def _forward_nodes(f: Facts) -> pd.Series:
    """The forward node of each backward node (by data-flow node id)."""
    flows, ops = f.tables["flows"], f.tables["ops"]
    if flows.empty:
        return pd.Series(dtype="int64")
    op_node = ops["node_id"].to_numpy(dtype=np.int64, na_value=-1)
    fwd_of = pd.Series(
        op_node[flows["forward_op_id"].to_numpy()],
        index=op_node[flows["backward_op_id"].to_numpy()],
    )
    return fwd_of[~fwd_of.index.duplicated()]


def outside_work_rule(o: Owners) -> None:
    """4. Work outside every module on a model's blocks (the loss on its output, in-place
    writes through views): a data-flow node belongs to the root module of the blocks it
    reads, the one holding most of the bytes read; a backward node first takes the module
    its forward node got. In rounds, as rule 3."""
    f = o.f
    opt = f.alloc_phase == OPTIMIZER
    fwd_of = _forward_nodes(f)
    computed = o.reasons("computed outside any module from its blocks")
    for _ in range(_PASSES):
        pending = (o.module < 0) & ~opt & (f.alloc_node >= 0)
        if not pending.any():
            break
        rows = np.flatnonzero(pending)
        nodes = np.unique(f.alloc_node[rows])
        fwd = fwd_of.reindex(nodes).to_numpy(dtype="float64")
        r_node, r_block, r_mod = o.owned_reads(
            np.concatenate([nodes, fwd[~np.isnan(fwd)].astype(np.int64)])
        )
        if not len(r_node):
            break
        root_node, root = _heaviest_root(o, r_node, r_block, r_mod)
        j, hit = find(root_node, nodes)
        own = np.where(hit, root[j], -1)
        j, hit = find(root_node, np.where(np.isnan(fwd), -1, fwd).astype(np.int64))
        via_fwd = np.where(hit, root[j], -1)
        found = np.where(via_fwd >= 0, via_fwd, own)
        got = found[np.searchsorted(nodes, f.alloc_node[rows])]
        ok = got >= 0
        if not ok.any():
            break
        o.module[rows[ok]] = got[ok]
        o.why[rows[ok]] = computed


def _heaviest_root(o: Owners, r_node, r_block, r_mod):
    """Per node read: the root module holding most of the bytes it read (on a tie the first
    root by name), as (sorted nodes, root codes)."""
    r_root = o.root_of(r_mod)
    by_name = sorted(np.unique(r_root).tolist(), key=o.paths.values.__getitem__)
    rank = np.zeros(len(o.paths.values), dtype=np.int64)
    rank[by_name] = np.arange(len(by_name))
    rank = rank[r_root]
    order, new = runs((r_node, rank), by=2)
    starts = np.flatnonzero(new)
    w_node, w_root = r_node[order[starts]], r_root[order[starts]]
    w_size = np.add.reduceat(o.size[r_block[order]], starts) if len(starts) else np.zeros(0)
    order = np.lexsort((-w_size, w_node))
    best = np.r_[True, w_node[order][1:] != w_node[order][:-1]]
    return w_node[order][best], w_root[order][best]


#: The module rules, in order: a block keeps the first module a rule gives it.
RULES = (owner_rule, fsdp_module_rule, allocating_op_rule, optimizer_work_rule, outside_work_rule)


def attribute_modules(f: Facts):
    """The module each block belongs to, and why (:data:`RULES`), as
    :data:`schema.STRING` arrays."""
    o = Owners(f)
    for rule in RULES[:3]:
        rule(o)
    unowned = (o.module < 0) & (f.alloc_node >= 0)
    if unowned.any() and not f.tables["uses"].empty:
        for rule in RULES[3:]:
            rule(o)
    return o.columns()
