"""Categories: what each block and tensor version is for, and why.

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
   FSDP2 (``fully_shard``): blocks made under FSDP's own labels are the parameters it
   all-gathers (``parameter``, "unsharded by FSDP for model.blocks.3", "all-gathered by FSDP
   for ...") and the gradients it reduce-scatters (``gradient``, "reduce-scattered by FSDP
   for ..."); see :mod:`~jupyter_memprof._analysis.distributed`.
   Activation checkpointing: forward work replayed inside an autograd node (module calls
   during backward) makes ``activation`` ("recomputed in backward (checkpointing)").
3. Short lives: a block freed inside the data-flow op that allocated it is ``temporary``
   ("freed inside the op that made it"); this covers raw blocks with no tensor identity
   (convolution workspaces). A block made and freed inside ``optimizer.step()`` /
   ``zero_grad()`` is ``temporary`` too ("made and freed inside the optimizer"): foreach
   intermediates, scalar wrappers.
4. The phase that made the block (see ``ops.phase``: from what the code does, so the
   forward and backward a closure runs inside ``optimizer.step(closure)`` are forward and
   backward):
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
   data that is not part of the forward-backward-update loop. A batch a DataLoader worker
   sent through shared memory is ``input`` ("batch from a DataLoader worker, through shared
   memory").
6. Otherwise ``unknown`` ("no rule applies").

Versions: an ``input`` written in place by a forward op becomes an ``activation`` from that
version on ("input written in place by forward"); every other version keeps the category of
the tensor. A block's category is the category of its last version.

Modules: every block also gets the module it belongs to (``module``) and why
(``module_reason``), first rule wins:

1. the module holding it, from the live session: its parameters and buffers ("holds it as a
   parameter", "holds it as a buffer"), their gradients ("holds its parameter (.grad)") and
   the optimizer state of those parameters ("holds its parameter (optimizer state)"); the
   module FSDP unsharded a block for ("its parameters, unsharded by FSDP", "its gradients,
   reduce-scattered by FSDP");
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
from .arrays import BACKWARD, FORWARD, OPTIMIZER, OTHER
from .distributed import BUCKET_REASON, fsdp_steps
from .facts import Facts, Strings, at, facts, inside_module
from .modules import attribute_modules
from .schema import Category, Role
from .trace_rules import trace_rule

C = Category

_ROLE_RULES = {
    Role.PARAMETER.value: (C.PARAMETER, "module parameter"),
    Role.BUFFER.value: (C.PARAMETER, "module buffer"),
    Role.OPTIMIZER_STATE.value: (C.OPTIMIZER_STATE, "optimizer.state"),
    Role.GRADIENT.value: (C.GRADIENT, ".grad of a parameter"),
}
_CATEGORY = S.codes_of(S.CATEGORY_DTYPE)
_ROLE = S.codes_of(S.ROLE_DTYPE)


#: The reason of the baseline's remainder that nothing names (blocks of address 0).
UNREACHABLE_REASON = "allocated before the capture, reachable from nothing the session knows"
_UNTOUCHED = "existed before the capture, untouched"


def _mark_untouched(untouched: np.ndarray, why: np.ndarray, reasons: Strings) -> None:
    """Say so in the reason of untouched blocks that a rule named for what they are (a
    parameter, a gradient, optimizer state): ``.grad of a parameter; existed before the
    capture, untouched``."""
    for code in np.unique(why[untouched]).tolist():
        text = reasons.values[code]
        if text != _UNTOUCHED:
            why[untouched & (why == code)] = reasons(f"{text}; {_UNTOUCHED}")


class Decisions:
    """The category and reason of every block, as codes (-1: not decided yet). The first
    rule that decides a block wins."""

    def __init__(self, n: int) -> None:
        self.cat = np.full(n, -1, dtype=np.int8)
        self.why = np.full(n, -1, dtype=np.int64)
        self.reasons = Strings()

    def decide(self, mask: np.ndarray, category: Category, reason: str) -> None:
        """Blocks of ``mask`` not decided yet get ``category`` for ``reason``."""
        m = mask & (self.cat < 0)
        self.cat[m] = _CATEGORY[category.value]
        self.why[m] = self.reasons(reason)


# -- the rules, most certain first -----------------------------------------------------------
def unreachable_rule(f: Facts, d: Decisions) -> None:
    """0. The baseline's remainder: what the CUDA allocator held at the start, or the CPU's
    tensors held, that nothing the session knows names (a block of address 0) is
    ``unknown``."""
    allocs = f.tables["allocations"]
    d.decide(_unreachable(f, allocs), C.UNKNOWN, UNREACHABLE_REASON)


def _unreachable(f: Facts, allocs: pd.DataFrame) -> np.ndarray:
    return f.before & (allocs["ptr"].to_numpy() == 0) & allocs["tensor_id"].isna().to_numpy()


def session_rule(f: Facts, d: Decisions) -> None:
    """1. The live session names a block: a model's parameters and buffers, optimizer state
    and a parameter's ``.grad`` (exact)."""
    for r, (category, reason) in _ROLE_RULES.items():
        d.decide(f.role == _ROLE[r], category, reason)


