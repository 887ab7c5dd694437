"""cuDNN's kernels in an estimate: the LSTM and convolutions.

The LSTM as cuDNN runs it (one ``_cudnn_rnn``
over every layer, its weight buffer, reserve space and workspace) and the convolution's
workspaces, sized from tables measured on an H100 (docs/estimate.md). Their size rules join
:data:`.cuda_kernels.CUDA_SIZE_RULES` (see there for the form)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .gpus import CUDNN_PAD, Gpu, Out, nbytes

__all__ = ["CUDNN_RULES", "RnnDims", "allow_cudnn_rnn_backward", "cudnn_lstm"]


# -- cuDNN's LSTM -------------------------------------------------------------------------------
#: cuDNN's RNN workspace (bytes a forward or backward call allocates and frees), measured on
#: an H100 with cuDNN 9.19 (sm90) for (dtype, input size, hidden size, layers, batch, steps,
#: directions). cuDNN's heuristics choose it; shapes not here are named as not modelled.
CUDNN_RNN_WORKSPACE = {
    ("float32", 64, 256, 2, 16, 64, 1): 26018304,
    ("float32", 32, 96, 2, 6, 24, 1): 18485760,
    ("float32", 16, 16, 1, 1, 1, 1): 8399360,
    ("float32", 100, 300, 1, 4, 50, 2): 24173056,
    ("float32", 128, 128, 3, 8, 17, 1): 28369408,
    ("float32", 64, 200, 2, 5, 33, 2): 41166848,
    ("float16", 64, 256, 2, 16, 64, 1): 21398016,
    ("float16", 32, 96, 2, 6, 24, 1): 17631744,
    ("float16", 16, 16, 1, 1, 1, 1): 8394240,
    ("float16", 100, 300, 1, 4, 50, 2): 20971520,
    ("float16", 128, 128, 3, 8, 17, 1): 26767872,
    ("float16", 64, 200, 2, 5, 33, 2): 37361152,
}
_CUDNN_LSTM = 2  # cudnnRNNMode_t CUDNN_LSTM


class RnnDims(NamedTuple):
    """One cuDNN RNN call: steps, batch, input size, hidden size, layers, directions."""

    steps: int
    batch: int
    inp: int
    hidden: int
    layers: int
    dirs: int
    dtype: torch.dtype

    def workspace(self) -> int | None:
        key = (str(self.dtype).removeprefix("torch."), self.inp, self.hidden, self.layers,
               self.batch, self.steps, self.dirs)  # fmt: skip
        return CUDNN_RNN_WORKSPACE.get(key)

    def reserve(self) -> int:
        """The reserve space of a training forward (saved for backward): per step and batch
        element, 6 x hidden per layer and direction (gates, cell and hidden states), less
        one hidden for each direction of the last layer (its output is ``output``)."""
        per = self.dirs * (6 * self.layers - 1) * self.hidden
        return self.steps * self.batch * per * self.dtype.itemsize + CUDNN_PAD


def _rnn_dims(a: dict) -> RnnDims | None:
    """The call's dimensions where the rules cover it: an LSTM without projections, not
    packed, f16/f32."""
    x = a["input"]
    if a["mode"] != _CUDNN_LSTM or a["proj_size"] or a["batch_sizes"]:
        return None
    if x.dim() != 3 or x.dtype not in (torch.float16, torch.float32):
        return None
    steps, batch = (x.shape[1], x.shape[0]) if a["batch_first"] else (x.shape[0], x.shape[1])
    dirs = 2 if a["bidirectional"] else 1
    return RnnDims(int(steps), int(batch), int(x.shape[2]), int(a["hidden_size"]),
                   int(a["num_layers"]), dirs, x.dtype)  # fmt: skip


def _time_major_copy(a: dict, x: torch.Tensor) -> int:
    """cuDNN reads (steps, batch, features) contiguous: bytes of the copy made of ``x``
    (batch-first or not contiguous), 0 when it is read as it is."""
    t = x.transpose(0, 1) if a["batch_first"] else x
    return 0 if t.is_contiguous() else nbytes(x.shape, x.dtype)


def _cudnn_rnn(a: dict, gpu: Gpu):
    """cuDNN's RNN forward: the reserve space (4th output, empty in a fake run) by
    :meth:`RnnDims.reserve` in training; inside, the input's time-major copy and the
    workspace (:data:`CUDNN_RNN_WORKSPACE`)."""
    dims = _rnn_dims(a)
    if dims is None or gpu.sm != 90:
        return None
    ws = dims.workspace()
    if ws is None:
        return None
    outs = {3: dims.reserve()} if a["train"] else {}
    temps = [n for n in (_time_major_copy(a, a["input"]), ws) if n]
    return outs, temps


def _cudnn_rnn_backward(a: dict, gpu: Gpu):
    """cuDNN's RNN backward: zeros for the hidden and cell gradients not given, then the
    data pass (time-major copies of the input and of the output's gradient, dx, dhx, dcx,
    the workspace), then the weight pass (the input's copy again, the flat weight gradient
    (4th output, the weights' bytes), the workspace)."""
    dims = _rnn_dims(a)
    if dims is None or gpu.sm != 90:
        return None
    ws = dims.workspace()
    if ws is None:
        return None
    hx, cx, go = a["hx"], a["cx"], a["grad_output"]
    temps: list = []
    if a["grad_hy"] is None:
        temps.append(nbytes(hx.shape, hx.dtype))
    if cx is not None and a["grad_cy"] is None:
        temps.append(nbytes(cx.shape, cx.dtype))
    x_copy = _time_major_copy(a, a["input"])
    out = a["output"]
    dy_copy = _time_major_copy(a, go) if go is not None else nbytes(out.shape, out.dtype)
    data = tuple(n for n in (x_copy, dy_copy) if n) + (Out(0), Out(1), Out(2), ws)
    weight = tuple(n for n in (x_copy,) if n) + (Out(3), ws)
    return {}, [*temps, data, weight]


def cudnn_rnn_backward_meta(input, weight, weight_stride0, weight_buf, hx, cx, output,
                            grad_output, grad_hy, grad_cy, mode, hidden_size, proj_size,
                            num_layers, batch_first, dropout, train, bidirectional,
                            batch_sizes, dropout_state, reserve, output_mask):  # fmt: skip
    """A fake (meta) ``aten::_cudnn_rnn_backward``: dx, dhx, dcx shaped as the input and
    the states (the real kernel makes them whatever ``output_mask`` says); the weight
    gradients are views of one flat buffer, as cuDNN's are."""
    dx = input.new_empty(input.shape)
    dhx = hx.new_empty(hx.shape)
    dcx = cx.new_empty(cx.shape) if cx is not None else None
    dw = []
    if output_mask[3]:
        flat = input.new_empty(sum(w.numel() for w in weight))
        offset = 0
        for w in weight:
            dw.append(flat[offset : offset + w.numel()].view(w.shape))
            offset += w.numel()
    return dx, dhx, dcx, dw


_LIBRARY: list = []


def allow_cudnn_rnn_backward() -> None:
    """Give ``aten::_cudnn_rnn_backward`` its fake (meta) kernel, once per process (torch
    has none; a CPU-only torch never runs the real one)."""
    if _LIBRARY:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_cudnn_rnn_backward", cudnn_rnn_backward_meta, "Meta")
    _LIBRARY.append(lib)


def cudnn_lstm(args: tuple, kwargs: dict):
    """``torch.lstm`` (``nn.LSTM``'s ``_VF.lstm``) as CUDA runs it with cuDNN: one
    ``aten::_cudnn_rnn`` over every layer, its backward ``aten::_cudnn_rnn_backward``. The
    weights are taken as flattened (``nn.LSTM`` on a GPU keeps them in one buffer), so no
    weight buffer is made. ``None`` where cuDNN would not take the call."""
    names = ("input", "hx", "params", "has_biases", "num_layers", "dropout", "train",
             "bidirectional", "batch_first")  # fmt: skip
    a = {**dict(zip(names, args)), **kwargs}
    x, hx, params = a.get("input"), a.get("hx"), a.get("params")
    if not (isinstance(x, torch.Tensor) and isinstance(hx, (list, tuple)) and len(hx) == 2):
        return None
    if not torch.backends.cudnn.enabled or x.dtype not in (torch.float16, torch.float32,
                                                           torch.float64):  # fmt: skip
        return None
    h0, c0 = hx
    hidden, proj = int(c0.shape[2]), 0
    if h0.shape[2] != c0.shape[2]:
        proj = int(h0.shape[2])
    allow_cudnn_rnn_backward()
    out = torch.ops.aten._cudnn_rnn(
        x, list(params), 4 if a["has_biases"] else 2, params[0].detach(), h0, c0,
        _CUDNN_LSTM, hidden, proj, int(a["num_layers"]), bool(a["batch_first"]),
        float(a["dropout"]), bool(a["train"]), bool(a["bidirectional"]), [], None,
    )  # fmt: skip
    return out[0], out[1], out[2]


# -- cuDNN's convolution ------------------------------------------------------------------------
#: cuDNN's convolution workspaces (forward, backward data, backward weight), measured on an
#: H100 with cuDNN 9.19 and ``torch.backends.cudnn.benchmark = False`` (its heuristics pick
#: the algorithm, and the algorithm its workspace: no closed rule), for 2-D convolutions
#: keyed by (dtype, N, C, H, W, out channels, kernel, stride, padding), dilation 1, groups 1.
CUDNN_CONV_WORKSPACE = {
    ("float32", 16, 3, 32, 32, 16, 3, 1, 1): (0, 1313280, 1325568),
    ("float32", 16, 16, 16, 16, 32, 3, 1, 1): (0, 0, 1666560),
    ("float32", 8, 64, 56, 56, 64, 3, 1, 1): (6570496, 12993024, 15057920),
    ("float32", 4, 3, 224, 224, 64, 7, 2, 3): (15291392, 0, 18816512),
    ("float32", 32, 128, 14, 14, 256, 1, 1, 0): (512, 0, 4734976),
    ("float16", 16, 3, 32, 32, 16, 3, 1, 1): (0, 788992, 1034752),
    ("float16", 16, 16, 16, 16, 32, 3, 1, 1): (402944, 402944, 402944),
    ("float16", 8, 64, 56, 56, 64, 3, 1, 1): (7143424, 6496768, 8414208),
    ("float16", 4, 3, 224, 224, 64, 7, 2, 3): (8053760, 9887744, 12594688),
    ("float16", 32, 128, 14, 14, 256, 1, 1, 0): (0, 0, 4817408),
}


def _conv_key(x: torch.Tensor, w: torch.Tensor, a: dict) -> tuple | None:
    """The table key of a plain 2-D convolution (square kernel, stride and padding, no
    dilation, groups or transposition), or None."""
    stride, padding, dilation = list(a["stride"]), list(a["padding"]), list(a["dilation"])
    if x.dim() != 4 or a["transposed"] or int(a["groups"]) != 1 or set(dilation) != {1}:
        return None
    kh, kw = int(w.shape[2]), int(w.shape[3])
    if kh != kw or len(set(stride)) != 1 or len(set(padding)) != 1:
        return None
    n, c, h, wd = (int(s) for s in x.shape)
    return (str(x.dtype).removeprefix("torch."), n, c, h, wd, int(w.shape[0]), kh,
            int(stride[0]), int(padding[0]))  # fmt: skip


def _convolution(a: dict, gpu: Gpu):
    """cuDNN's convolution forward: its workspace (:data:`CUDNN_CONV_WORKSPACE`) inside."""
    key = _conv_key(a["input"], a["weight"], a) if gpu.sm == 90 else None
    ws = CUDNN_CONV_WORKSPACE.get(key) if key else None
    if ws is None:
        return None
    return {}, [ws[0]] if ws[0] else []


def _convolution_backward(a: dict, gpu: Gpu):
    """cuDNN's convolution backward: the input's gradient, then the data pass's workspace;
    the weight's gradient, then the weight pass's workspace; then the bias's gradient."""
    key = _conv_key(a["input"], a["weight"], a) if gpu.sm == 90 else None
    ws = CUDNN_CONV_WORKSPACE.get(key) if key else None
    if ws is None:
        return None
    mask = list(a["output_mask"])
    temps: list = []
    for i, n in ((0, ws[1]), (1, ws[2])):
        if mask[i]:
            temps.append((Out(i), n) if n else Out(i))
    if mask[2]:
        temps.append(Out(2))
    return {}, temps


#: cuDNN's ops and their size rules.
CUDNN_RULES = {
    torch.ops.aten._cudnn_rnn.default: _cudnn_rnn,
    torch.ops.aten._cudnn_rnn_backward.default: _cudnn_rnn_backward,
    torch.ops.aten.convolution.default: _convolution,
    torch.ops.aten.convolution_backward.default: _convolution_backward,
}
