"""Every op on fake tensors recorded as a producer's records.

What a fake run offers, and how each record is made from it:

- **ops**: a :class:`TorchDispatchMode` on top of torch's :class:`FakeTensorMode` sees every
  aten op below autograd, with its inputs and outputs (``kind`` ``op``). Composite ops such
  as ``aten::linear`` reach it already decomposed (``aten::t`` + ``aten::addmm``).
- **modules and optimizers**: global module forward hooks and optimizer step hooks open and
  close ``module`` and ``optimizer`` ops, as the torch-profiler producer's hooks do.
- **backward**: ops run by the autograd engine happen while
  ``torch._C._current_autograd_node()`` names the node; each node gets a ``backward`` op
  (``autograd::engine::evaluate_function: AddmmBackward0``) with the node's sequence number.
  ``loss.backward()`` / ``torch.autograd.grad`` themselves are seen by a
  :class:`TorchFunctionMode`, so the seed gradient is backward work too.
- **forward/backward links**: autograd's sequence counter advances when an op creates a node;
  the op during whose dispatch it advanced gets the new node's number, which the node's
  ``backward`` op carries too.
- **memory**: a storage first seen as an op's output is allocated by that op; a weak
  reference on it records the free (torch keeps a storage's Python object for as long as the
  storage lives). Storages that existed before the run (the fake copies of the user's
  objects) are reported as pre-existing. Fake storages have no address (``data_ptr()`` is
  0): each gets a synthetic, never reused address, used for its blocks and its names alike.
- **time**: a fake run has no meaningful duration. The clock is a counter that advances at
  every record (op start, op end, allocation, free) by :data:`CLOCK_STEP_NS`, so ``*_ns``
  columns are monotonic and a view that shows milliseconds shows the position in the run.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    UnsupportedOperatorException,
)
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from ..._devices import block_bytes
from ..._errors import EstimateError
from ..._records import (
    MODULE_MARKER,
    NO_ID,
    STEP_MARKER,
    MemoryRecord,
    OpRecord,
    TensorRef,
    UntrackedTensor,
)
from ..._vocab import OpKind
from .. import cuda_kernels
from ..dtensor import local_tensor
from ..live import STEP_LISTENERS
from ..torch_profiler import FrameNamer
from .known import UNKNOWN, KnownValues
from .sizes import SizedOutputs
from .values import stand_in

#: How far the fake clock advances per record (views in milliseconds then count records).
CLOCK_STEP_NS = 1_000_000
_BASE_ADDRESS = 0x7F0000000000
_LIFT = frozenset({torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default})
#: ``record_function``'s ops: a label's start and end (FSDP's ``FSDP::all_gather (blocks.3)``).
_LABEL_ENTER = "profiler::_record_function_enter_new"
_LABEL_EXIT = "profiler::_record_function_exit"
AUTOGRAD_CALLS = frozenset({torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad})
_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)
_MAX_SEQ = 1 << 62  # AccumulateGrad nodes carry UINT64_MAX: no sequence number
#: Tensor methods that hand out the values themselves (fake tensors raise RuntimeError)
VALUE_METHODS = {torch.Tensor.numpy: "Tensor.numpy()", torch.Tensor.__array__: "numpy's array()"}
#: what the errors for code that reads values suggest instead
NO_VALUES = (
    "estimate code that does not read values (`.item()`, `.numpy()`, `nonzero`, `if tensor:`, "
    "boolean masks)"
)


CUDNN_HINT = (
    ": estimate with `torch.backends.cudnn.flags(enabled=False)` (PyTorch's own kernels, "
    "whose memory can differ from cuDNN's) or on a machine without CUDA"
)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def cudnn_rnn_error(exc: BaseException, recorder: FakeRecorder) -> EstimateError | None:
    """The EstimateError for an error autograd raised around cuDNN's RNN kernels on fake CUDA
    tensors (their backward needs a weight buffer that a fake forward does not make), or
    ``None`` for any other error."""
    if not (recorder.cudnn_rnn and isinstance(exc, RuntimeError)):
        return None
    text = str(exc)
    if "weight_buf" not in text and "CUDNN" not in text.upper():
        return None
    return EstimateError(
        f"cuDNN's RNN kernels cannot run on fake CUDA tensors ({_first_line(exc)})" + CUDNN_HINT
    )


def _has_meta(func) -> bool:
    """Whether an aten op has a meta kernel (fake tensors run it instead of the real one)."""
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "Meta"))
    except (AttributeError, RuntimeError):
        return True


def cuda_rounded(nbytes: int) -> int:
    """The size CUDA's caching allocator reserves for a request of ``nbytes`` (> 0)."""
    return block_bytes("cuda", nbytes)


