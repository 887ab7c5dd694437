"""Records -> tables: ops, blocks, versions, uses, names, flows.

Everything here is vectorised over the flat records of :mod:`_records`: numpy reads the
records once (:func:`_read`) and the tables are built with numpy on int64 ids and on codes
(phases, op kinds, module paths), not with pandas merges and group-bys on Python objects,
whose fixed costs dominate a one-step capture and whose per-row costs dominate a long one.
Categories are not decided here (see :mod:`categories`); ``events`` and ``timeline`` are
derived from the categorised tables in :mod:`timeline`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .._records import CLOSURE_MARKER, MemoryColumns, MemoryRecord, OpRecord, TensorRef, Trace
from . import schema as S
from .arrays import BACKWARD, FORWARD, KIND, OPTIMIZER, OTHER, find, levels, runs
from .schema import OpKind


def _record_dtype(
    kind: type, objects: frozenset = frozenset(), flags: frozenset = frozenset()
) -> np.dtype:
    """A structured dtype for one kind of record: int64 fields, but for Python objects
    (``objects``) and bools (``flags``)."""
    fields = kind._fields  # type: ignore[attr-defined]
    return np.dtype([(f, "O" if f in objects else "?" if f in flags else "i8") for f in fields])


_OP_RECORD = _record_dtype(
    OpRecord, objects={"name", "kind", "callsite", "input_shapes"}, flags={"backward", "optimizer"}
)
_MEMORY_RECORD = _record_dtype(MemoryRecord, objects={"device"})
_TENSOR_REF = _record_dtype(TensorRef, flags={"mutable"})


def _read(records: list, dtype: np.dtype) -> dict[str, np.ndarray]:
    """Records as columns (one array per field of ``dtype``).

    numpy reads the records once into a structured array, each record's fields together,
    instead of one pass over all records per column (``zip(*records)``): on a long capture
    that is much of the cost of turning records into tables, and memory-bound.
    """
    arr = np.fromiter(records, dtype=dtype, count=len(records))
    return {f: np.ascontiguousarray(arr[f]) for f in dtype.names}


def _masked(arr: np.ndarray, missing: np.ndarray | None = None) -> pd.arrays.IntegerArray:
    """A nullable Int64 array; by default negative ids (``NO_ID``) are missing."""
    arr = np.asarray(arr, dtype=np.int64)
    return pd.arrays.IntegerArray(arr, arr < 0 if missing is None else missing)


# -- flops ---------------------------------------------------------------------------------
def _prod(xs) -> int:
    return math.prod(int(x) for x in xs)


def _flops(name: str, shapes: list) -> int | None:
    """torch's estimates for matmul-like and elementwise ops (see torch's profiler
    ``computeFlops``): 2*M*K*N for a matmul, numel for add/mul. Convolutions are estimated
    from input and weight shapes assuming the output keeps the spatial size (stride 1,
    'same' padding), which is what the recorded shapes allow."""
    try:
        if name == "aten::mm" and len(shapes) >= 2:
            (m, k), (_, n) = shapes[0], shapes[1]
            return 2 * m * k * n
        if name == "aten::addmm" and len(shapes) >= 3:
            (m, k), (_, n) = shapes[1], shapes[2]
            return 2 * m * k * n
        if name == "aten::bmm" and len(shapes) >= 2:
            (b, m, k), (_, _, n) = shapes[0], shapes[1]
            return 2 * b * m * k * n
        if name == "aten::baddbmm" and len(shapes) >= 3:
            (b, m, k), (_, _, n) = shapes[1], shapes[2]
            return 2 * b * m * k * n
        if name in ("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution"):
            x, w = shapes[0], shapes[1]
            if len(x) >= 3 and len(w) == len(x):
                spatial_out = _prod(x[2:])
                return 2 * x[0] * w[0] * spatial_out * _prod(w[1:])
        if name in ("aten::mul", "aten::add") and shapes and shapes[0]:
            return _prod(shapes[0])
    except (TypeError, ValueError):
        return None
    return None


_FLOP_NAMES = frozenset(
    "aten::mm aten::addmm aten::bmm aten::baddbmm aten::conv1d aten::conv2d aten::conv3d "
    "aten::convolution aten::mul aten::add".split()
)


# -- ops -----------------------------------------------------------------------------------
#: the phase code of ops whose phase needs the other tables (:func:`finish_ops`)
UNSET = -1


def build_ops(trace: Trace, module_paths: list[str], module_classes: list[str]) -> pd.DataFrame:
    """The ops table as far as the records tell: :func:`finish_ops` completes it.

    Until then ``phase`` is missing where it depends on other tables, and ``module`` is
    categorical over the capture's module paths, so that finishing works on codes.
    """
    recs = trace.ops
    n = len(recs)
    if n == 0:
        return S.empty(S.OPS)
    r = _read(recs, _OP_RECORD)
    parent = r["parent_id"]
    kind = S.categorical(r["kind"], S.KIND_DTYPE)  # str enums: categorise as strings
    is_module = kind.codes == KIND[OpKind.MODULE.value]
    names = r["name"]
    mod_idx = r["module_index"]
    ctx = r["module_ctx"]
    # the module each op runs in: its own for module rows, else the enclosing module call's
    own_mod = np.where(is_module, mod_idx, np.where(ctx >= 0, mod_idx[np.maximum(ctx, 0)], -1))
    rows = np.flatnonzero(is_module)
    if len(rows):
        classes = [*module_classes]
        names[rows] = [
            f"nn.Module: {classes[k] if 0 <= k < len(classes) else 'Module'}"
            for k in mod_idx[rows].tolist()
        ]
    # module paths as codes into the distinct paths; "" (and index -1) is no module
    path_codes, paths = pd.factorize(np.array([*module_paths, ""], dtype=object))
    none = [i for i, p in enumerate(paths) if p == ""]
    path_codes[np.isin(path_codes, none)] = -1
    module = path_codes[own_mod]

    # Phases from what the code does: autograd's engine runs backward, a module call is
    # forward, even inside ``optimizer.step(closure)`` (LBFGS, Lightning, wrappers); the
    # rest of an optimizer's call is its own work (``finish_ops`` takes back the forward
    # work of a closure done outside modules).
    phase = np.full(n, UNSET, dtype=np.int8)
    phase[r["backward"]] = BACKWARD
    phase[(phase == UNSET) & (own_mod >= 0)] = FORWARD
    phase[r["optimizer"] & (phase == UNSET)] = OPTIMIZER

    name = S.open_categorical(names)
    # a closure's own work outside modules is the user's, as outside the optimizer (a
    # producer that cannot clear the optimizer flag below it: see finish_ops)
    closure = name.categories.get_indexer([CLOSURE_MARKER])[0]
    if closure >= 0:
        phase[((phase == UNSET) | (phase == OPTIMIZER)) & (name.codes == closure)] = OTHER
    shapes = r["input_shapes"]
    flops = np.full(n, -1, dtype=np.int64)
    with_flops = [i for i, c in enumerate(name.categories) if c in _FLOP_NAMES]
    for i in np.flatnonzero(np.isin(name.codes, with_flops)).tolist():
        f = _flops(names[i], shapes[i])
        if f is not None:
            flops[i] = f
    return pd.DataFrame(
        {
            "op_id": r["op_id"],
            "parent_id": _masked(parent),
            "depth": r["depth"],
            "name": name,
            "kind": kind,
            "start_ns": r["start_ns"],
            "end_ns": r["end_ns"],
            "thread": r["thread"],
            "seq_nr": _masked(r["seq_nr"]),
            "phase": pd.Categorical.from_codes(phase, dtype=S.PHASE_DTYPE),
            "module": pd.Categorical.from_codes(module, categories=pd.Index(paths, dtype=object)),
            "callsite": S.strings(r["callsite"]),
            "input_shapes": shapes,
            "self_alloc_bytes": np.zeros(n, dtype=np.int64),
            "total_alloc_bytes": np.zeros(n, dtype=np.int64),
            "flops": _masked(flops),
            "node_id": _masked(r["node_id"]),
        }
    )


def finish_ops(ops: pd.DataFrame, flows: pd.DataFrame, allocations: pd.DataFrame) -> pd.DataFrame:
    """Fill what needs the other tables: phase of ops outside modules, module of backward
    ops (from their forward partner), and self/total allocated bytes."""
    if ops.empty:
        return ops
    n = len(ops)
    parent = ops["parent_id"].to_numpy(dtype=np.int64, na_value=-1)
    by_depth = levels(ops["depth"].to_numpy())
    phase = ops["phase"].cat.codes.to_numpy().astype(np.int8)  # UNSET: not known yet
    paths = ops["module"].cat.categories
    module = ops["module"].cat.codes.to_numpy().astype(np.int64)  # -1: none

    # An op outside any module whose autograd node ran in backward is forward work
    # (e.g. `loss = out.sum()` at top level), and so is the data-flow op around it: composite
    # ops such as `aten::cross_entropy_loss` only reach autograd through the ops they call.
    # Everything inside inherits that below.
    # Inside ``optimizer.step(closure)`` the same holds: an op that made an autograd node
    # is forward work whatever Python call encloses it (the optimizer's own ops run under
    # no_grad and make none), and so is everything inside it.
    fwd = flows["forward_op_id"].to_numpy()
    node = ops["node_id"].to_numpy(dtype=np.int64, na_value=-1)[fwd]
    made_nodes = np.concatenate([fwd, node[node >= 0]])
    retake = (phase[made_nodes] == UNSET) | (phase[made_nodes] == OPTIMIZER)
    phase[made_nodes[retake]] = FORWARD
    # backward ops take the module of the forward op they differentiate
    bwd = flows["backward_op_id"].to_numpy()
    take = module[bwd] < 0
    module[bwd[take]] = module[fwd[take]]
    # an op the optimizer flag claimed inside forward work, or inside a closure (whose
    # annotation alone is ``other`` here), is that work; the optimizer's own calls
    # (``zero_grad()`` in a closure) stay the optimizer's
    own = ops["kind"].cat.codes.to_numpy() == KIND[OpKind.OPTIMIZER.value]
    for level in by_depth[1:]:
        p = parent[level]
        claimed = (phase[level] == OPTIMIZER) & ~own[level]
        inherit = ((phase[level] == UNSET) & (phase[p] != UNSET)) | (
            claimed & ((phase[p] == FORWARD) | (phase[p] == OTHER))
        )
        phase[level[inherit]] = phase[p[inherit]]
        bw = (phase[level] == BACKWARD) & (module[level] < 0)
        module[level[bw]] = module[p[bw]]
    phase[phase == UNSET] = OTHER

    self_bytes = np.zeros(n, dtype=np.int64)
    if len(allocations):
        op = allocations["alloc_op_id"]
        ok = (op.notna() & allocations["alloc_ns"].notna()).to_numpy()
        op = op.to_numpy(dtype=np.int64, na_value=0)
        np.add.at(self_bytes, op[ok], allocations["size_bytes"].to_numpy()[ok])
    total = self_bytes.copy()
    for level in reversed(by_depth[1:]):
        np.add.at(total, parent[level], total[level])
    ops = ops.assign(
        phase=pd.Categorical.from_codes(phase, dtype=S.PHASE_DTYPE),
        module=S.taken_strings(module, paths),
        self_alloc_bytes=self_bytes,
        total_alloc_bytes=total,
    )
    return S.conform(ops, S.OPS, name="ops")


def op_context(ops: pd.DataFrame, op_ids: pd.Series) -> dict[str, np.ndarray]:
    """For rows that name an op (``op_ids``, nullable): that op's name, phase, module and
    callsite, as object arrays (None where the row names no op). ``op_id`` is the position
    of the op in ``ops``."""
    ok = op_ids.notna().to_numpy()
    idx = op_ids.to_numpy(dtype=np.int64, na_value=0)
    out = {}
    for col, src in (
        ("op_name", "name"),
        ("phase", "phase"),
        ("module", "module"),
        ("callsite", "callsite"),
    ):
        if len(ops):
            # only the rows asked for are converted to objects, not the whole column
            values = ops[src].take(idx).astype(object).to_numpy()
            out[col] = np.where(ok, values, None)
        else:
            out[col] = np.full(len(idx), None, dtype=object)
    return out


# -- flows ---------------------------------------------------------------------------------
def build_flows(ops: pd.DataFrame) -> pd.DataFrame:
    """Link each autograd node run in backward to the forward op that created it.

    The autograd engine tags a backward op with the sequence number of the forward op that
    created its node. Ops record the *current* sequence number, which only advances when a
    node is created, so several forward ops can carry the same number; the node's creator is
    the last of them before the backward op ran. The backward side is the outermost backward
    op with that number (``autograd::engine::evaluate_function: XBackward0``), which
    encloses everything the node did.
    """
    if ops.empty:
        return S.empty(S.FLOWS)
    has_seq = ops["seq_nr"].notna().to_numpy()
    is_bwd = ops["kind"].cat.codes.to_numpy() == KIND[OpKind.BACKWARD.value]
    parent = ops["parent_id"].to_numpy(dtype=np.int64, na_value=-1)
    parent_is_bwd = np.zeros(len(ops), dtype=bool)
    ok = parent >= 0
    parent_is_bwd[ok] = is_bwd[parent[ok]] & has_seq[parent[ok]]
    phase = ops["phase"].cat.codes.to_numpy()
    bwd = np.flatnonzero(has_seq & is_bwd & ~parent_is_bwd)
    fwd = np.flatnonzero(has_seq & ~is_bwd & (phase != BACKWARD))
    if not len(bwd) or not len(fwd):
        return S.empty(S.FLOWS)
    seq = ops["seq_nr"].to_numpy(dtype=np.int64, na_value=0)
    start = ops["start_ns"].to_numpy()
    # For each backward op, the last forward op with its number that started strictly
    # before it. Sorted by (number, start), a backward op goes before forward ops of its
    # number and start (strictly before), forward ops of equal start keep op order; the
    # answer is then the nearest forward op before it, if it has the same number.
    rows = np.concatenate([bwd, fwd])
    is_f = np.concatenate([np.zeros(len(bwd), dtype=bool), np.ones(len(fwd), dtype=bool)])
    order = np.lexsort((is_f, start[rows], seq[rows]))
    rows, is_f = rows[order], is_f[order]
    last_f = np.maximum.accumulate(np.where(is_f, np.arange(len(rows)), -1))
    b = np.flatnonzero(~is_f)
    f = last_f[b]
    hit = f >= 0
    b, f = rows[b[hit]], rows[f[hit]]
    same = seq[b] == seq[f]
    b, f = b[same], f[same]
    order = np.lexsort((b, f))
    return pd.DataFrame(
        {
            "seq_nr": seq[b[order]],
            "forward_op_id": ops["op_id"].to_numpy()[f[order]],
            "backward_op_id": ops["op_id"].to_numpy()[b[order]],
        }
    )


# -- allocations ---------------------------------------------------------------------------
def memory_table(trace: Trace, devices: list[str]) -> pd.DataFrame:
    """The allocator events, one row each; ``total_allocated`` and ``total_reserved`` are
    the allocator's own totals after the event (-1 where none were recorded)."""
    if not len(trace.memory):
        return S.empty(_MEMORY)
    r = memory_columns(trace.memory)
    df = pd.DataFrame(
        {
            "time_ns": r["time_ns"],
            "ptr": r["ptr"],
            "size": r["size"],
            "tensor_id": _masked(r["tensor_id"]),
            "allocation_id": r["allocation_id"],
            "device": r["device"],
            "op_id": _masked(r["op_id"]),
            "total_allocated": r["total_allocated"],
            "total_reserved": r["total_reserved"],
        }
    )
    if set(pd.unique(r["device"]).tolist()) <= set(devices):
        return df
    return df[df["device"].isin(devices)].reset_index(drop=True)