def accumulate_grad_rule(f: Facts, d: Decisions) -> None:
    """2a. What an ``AccumulateGrad`` node writes in place (else the tensor it stores) is a
    ``gradient``, even when nothing names it."""
    if not len(f.u_ops):
        return
    acc = f.uses_named(lambda nm: nm == "torch::autograd::AccumulateGrad")
    if acc.any():
        has_mut = np.isin(f.u_ops, f.u_ops[acc & f.u_mut])
        target = f.u_alloc[acc & (f.u_mut | ~has_mut) & (f.u_alloc >= 0)]
        d.decide(np.isin(f.alloc_ids, target), C.GRADIENT, "accumulated into .grad")


def fsdp_rule(f: Facts, d: Decisions) -> None:
    """2b. FSDP2's own blocks, by the profiler label they were made under: the parameters
    it all-gathers for a module (``parameter``, "unsharded by FSDP for model.blocks.3") and
    the module's gradients it reduce-scatters (``gradient``); see :mod:`.distributed`."""
    fsdp = fsdp_steps(f.tables["ops"])
    step = at(fsdp.step, f.alloc_op, -1)
    for k, (category, reason, _) in enumerate(fsdp.labels):
        d.decide(step == k, category, reason)


def gradient_bucket_rule(f: Facts, d: Decisions) -> None:
    """2b. A block a collective reduces across ranks during backward is a gradient bucket
    (DDP's reducer copies gradients into it, all-reduces it, copies it back)."""
    if not len(f.u_ops):
        return
    reduced = f.uses_named(lambda nm: nm.startswith("c10d::") and "reduce" in nm) & (
        f.op_phase[f.u_ops] == BACKWARD
    )
    bucket = f.u_alloc[reduced & (f.u_alloc >= 0)]
    d.decide(np.isin(f.alloc_ids, bucket), C.GRADIENT, BUCKET_REASON)


def recomputed_rule(f: Facts, d: Decisions) -> None:
    """2c. Forward work replayed inside backward (activation checkpointing) makes
    activations, even though the autograd node that replays it frees them before it
    returns."""
    inside = at(inside_module(f.tables["ops"]), f.alloc_op, False)
    d.decide(
        f.created & (f.alloc_phase == BACKWARD) & inside,
        C.ACTIVATION,
        "recomputed in backward (checkpointing)",
    )


def short_life_rule(f: Facts, d: Decisions) -> None:
    """3. Freed inside the data-flow op that made it (raw workspaces included), or made and
    freed inside the optimizer: ``temporary``."""
    same_node = (f.alloc_node >= 0) & (f.alloc_node == f.free_node)
    same_op = (f.alloc_node < 0) & (f.alloc_op >= 0) & (f.alloc_op == f.free_op)
    d.decide(same_node | same_op, C.TEMPORARY, "freed inside the op that made it")
    in_opt = (f.alloc_phase == OPTIMIZER) & (f.free_phase == OPTIMIZER)
    d.decide(in_opt, C.TEMPORARY, "made and freed inside the optimizer")


def phase_rule(f: Facts, d: Decisions) -> None:
    """4. The phase that made it: forward makes activations (saved for backward when
    backward reads or frees them), backward makes autograd detail, the optimizer makes
    optimizer state when it is kept."""
    fwd = f.created & (f.alloc_phase == FORWARD)
    saved = f.read_in(BACKWARD) | (f.free_phase == BACKWARD)
    d.decide(fwd & saved, C.ACTIVATION, "saved for backward")
    d.decide(fwd, C.ACTIVATION, "created in forward")
    d.decide(f.created & (f.alloc_phase == BACKWARD), C.AUTOGRAD_DETAIL, "created in backward")
    d.decide(
        f.created & (f.alloc_phase == OPTIMIZER) & f.kept,
        C.OPTIMIZER_STATE,
        "created by the optimizer, kept",
    )


#: the annotation torch's DataLoader opens around each ``next(iter(loader))`` when its
#: batches come from worker processes (``num_workers`` > 0)
_LOADER_WITH_WORKERS = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter"
#: the reason :func:`received_rule` gives
FROM_WORKER = "batch from a DataLoader worker, through shared memory"


def received_rule(f: Facts, d: Decisions) -> None:
    """5a. Batches that arrive rather than being computed: inside the ``next()`` of a
    DataLoader with worker processes, a tensor's storage made outside every op is one torch
    rebuilt from the shared memory a worker filled (``input``). Other storages made outside
    every op (``torch.tensor(data)``, a ``torch.multiprocessing`` queue) are left to the
    data rule."""
    ops = f.tables["ops"]
    if ops.empty:
        return
    allocs = f.tables["allocations"]
    raw = (
        f.created
        & (f.alloc_phase == OTHER)
        & (f.alloc_node < 0)
        & (f.alloc_op >= 0)
        & allocs["tensor_id"].notna().to_numpy()
    )
    if not raw.any():
        return
    names = ops["name"].astype(object).to_numpy()[f.alloc_op[raw]]
    loader = np.zeros(f.n, dtype=bool)
    loader[np.flatnonzero(raw)] = [str(n).startswith(_LOADER_WITH_WORKERS) for n in names.tolist()]
    d.decide(loader, C.INPUT, FROM_WORKER)


