"""torch's profiler event tree, read once into plain records.

It walks the event tree of a finished ``torch.profiler.profile`` run
(``kineto_results.experimental_event_tree()``) once, and turns it into plain named
records: :class:`OpRecord` for ops, :class:`TensorRef` for the tensors an op reads or writes,
and :class:`MemoryRecord` for allocator events. Everything downstream works on these records
and never sees ``torch._C``.

Op nesting comes from time containment on each thread, not from the tree's shape: with
Python stacks recorded, a ``record_function`` annotation sits inside the short Python frame
that opened it, and the ops it encloses are not its children in the tree. The tree is still
used for what it is right about: the Python frames above each op (callsite). ``op_id`` is
the position in start-time order, so parents precede their children.

Module calls come from one of two sources. Without Python stacks, the capture's hooks
bracket each call with a ``memprof.module#<index>`` annotation. With Python stacks
(``tracer_modules``), the Python tracer already records every ``nn.Module`` call as a frame
carrying the module's address and class, so those frames become the module ops and
``Trace.module_calls`` lists each module's ``(id, class name)`` by ``module_index``: the
hooks would only add events (about 20 per module call) and stop time.

:func:`read_trace` is the loop over the events, Python frames read inline; ops, their
inputs and allocator events are read by closures over the walk's state (:class:`_Walk`):
a call per event of those kinds, measured no slower than one long loop within the noise
(214k events of an Adam loop with Python stacks, CPU time, interleaved rounds: 0.97x to
1.03x the loop's median; every table built, 0.99x).

Which arguments an op writes comes from :mod:`.op_schemas`, callsites from
:mod:`.frame_names`. Differences between torch releases are guarded here (``getattr`` with
defaults for fields that come and go, such as ``forward_tid``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .._records import (
    CLOSURE_MARKER,
    MODULE_MARKER,
    NO_ID,
    MemoryRecord,
    OpRecord,
    TensorRef,
    Trace,
    UntrackedTensor,
)
from .._vocab import OpKind
from .frame_names import FrameNamer
from .op_schemas import AMBIGUOUS, SCHEMAS, mutable_arguments

try:  # private API: present in every torch this package supports (>= 2.13)
    from torch._C._profiler import (
        RecordScope,
        _ExtraFields_Allocation,
        _ExtraFields_PyCall,
        _ExtraFields_PyCCall,
        _ExtraFields_TorchOp,
        _TensorMetadata,
    )
except ImportError as exc:  # pragma: no cover - only on unsupported torch builds
    raise ImportError(
        f"jupyter_memprof needs torch's profiler event tree (torch >= 2.13); found torch {torch.__version__}"
    ) from exc


# An event's kind is the type of its extra fields: one identity test, where comparing
# ``ev.tag`` (a pybind11 enum, ~0.3 µs per access and per comparison) would cost several.
_TORCH_OP = _ExtraFields_TorchOp
_ALLOCATION = _ExtraFields_Allocation
_PY_CALL = _ExtraFields_PyCall
_PY_CCALL = _ExtraFields_PyCCall
_BACKWARD_SCOPE = RecordScope.BACKWARD_FUNCTION
_OP = OpKind.OP
# Python functions whose own ops (the seed gradient) belong to the backward pass
_AUTOGRAD_ENTRY_POINTS = frozenset({"backward", "grad", "_engine_run_backward"})


# -- the walk --------------------------------------------------------------------------
#: the open-op entry an op outside every other op sees as its enclosing one:
#: (end_ns, op_id, depth, node, module_ctx, backward, optimizer); its child has depth 0
_OUTSIDE = (0, NO_ID, -1, NO_ID, NO_ID, False, False)
#: the end of an op still running when the capture stopped: it encloses everything after it
_FOREVER = 1 << 62
#: thread ids are unsigned 64-bit numbers in torch; the ``thread`` column is int64
_INT64_END = 1 << 63
_UINT64_SPAN = 1 << 64


def thread_id(tid: int) -> int:
    """torch's thread id as the int64 the ``thread`` column holds: ids from 2**63 on (torch
    reports 2**64-1 for a thread its Python tracer could not name) are read as the signed
    number of the same 64 bits, so 2**64-1 is -1 and no two ids become one."""
    return tid - _UINT64_SPAN if tid >= _INT64_END else tid


def _kind(name: str, scope) -> OpKind:
    """The kind of an event that is not a dispatcher op (those are decided before)."""
    if scope == _BACKWARD_SCOPE or name.startswith("autograd::engine::evaluate_function"):
        return OpKind.BACKWARD
    if name.startswith("Optimizer."):
        return OpKind.OPTIMIZER
    return OpKind.ANNOTATION


#: how many events are read between two progress reports (a power of two: a mask test)
_PROGRESS_EVERY = 1 << 16


def _time_span(roots: list) -> tuple[int, int]:
    """First start and last end of the tree's root events (ends of events still running
    when the capture stopped do not count)."""
    first = roots[0].start_time_ns
    last = max(max(r.end_time_ns, r.start_time_ns) for r in roots)
    return first, max(last, first + 1)


def _progress_mask(roots: list, progress: Callable[[float], object] | None):
    """The mask that picks every ``_PROGRESS_EVERY``-th event (-1: none, as ``n & -1`` is
    never 0 once counting started), and the report for such an event: the fraction of the
    capture's time span read (events come in start-time order)."""
    if progress is None or not roots:
        return -1, None
    first, last = _time_span(roots)
    span = last - first

    def report(ev) -> None:
        progress(min(max((ev.start_time_ns - first) / span, 0.0), 1.0))

    return _PROGRESS_EVERY - 1, report