def memory_columns(memory: list[MemoryRecord] | MemoryColumns) -> dict[str, np.ndarray]:
    """A trace's allocator events, records or columns (:class:`MemoryColumns`), as one
    array per field of :class:`MemoryRecord` (``device``: its names, objects)."""
    if not isinstance(memory, MemoryColumns):
        return _read(memory, _MEMORY_RECORD)
    r = dict(memory.fields)
    names = np.empty(len(memory.device_names), dtype=object)
    names[:] = memory.device_names
    r["device"] = names[r["device"]]
    return r


#: The columns of the record tables (the analysis's own: not part of a profile).
_MEMORY = {
    "time_ns": "int64",
    "ptr": "int64",
    "size": "int64",
    "tensor_id": "Int64",
    "allocation_id": "int64",
    "device": "object",
    "op_id": "Int64",
    "total_allocated": "int64",
    "total_reserved": "int64",
}
_REFS = {"op_id": "int64", "tensor_id": "int64", "mutable": bool}
_UNTRACKED = {"tensor_id": "int64", "ptr": "int64", "device": object, "extent": "int64"}


def refs_table(trace: Trace) -> pd.DataFrame:
    if not trace.tensors:
        return S.empty(_REFS)
    r = _read(trace.tensors, _TENSOR_REF)
    return pd.DataFrame({"op_id": r["op_id"], "tensor_id": r["tensor_id"], "mutable": r["mutable"]})


