"""Categories from Python stacks and time order (snapshots).

They serve producers that record a stack per
allocator event instead of ops (a torch memory snapshot: ``Capture.stacks``).

What each stack says (its :class:`~jupyter_memprof._records.StackContext`: forward,
backward, ``optimizer.step()``, ``zero_grad()``, data loading, ``Module.to()``, a module's
``__init__``) is the producer's reading of the frames; the rules here decide what a block
is from the context it was made in, the context it was freed in, and whether it outlived
the recording. Like :data:`.categories.RULES` they run in order, the first that decides a
block winning, and each can be run alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._records import Capture, StackContext
from . import schema as S
from .categories import Decisions
from .schema import Category

C, X = Category, StackContext
__all__ = ["FRAME_RULES", "StackFacts", "categorise_by_frames", "stack_facts"]
_CODE = {c.value: i for i, c in enumerate(StackContext)}


@dataclass
class StackFacts:
    """Per block (by position in ``allocations``): the context codes of the stacks that
    made and freed it (-1: none recorded), whether it is older than the recording and
    whether it outlived it, and its callsite."""

    n: int
    made: np.ndarray
    freed: np.ndarray
    older: np.ndarray
    kept: np.ndarray
    callsite: np.ndarray
    alloc_ns: np.ndarray  # 0 for older blocks
    free_ns: np.ndarray  # int64 max for blocks alive at the end
    #: blocks whose making context was read from the time order (:func:`frameless_pass`)
    by_time: np.ndarray | None = None
    #: the category the file itself gives each block (None: none given)
    recorded: np.ndarray | None = None

    def alive_through(self, context: StackContext) -> np.ndarray:
        """Per block: was a block of ``context`` made while it was alive?"""
        times = np.sort(self.alloc_ns[self.made_in(context) & ~self.older])
        if not len(times):
            return np.zeros(self.n, dtype=bool)
        first = np.searchsorted(times, self.alloc_ns, side="left")
        return (first < len(times)) & (times[np.minimum(first, len(times) - 1)] < self.free_ns)

    def made_in(self, *contexts: StackContext) -> np.ndarray:
        return np.isin(self.made, [_CODE[c.value] for c in contexts])

    def freed_in(self, *contexts: StackContext) -> np.ndarray:
        return np.isin(self.freed, [_CODE[c.value] for c in contexts])


def _nth(device, ptr, time) -> pd.DataFrame:
    df = pd.DataFrame({"d": device, "p": ptr, "t": time})
    df["k"] = df.groupby(["d", "p", "t"], sort=False).cumcount()
    return df


def _match(blocks: pd.DataFrame, records: pd.DataFrame, stack: np.ndarray) -> np.ndarray:
    """The stack of each block row from the record with its (device, address, time, n-th)."""
    out = np.full(len(blocks), -1, dtype=np.int64)
    if blocks.empty or records.empty:
        return out
    key = pd.MultiIndex.from_frame(records[["d", "p", "t", "k"]])
    pos = key.get_indexer(pd.MultiIndex.from_frame(blocks[["d", "p", "t", "k"]]))
    ok = pos >= 0
    out[ok] = stack[pos[ok]]
    return out


def stack_facts(allocations: pd.DataFrame, mem: pd.DataFrame, capture: Capture) -> StackFacts:
    """The :class:`StackFacts` of ``allocations``: blocks meet the memory records that made
    and freed them by device, address, time and order (an address is one block at a time),
    blocks older than the recording meet ``capture.older``."""
    st = capture.stacks
    ctx = np.array([_CODE[c] for c in st.context] + [-1], dtype=np.int64)  # [-1]: NO_ID
    of_mem = np.asarray(st.of_memory, dtype=np.int64)
    a = allocations
    n = len(a)
    dev = a["device"].astype(object).to_numpy()
    ptr = a["ptr"].to_numpy()
    has_a, has_f = a["alloc_ns"].notna().to_numpy(), a["free_ns"].notna().to_numpy()
    alloc_ns = a["alloc_ns"].to_numpy(dtype=np.int64, na_value=0)
    free_ns = a["free_ns"].to_numpy(dtype=np.int64, na_value=0)
    made = np.full(n, -1, dtype=np.int64)  # by block: its memory record's position
    freed = np.full(n, -1, dtype=np.int64)
    m_dev, m_ptr = mem["device"].astype(object).to_numpy(), mem["ptr"].to_numpy()
    m_t, m_size = mem["time_ns"].to_numpy(), mem["size"].to_numpy()
    codes, _ = pd.factorize(np.concatenate([dev, m_dev]))
    b_dev, r_dev = codes[:n], codes[n:]
    for rows, times, sign, out in ((has_a, alloc_ns, 1, made), (has_f, free_ns, -1, freed)):
        idx = np.flatnonzero(rows)
        # blocks at one address and time in the order they lived (a freed one first)
        order = idx[np.lexsort((~has_f[idx], free_ns[idx], times[idx], ptr[idx], b_dev[idx]))]
        recs = np.flatnonzero(m_size * sign > 0)  # records in file order within a key
        recs = recs[np.lexsort((recs, m_t[recs], m_ptr[recs], r_dev[recs]))]
        same = len(order) == len(recs) and all(
            np.array_equal(x[order], y[recs])
            for x, y in ((b_dev, r_dev), (ptr, m_ptr), (times, m_t))
        )
        if same:  # one record per block, as a snapshot's are: matched in order
            out[order] = recs
            continue
        blocks = _nth(dev[order], ptr[order], times[order])
        records = _nth(m_dev[recs], m_ptr[recs], m_t[recs])
        out[order] = _match(blocks, records, recs)
    made_rec = made
    of_mem = np.append(of_mem, -1)  # [-1]: no record
    made, freed = of_mem[made], of_mem[freed]
    if st.of_older:
        alive = np.flatnonzero(~has_a & ~has_f)
        key = {(o.device, o.ptr): s for o, s in zip(capture.older, st.of_older)}
        made[alive] = [key.get(k, -1) for k in zip(dev[alive].tolist(), ptr[alive].tolist())]
    cs = np.array([*st.callsite, None], dtype=object)
    recorded = None
    if st.recorded is not None:
        recorded = np.array([*st.recorded, None], dtype=object)[made_rec]
        recorded[~has_a] = None
    return StackFacts(
        n=n,
        made=ctx[made],
        freed=ctx[freed],
        older=~has_a,
        kept=~has_f,
        callsite=cs[made],
        alloc_ns=np.where(has_a, alloc_ns, 0),
        free_ns=np.where(has_f, free_ns, np.iinfo(np.int64).max),
        recorded=recorded,
    )


# -- the rules, most certain first -----------------------------------------------------------
def recorded_category_rule(f: StackFacts, d: Decisions) -> None:
    """The category the file itself gives the block: torch's ``profile_plot`` writes one
    on each allocation of the snapshots it makes from a profiler run, and so does
    :meth:`Profile.to_snapshot` (ours, read back). Only categories of our vocabulary
    count; ``unknown`` decides nothing."""
    if f.recorded is None:
        return
    for category in C:
        if category is C.UNKNOWN:
            continue
        d.decide(f.recorded == category.value, category, "the category the file records")


def module_setup_rule(f: StackFacts, d: Decisions) -> None:
    """Made by ``Module.to()`` / ``.cuda()`` (``Module._apply``) or in a torch module's
    ``__init__`` and not freed there: a module's ``parameter`` (or buffer)."""
    setup = f.made_in(X.MODULE_TO, X.MODULE_INIT) & ~f.freed_in(X.MODULE_TO, X.MODULE_INIT)
    d.decide(setup & f.made_in(X.MODULE_TO), C.PARAMETER, "made by Module.to() / .cuda()")
    d.decide(setup, C.PARAMETER, "made in a module's __init__")