class _Walk:
    """What the walk builds and keeps while it reads the events. The reader of each kind of
    event (:func:`_op_reader`, :func:`_input_reader`, :func:`_allocation_reader`) binds the
    parts it uses as names of a closure: the loop pays a call per op and per allocation, and
    no attribute look-ups."""

    def __init__(self) -> None:
        self.ops: list[OpRecord] = []
        self.tensors: list[TensorRef] = []
        self.memory: list[MemoryRecord] = []
        self.dev_names: dict[Any, str] = {}
        self.module_calls: list[tuple[int, str]] = []
        self.module_index_of: dict[int, int] = {}  # a module's id -> its module_index
        # storages allocated during the capture: their address and size come from the
        # allocator (tensor id -> its first allocation id); see _split_tensor_id for the rest
        self.allocated: dict[int, int] = {}
        self.split: dict[tuple[int, int], int] = {}  # (tensor id, allocation id) -> own id
        self.merged: set[int] = set()  # tensor ids torch gave several storages
        self.untracked: dict[int, list] = {}
        # per thread: open ops as (end_ns, op_id, depth, node, module_ctx, backward, optimizer)
        self.open_ops: dict[int, list[tuple]] = {}

    def trace(self, n_events: int) -> Trace:
        untracked = [UntrackedTensor(tid, *v) for tid, v in self.untracked.items()]
        return Trace(self.ops, self.tensors, self.memory, untracked, n_events, self.module_calls)

    def module_call(self, ev, module, callsite, in_autograd: bool) -> None:
        """An ``nn.Module`` call the Python tracer recorded: a module op, nested by time like
        the dispatcher ops around it."""
        key = module.self_ptr
        index = self.module_index_of.get(key)
        if index is None:
            index = self.module_index_of[key] = len(self.module_calls)
            self.module_calls.append((key, module.cls_name))
        op_id = len(self.ops)
        start = ev.start_time_ns
        end = ev.end_time_ns
        thread = thread_id(ev.start_tid)
        st = self.open_ops.setdefault(thread, [])
        while st and st[-1][0] <= start:
            st.pop()
        _, parent, depth, node, module_ctx, backward, optimizer = st[-1] if st else _OUTSIDE
        depth += 1
        backward = backward or in_autograd
        self.ops.append(
            OpRecord(
                op_id=op_id,
                parent_id=parent,
                depth=depth,
                name=f"{MODULE_MARKER}{index}",
                kind=OpKind.MODULE,
                start_ns=start,
                end_ns=end,
                thread=thread,
                seq_nr=NO_ID,
                backward=backward,
                optimizer=optimizer,
                module_index=index,
                module_ctx=module_ctx,
                callsite=callsite,
                input_shapes=[],
                node_id=node,
            )
        )
        end = end if end >= start else _FOREVER
        st.append((end, op_id, depth, node, op_id, backward, optimizer))


