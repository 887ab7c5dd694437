"""FSDP2's all-gathered parameters and reduce-scattered gradients.

``fully_shard`` (FSDP2) keeps only this rank's shard of every parameter between steps (a
DTensor, named by the live session like any parameter). Around each sharded module's
forward and backward it all-gathers the module's full parameters and frees them again, and
after the module's backward it reduce-scatters the module's full gradients into this
rank's shard. None of those blocks is held by anything the session names, and their ops
run inside FSDP's hooks, outside the module or in backward. What tells them apart is FSDP's
own profiler labels (``record_function``), which wrap every such step and name the module
(relative to the ``fully_shard`` root):

- ``FSDP::all_gather (blocks.3)``: the flat buffer every rank's shards are gathered into
  (``parameter``, "all-gathered by FSDP for model.blocks.3");
- ``FSDP::all_gather_copy_out (blocks.3)``: the unsharded parameters the module computes
  with (``parameter``, "unsharded by FSDP for model.blocks.3");
- ``FSDP::post_backward_reduce (blocks.3)``: the module's full gradients copied into one
  buffer and reduce-scattered (or all-reduced) across ranks (``gradient``, "reduce-scattered
  by FSDP for model.blocks.3"); the shard it leaves in ``.grad`` is named by the session.

Every block made under one of these labels counts, also the copies a collective makes for
itself and frees before it returns (gloo's): they hold the same parameters or gradients.

The label without a module is the root's own group (its parameters outside every sharded
submodule). Module paths are completed with the root's path, read from the labels that run
inside a module call (``FSDP::pre_forward (blocks.0)`` inside ``model.blocks.0``). A pure
function of the ops table, used by :mod:`~jupyter_memprof._analysis.categories`.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

import numpy as np
import pandas as pd

from .._records import DDP_BUCKET_MARKER
from .arrays import levels
from .schema import Category, OpKind

#: FSDP2's labels: the step, the module's path under the root (optional), a process group.
_LABEL = re.compile(r"^FSDP::(?P<step>[a-z_]+)(?: \((?P<fqn>[^()]*)\))?(?: \[pg=\d+\])?$")

#: The steps whose blocks this rule names: (category, reason before the module's path).
STEPS = {
    "all_gather": (Category.PARAMETER, "all-gathered by FSDP for"),
    "all_gather_copy_out": (Category.PARAMETER, "unsharded by FSDP for"),
    "post_backward_reduce": (Category.GRADIENT, "reduce-scattered by FSDP for"),
}
#: DDP's gradient buckets (a real capture's are found by the collective that reduces them;
#: estimate mode's stand-in for DDP makes them under :data:`DDP_BUCKET_MARKER`).
BUCKET_REASON = "gradient bucket, reduced across ranks in backward"
#: The module's reason for such a block: its own parameters, or gradients.
MODULE_REASONS = {
    Category.PARAMETER: "its parameters, unsharded by FSDP",
    Category.GRADIENT: "its gradients, reduce-scattered by FSDP",
}


class FsdpBlocks(NamedTuple):
    """Per op (by ``op_id``): the FSDP step it runs in (-1: none) and the module's path
    (None for DDP's buckets)."""

    step: np.ndarray  # index into the list of (category, reason, module) of ``labels``
    labels: list[tuple[Category, str, str]]


def _root(names: list[str], modules: list) -> str | None:
    """The ``fully_shard`` root's path: from FSDP labels run inside a module call, the most
    common prefix left when the label's path is taken off the module's path."""
    found: Counter = Counter()
    for name, module in zip(names, modules):
        m = _LABEL.match(name)
        if m is None or not isinstance(module, str):
            continue
        fqn = m.group("fqn") or ""
        if not fqn and m.group("step") in ("root_pre_forward", "pre_forward", "post_forward"):
            found[module] += 1
        elif fqn and module.endswith("." + fqn):
            found[module[: -len(fqn) - 1]] += 1
    return found.most_common(1)[0][0] if found else None


def fsdp_steps(ops: pd.DataFrame) -> FsdpBlocks:
    """For every op, the innermost FSDP step among itself and its ancestors that
    :data:`STEPS` names, as an index into ``labels`` ((category, reason, module path))."""
    n = len(ops)
    step = np.full(n, -1, dtype=np.int64)
    labels: list[tuple[Category, str, str]] = []
    if not n:
        return FsdpBlocks(step, labels)
    is_label = (ops["kind"].astype(object) == OpKind.ANNOTATION.value).to_numpy()
    rows = np.flatnonzero(is_label)
    names = ops["name"].astype(object).to_numpy()[rows].tolist()
    if not any(str(nm).startswith(("FSDP::", "DDP::")) for nm in names):
        return FsdpBlocks(step, labels)
    modules = ops["module"].astype(object).to_numpy()[rows].tolist()
    root = _root(names, modules)
    index: dict[tuple, int] = {}
    for row, name in zip(rows.tolist(), names):
        if name == DDP_BUCKET_MARKER:  # no module: a bucket holds every module's gradients
            step[row] = index.setdefault((Category.GRADIENT, BUCKET_REASON, None), len(index))
            continue
        m = _LABEL.match(str(name))
        if m is None or m.group("step") not in STEPS:
            continue
        category, reason = STEPS[m.group("step")]
        fqn = m.group("fqn") or ""
        path = ".".join(p for p in (root, fqn) if p) or "the root module of fully_shard"
        key = (category, f"{reason} {path}", path)
        step[row] = index.setdefault(key, len(index))
    labels = list(index)
    parent = ops["parent_id"].to_numpy(dtype=np.int64, na_value=-1)
    for level in levels(ops["depth"].to_numpy())[1:]:
        inherit = (step[level] < 0) & (parent[level] >= 0)
        step[level[inherit]] = step[parent[level[inherit]]]
    return FsdpBlocks(step, labels)


#: FSDP's labels that end each kind of its buffers: a module's all-gathered buffer is done
#: once that module's parameters are copied out of it; the reduce-scatter buffers once FSDP
#: waits for the reduce-scatter (before the next group's, or at the end of backward).
_ENDS = {
    "all-gathered by FSDP for": ("all_gather_copy_out",),
    "reduce-scattered by FSDP for": ("post_backward_rs_wait", "root_post_backward_callback"),
}


def fsdp_releases(allocs: pd.DataFrame, ops: pd.DataFrame) -> dict[int, int]:
    """Block position -> op position of the label at whose end FSDP is done with that
    communication buffer: the first label of :data:`_ENDS` that starts after the buffer was
    made (for an all-gather, one of the same module; the root's own group has no path in
    its labels). Buffers that no such label follows are left out."""
    if allocs.empty or ops.empty:
        return {}
    reason = allocs["reason"].astype(object).fillna("")
    todo = [
        (i, prefix)
        for prefix in _ENDS
        for i in np.flatnonzero(reason.str.startswith(prefix).to_numpy()).tolist()
    ]
    if not todo:
        return {}
    rows = np.flatnonzero((ops["kind"].astype(object) == OpKind.ANNOTATION.value).to_numpy())
    labels = []  # (op position, step, module path under the root), in start order
    for row, name in zip(rows.tolist(), ops["name"].astype(object).to_numpy()[rows].tolist()):
        m = _LABEL.match(str(name))
        if m is not None:
            labels.append((row, m.group("step"), m.group("fqn") or ""))
    start = ops["start_ns"].to_numpy(dtype=np.int64)
    alloc_ns = allocs["alloc_ns"].to_numpy(dtype=np.int64, na_value=0)
    out: dict[int, int] = {}
    for i, prefix in todo:
        path = reason.iat[i][len(prefix) :].strip()
        for row, step, fqn in labels:
            if step not in _ENDS[prefix] or start[row] <= alloc_ns[i]:
                continue
            if step == "all_gather_copy_out" and not (
                path == fqn or path.endswith("." + fqn) if fqn else "." not in path
            ):
                continue
            out[i] = row
            break
    return out


def end_unseen_frees(allocs: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """End FSDP's communication buffers whose free the capture never saw.

    A collective's buffers are held by its work object too, and the communication backend's
    thread (gloo's) may drop the last reference: torch's profiler sees only the threads it
    profiles, so such a free goes unrecorded and the buffer would look alive to the end.
    FSDP keeps none of them past its step: a buffer that nothing names at the end and that
    has no free is ended when FSDP is done with it (:func:`fsdp_releases`)."""
    open_ = allocs["free_ns"].isna() & allocs["alloc_ns"].notna() & allocs["name"].isna()
    if not open_.any():
        return allocs
    ends = fsdp_releases(allocs, ops)
    hit = [i for i in np.flatnonzero(open_.to_numpy()).tolist() if i in ends]
    if not hit:
        return allocs
    end = ops["end_ns"].to_numpy(dtype=np.int64)
    free_ns = allocs["free_ns"].copy()
    free_op = allocs["free_op_id"].copy()
    for i in hit:
        free_ns.iat[i], free_op.iat[i] = int(end[ends[i]]), ends[i]
    return allocs.assign(free_ns=free_ns, free_op_id=free_op)