def optimizer_rule(f: StackFacts, d: Decisions) -> None:
    """Made inside ``optimizer.step()``: freed inside a step, ``temporary``; kept past it
    (to the end, or freed elsewhere), ``optimizer_state``."""
    made = f.made_in(X.OPTIMIZER_STEP)
    d.decide(made & f.freed_in(X.OPTIMIZER_STEP), C.TEMPORARY, "made and freed in optimizer.step()")
    d.decide(made, C.OPTIMIZER_STATE, "made in optimizer.step(), kept past it")


def backward_rule(f: StackFacts, d: Decisions) -> None:
    """Made during ``backward()``: freed during backward, ``autograd_detail``; kept past it
    (freed by ``zero_grad()``, the optimizer or later, or alive at the end), ``gradient``."""
    made = f.made_in(X.BACKWARD)
    d.decide(made & f.freed_in(X.BACKWARD), C.AUTOGRAD_DETAIL, "made and freed in backward")
    d.decide(made, C.GRADIENT, "made in backward, kept past it")


def forward_rule(f: StackFacts, d: Decisions) -> None:
    """Made inside a module's forward: ``activation``, saved for backward when backward
    freed it."""
    made = f.made_in(X.FORWARD)
    d.decide(made & f.freed_in(X.BACKWARD), C.ACTIVATION, "made in forward, freed in backward")
    d.decide(made, C.ACTIVATION, "made in forward")