def read_trace(
    kineto_results,
    namer: FrameNamer | None = None,
    *,
    tracer_modules: bool = False,
    progress: Callable[[float], object] | None = None,
) -> Trace:
    """Walk torch's event tree once and return plain records, ops in start-time order (how
    ops nest and where module calls come from: the module's docstring). With
    ``tracer_modules``, the Python tracer's ``nn.Module`` frames are the module ops.

    ``progress(fraction)``, if given, is called every 65,536 events with the fraction of the
    capture's time span read so far.
    """
    namer = namer or FrameNamer()
    roots = kineto_results.experimental_event_tree()
    every, report = _progress_mask(roots, progress)
    walk = _Walk()
    read_op, read_allocation = _op_reader(walk), _allocation_reader(walk)
    module_call = walk.module_call
    is_user = namer.is_user
    label = namer.label
    n_events = 0
    # (event, callsite, in_autograd_call, user_frame) in pre-order, which is start-time order.
    # user_frame: whether the Python frame running when the event starts is user code (None:
    # not known yet). A Python call's children run in the frame it called, a C call's in the
    # frame that called it, an op's in the frame around it; so C calls made from library
    # frames (most of the Python events) need not be opened at all.
    stack: list[tuple] = [(e, None, False, None) for e in reversed(roots)]
    pop, push = stack.pop, stack.append
    while stack:
        ev, callsite, in_autograd, user_frame = pop()
        n_events += 1
        if not n_events & every:
            report(ev)
        f = ev.extra_fields
        fields_type = type(f)
        if fields_type is _TORCH_OP:
            read_op(ev, f, callsite, in_autograd)
        elif fields_type is _ALLOCATION:
            read_allocation(ev, f)
            continue
        elif fields_type is _PY_CCALL:
            if user_frame is not False:  # else: a C call from library code moves nothing
                # Frame strings can be undecodable in some torch builds (seen: ev.name of a
                # PyCall); a frame we cannot read just does not move the callsite.
                try:
                    caller = f.caller
                    fn = caller.file_name
                    user_frame = is_user(fn)
                    if user_frame:
                        callsite = label(fn, caller.line_number, caller.function_name)
                except UnicodeDecodeError:
                    pass
        elif fields_type is _PY_CALL:
            try:
                callee = f.callsite
                if user_frame is not False:
                    caller = f.caller
                    fn = caller.file_name
                    if is_user(fn):
                        callsite = label(fn, caller.line_number, caller.function_name)
                        # user code calling `loss.backward()` / `torch.autograd.grad(...)`
                        if not in_autograd:
                            in_autograd = callee.function_name in _AUTOGRAD_ENTRY_POINTS and (
                                callee.file_name.startswith(("torch/autograd/", "torch/_tensor.py"))
                            )
                user_frame = is_user(callee.file_name)  # the frame its children run in
            except UnicodeDecodeError:
                user_frame = None
            if tracer_modules and f.module is not None:
                module_call(ev, f.module, callsite, in_autograd)
        children = ev.children
        if children:
            for c in reversed(children):
                push((c, callsite, in_autograd, user_frame))
    return walk.trace(n_events)


def _op_reader(walk: _Walk) -> Callable[[Any, Any, Any, bool], None]:
    """The reader of an op event (a dispatcher op, an annotation, a module call the hooks
    bracketed): its record, nested by time among the open ops of its thread."""
    ops, open_ops = walk.ops, walk.open_ops
    known_schemas = SCHEMAS.get  # most ops: the cached answer, no call
    ambiguous = AMBIGUOUS
    # records are built with tuple.__new__ (a C call), not the NamedTuple's Python __new__
    new_op = functools.partial(tuple.__new__, OpRecord)
    read_inputs = _input_reader(walk)

    def read_op(ev, f, callsite, in_autograd: bool) -> None:
        name = f.name
        op_id = len(ops)
        start = ev.start_time_ns
        end = ev.end_time_ns
        thread = ev.start_tid
        if thread >= _INT64_END:  # rare: see thread_id
            thread = thread_id(thread)
        st = open_ops.get(thread)
        if st is None:
            st = open_ops[thread] = []
        while st and st[-1][0] <= start:
            st.pop()
        _, parent, depth, node, module_ctx, backward, optimizer = st[-1] if st else _OUTSIDE
        depth += 1
        # ops run by `loss.backward()` / `torch.autograd.grad` itself (the seed gradient)
        backward = backward or in_autograd
        inputs = f.inputs
        mutable = known_schemas((name, len(inputs)), ambiguous)
        if mutable is ambiguous:  # not cached yet, or overloads to match per call
            mutable = mutable_arguments(name, inputs)
        module_index = NO_ID
        module_ctx_child = module_ctx
        if mutable is not None:  # a dispatcher op: the common case, decided cheaply
            kind = _OP
            if node < 0:
                node = op_id
        else:
            scope = f.scope
            if name.startswith(MODULE_MARKER):
                kind = OpKind.MODULE
                module_index = int(name[len(MODULE_MARKER) :])
                module_ctx_child = op_id
            else:
                kind = _kind(name, scope)
            if kind is OpKind.BACKWARD:
                backward = True
            elif kind is OpKind.OPTIMIZER:
                optimizer = True
            elif name == CLOSURE_MARKER:
                optimizer = False  # the user's step, called by the optimizer
            if node < 0 and scope == _BACKWARD_SCOPE:
                node = op_id
        shapes = read_inputs(op_id, inputs, mutable)
        seq = f.sequence_number
        seq = seq if seq is not None and seq >= 0 else NO_ID
        ops.append(new_op((
            op_id, parent, depth, name, kind, start, end, thread, seq, backward, optimizer,
            module_index, module_ctx, callsite, shapes, node,
        )))  # fmt: skip
        # an op still running when the capture stopped has no sensible end
        end = end if end >= start else _FOREVER
        st.append((end, op_id, depth, node, module_ctx_child, backward, optimizer))

    return read_op