def data_rule(f: Facts, d: Decisions) -> None:
    """5. Data: blocks from before the capture or made outside the model. Read by forward:
    ``input``; computed from forward results (a metric): ``activation``; made and freed
    outside the model: ``temporary``; kept: ``input``, as torch defines inputs (data that is
    not part of the forward-backward-update loop)."""
    outside = f.created & (f.alloc_phase == OTHER)
    read_by_fwd = f.read_in(FORWARD)
    d.decide(f.before & read_by_fwd, C.INPUT, "existed before the capture, read by forward")
    d.decide(outside & read_by_fwd, C.INPUT, "made outside the model, read by forward")
    from_fwd = np.zeros(f.n, dtype=bool)
    if len(f.u_ops):
        fwd = f.created & (f.alloc_phase == FORWARD)
        reading = np.unique(f.u_ops[np.isin(f.u_alloc, f.alloc_ids[fwd])])
        from_fwd = np.isin(f.alloc_node, reading) & (f.alloc_node >= 0)
    d.decide(outside & from_fwd, C.ACTIVATION, "computed from forward results")
    d.decide(outside & ~f.kept, C.TEMPORARY, "made and freed outside the model")
    d.decide(
        f.before & ~f.kept & (f.role != _ROLE[Role.VARIABLE.value]),
        C.UNKNOWN,
        "existed before the capture, freed during it",
    )
    d.decide(f.before & untouched(f), C.INPUT, _UNTOUCHED)
    d.decide(f.before, C.INPUT, "existed before the capture")
    d.decide(outside, C.INPUT, "made outside the model, kept")


def fallback_rule(f: Facts, d: Decisions) -> None:
    """6. Otherwise ``unknown``."""
    d.decide(np.ones(f.n, dtype=bool), C.UNKNOWN, "no rule applies")


#: The category rules, in order: the first that decides a block wins.
RULES = (
    unreachable_rule,
    session_rule,
    accumulate_grad_rule,
    fsdp_rule,
    gradient_bucket_rule,
    recomputed_rule,
    trace_rule,
    short_life_rule,
    phase_rule,
    received_rule,
    data_rule,
    fallback_rule,
)


def untouched(f: Facts) -> np.ndarray:
    """Blocks from before the capture that no op read or wrote, still alive at the end (the
    baseline's unnamed remainder left out)."""
    used = np.zeros(f.n, dtype=bool)
    used[f.u_alloc[f.u_alloc >= 0]] = True
    return f.before & ~used & f.kept & ~_unreachable(f, f.tables["allocations"])


def version_pass(f: Facts, d: Decisions, versions: pd.DataFrame) -> pd.DataFrame:
    """Versions: an ``input`` written in place by forward becomes an ``activation`` from
    that version on; every other version keeps its block's category. A block's category is
    then its last version's (``d`` is updated)."""
    if versions.empty:
        return versions.copy()
    pos = pd.Index(f.alloc_ids).get_indexer(versions["alloc_id"].to_numpy())
    vcat = d.cat[pos]
    vwhy = d.why[pos]
    vop = versions["op_id"].to_numpy(dtype=np.int64, na_value=-1)
    vphase = at(f.op_phase, vop, -1)
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
        vwhy[flip] = d.reasons("input written in place by forward")
    # a block's category is its last version's
    back = pos[::-1]
    _, last = np.unique(back, return_index=True)
    last = len(pos) - 1 - last
    d.cat[pos[last]] = vcat[last]
    d.why[pos[last]] = vwhy[last]
    return versions.assign(
        category=pd.Categorical.from_codes(vcat, dtype=S.CATEGORY_DTYPE),
        reason=d.reasons.column(vwhy),
    )


def categorise(tables: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (allocations, versions) with ``category``, ``reason``, ``name``, ``module``
    and ``module_reason`` filled: :data:`RULES` in order, the untouched marking, the
    version pass, then the module rules (:mod:`.modules`)."""
    allocs, versions, names = tables["allocations"], tables["versions"], tables["names"]
    if len(allocs) == 0:
        return allocs.copy(), versions.copy()
    f = facts(tables)
    d = Decisions(f.n)
    for rule in RULES:
        rule(f, d)
    _mark_untouched(untouched(f), d.why, d.reasons)
    versions = version_pass(f, d, versions)
    module, module_why = attribute_modules(f)
    allocs = allocs.assign(
        category=pd.Categorical.from_codes(d.cat, dtype=S.CATEGORY_DTYPE),
        reason=d.reasons.column(d.why),
        name=S.taken_strings(f.named, names["name"].to_numpy(dtype=object, na_value=None)),
        module=module,
        module_reason=module_why,
    )
    return allocs, versions