def setup_work_rule(f: StackFacts, d: Decisions) -> None:
    """Made by ``zero_grad()`` (gradients zeroed into new blocks): ``gradient``; by data
    loading (a DataLoader, its collate): ``input``."""
    d.decide(f.made_in(X.ZERO_GRAD), C.GRADIENT, "made by zero_grad()")
    d.decide(f.made_in(X.DATA), C.INPUT, "made by data loading")


def outside_rule(f: StackFacts, d: Decisions) -> None:
    """Made by user code outside the model, the backward and the optimizer, by time order:
    freed in backward, an ``activation`` (the loss's work on forward results); alive while
    a forward ran, or kept to the end, ``input`` (data not part of the forward-backward-
    update loop, as torch defines inputs); else ``temporary``."""
    made = f.made_in(X.OTHER)
    d.decide(
        made & f.freed_in(X.BACKWARD), C.ACTIVATION, "made outside the model, freed in backward"
    )
    d.decide(made & f.alive_through(X.FORWARD), C.INPUT, "made outside the model, alive in forward")
    d.decide(made & f.kept, C.INPUT, "made outside the model, kept")
    d.decide(made, C.TEMPORARY, "made and freed outside the model")


def older_rule(f: StackFacts, d: Decisions) -> None:
    """Older than the recorded history with no stack of its making: freed in backward, an
    ``activation``; freed by the optimizer or ``zero_grad()``, a ``gradient`` or the step's
    own (``unknown``: which one the frames cannot say); else ``unknown``, named as such."""
    old = f.older & (f.made < 0)
    d.decide(
        old & f.freed_in(X.BACKWARD), C.ACTIVATION, "older than the history, freed in backward"
    )
    d.decide(old & f.kept, C.UNKNOWN, "older than the recorded history, alive throughout")
    d.decide(old, C.UNKNOWN, "older than the recorded history")


def fallback_rule(f: StackFacts, d: Decisions) -> None:
    """Otherwise ``unknown``: no Python frames recorded (C++ only, or another thread)."""
    d.decide(np.ones(f.n, dtype=bool), C.UNKNOWN, "no rule applies to its frames")


#: The frame rules, in order: the first that decides a block wins.
FRAME_RULES = (
    recorded_category_rule,
    module_setup_rule,
    optimizer_rule,
    backward_rule,
    forward_rule,
    setup_work_rule,
    outside_rule,
    older_rule,
    fallback_rule,
)


def frameless_pass(f: StackFacts) -> None:
    """Allocations and frees with no Python frames (on a GPU, the autograd engine's device
    threads record none: backward's blocks and the activations it frees) take the context
    of the event before them in time that has one: the main thread was in ``backward()``
    then. Sets ``f.by_time`` (made so) and fills ``f.made`` / ``f.freed``."""
    none = {-1, _CODE[X.NONE.value]}
    made_ev = np.flatnonzero(~f.older)
    freed_ev = np.flatnonzero(f.free_ns < np.iinfo(np.int64).max)
    times = np.concatenate([f.alloc_ns[made_ev], f.free_ns[freed_ev]])
    codes = np.concatenate([f.made[made_ev], f.freed[freed_ev]])
    order = np.argsort(times, kind="stable")
    c = codes[order]
    known = ~np.isin(c, list(none))
    last = np.maximum.accumulate(np.where(known, np.arange(len(c)), -1)) if len(c) else c
    filled = np.where(known | (last < 0), c, c[np.maximum(last, 0)])
    codes[order] = filled
    k = len(made_ev)
    f.by_time = np.zeros(f.n, dtype=bool)
    f.by_time[made_ev] = np.isin(f.made[made_ev], list(none)) & ~np.isin(codes[:k], list(none))
    f.made[made_ev], f.freed[freed_ev] = codes[:k], codes[k:]


def _mark_by_time(f: StackFacts, d: Decisions) -> None:
    """Say so in the reason of blocks whose context came from the time order."""
    if f.by_time is None or not f.by_time.any():
        return
    for code in np.unique(d.why[f.by_time]).tolist():
        text = d.reasons.values[code]
        d.why[f.by_time & (d.why == code)] = d.reasons(f"{text} (no frames: by time)")


def categorise_by_frames(allocations: pd.DataFrame, mem: pd.DataFrame, capture: Capture):
    """``allocations`` with ``category`` and ``reason`` from :data:`FRAME_RULES`, after
    :func:`frameless_pass`."""
    if allocations.empty or capture.stacks is None:
        return allocations
    f = stack_facts(allocations, mem, capture)
    frameless_pass(f)
    d = Decisions(f.n)
    for rule in FRAME_RULES:
        rule(f, d)
    _mark_by_time(f, d)
    return allocations.assign(
        category=pd.Categorical.from_codes(d.cat, dtype=S.CATEGORY_DTYPE),
        reason=d.reasons.column(d.why),
        callsite=pd.array(f.callsite, dtype=S.STRING),
    )
