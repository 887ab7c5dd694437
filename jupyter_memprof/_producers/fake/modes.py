"""A fake run's dispatch and function modes.

Torch's dispatch mode records every aten op on fake tensors, and
its function mode stands in for what a fake run cannot do (read values, deep copies) and
for CUDA's own kernels on tensors said to live on a CUDA device (attention, dropout, cuDNN's
LSTM: :mod:`.cuda_kernels`). Both hand what they see to a :class:`.recorder.FakeRecorder`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..._devices import is_cuda
from ..._errors import EstimateError
from .. import cuda_kernels

#: How far the fake clock advances per record (views in milliseconds then count records).
from .recorder import AUTOGRAD_CALLS, NO_VALUES, VALUE_METHODS, FakeRecorder


class RecordingMode(TorchDispatchMode):
    """Sees every aten op of the fake run (it sits above the FakeTensorMode)."""

    def __init__(self, recorder: FakeRecorder):
        super().__init__()
        self.recorder = recorder
        recorder.mode = self

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "prim":  # prim::device and friends: queries, not work
            return func(*args, **kwargs)
        return self.recorder.run_op(func, args, kwargs)


class PythonMode(TorchFunctionMode):
    """What only the Python level shows: ``backward()`` calls, ``copy.deepcopy`` of fake
    tensors, CUDA's kernels for tensors on a CUDA device (``scaled_dot_product_attention``'s
    backend for the recorder's ``gpu``, fused dropout, and, when CUDA is absent, cuDNN's
    LSTM: :mod:`.cuda_kernels`), and (when CUDA is asked for but absent) device arguments,
    which are moved to the device the fake run computes on."""

    def __init__(self, recorder: FakeRecorder, remap_cuda_to: torch.device | None):
        super().__init__()
        self.recorder = recorder
        self.remap = remap_cuda_to

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.recorder
        if func in AUTOGRAD_CALLS:
            rec.sync_backward()
            rec.in_autograd += 1
            try:
                return func(*args, **kwargs)
            finally:
                rec.in_autograd -= 1
                rec.end_backward()
        reads = VALUE_METHODS.get(func)
        if reads is not None:
            site = rec.callsite()
            raise EstimateError(
                f"{reads} needs tensor values, which a fake run does not have"
                f"{f' at {site}' if site else ''}: {NO_VALUES}"
            )
        if func is torch.Tensor.__deepcopy__:
            return deepcopy_fake(args[0], args[1] if len(args) > 1 else kwargs.get("memo", {}))
        if rec.gpu is not None:
            if func is _SDPA:
                return cuda_attention(rec, args, kwargs)
            if func is _DROPOUT:
                return cuda_dropout(rec, args, kwargs)
            if func is torch.lstm and self.remap is not None:
                out = _cudnn_lstm(rec, args, kwargs)
                if out is not None:
                    return out
        if self.remap is not None:
            if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
                return args[0].to(self.remap)
            if "device" in kwargs and is_cuda(kwargs["device"]):
                kwargs = {**kwargs, "device": self.remap}
            if func is torch.Tensor.to:
                args = tuple(self.remap if is_cuda(a) else a for a in args)
        return func(*args, **kwargs)


def cuda_attention(rec: FakeRecorder, args: tuple, kwargs: dict) -> torch.Tensor:
    """``scaled_dot_product_attention`` as CUDA runs it on the recorder's GPU, for query
    tensors on a CUDA device; torch's own composite (the fake device's kernels) otherwise."""
    call = cuda_kernels.bind_sdpa(args, kwargs)
    if call is None or not is_cuda(rec.device_of(call.query.device) or "cpu"):
        return _SDPA(*args, **kwargs)
    backend = cuda_kernels.sdpa_backend(call, rec.gpu)
    if backend is cuda_kernels.SdpaBackend.CUDNN and call.query.shape[1] != call.key.shape[1]:
        rec.not_modelled.setdefault(
            "aten::_scaled_dot_product_cudnn_attention_backward",
            "grouped-query heads: the workspace rule was measured with equal heads",
        )
    return cuda_kernels.cuda_sdpa(call, backend)


def _cudnn_lstm(rec: FakeRecorder, args: tuple, kwargs: dict):
    """``torch.lstm`` on a CUDA device of a simulated run: cuDNN's op (:mod:`.cuda_kernels`),
    or ``None`` (torch's own kernels run) where cuDNN would not take it."""
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, torch.Tensor) or not is_cuda(rec.device_of(x.device) or "cpu"):
        return None
    return cuda_kernels.cudnn_lstm(args, kwargs)