def untracked_table(trace: Trace) -> pd.DataFrame:
    if not trace.untracked:
        return S.empty(_UNTRACKED)
    return pd.DataFrame(trace.untracked, columns=list(_UNTRACKED)).astype(_UNTRACKED)


# -- uses and versions ---------------------------------------------------------------------
def _first_blocks(allocations: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The tensor ids the blocks hold, sorted, and the position of the first block (in
    table order) holding each."""
    tid = allocations["tensor_id"]
    rows = np.flatnonzero(tid.notna().to_numpy())
    t = tid.to_numpy(dtype=np.int64, na_value=0)[rows]
    order, first = runs((t,), by=1)
    return t[order[first]], rows[order[first]]


def build_uses(ops: pd.DataFrame, refs: pd.DataFrame, allocations: pd.DataFrame) -> pd.DataFrame:
    """Data-flow edges at the level of data-flow nodes.

    Ops call ops: ``aten::linear`` runs ``aten::t`` and ``aten::addmm``. Like torch's memory
    profiler we fold every op into its outermost dispatcher op (or autograd node), the
    *node*, and record one edge per (node, tensor): the node read the tensor, and
    ``mutated`` says some op inside it wrote it in place according to its schema. Tensors
    created inside the node are its outputs, not inputs, and get no edge. Each mutation
    makes a new version; ``version`` is the one the node saw.
    """
    if refs.empty or ops.empty:
        return S.empty(S.USES)
    op_node = ops["node_id"].to_numpy(dtype=np.int64, na_value=-1)
    node = op_node[refs["op_id"].to_numpy()]
    keep = node >= 0
    node = node[keep]
    tensor = refs["tensor_id"].to_numpy()[keep]
    mutable = refs["mutable"].to_numpy()[keep]
    # one edge per (node, tensor), in order of first appearance, mutated if any op wrote it
    order, start = runs((node, tensor), by=2)
    starts = np.flatnonzero(start)
    mutated = np.logical_or.reduceat(mutable[order], starts) if len(starts) else np.zeros(0, bool)
    first = order[starts]
    seen = np.argsort(first, kind="stable")
    node, tensor, mutated = node[first[seen]], tensor[first[seen]], mutated[seen]
    # the block each tensor lives in; blocks the node allocated itself are its outputs
    t_ids, t_rows = _first_blocks(allocations)
    j, found = find(t_ids, tensor)
    alloc = np.full(len(tensor), -1, dtype=np.int64)
    alloc[found] = allocations["alloc_id"].to_numpy()[t_rows[j[found]]]
    alloc_op = allocations["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    alloc_node = np.where(alloc_op >= 0, op_node[np.maximum(alloc_op, 0)], -1)
    made_here = found.copy()
    made_here[found] = alloc_node[alloc[found]] == node[found]  # alloc_id: the block's row
    keep = ~made_here
    node, tensor, mutated, alloc, found = (x[keep] for x in (node, tensor, mutated, alloc, found))
    order = np.lexsort((node, ops["start_ns"].to_numpy()[node]))
    node, tensor, mutated, alloc, found = (x[order] for x in (node, tensor, mutated, alloc, found))
    # the version each node saw: the writes to its tensor before it
    m = mutated.astype(np.int64)
    order, start = runs((tensor,), by=1)
    before = np.cumsum(m[order]) - m[order]
    version = np.empty(len(m), dtype=np.int64)
    version[order] = before - before[start][np.cumsum(start) - 1]
    return pd.DataFrame(
        {
            "op_id": node,
            "tensor_id": tensor,
            "alloc_id": S.integers(alloc, ~found),
            "version": version,
            "mutated": mutated,
        }
    )


def build_versions(
    allocations: pd.DataFrame, uses: pd.DataFrame, ops: pd.DataFrame
) -> pd.DataFrame:
    """Version 0 at creation (op: the op that allocated the block), +1 per in-place write
    (op: the data-flow node that wrote it)."""
    if allocations.empty:  # every version belongs to a block
        return S.empty(S.VERSIONS)
    t_ids, t_rows = _first_blocks(allocations)
    alloc_ns = allocations["alloc_ns"].array
    alloc_op = allocations["alloc_op_id"].array
    mut = uses["mutated"].to_numpy()
    u_alloc = uses["alloc_id"]
    w = np.flatnonzero(mut & u_alloc.notna().to_numpy())
    w_op = uses["op_id"].to_numpy()[w]
    tensor = np.concatenate([t_ids, uses["tensor_id"].to_numpy()[w]])
    version = np.concatenate([np.zeros(len(t_ids), np.int64), uses["version"].to_numpy()[w] + 1])
    alloc = np.concatenate(
        [
            allocations["alloc_id"].to_numpy()[t_rows],
            u_alloc.to_numpy(dtype=np.int64, na_value=0)[w],
        ]
    )
    start_ns = np.concatenate(
        [alloc_ns.to_numpy(dtype=np.int64, na_value=0)[t_rows], ops["start_ns"].to_numpy()[w_op]]
    )
    start_na = np.concatenate([alloc_ns.isna()[t_rows], np.zeros(len(w), dtype=bool)])
    op = np.concatenate([alloc_op.to_numpy(dtype=np.int64, na_value=0)[t_rows], w_op])
    op_na = np.concatenate([alloc_op.isna()[t_rows], np.zeros(len(w), dtype=bool)])
    order = np.lexsort((version, tensor))
    n = len(order)
    return pd.DataFrame(
        {
            "tensor_id": tensor[order].astype(np.int64),
            "version": version[order].astype(np.int64),
            "alloc_id": alloc[order].astype(np.int64),
            "category": pd.Categorical.from_codes(
                np.full(n, -1, dtype=np.int8), dtype=S.CATEGORY_DTYPE
            ),
            "start_ns": S.integers(start_ns[order], start_na[order]),
            "op_id": S.integers(op[order], op_na[order]),
            "reason": S.no_strings(n),
        }
    )


# -- names ---------------------------------------------------------------------------------
def names_table(rows: list) -> pd.DataFrame:
    if not rows:
        return S.empty(S.NAMES)
    name, role, device, ptr, size, when, module = zip(*rows)
    return pd.DataFrame(
        {
            "name": pd.array(name, dtype=S.STRING),
            "role": pd.Categorical([r.value for r in role], dtype=S.ROLE_DTYPE),
            "device": S.open_categorical(device),
            "ptr": np.asarray(ptr, dtype=np.int64),
            "size_bytes": np.asarray(size, dtype=np.int64),
            "when": pd.Categorical(when, dtype=S.NAMES["when"]),
            "alloc_id": S.integers(np.zeros(len(name)), np.ones(len(name), dtype=bool)),
            "module": pd.array(module, dtype=S.STRING),
        }
    )


def holds(device: str, name_bytes: int, block_bytes: int) -> bool:
    """Whether a storage of ``name_bytes`` (as :func:`_devices.block_bytes` counts it) can be
    the block of ``block_bytes`` at its address. On the CPU a storage is its allocation
    (pinned memory's host allocator rounds up to a power of two); CUDA's blocks may be
    rounded further (``roundup_power2_divisions``). A storage that cannot be the block found
    at its address was made there after that block's free went unrecorded (a thread the
    profiler does not see, as gloo's)."""
    if name_bytes <= 0:
        return True
    if device == "cpu":
        return name_bytes == block_bytes or block_bytes == 1 << (name_bytes - 1).bit_length()
    return name_bytes <= block_bytes


def match_names(names: pd.DataFrame, allocations: pd.DataFrame) -> pd.DataFrame:
    """Attach each named tensor to its block: names read at the start match blocks alive at
    the start (``alloc_ns`` NA), names read at the end match blocks alive at the end (``free_ns``
    NA; the latest allocated when an address was reused) that can hold them (:func:`holds`)."""
    if names.empty:
        return S.conform(names, S.NAMES, name="names")
    a = allocations
    device = a["device"].to_numpy(dtype=object)
    ptr = a["ptr"].to_numpy()
    ids = a["alloc_id"].to_numpy()
    size_of = dict(zip(ids.tolist(), a["size_bytes"].to_numpy(dtype=np.int64).tolist()))
    start: dict = {}
    rows = np.flatnonzero(a["alloc_ns"].isna().to_numpy())
    for key, i in zip(zip(device[rows].tolist(), ptr[rows].tolist()), ids[rows].tolist()):
        start.setdefault(key, i)
    end: dict = {}
    alive = a["alloc_ns"][a["free_ns"].isna().to_numpy()]
    rows = alive.sort_values(na_position="first").index.to_numpy()
    for key, i in zip(zip(device[rows].tolist(), ptr[rows].tolist()), ids[rows].tolist()):
        end[key] = i
    when = names["when"].to_numpy(dtype=object).tolist()
    dev = names["device"].to_numpy(dtype=object).tolist()
    keys = zip(dev, names["ptr"].to_numpy().tolist())
    sizes = names["size_bytes"].to_numpy(dtype=np.int64).tolist()
    none: dict = {}
    found = []
    for w, key, size in zip(when, keys, sizes):
        i = (start if w == "start" else end if w == "end" else none).get(key, -1)
        found.append(i if i < 0 or holds(str(key[0]), size, size_of[i]) else -1)
    ids = np.array(found, dtype=np.int64)
    return S.conform(names.assign(alloc_id=S.integers(ids, ids < 0)), S.NAMES, name="names")