class FakeRecorder(SizedOutputs):
    """Collects ops, tensor references and memory events of one fake run.

    ``device_of(torch.device)`` names the device a block is attributed to (``None``: not
    recorded, e.g. meta tensors). Blocks attributed to a CUDA device are rounded as CUDA's
    caching allocator rounds requests.
    """

    def __init__(self, device_of: Callable[[torch.device], str | None], namer: FrameNamer):
        self.device_of = device_of
        self.namer = namer
        self.ops: list[list] = []
        self.tensors: list[TensorRef] = []
        self.memory: list[MemoryRecord] = []
        self.untracked: list[UntrackedTensor] = []
        self.modules: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.foreach_optimizers = False
        self.cudnn_rnn = False  # a cuDNN RNN op ran (see cudnn_rnn_error)
        self.gpu: cuda_kernels.Gpu | None = None  # CUDA's kernel choices follow this GPU
        self.not_modelled: dict[str, str] = {}  # CUDA op -> kernel memory no rule covers
        self.scalars: dict[str, str] = {}  # user's line -> data-dependent scalar answered
        self.known = KnownValues()  # real values of inputs (ids, masks) and what they make
        self.mode_fake = None  # the run's FakeTensorMode
        self.pinned: dict[int, str] = {}  # storage key -> device, over device_of
        self.active = False
        self.in_autograd = 0
        self._clock = 0
        self._stack: list[tuple] = []  # open ops: (op_id, depth, node, module_ctx, bwd, opt)
        self._node: tuple | None = None  # (key, op_id) of the open autograd-node op
        self._module_ops: list[int] = []
        self._module_index: dict[int, int] = {}
        self._storages: dict[int, tuple] = {}  # storage _cdata -> (tid, ptr, size, device)
        self._refs: dict[int, weakref.ref] = {}
        self._next_address: dict[str, int] = {}
        self._n_blocks = 0
        self._last_seq = 0
        self._thread = threading.get_ident()
        self.mode = None  # the run's dispatch mode (fake_modes.RecordingMode), once entered
        self._handles: list = []
        self._writes: dict = {}
        self._labels: list[int] = []  # open record_function labels (op ids), innermost last
        self._resized: dict[int, str] = {}  # storage key -> device, of storages resized to 0

    # -- clock and ops --------------------------------------------------------------------
    def tick(self) -> int:
        self._clock += CLOCK_STEP_NS
        return self._clock

    def open(self, name: str, kind: OpKind, seq: int = NO_ID, module_index: int = NO_ID) -> int:
        st = self._stack
        op_id = len(self.ops)
        if st:
            parent, pdepth, node, ctx, bwd, opt = st[-1]
            depth = pdepth + 1
        else:
            parent, depth, node, ctx, bwd, opt = NO_ID, 0, NO_ID, NO_ID, False, False
        bwd = bwd or self.in_autograd > 0 or kind is OpKind.BACKWARD
        opt = opt or kind is OpKind.OPTIMIZER
        if node < 0 and kind in (OpKind.OP, OpKind.BACKWARD):
            node = op_id
        self.ops.append(
            [op_id, parent, depth, name, kind, self.tick(), NO_ID, self._thread, seq, bwd, opt,
             module_index, ctx, self.callsite(), [], node]
        )  # fmt: skip
        st.append((op_id, depth, node, op_id if kind is OpKind.MODULE else ctx, bwd, opt))
        return op_id

    def close(self, op_id: int) -> None:
        """End ``op_id`` and every op still open inside it."""
        st = self._stack
        if not any(e[0] == op_id for e in st):
            return
        while st:
            top = st.pop()[0]
            self.ops[top][6] = self.tick()
            if top == op_id:
                return

    def callsite(self) -> str | None:
        """The innermost user frame, ``file.py:12 in fn``."""
        f = sys._getframe(2)
        is_user = self.namer.is_user
        while f is not None:
            code = f.f_code
            if is_user(code.co_filename):
                return self.namer.label(code.co_filename, f.f_lineno, code.co_name)
            f = f.f_back
        return None

    def sync_backward(self) -> None:
        """Open an op for the autograd node now running (closing the previous one)."""
        node = torch._C._current_autograd_node()
        cur = self._node
        if node is None:
            if cur is not None and self.in_autograd == 0:
                self.close(cur[1])
                self._node = None
            return
        key = (id(node), node._sequence_nr())
        if cur is not None:
            if cur[0] == key:
                return
            self.close(cur[1])
        seq = node._sequence_nr()
        op_id = self.open(
            f"autograd::engine::evaluate_function: {node.name()}",
            OpKind.BACKWARD,
            seq=seq if 0 <= seq < _MAX_SEQ else NO_ID,
        )
        self._node = (key, op_id)

    def end_backward(self) -> None:
        if self._node is not None and self.in_autograd == 0:
            self.close(self._node[1])
            self._node = None

    def forward_seq(self) -> int:
        """The sequence number of the autograd node this op created, if it created one."""
        now = torch._C._autograd._get_sequence_nr()
        last, self._last_seq = self._last_seq, now
        return now - 1 if now > last else NO_ID

    # -- memory ---------------------------------------------------------------------------
    def block(self, t: torch.Tensor, op_id: int, created: bool, nbytes: int | None = None) -> int:
        """The tensor id of ``t``'s storage; a storage seen for the first time is an
        allocation by ``op_id`` (``created``) or a block from before the run. ``nbytes``
        overrides the storage's size (a size rule: the real kernel's block is bigger)."""
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return NO_ID
        key = s._cdata
        hit = self._storages.get(key)
        if hit is not None:
            return hit[0]
        device = self.pinned.get(key) or self.device_of(t.device)
        n = s.nbytes() if nbytes is None else nbytes
        if device is None or n == 0:
            return NO_ID
        size = block_bytes(device, n)
        tid, ptr = self._new_block(device, size)
        self._storages[key] = (tid, ptr, size, device)
        self._refs[tid] = weakref.ref(s, self._freer(key, tid, ptr, size, device))
        if created:
            self.memory.append(MemoryRecord(self.tick(), ptr, size, tid, tid, device, op_id))
        else:
            self.untracked.append(UntrackedTensor(tid, ptr, device, size))
        return tid

    def _new_block(self, device: str, size: int) -> tuple[int, int]:
        """The next block's id, and an address for ``size`` bytes on ``device``."""
        tid = self._n_blocks
        self._n_blocks += 1
        ptr = self._next_address.get(device, _BASE_ADDRESS)
        self._next_address[device] = ptr + cuda_rounded(size)
        return tid, ptr

    def _freer(self, key: int, tid: int, ptr: int, size: int, device: str):
        def freed(_ref) -> None:
            self._refs.pop(tid, None)
            self.pinned.pop(key, None)
            known = self._storages.get(key)
            if known is not None and known[0] == tid:
                del self._storages[key]
            if self.active:
                op = self._stack[-1][0] if self._stack else NO_ID
                self.memory.append(MemoryRecord(self.tick(), ptr, -size, tid, tid, device, op))

        return freed

    def storage(self, t: torch.Tensor) -> tuple[str, int, int] | None:
        """(device, synthetic address, bytes) of a fake tensor's storage, for its name."""
        try:
            hit = self._storages.get(t.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError, TypeError):
            return None
        return None if hit is None else (hit[3], hit[1], hit[2])

    # -- one op ---------------------------------------------------------------------------
    def _write_flags(self, func) -> tuple[tuple[bool, ...], dict[str, bool]]:
        hit = self._writes.get(func)
        if hit is None:
            args = func._schema.arguments
            flags = tuple(bool(a.alias_info is not None and a.alias_info.is_write) for a in args)
            hit = self._writes[func] = (flags, {a.name: f for a, f in zip(args, flags)})
        return hit

    def label(self, func, name: str, args: tuple, kwargs: dict):
        """A ``record_function`` label's start or end: an annotation, as torch's profiler
        records it (FSDP's name modules). An end closes the innermost label open."""
        out = func(*args, **kwargs)
        if name == _LABEL_ENTER:
            self._labels.append(self.open(str(args[0]), OpKind.ANNOTATION))
        elif self._labels:
            self.close(self._labels.pop())
        return out

    def resized(self, storage, nbytes: int) -> None:
        """A storage resized in place (``UntypedStorage.resize_``: FSDP frees and makes again
        its unsharded parameters so): its block is freed, and a new size is a new block
        made by the op running now."""
        key = storage._cdata
        op = self._stack[-1][0] if self._stack else NO_ID
        known = self._storages.pop(key, None)
        device = self._resized.pop(key, None)
        if known is not None:
            tid, ptr, size, device = known
            self._refs.pop(tid, None)
            if self.active:
                self.memory.append(MemoryRecord(self.tick(), ptr, -size, tid, tid, device, op))
        if device is None:
            device = self.pinned.get(key) or self.device_of(storage.device)
        if device is None:
            return
        if nbytes == 0:
            self._resized[key] = device
            return
        size = block_bytes(device, nbytes)
        tid, ptr = self._new_block(device, size)
        self._storages[key] = (tid, ptr, size, device)
        self._refs[tid] = weakref.ref(storage, self._freer(key, tid, ptr, size, device))
        self.memory.append(MemoryRecord(self.tick(), ptr, size, tid, tid, device, op))

    def run_op(self, func, args: tuple, kwargs: dict):
        self.sync_backward()
        name = func._schema.name
        if name == _LABEL_ENTER or name == _LABEL_EXIT:
            return self.label(func, name, args, kwargs)
        if name.startswith("aten::_cudnn_rnn"):
            self.cudnn_rnn = True
        op_id = self.open(name, OpKind.OP, seq=self.forward_seq())
        flags, by_name = self._write_flags(func)
        shapes: list = []
        real = None
        for i, a in enumerate(args):
            shapes.append(self._ref(op_id, a, i < len(flags) and flags[i]))
            real = real or _real_tensor(a)
        for k, a in kwargs.items():
            self._ref(op_id, a, by_name.get(k, False))
            real = real or _real_tensor(a)
        self.ops[op_id][14] = shapes
        if real is not None and func not in _LIFT:
            raise EstimateError(
                f"{name} got a real tensor (shape {list(real.shape)}) that estimate() did not "
                f"copy{self._where(op_id)}: pass it to estimate() as an argument, or create it "
                "inside the estimated code"
            )
        written = [a for a, f in zip(args, flags) if f] + [
            a for k, a in kwargs.items() if by_name.get(k, False)
        ]
        known = self.known.run(func, args, kwargs, written)
        try:
            out = func(*args, **kwargs)
        except _DATA_DEPENDENT:
            out = self._data_dependent(func, args, op_id, known)
        except UnsupportedOperatorException:
            raise EstimateError(
                f"{self._what(op_id)} has no fake (meta) implementation, so it cannot run on "
                f"fake tensors{self._where(op_id)}: estimate without that op (register a fake "
                "kernel with torch.library.register_fake)"
            ) from None
        except RuntimeError as exc:
            if _has_meta(func):  # the op's own error, as the real run would raise it
                raise EstimateError(
                    f"{self._what(op_id)} failed{self._where(op_id)}: {_first_line(exc)} "
                    f"(the step run for real fails there too: {self._fix(op_id)})"
                ) from None
            # No meta kernel: fake tensors ran the real kernel on stand-in inputs, and it
            # failed (cuDNN's RNN backward does, on a GPU: its weight buffer is not there).
            raise EstimateError(
                f"{name} has no fake (meta) implementation and its real kernel failed on fake "
                f"tensors ({_first_line(exc)}){self._where(op_id)}"
                + (CUDNN_HINT if "cudnn" in name else "")
            ) from None
        if known is UNKNOWN:
            known = self.known.run_factory(func, args, kwargs, out)
        self.known.learn(out, known)
        self._record_outputs(func, op_id, out, args, kwargs)
        self.close(op_id)
        return out

    def _data_dependent(self, func, args: tuple, op_id: int, known):
        """The answer to an op that needs values: the real one where the values are known
        (:mod:`.known`), a stand-in inside optimizer steps and GradScaler
        (:mod:`.values`, noted in ``scalars``), else an EstimateError."""
        if known is not UNKNOWN:
            return self.known.fake_of(self.mode_fake, known)
        name = func._schema.name
        out = stand_in(func, args, self.ops[op_id][10])
        if out is None:
            raise EstimateError(
                f"{self._what(op_id)} needs tensor values, which a fake run does not have "
                f"(data-dependent output){self._where(op_id)}: {NO_VALUES}"
            ) from None
        self.scalars.setdefault(self.ops[op_id][13] or name, f"{name}: {out!r}")
        return out

    def _fix(self, op_id: int) -> str:
        """What to do about an op that fails on its shapes: a forward op run during backward
        is a checkpointed module computed again, which saw other state than the first time
        (a key/value cache it appended to)."""
        in_backward = self.ops[op_id][9]
        node = torch._C._current_autograd_node()
        if in_backward and (node is None or "Checkpoint" in node.name() or self.in_autograd):
            return (
                "a checkpointed module computed again in backward saw other state than in "
                "forward, such as a key/value cache it appended to: call the model with "
                "use_cache=False, as transformers does under gradient checkpointing"
            )
        return "fix the shapes at that line"

    def _what(self, op_id: int) -> str:
        """The op and the shapes of its tensor inputs: ``aten::mm on [4, 8], [8, 2]``."""
        shapes = [str(x) for x in self.ops[op_id][14] if x]
        name = self.ops[op_id][3]
        return f"{name} on {', '.join(shapes)}" if shapes else name

    def _where(self, op_id: int) -> str:
        site = self.ops[op_id][13]
        return f" at {site}" if site else ""

    def _ref(self, op_id: int, a, mutable: bool) -> list:
        if isinstance(a, torch.Tensor):
            shape = list(a.shape)
            a = local_tensor(a)  # a DTensor reads and writes its local shard
            if isinstance(a, FakeTensor):
                tid = self.block(a, op_id, False)
                if tid >= 0:
                    self.tensors.append(TensorRef(op_id, tid, mutable))
            return shape
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return [self._ref(op_id, x, mutable) for x in a]
        return []

    # -- hooks ----------------------------------------------------------------------------
    def _ours(self) -> bool:
        """Whether the running thread runs the estimated code: the module and optimizer
        hooks are global, and fire for every thread's calls. The dispatch modes are per
        thread (and go with autograd to the threads its engine runs a backward in)."""
        if threading.get_ident() == self._thread:
            return True
        mode = self.mode
        return mode is not None and any(m is mode for m in _get_current_dispatch_mode_stack())

    def _module_pre(self, module, args) -> None:
        if not self._ours():
            return
        self.sync_backward()
        index = self._module_index.get(id(module))
        if index is None:
            index = self._module_index[id(module)] = len(self.modules)
            self.modules.append(module)
        self._module_ops.append(
            self.open(f"{MODULE_MARKER}{index}", OpKind.MODULE, module_index=index)
        )

    def _module_post(self, module, args, output) -> None:
        if self._module_ops and self._ours():
            self.close(self._module_ops.pop())

    def _step_pre(self, optimizer, args, kwargs) -> None:
        if not self._ours():
            return
        self.sync_backward()
        if all(o is not optimizer for o in self.optimizers):
            self.optimizers.append(optimizer)
        # The multi-tensor (foreach) path is what optimizers take on CUDA by default. Torch
        # decides it by the tensors' exact types, which fake tensors fail, so it is chosen
        # here: for CUDA computed on the CPU (simulated), and for fake CUDA tensors.
        for group in optimizer.param_groups:
            if group.get("foreach", False) is not None or group.get("fused"):
                continue
            if group.get("differentiable"):
                continue
            params = group.get("params") or ()
            if self.foreach_optimizers or (params and all(p.device.type == "cuda" for p in params)):
                group["foreach"] = True
        self._step_op = self.open(
            f"Optimizer.step#{type(optimizer).__name__}.step", OpKind.OPTIMIZER
        )

    def _step_post(self, optimizer, args, kwargs) -> None:
        op = getattr(self, "_step_op", None)
        if op is not None and self._ours():
            self.close(op)
            self._step_op = None

    # -- start and stop -------------------------------------------------------------------
    def start(self) -> None:
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        self._handles = [
            nn_module.register_module_forward_pre_hook(self._module_pre),
            nn_module.register_module_forward_hook(self._module_post, always_call=True),
            optim_module.register_optimizer_step_pre_hook(self._step_pre),
            optim_module.register_optimizer_step_post_hook(self._step_post),
        ]
        self._last_seq = torch._C._autograd._get_sequence_nr()
        STEP_LISTENERS.append(self.mark_step)
        self.active = True

    def mark_step(self) -> None:
        """:func:`jupyter_memprof.step` during the run: the same annotation a capture records."""
        self.sync_backward()
        self.close(self.open(STEP_MARKER, OpKind.ANNOTATION))

    def stop(self) -> None:
        with contextlib.suppress(ValueError):  # not started
            STEP_LISTENERS.remove(self.mark_step)
        for h in self._handles:
            h.remove()
        self._handles = []
        while self._stack:
            self.close(self._stack[-1][0])
        self.active = False

    def op_records(self) -> list[OpRecord]:
        new = OpRecord._make
        return [new(r) for r in self.ops]

    def release(self) -> None:
        """Forget the storages (their weak references no longer record anything)."""
        self.active = False
        self._storages.clear()
        self._refs.clear()
        self.modules, self.optimizers = [], []


def _real_tensor(a) -> torch.Tensor | None:
    """A tensor with real data in argument ``a`` (a tensor, a list); a DTensor's is its shard."""
    if isinstance(a, torch.Tensor):
        a = local_tensor(a)
        return None if isinstance(a, FakeTensor) or a.device.type == "meta" else a
    if isinstance(a, (list, tuple)):
        for x in a:
            if isinstance(x, torch.Tensor):
                x = local_tensor(x)
                if not isinstance(x, FakeTensor):
                    return x if x.device.type != "meta" else None
    return None
