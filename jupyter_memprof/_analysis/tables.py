"""Records -> tables: ops, allocations, versions, uses, names and flows.

Everything here is vectorised (numpy/pandas) over the flat records of
:mod:`_torch_events`; the only per-record Python work is unpacking the records once.
Categories are not decided here (see :mod:`_categories`); ``events`` and ``timeline`` are
derived from the categorised tables in :mod:`_timeline`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .._devices import cuda_block_bytes
from .._records import Trace
from . import schema as S
from .schema import OpKind, Phase

_NA = pd.NA


def _ids(values) -> np.ndarray:
    """Record ids (``NO_ID`` for none) as an int64 array."""
    return np.asarray(values, dtype=np.int64)


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
def build_ops(trace: Trace, module_paths: list[str], module_classes: list[str]) -> pd.DataFrame:
    recs = trace.ops
    n = len(recs)
    if n == 0:
        return S.empty(S.OPS)
    (op_id, parent, depth, name, kind, start, end, thread, seq, backward, optimizer,
     module_index, module_ctx, callsite, shapes, node) = zip(*recs)  # fmt: skip
    parent_a = _ids(parent)
    depth_a = np.asarray(depth, dtype=np.int64)
    kind_a = np.asarray(kind, dtype=object)  # str enums: compare and categorise as strings
    is_module = kind_a == OpKind.MODULE.value
    names = list(name)
    mod_idx = _ids(module_index)
    ctx = _ids(module_ctx)
    # the module each op runs in: its own for module rows, else the enclosing module call's
    own_mod = np.where(is_module, mod_idx, np.where(ctx >= 0, mod_idx[np.maximum(ctx, 0)], -1))
    paths = np.array([*module_paths, ""], dtype=object)
    classes = [*module_classes]
    for i in np.flatnonzero(is_module):
        k = mod_idx[i]
        names[i] = f"nn.Module: {classes[k] if 0 <= k < len(classes) else 'Module'}"
    module = paths[own_mod]  # index -1 -> ""

    phase = np.full(n, "", dtype=object)
    phase[np.asarray(backward, dtype=bool)] = Phase.BACKWARD.value
    opt = np.asarray(optimizer, dtype=bool) & (phase == "")
    phase[opt] = Phase.OPTIMIZER.value
    phase[(phase == "") & (own_mod >= 0)] = Phase.FORWARD.value

    flops = np.full(n, -1, dtype=np.int64)
    for i, nm in enumerate(names):
        if nm in _FLOP_NAMES:
            f = _flops(nm, shapes[i])
            if f is not None:
                flops[i] = f
    df = pd.DataFrame(
        {
            "op_id": np.asarray(op_id, dtype=np.int64),
            "parent_id": _masked(parent_a, parent_a < 0),
            "depth": depth_a,
            "name": pd.Categorical(names),
            "kind": pd.Categorical(kind_a, dtype=S.KIND_DTYPE),
            "start_ns": np.asarray(start, dtype=np.int64),
            "end_ns": np.asarray(end, dtype=np.int64),
            "thread": np.asarray(thread, dtype=np.int64),
            "seq_nr": _masked(_ids(seq)),
            "phase": phase,
            "module": pd.array(np.where(module == "", None, module), dtype=S.STRING),
            "callsite": pd.array(list(callsite), dtype=S.STRING),
            "input_shapes": pd.Series(list(shapes), dtype=object),
            "self_alloc_bytes": np.zeros(n, dtype=np.int64),
            "total_alloc_bytes": np.zeros(n, dtype=np.int64),
            "flops": _masked(flops),
            "node_id": _masked(_ids(node)),
        }
    )
    return df


def finish_ops(ops: pd.DataFrame, flows: pd.DataFrame, allocations: pd.DataFrame) -> pd.DataFrame:
    """Fill what needs the other tables: phase of ops outside modules, module of backward
    ops (from their forward partner), and self/total allocated bytes."""
    if ops.empty:
        return ops
    n = len(ops)
    parent = ops["parent_id"].to_numpy(dtype=np.int64, na_value=-1)
    depth = ops["depth"].to_numpy()
    phase = ops["phase"].to_numpy(dtype=object).copy()
    module = ops["module"].to_numpy(dtype=object, na_value=None).copy()
    order = np.argsort(depth, kind="stable")
    levels = np.split(order, np.flatnonzero(np.diff(depth[order])) + 1)

    # An op outside any module whose autograd node ran in backward is forward work
    # (e.g. `loss = out.sum()` at top level), and so is the data-flow op around it: composite
    # ops such as `aten::cross_entropy_loss` only reach autograd through the ops they call.
    # Everything inside inherits that below.
    fwd = flows["forward_op_id"].to_numpy()
    phase[fwd[(phase[fwd] == "")]] = Phase.FORWARD.value
    node = ops["node_id"].to_numpy(dtype=np.int64, na_value=-1)[fwd]
    node = node[node >= 0]
    phase[node[(phase[node] == "")]] = Phase.FORWARD.value
    # backward ops take the module of the forward op they differentiate
    bwd = flows["backward_op_id"].to_numpy()
    take = np.array([module[b] is None for b in bwd], dtype=bool) if len(bwd) else np.zeros(0, bool)
    module[bwd[take]] = module[fwd[take]]
    for level in levels[1:]:
        p = parent[level]
        inherit = (phase[level] == "") & (phase[p] != "")
        phase[level[inherit]] = phase[p[inherit]]
        bw = (phase[level] == Phase.BACKWARD.value) & np.array(
            [module[i] is None for i in level], dtype=bool
        )
        module[level[bw]] = module[p[bw]]
    phase[phase == ""] = Phase.OTHER.value

    self_bytes = np.zeros(n, dtype=np.int64)
    if not allocations.empty:
        a = allocations.dropna(subset=["alloc_op_id", "alloc_ns"])
        np.add.at(self_bytes, a["alloc_op_id"].to_numpy(dtype=np.int64), a["size_bytes"].to_numpy())
    total = self_bytes.copy()
    for level in reversed(levels[1:]):
        np.add.at(total, parent[level], total[level])
    ops = ops.copy()
    ops["phase"] = pd.Categorical(phase, dtype=S.PHASE_DTYPE)
    ops["module"] = pd.array(module, dtype=S.STRING)
    ops["self_alloc_bytes"] = self_bytes
    ops["total_alloc_bytes"] = total
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
            values = ops[src].astype(object).to_numpy()[idx]
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
    kind = ops["kind"].to_numpy(dtype=object)
    is_bwd = kind == OpKind.BACKWARD.value
    parent = ops["parent_id"].to_numpy(dtype=np.int64, na_value=-1)
    parent_is_bwd = np.zeros(len(ops), dtype=bool)
    ok = parent >= 0
    parent_is_bwd[ok] = is_bwd[parent[ok]] & has_seq[parent[ok]]
    cols = ["op_id", "seq_nr", "start_ns"]
    bwd = ops.loc[has_seq & is_bwd & ~parent_is_bwd, cols]
    phase = ops["phase"].to_numpy(dtype=object)
    fwd = ops.loc[has_seq & ~is_bwd & (phase != Phase.BACKWARD.value), cols]
    if bwd.empty or fwd.empty:
        return S.empty(S.FLOWS)
    bwd = bwd.astype({"seq_nr": "int64"}).sort_values("start_ns")
    fwd = fwd.astype({"seq_nr": "int64"}).sort_values("start_ns")
    m = pd.merge_asof(
        bwd.rename(columns={"op_id": "backward_op_id"}),
        fwd.rename(columns={"op_id": "forward_op_id"}),
        on="start_ns",
        by="seq_nr",
        direction="backward",
        allow_exact_matches=False,
    ).dropna(subset=["forward_op_id"])
    m = m.astype({"forward_op_id": "int64"}).sort_values(["forward_op_id", "backward_op_id"])
    return S.conform(m, S.FLOWS, name="flows")


# -- allocations ---------------------------------------------------------------------------
def memory_table(trace: Trace, devices: list[str]) -> pd.DataFrame:
    cols = ["time_ns", "ptr", "size", "tensor_id", "allocation_id", "device", "op_id"]
    if not trace.memory:
        return pd.DataFrame({c: pd.Series([], dtype="Int64") for c in cols}).astype(
            {
                "time_ns": "int64",
                "ptr": "int64",
                "size": "int64",
                "allocation_id": "int64",
                "device": "object",
            }
        )
    t, ptr, size, tid, aid, dev, op = zip(*trace.memory)
    df = pd.DataFrame(
        {
            "time_ns": np.asarray(t, dtype=np.int64),
            "ptr": np.asarray(ptr, dtype=np.int64),
            "size": np.asarray(size, dtype=np.int64),
            "tensor_id": _masked(_ids(tid)),
            "allocation_id": np.asarray(aid, dtype=np.int64),
            "device": np.asarray(dev, dtype=object),
            "op_id": _masked(_ids(op)),
        }
    )
    return df[df["device"].isin(devices)].reset_index(drop=True)


def refs_table(trace: Trace) -> pd.DataFrame:
    if not trace.tensors:
        return pd.DataFrame({"op_id": [], "tensor_id": [], "mutable": []}).astype(
            {"op_id": "int64", "tensor_id": "int64", "mutable": bool}
        )
    op, tid, mut = zip(*trace.tensors)
    return pd.DataFrame(
        {
            "op_id": np.asarray(op, dtype=np.int64),
            "tensor_id": np.asarray(tid, dtype=np.int64),
            "mutable": np.asarray(mut, dtype=bool),
        }
    )


def untracked_table(trace: Trace) -> pd.DataFrame:
    cols = {"tensor_id": "int64", "ptr": "int64", "device": object, "extent": "int64"}
    if not trace.untracked:
        return pd.DataFrame({c: pd.Series([], dtype=d) for c, d in cols.items()})
    return pd.DataFrame(trace.untracked, columns=list(cols)).astype(cols)


def build_allocations(
    mem: pd.DataFrame, untracked: pd.DataFrame, names: pd.DataFrame, devices: list[str]
) -> pd.DataFrame:
    """One row per block, from allocation to free.

    Allocator events are paired by ``allocation_id`` (torch gives the allocation and its free
    the same id, including raw blocks with no tensor identity). A free with no allocation is
    a block that existed before the capture. Tensors that ops used but whose blocks the
    allocator never reported (parameters, inputs made before the capture and still alive)
    become pre-existing blocks too; their size comes from the live object when the session
    knows it, else from the furthest byte any view of them reached.
    """
    if mem.empty and untracked.empty:  # nothing happened: skip pandas' fixed costs
        return S.empty(S.ALLOCATIONS)
    allocs = mem[mem["size"] > 0]
    frees = mem[mem["size"] < 0]
    a = allocs.rename(
        columns={
            "time_ns": "alloc_ns",
            "op_id": "alloc_op_id",
            "size": "size_bytes",
        }
    ).drop_duplicates(["allocation_id", "device"])
    f = frees.rename(
        columns={
            "time_ns": "free_ns",
            "op_id": "free_op_id",
            "size": "free_size",
        }
    ).drop_duplicates(["allocation_id", "device"])
    # nullable before the outer merge: float64 would round absolute nanoseconds (~256 ns)
    a = a.astype({"alloc_ns": "Int64"})
    f = f.astype({"free_ns": "Int64"})
    blocks = a.merge(
        f[["allocation_id", "device", "free_ns", "free_op_id", "free_size", "tensor_id", "ptr"]],
        on=["allocation_id", "device"],
        how="outer",
        suffixes=("", "_f"),
    )
    pre = blocks["alloc_ns"].isna()
    blocks.loc[pre, "size_bytes"] = -blocks.loc[pre, "free_size"]
    blocks.loc[pre, "ptr"] = blocks.loc[pre, "ptr_f"]
    blocks["tensor_id"] = blocks["tensor_id"].fillna(blocks["tensor_id_f"])
    blocks = blocks.drop(columns=["free_size", "ptr_f", "tensor_id_f"])

    # tensors seen only as op inputs: blocks from before the capture, still alive after it
    known = set(blocks["tensor_id"].dropna().astype("int64"))
    g = untracked[~untracked["tensor_id"].isin(known)]  # in order of first use
    if not g.empty:
        g = g.rename(columns={"extent": "size_bytes"})
        g = g[g["device"].isin(devices)]
        start_names = names[names["when"] == "start"][
            ["device", "ptr", "size_bytes"]
        ].drop_duplicates(["device", "ptr"])
        g = g.merge(
            start_names.rename(columns={"size_bytes": "live_size"}),
            on=["device", "ptr"],
            how="left",
        )
        size = np.maximum(g["size_bytes"], g["live_size"].fillna(0).astype("int64"))
        # a view's furthest byte is a request: CUDA's block around it is rounded
        cuda = g["device"].astype(str).str.startswith("cuda").to_numpy()
        g["size_bytes"] = np.where(cuda, cuda_block_bytes(size.to_numpy()), size)
        g = g.drop(columns=["live_size"])
        extra = pd.DataFrame(
            {
                "tensor_id": g["tensor_id"].astype("Int64"),
                "device": g["device"],
                "ptr": g["ptr"],
                "size_bytes": g["size_bytes"],
            }
        )
        blocks = pd.concat([blocks, extra], ignore_index=True)

    # Preexisting blocks first (alloc_ns NA), then by allocation time.
    blocks = blocks.sort_values(
        ["alloc_ns", "free_ns"], na_position="first", kind="stable"
    ).reset_index(drop=True)
    infer_invisible_frees(blocks)
    out = pd.DataFrame(
        {
            "alloc_id": np.arange(len(blocks), dtype=np.int64),
            "tensor_id": blocks["tensor_id"].astype("Int64"),
            "device": blocks["device"].astype(object),
            "ptr": blocks["ptr"].astype("int64"),
            "size_bytes": blocks["size_bytes"].astype("int64"),
            "alloc_ns": blocks["alloc_ns"].astype("Int64"),
            "free_ns": blocks["free_ns"].astype("Int64"),
            "alloc_op_id": blocks["alloc_op_id"].astype("Int64"),
            "free_op_id": blocks["free_op_id"].astype("Int64"),
            "category": pd.Categorical([None] * len(blocks), dtype=S.CATEGORY_DTYPE),
            "reason": pd.array([None] * len(blocks), dtype=S.STRING),
            "name": pd.array([None] * len(blocks), dtype=S.STRING),
            "module": pd.array([None] * len(blocks), dtype=S.STRING),
            "module_reason": pd.array([None] * len(blocks), dtype=S.STRING),
        }
    )
    return S.conform(out, S.ALLOCATIONS, name="allocations")


def infer_invisible_frees(blocks: pd.DataFrame) -> None:
    """Close pre-existing blocks whose address was handed out again during the capture.

    torch's CPU allocator does not report frees of blocks allocated before profiling began
    (it does not know their size). When a new block later starts at the same address on the
    same device, the old one was necessarily freed before: we end it there (``free_ns`` =
    the new allocation's time, no ``free_op_id``).
    """
    pre_open = (blocks["alloc_ns"].isna() & blocks["free_ns"].isna()).to_numpy()
    if not pre_open.any():
        return
    later = blocks[blocks["alloc_ns"].notna()]
    devices = blocks["device"].to_numpy(dtype=object)
    ptrs = blocks["ptr"].to_numpy(dtype=np.int64)
    for dev in pd.unique(devices[pre_open]):
        first_reuse = later[later["device"] == dev].groupby("ptr")["alloc_ns"].min()
        rows = np.flatnonzero(pre_open & (devices == dev))
        reuse = first_reuse.reindex(ptrs[rows])
        hit = reuse.notna().to_numpy()
        if hit.any():
            blocks.loc[blocks.index[rows[hit]], "free_ns"] = reuse.to_numpy()[hit].astype(np.int64)


# -- uses and versions ---------------------------------------------------------------------
def tensor_to_alloc(allocations: pd.DataFrame) -> pd.Series:
    t = allocations.dropna(subset=["tensor_id"])
    return (
        pd.Series(t["alloc_id"].to_numpy(), index=t["tensor_id"].astype("int64").to_numpy())
        .groupby(level=0)
        .first()
    )


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
    node = ops["node_id"].to_numpy(dtype=np.int64, na_value=-1)[refs["op_id"].to_numpy()]
    r = pd.DataFrame(
        {
            "op_id": node,
            "tensor_id": refs["tensor_id"].to_numpy(),
            "mutated": refs["mutable"].to_numpy(),
        }
    )
    r = r[r["op_id"] >= 0]
    e = r.groupby(["op_id", "tensor_id"], sort=False)["mutated"].any().reset_index()
    t2a = tensor_to_alloc(allocations)
    e["alloc_id"] = t2a.reindex(e["tensor_id"].to_numpy()).to_numpy()
    op_node = ops["node_id"].to_numpy(dtype=np.int64, na_value=-1)
    alloc_op = allocations["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1)
    alloc_node = np.where(alloc_op >= 0, op_node[np.maximum(alloc_op, 0)], -1)
    pos = e["alloc_id"].to_numpy(dtype=np.int64, na_value=-1)
    made_here = (pos >= 0) & (alloc_node[np.maximum(pos, 0)] == e["op_id"].to_numpy())
    e = e[~made_here]
    starts = ops["start_ns"].to_numpy()
    e = e.assign(_t=starts[e["op_id"].to_numpy()]).sort_values(["_t", "op_id"], kind="stable")
    m = e["mutated"].astype(np.int64)
    e["version"] = m.groupby(e["tensor_id"]).cumsum() - m
    e = e.drop(columns="_t")
    e["alloc_id"] = e["alloc_id"].astype("Int64")
    return S.conform(e, S.USES, name="uses")


def build_versions(
    allocations: pd.DataFrame, uses: pd.DataFrame, ops: pd.DataFrame
) -> pd.DataFrame:
    """Version 0 at creation (op: the op that allocated the block), +1 per in-place write
    (op: the data-flow node that wrote it)."""
    if allocations.empty:  # every version belongs to a block
        return S.empty(S.VERSIONS)
    t = allocations.dropna(subset=["tensor_id"]).drop_duplicates("tensor_id")
    v0 = pd.DataFrame(
        {
            "tensor_id": t["tensor_id"].astype("int64"),
            "version": 0,
            "alloc_id": t["alloc_id"],
            "start_ns": t["alloc_ns"],
            "op_id": t["alloc_op_id"],
        }
    )
    mut = uses[uses["mutated"]]
    vn = pd.DataFrame(
        {
            "tensor_id": mut["tensor_id"],
            "version": mut["version"] + 1,
            "alloc_id": mut["alloc_id"],
            "start_ns": pd.array(
                ops["start_ns"].to_numpy()[mut["op_id"].to_numpy()], dtype="Int64"
            ),
            "op_id": mut["op_id"].astype("Int64"),
        }
    ).dropna(subset=["alloc_id"])
    v = pd.concat([v0, vn], ignore_index=True).sort_values(["tensor_id", "version"], kind="stable")
    v["category"] = pd.Categorical([None] * len(v), dtype=S.CATEGORY_DTYPE)
    v["reason"] = pd.array([None] * len(v), dtype=S.STRING)
    return S.conform(v.reset_index(drop=True), S.VERSIONS, name="versions")


# -- names ---------------------------------------------------------------------------------
def names_table(rows: list) -> pd.DataFrame:
    if not rows:
        return S.empty(S.NAMES)
    name, role, device, ptr, size, when, module = zip(*rows)
    return pd.DataFrame(
        {
            "name": pd.array(name, dtype=S.STRING),
            "role": pd.Categorical([r.value for r in role], dtype=S.ROLE_DTYPE),
            "device": list(device),
            "ptr": np.asarray(ptr, dtype=np.int64),
            "size_bytes": np.asarray(size, dtype=np.int64),
            "when": list(when),
            "alloc_id": pd.array([None] * len(name), dtype="Int64"),
            "module": pd.array(module, dtype=S.STRING),
        }
    )


def match_names(names: pd.DataFrame, allocations: pd.DataFrame) -> pd.DataFrame:
    """Attach each named tensor to its block: names read at the start match blocks alive at
    the start (``alloc_ns`` NA), names read at the end match blocks alive at the end (``free_ns``
    NA; the latest allocated when an address was reused)."""
    if names.empty:
        return S.conform(names, S.NAMES, name="names")
    a = allocations
    start = a[a["alloc_ns"].isna()].drop_duplicates(["device", "ptr"], keep="first")
    end = (
        a[a["free_ns"].isna()]
        .sort_values("alloc_ns", na_position="first")
        .drop_duplicates(["device", "ptr"], keep="last")
    )
    out = names.copy()
    out["device"] = out["device"].astype(object)
    for when, blocks in (("start", start), ("end", end)):
        sel = out["when"] == when
        key = blocks.set_index([blocks["device"].astype(object), "ptr"])["alloc_id"]
        idx = pd.MultiIndex.from_frame(out.loc[sel, ["device", "ptr"]])
        out.loc[sel, "alloc_id"] = key.reindex(idx).to_numpy()
    out["alloc_id"] = out["alloc_id"].astype("Int64")
    return S.conform(out, S.NAMES, name="names")
