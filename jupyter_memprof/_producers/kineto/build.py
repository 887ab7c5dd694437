"""A trace's spans and memory events as a Capture.

What a Kineto trace holds, and how each record is made from it:

- ops: ``cpu_op`` and ``user_annotation`` events, nested by time on their thread (a trace
  has no parent links: an event inside another's interval is its child). Kinds by name:
  ``autograd::engine::evaluate_function: ...`` and the autograd node it runs are backward
  nodes, ``Optimizer.step#...`` / ``Optimizer.zero_grad#...`` the optimizer, ``aten::...``
  (and other ``ns::op``) dispatcher ops, everything else an annotation (``ProfilerStep#N``
  starts a step). ``Sequence number`` links forward ops with their backward nodes, so the
  analysis finds the forward phase even with no module events.
- modules: ``python_function`` events named ``nn.Module: Linear_0`` (``with_stack=True``) are
  module calls, named by what the trace calls them (``Linear_0``).
- callsite: the innermost ``python_function`` of user code around an op (not torch's own,
  not the standard library's), ``file.py:12 in fn``; ops run by ``Tensor.backward()`` /
  ``torch.autograd.backward`` (the seed gradient) count as backward.
- memory: ``[memory]`` events paired into blocks by (device, address): a free closes the open
  block at its address; a free with none is a block from before the trace. The op of each
  event is the innermost op around its time on its thread. A trace has no tensor ids: every
  block is a raw block to the analysis. On CUDA the allocator's totals (``Total Allocated``,
  ``Total Reserved``) go with every event; the CPU's are counted from the trace's start, so
  they are left out.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..._records import (
    NO_ID,
    Capture,
    DeviceTotals,
    MemoryRecord,
    OpRecord,
    Trace,
)
from ..._vocab import OpKind
from .frames import MODULE_PREFIX
from .frames import frame_facts as _frame_facts
from .source import Mem, Span, TraceFile

__all__ = ["build_capture"]

_EVALUATE = "autograd::engine::evaluate_function"
_MODULE_PREFIX = MODULE_PREFIX
_FOREVER = 1 << 62


def _kind(span: Span, parent_kind: OpKind | None) -> OpKind:
    name = span.name
    if name.startswith(_EVALUATE):
        return OpKind.BACKWARD
    if span.cat == "user_annotation":
        return OpKind.OPTIMIZER if name.startswith("Optimizer.") else OpKind.ANNOTATION
    if parent_kind is OpKind.BACKWARD and "::" not in name:
        return OpKind.BACKWARD  # the autograd node an evaluate_function runs
    if name.startswith("Optimizer."):
        return OpKind.OPTIMIZER
    return OpKind.OP if "::" in name else OpKind.ANNOTATION


class _Frame:
    """A Python call open on a thread: its end, the user's callsite around it, whether it
    is the backward pass itself."""

    __slots__ = ("end", "callsite", "autograd")

    def __init__(self, end: int, callsite: str | None, autograd: bool):
        self.end, self.callsite, self.autograd = end, callsite, autograd


def _python_frame(span: Span, outer: _Frame | None, memo: dict) -> _Frame:
    facts = memo.get(span.name)
    if facts is None:
        facts = memo[span.name] = _frame_facts(span.name)
    callsite, autograd = facts
    if outer is not None:
        callsite = callsite or outer.callsite
        autograd = autograd or outer.autograd
    return _Frame(span.end_ns, callsite, autograd)


#: an op open on a thread, as a tuple: (end, op_id, depth, node, module_ctx, backward,
#: optimizer, kind); the thread's outside
_OUTSIDE = (_FOREVER, NO_ID, -1, NO_ID, NO_ID, False, False, None)


def _ordered(spans: list[Span]) -> list[int]:
    """The spans in the order of a walk: by start, a longer span before the ones it
    contains, then in file order."""
    n = len(spans)
    start = np.fromiter((s.start_ns for s in spans), dtype=np.int64, count=n)
    end = np.fromiter((s.end_ns for s in spans), dtype=np.int64, count=n)
    return np.lexsort((np.arange(n), -end, start)).tolist()


def _walk(spans: list[Span]):
    """Ops (in start order: a pre-order) and the module names by index."""
    ops: list[OpRecord] = []
    modules: list[str] = []
    open_ops: dict[int, list[tuple]] = defaultdict(list)
    open_py: dict[int, list[_Frame]] = defaultdict(list)
    memo: dict[str, tuple[str | None, bool]] = {}
    kinds: dict[tuple, OpKind] = {}
    for i in _ordered(spans):
        s = spans[i]
        st, py = open_ops[s.tid], open_py[s.tid]
        # an event ends where the next one on its thread starts (times are rounded to the
        # microsecond's thousandths): a span there is the next, not a child
        closed = s.start_ns + 1
        while st and st[-1][0] < closed:
            st.pop()
        while py and py[-1].end < closed:
            py.pop()
        frame = py[-1] if py else None
        top = st[-1] if st else _OUTSIDE
        op_id = len(ops)
        module_index = NO_ID
        if s.cat == "python_function":
            if not s.name.startswith(_MODULE_PREFIX):
                py.append(_python_frame(s, frame, memo))
                continue
            kind = OpKind.MODULE  # an nn.Module call
            module_index = len(modules)
            modules.append(s.name[len(_MODULE_PREFIX) :])
        else:
            key = (s.name, s.cat, top[7] is OpKind.BACKWARD)
            kind = kinds.get(key)
            if kind is None:
                kind = kinds[key] = _kind(s, top[7])
        backward = top[5] or kind is OpKind.BACKWARD or (frame is not None and frame.autograd)
        optimizer = top[6] or kind is OpKind.OPTIMIZER
        node = top[3]
        if node < 0 and (kind is OpKind.OP or kind is OpKind.BACKWARD):
            node = op_id
        ops.append(
            OpRecord(
                op_id, top[1], top[2] + 1, s.name, kind, s.start_ns, s.end_ns, s.tid,
                s.seq_nr if s.seq_nr >= 0 else NO_ID, backward, optimizer, module_index,
                top[4], frame.callsite if frame is not None else None, s.shapes, node,
            )
        )  # fmt: skip
        module_ctx = op_id if kind is OpKind.MODULE else top[4]
        st.append((s.end_ns, op_id, top[2] + 1, node, module_ctx, backward, optimizer, kind))
    return ops, modules


def _enclosing_ops(ops: list[OpRecord], mems: list[Mem]) -> np.ndarray:
    """Each memory event's op (by position in ``mems``): the innermost op of its thread
    open at its time, an op ending at that very instant included; NO_ID when none.

    The last op of the thread to start at or before the event (ops are in start order,
    nested by their parents) is the innermost one open then, unless it ended before the
    event: then its innermost open ancestor is, found for all events at once, one level of
    parents per step."""
    n = len(ops)
    mem_op = np.full(len(mems), NO_ID, dtype=np.int64)
    if not n or not mems:
        return mem_op
    start = np.fromiter((o.start_ns for o in ops), dtype=np.int64, count=n)
    end = np.fromiter((o.end_ns for o in ops), dtype=np.int64, count=n)
    parent = np.fromiter((o.parent_id for o in ops), dtype=np.int64, count=n)
    tid = np.array([o.thread for o in ops], dtype=object)
    m_time = np.fromiter((m.time_ns for m in mems), dtype=np.int64, count=len(mems))
    m_tid = np.array([m.tid for m in mems], dtype=object)
    for t in set(m_tid.tolist()):
        mine = np.flatnonzero(m_tid == t)
        theirs = np.flatnonzero(tid == t)
        if not len(theirs):
            continue
        pos = np.searchsorted(start[theirs], m_time[mine], side="right") - 1
        mem_op[mine] = np.where(pos >= 0, theirs[np.maximum(pos, 0)], NO_ID)
    while True:
        late = np.flatnonzero(mem_op >= 0)
        late = late[end[mem_op[late]] < m_time[late]]
        if not len(late):
            return mem_op
        mem_op[late] = parent[mem_op[late]]


def _memory(mems: list[Mem], mem_op: list[int]) -> tuple[list[MemoryRecord], dict]:
    """Blocks paired by (device, address), in time order; and what else the trace said:
    out-of-memory events, frees whose size differs from their block's."""
    order = sorted(range(len(mems)), key=lambda k: mems[k].time_ns)
    open_blocks: dict[tuple[str, int], tuple[int, int]] = {}
    out: list[MemoryRecord] = []
    ooms: list[dict] = []
    odd = 0
    next_id = 0
    for k in order:
        m = mems[k]
        cuda = m.device.startswith("cuda")
        totals = (m.total_allocated, m.total_reserved) if cuda else (NO_ID, NO_ID)
        if m.oom:
            ooms.append(
                {"time_ns": m.time_ns, "device": m.device, "bytes": m.size,
                 "total_allocated": m.total_allocated, "total_reserved": m.total_reserved}
            )  # fmt: skip
            continue
        if m.size == 0:
            continue
        key = (m.device, m.addr)
        if m.size > 0:
            open_blocks[key] = (next_id, m.size)
            out.append(
                MemoryRecord(
                    m.time_ns, m.addr, m.size, NO_ID, next_id, m.device, mem_op[k], *totals
                )
            )
            next_id += 1
            continue
        block = open_blocks.pop(key, None)
        if block is None:  # allocated before the trace
            block = (next_id, -m.size)
            next_id += 1
        elif block[1] != -m.size:
            odd += 1
        out.append(
            MemoryRecord(
                m.time_ns, m.addr, -block[1], NO_ID, block[0], m.device, mem_op[k], *totals
            )
        )
    return out, {"ooms": ooms, "mismatched_frees": odd}