def cuda_dropout(rec: FakeRecorder, args: tuple, kwargs: dict) -> torch.Tensor:
    """``F.dropout`` as CUDA runs it: in training, out of place, ``0 < p < 1``, CUDA's
    ``aten::dropout`` takes the fused ``native_dropout`` (a one-byte-per-element mask saved
    for backward), where the CPU's multiplies by a noise tensor of the input's dtype."""
    a = {**dict(zip(("input", "p", "training", "inplace"), args)), **kwargs}
    x, p = a.get("input"), a.get("p", 0.5)
    fused = (
        isinstance(x, torch.Tensor)
        and a.get("training", True)
        and not a.get("inplace", False)
        and isinstance(p, (int, float))
        and 0.0 < p < 1.0
        and x.numel() > 0
        and is_cuda(rec.device_of(x.device) or "cpu")
    )
    if not fused:
        return _DROPOUT(*args, **kwargs)
    return torch.native_dropout(x, float(p), True)[0]


_SDPA = torch.nn.functional.scaled_dot_product_attention
_DROPOUT = torch.nn.functional.dropout
#: torch.nn.functional's functions that take CUDA's kernels in an estimate for CUDA.
_CUDA_FUNCTIONS = {"scaled_dot_product_attention": (_SDPA, cuda_attention),
                   "dropout": (_DROPOUT, cuda_dropout)}  # fmt: skip


@contextlib.contextmanager
def cuda_functions(rec: FakeRecorder):
    """While the run lasts, ``torch.nn.functional``'s attention and dropout take CUDA's
    kernels for tensors on a CUDA device (:func:`cuda_attention`, :func:`cuda_dropout`).
    They are replaced in the module itself, so calls from inside torch's own Python code
    (``nn.MultiheadAttention`` calls both by their module-level names, out of
    :class:`PythonMode`'s sight: a mode is off inside its own handler) take them too. One
    fake run runs at a time in a process; the originals are back when it ends."""
    functional = torch.nn.functional
    if rec.gpu is None:
        yield
        return
    saved = {}
    for name, (original, route) in _CUDA_FUNCTIONS.items():
        if getattr(functional, name) is not original:
            continue  # someone else's replacement: left alone
        saved[name] = original
        setattr(functional, name, _router(rec, route))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(functional, name, original)


def _router(rec: FakeRecorder, route: Callable) -> Callable:
    def routed(*args, **kwargs):
        return route(rec, args, kwargs)

    return routed


def deepcopy_fake(t: torch.Tensor, memo: dict) -> torch.Tensor:
    """``copy.deepcopy`` of a tensor during a fake run: a clone in the same fake mode.

    torch's own deep copy of a fake tensor builds it in a new fake mode, and the next op
    that mixes the two fails ("Mixing fake modes NYI"); a clone stays in the run's mode and
    is recorded like any other allocation.
    """
    hit = memo.get(id(t))
    if hit is not None:
        return hit
    with torch.no_grad():
        new = t.clone()
    if isinstance(t, torch.nn.Parameter):
        new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
    elif t.requires_grad and t.is_leaf:
        new.requires_grad_(True)
    if t.is_leaf and t.grad is not None:
        new.grad = deepcopy_fake(t.grad, memo)
    memo[id(t)] = new
    return new
