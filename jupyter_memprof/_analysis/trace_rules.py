"""Category rules for profiles with no tensor ids (traces).

Such profiles are traces torch's profiler wrote
(Kineto JSON) and other files that record blocks but not the tensors in them.

Without tensor ids the analysis cannot follow data (which op read a block, what
``AccumulateGrad`` wrote), so these rules read only when a block was made and freed, by
phase: they run only when no block of the profile has a tensor id, so a capture's blocks
are never decided by them.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .arrays import BACKWARD, FORWARD, OPTIMIZER, OTHER
from .facts import Facts
from .schema import Category

__all__ = ["no_tensor_ids", "trace_rule"]

C = Category


def no_tensor_ids(f: Facts) -> bool:
    """Whether the profile has blocks and none of them a tensor id (a trace)."""
    tid = f.tables["allocations"]["tensor_id"]
    return bool(len(tid)) and bool(tid.isna().all())


def trace_rule(f: Facts, d) -> None:
    """2d. With no tensor ids (a trace): a block made in backward that outlives the
    backward pass is a ``gradient``; one made by the optimizer that outlives its step is
    ``optimizer_state``; one made outside the model, never freed by the model or the
    optimizer, of the size of such a gradient on its device is a ``parameter`` (one per
    gradient, in the order they were made)."""
    if not no_tensor_ids(f):
        return
    made = f.created
    grad = made & (f.alloc_phase == BACKWARD) & (f.free_phase != BACKWARD)
    d.decide(grad, C.GRADIENT, "made in backward, outlived it (no tensor ids)")
    state = made & (f.alloc_phase == OPTIMIZER) & (f.free_phase != OPTIMIZER)
    d.decide(state, C.OPTIMIZER_STATE, "made by the optimizer, outlived its step (no tensor ids)")
    allocs = f.tables["allocations"]
    size = allocs["size_bytes"].to_numpy(dtype=np.int64)
    dev = allocs["device"].astype(object).to_numpy()
    left = Counter(zip(dev[grad].tolist(), size[grad].tolist()))
    if not left:
        return
    unfreed = ~np.isin(f.free_phase, (FORWARD, BACKWARD, OPTIMIZER))
    cands = np.flatnonzero(made & (f.alloc_phase == OTHER) & unfreed)
    order = cands[
        np.argsort(allocs["alloc_ns"].to_numpy(dtype=np.int64, na_value=0)[cands], kind="stable")
    ]
    param = np.zeros(f.n, dtype=bool)
    for i in order.tolist():
        key = (dev[i], int(size[i]))
        if left[key] > 0:
            left[key] -= 1
            param[i] = True
    d.decide(param, C.PARAMETER, "made outside the model, the size of a gradient (no tensor ids)")