def _input_reader(walk: _Walk) -> Callable[[int, list, Any], list]:
    """The reader of an op's inputs: their shapes, a :class:`TensorRef` for each tensor
    that has storage (written where the op's schema says so), and where a storage from
    before the capture lives."""
    tensors, untracked, dev_names = walk.tensors, walk.untracked, walk.dev_names
    allocated, split, merged = walk.allocated, walk.split, walk.merged
    new_ref = functools.partial(tuple.__new__, TensorRef)

    def read_inputs(op_id: int, inputs: list, mutable) -> list:
        shapes = []
        for i, x in enumerate(inputs):
            if type(x) is _TensorMetadata:
                group, out = (x,), shapes
            elif type(x) is list:  # a list of tensors: its shapes one entry of ``shapes``
                group, out = x, []
                shapes.append(out)
            else:
                shapes.append([])
                continue
            written = mutable[i] if mutable else False
            for y in group:
                if type(y) is _TensorMetadata:
                    sizes = y.sizes
                    out.append(sizes)
                    tid = y.id
                    # no storage address: a wrapper holding no memory itself (a DTensor,
                    # whose bytes are its local shard, an input of the op it dispatches to)
                    if tid is not None and y.storage_data_ptr:
                        if tid in merged:
                            tid = split.get((tid, y.allocation_id), tid)
                        tensors.append(new_ref((op_id, tid, written)))
                        if tid not in allocated:
                            _untracked(untracked, tid, y, sizes, dev_names)
        return shapes

    return read_inputs


def _allocation_reader(walk: _Walk) -> Callable[[Any, Any], None]:
    """The reader of an allocator event: a :class:`MemoryRecord` under the op open on its
    thread, its tensor id one of its own where torch numbered its storage with another's."""
    memory, open_ops, dev_names = walk.memory, walk.open_ops, walk.dev_names
    allocated, split, merged = walk.allocated, walk.split, walk.merged
    new_memory = functools.partial(tuple.__new__, MemoryRecord)

    def read_allocation(ev, f) -> None:
        t = ev.start_time_ns
        thread = ev.start_tid
        st = open_ops.get(thread if thread < _INT64_END else thread_id(thread))
        while st and st[-1][0] <= t:
            st.pop()
        parent = st[-1][1] if st else NO_ID
        dev = f.device
        dname = dev_names.get(dev)
        if dname is None:
            dname = dev_names[dev] = str(dev)
        tid = f.id
        size = f.alloc_size
        if tid is None:
            tid = NO_ID
        elif size > 0:
            first = allocated.setdefault(tid, f.allocation_id)
            if first != f.allocation_id:
                tid = _split_tensor_id(tid, f.allocation_id, split, merged, allocated)
        elif tid in merged:
            tid = split.get((tid, f.allocation_id), tid)
        if dname == "cpu":  # the CPU reporter counts only what it saw: no totals
            total, reserved = -1, -1
        else:
            total, reserved = f.total_allocated, f.total_reserved
        memory.append(
            new_memory((t, f.ptr, size, tid, f.allocation_id, dname, parent, total, reserved))
        )

    return read_allocation


#: the first id :func:`_split_tensor_id` hands out, far above torch's own tensor ids
_SPLIT_IDS = 1 << 48