def _cuda_totals(records: list[MemoryRecord], first: bool) -> dict[str, DeviceTotals]:
    """Per CUDA device, the allocator's totals before its first event (``first``) or after
    its last, from the totals the trace carries; the device's free and total are unknown
    (0)."""
    out: dict[str, DeviceTotals] = {}
    for r in records if first else reversed(records):
        if r.device in out or r.total_allocated < 0:
            continue
        if first:
            out[r.device] = DeviceTotals(r.total_allocated - r.size, r.total_reserved, 0, 0)
        else:
            out[r.device] = DeviceTotals(r.total_allocated, r.total_reserved, 0, 0)
    return out


def build_capture(tf: TraceFile) -> tuple[Capture, dict]:
    """The Capture of a trace file, and the meta only a trace gives (``oom_events``,
    ``rank``, ...)."""
    ops, modules = _walk(tf.spans)
    mem_op = _enclosing_ops(ops, tf.mems).tolist()
    memory, extra = _memory(tf.mems, mem_op)
    devices = sorted({r.device for r in memory} | {o["device"] for o in extra["ooms"]})
    times = [o.start_ns for o in ops[:1]] + [r.time_ns for r in memory[:1]]
    capture = Capture(
        trace=Trace(ops, [], memory, [], tf.event_count),
        names=[],
        module_paths=modules,
        module_classes=[m.rsplit("_", 1)[0] for m in modules],
        devices=devices,
        start_ns=min(times) if times else None,
        totals_start=_cuda_totals(memory, True) or None,
        totals_end=_cuda_totals(memory, False) or None,
    )
    meta = {
        "oom_events": extra["ooms"],
        "mismatched_frees": extra["mismatched_frees"],
        "skipped_memory_events": tf.skipped_devices,
    }
    return capture, meta