def _split_tensor_id(tid: int, allocation_id: int, split: dict, merged: set, allocated: dict):
    """The tensor id of a storage torch numbered with an earlier storage's id: an id of its
    own, so that each storage is a block of its own and every use finds its block.

    torch joins the ids of storages one TensorImpl pointed to, and every empty tensor
    points to the same null storage. A tensor rebuilt from shared memory (a DataLoader
    worker's batch, a ``torch.multiprocessing`` queue) starts empty and is then set to its
    storage, so every such storage would share one id; a tensor whose storage ``resize_``
    or ``set_`` replaced too. Uses carry the allocation id of the storage they saw and are
    renumbered the same way."""
    key = (tid, allocation_id)
    new = split.get(key)
    if new is None:
        new = split[key] = _SPLIT_IDS + len(split)
        merged.add(tid)
        allocated[new] = allocation_id
    return new


def _untracked(untracked: dict, tid: int, t, sizes, dev_names) -> None:
    """Remember where a pre-existing storage lives and how far its views reach."""
    # furthest element of this view: 1 + sum((size - 1) * stride), 0 for an empty view
    n = 1
    for s, st in zip(sizes, t.strides):
        if s == 0:
            n = 0
            break
        n += (s - 1) * st
    extent = n * t.dtype.itemsize
    known = untracked.get(tid)
    if known is None:
        dev = t.device
        dname = dev_names.get(dev)
        if dname is None:
            dname = dev_names[dev] = str(dev)
        untracked[tid] = [t.storage_data_ptr or 0, dname, extent]
    elif extent > known[2]:
        known[2] = extent


#: ``annotation(name)``: a ``record_function`` context manager. torch's C++ one where it has
#: it: its enter and exit add no Python frames of their own to the trace.
annotation = getattr(torch._C._profiler, "_RecordFunctionFast", None) or (
    torch.autograd.profiler.record_function
)


def prepare() -> None:
    """Import what torch's profiler imports lazily while it stops.

    torch imports ``torch.profiler._cupti_monitor`` inside the profiler's ``__exit__``, while
    the Python tracer still records; the frames of that one-time import can come back with
    undecodable names. Importing it before the capture keeps such frames out of the trace.
    """
    try:
        import torch.profiler._cupti_monitor  # noqa: F401
    except ImportError:
        pass


def profiler_running() -> bool:
    """True while a torch profiler (kineto or legacy) is collecting in this thread (torch
    keeps that state per thread)."""
    return bool(torch._C._autograd._profiler_enabled())


def running_profiler() -> str | None:
    """Where a torch profiler is running: ``"in this thread"``, ``"in another thread"`` or
    None.

    torch keeps a profiler's state per thread, but runs one kineto profiler per process: a
    second one started in another thread crashes the process when either stops. The only
    process-wide sign is the flag torch's Python start sets and its stop clears
    (``torch.autograd.profiler._is_profiler_enabled``); the legacy profiler does not set it,
    and does not crash a capture in another thread either (measured: docs/dev-notes.md).
    """
    if profiler_running():
        return "in this thread"
    if getattr(torch.autograd.profiler, "_is_profiler_enabled", False):
        return "in another thread"
    return None


def clear_running_flag() -> None:
    """Clear torch's process-wide "a profiler runs" flag, as torch's own stop does: after a
    stop that failed half way, or for a capture whose thread ended without stopping (torch
    stops that thread's profiler as the thread ends, but leaves the flag set)."""
    stop = getattr(torch.autograd.profiler, "_run_on_profiler_stop", None)
    if stop is not None:
        stop()


def settle_after_lost_thread() -> None:
    """Put torch's profiler back in order after a thread that ran it ended without stopping
    it. torch stops that profiler as the thread ends, but leaves its process-wide flag set
    and its state such that the process crashes at exit (measured, plain torch too:
    docs/dev-notes.md) unless a profiler starts and stops again. An empty CPU-only one
    does that (under 1 ms) and clears the flag as it stops."""
    with torch.autograd.profiler.profile():
        pass


def force_off() -> None:
    """Turn torch's profiler off whatever state its Python object is in (when torch's own
    stop failed half way); what it recorded is lost."""
    try:
        torch.autograd._disable_profiler()
    finally:
        clear_running_flag()


def trace_start_ns(kineto_results) -> int | None:
    """When torch's trace began, on the events' clock (absent in some releases)."""
    fn = getattr(kineto_results, "trace_start_ns", None)
    try:
        return int(fn()) if fn is not None else None
    except (RuntimeError, TypeError):
        return None
