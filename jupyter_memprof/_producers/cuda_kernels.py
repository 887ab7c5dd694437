"""CUDA's own kernels in an estimate for a CUDA device: which scaled-dot-product-attention
backend CUDA takes, and what its kernels allocate that a fake run cannot see.

An estimate for CUDA computed without a GPU runs on fake CPU tensors, so composite ops
choose their CPU kernels. Where CUDA's choice changes the memory, it is made here instead:

- :func:`sdpa_backend` is CUDA's choice of attention kernel (flash, memory-efficient,
  cuDNN, math) for the tensors and the GPU (torch's ``sdp_utils.cpp``: the filters of
  each backend, in CUDA's priority order); :func:`cuda_sdpa` calls that kernel's aten op as
  CUDA's ``scaled_dot_product_attention`` calls it (padding, mask conversion, logsumexp).
- ``CUDA_SIZE_RULES`` give, per aten op, the real sizes of outputs a fake (meta) kernel
  leaves empty and the blocks the real kernel allocates and frees inside itself (same form
  as the CPU rules of :mod:`.fake_recorder`). Each is written down in docs/estimate.md with
  the shapes it was checked on.
- :data:`NOT_MODELLED` names the ops whose CUDA kernels allocate memory that no rule
  covers (cuDNN's and cuBLAS's workspaces, ...): an estimate lists the ones it ran.
"""

from __future__ import annotations

import enum
import math
import re
from typing import Any, NamedTuple

import torch

#: The GPU an estimate for CUDA assumes when none is named.
DEFAULT_GPU = "H100"

_NAMED_GPUS = {
    "H100": (9, 0), "H200": (9, 0), "GH200": (9, 0), "H800": (9, 0), "H20": (9, 0),
    "B200": (10, 0), "GB200": (10, 0), "B100": (10, 0),
    "A100": (8, 0), "A800": (8, 0), "A30": (8, 0),
    "A10": (8, 6), "A10G": (8, 6), "A40": (8, 6), "A6000": (8, 6), "RTX3090": (8, 6),
    "L4": (8, 9), "L40": (8, 9), "L40S": (8, 9), "RTX4090": (8, 9), "RTX6000ADA": (8, 9),
    "RTX5090": (12, 0), "V100": (7, 0), "T4": (7, 5), "RTX2080TI": (7, 5), "P100": (6, 0),
}  # fmt: skip
_SM = re.compile(r"^(?:SM_?)?(\d{1,3})(?:\.(\d))?$")


class Gpu(NamedTuple):
    """The GPU an estimate's kernel choices follow: a name and its compute capability."""

    name: str
    major: int
    minor: int

    @property
    def sm(self) -> int:
        """Compute capability as one number (9.0 -> 90)."""
        return self.major * 10 + self.minor


def parse_gpu(gpu: Any) -> Gpu:
    """``None`` (:data:`DEFAULT_GPU`), a name (``"H100"``, ``"a100"``, ``"RTX 4090"``), a
    compute capability (``"sm90"``, ``"sm_80"``, ``"8.6"``, ``(9, 0)``) -> :class:`Gpu`;
    anything else raises ValueError with one line."""
    if gpu is None:
        gpu = DEFAULT_GPU
    if isinstance(gpu, Gpu):
        return gpu
    if isinstance(gpu, tuple) and len(gpu) == 2 and all(type(x) is int for x in gpu):
        major, minor = gpu
        if 1 <= major <= 20 and 0 <= minor <= 9:
            return Gpu(f"sm{major}{minor}", major, minor)
    if isinstance(gpu, str):
        key = re.sub(r"[\s_-]", "", gpu.upper()).removeprefix("NVIDIA")
        if key in _NAMED_GPUS:
            return Gpu(key, *_NAMED_GPUS[key])
        m = _SM.match(gpu.strip().upper())
        if m:
            major, minor = _sm_digits(m.group(1), m.group(2))
            if major >= 1:
                return Gpu(f"sm{major}{minor}", major, minor)
    names = ", ".join(sorted(_NAMED_GPUS))
    raise ValueError(
        f"unknown gpu {gpu!r}: give a name ({names}) or a compute capability such as "
        "'sm90' or (9, 0)"
    )


def _sm_digits(whole: str, minor: str | None) -> tuple[int, int]:
    """``"90"`` -> (9, 0), ``"120"`` -> (12, 0), ``"8", "6"`` -> (8, 6), ``"9"`` -> (9, 0)."""
    if minor is not None:
        return int(whole), int(minor)
    if len(whole) >= 2:
        return int(whole[:-1]), int(whole[-1])
    return int(whole), 0


# -- scaled dot product attention: the backend --------------------------------------------------
class SdpaBackend(enum.Enum):
    """The kernels behind ``F.scaled_dot_product_attention`` on CUDA."""

    CUDNN = "cudnn"
    FLASH = "flash"
    EFFICIENT = "efficient"
    MATH = "math"


_HALF = (torch.float16, torch.bfloat16)


def _priority(gpu: Gpu) -> tuple[SdpaBackend, ...]:
    """CUDA's order of trial: cuDNN first on sm90/sm100 (torch 2.11+ with cuDNN 9.15+, the
    CUDA 13 builds), else flash, memory-efficient, math, cuDNN."""
    if gpu.major in (9, 10):
        return (SdpaBackend.CUDNN, SdpaBackend.FLASH, SdpaBackend.EFFICIENT, SdpaBackend.MATH)
    return (SdpaBackend.FLASH, SdpaBackend.EFFICIENT, SdpaBackend.MATH, SdpaBackend.CUDNN)


def _enabled(backend: SdpaBackend) -> bool:
    """The user's switches (``torch.backends.cuda.enable_*_sdp``)."""
    cuda = torch.backends.cuda
    return {
        SdpaBackend.CUDNN: cuda.cudnn_sdp_enabled,
        SdpaBackend.FLASH: cuda.flash_sdp_enabled,
        SdpaBackend.EFFICIENT: cuda.mem_efficient_sdp_enabled,
        SdpaBackend.MATH: cuda.math_sdp_enabled,
    }[backend]()


class SdpaCall(NamedTuple):
    """The arguments of one ``scaled_dot_product_attention`` call."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    dropout_p: float
    is_causal: bool
    scale: float | None
    enable_gqa: bool

    @property
    def needs_grad(self) -> bool:
        return torch.is_grad_enabled() and any(
            t.requires_grad for t in (self.query, self.key, self.value)
        )


def bind_sdpa(args: tuple, kwargs: dict) -> SdpaCall | None:
    """The call's arguments by name, or ``None`` where no fused kernel could take it (not
    three dense 4-D tensors): torch's own composite then runs, as on CUDA."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
    a = {**dict(zip(names, args)), **kwargs}
    qkv = [a.get(n) for n in names[:3]]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.layout == torch.strided
               for t in qkv):  # fmt: skip
        return None
    if any(t.is_nested for t in qkv):
        return None
    return SdpaCall(
        *qkv,
        a.get("attn_mask"),
        float(a.get("dropout_p", 0.0) or 0.0),
        bool(a.get("is_causal", False)),
        a.get("scale"),
        bool(a.get("enable_gqa", False)),
    )


def _common_ok(c: SdpaCall, *, gqa: bool) -> bool:
    """Shapes every fused kernel needs: same batch, heads equal (or grouped, where the
    kernel supports it), no empty sequence, last dimension contiguous."""
    q, k, v = c.query, c.key, c.value
    if not (q.dtype == k.dtype == v.dtype):
        return False
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return False
    if k.shape[1] != v.shape[1]:
        return False
    if q.shape[1] != k.shape[1]:
        if not (gqa and c.enable_gqa and q.shape[1] % k.shape[1] == 0):
            return False
    if min(q.shape[2], k.shape[2]) == 0:
        return False
    return all(t.stride(-1) == 1 for t in (q, k, v))


def _gemm_alignment(dtype: torch.dtype, gpu: Gpu) -> int:
    """``minimum_gemm_alignment`` of sdp_utils: elements a head dimension must be a
    multiple of for the memory-efficient kernels."""
    half = dtype in _HALF
    use_tc = gpu.major >= 8 or (gpu.major == 7 and half)
    align = 4 if gpu.major >= 8 else 1
    if use_tc:
        align = max(align, 128 // (16 if half else 32))
    return align


def can_use_flash(c: SdpaCall, gpu: Gpu) -> bool:
    q, k, v = c.query, c.key, c.value
    d = q.shape[-1]
    if c.attn_mask is not None or not (80 <= gpu.sm <= 121):
        return False
    if not (d == k.shape[-1] == v.shape[-1] and d <= 256):
        return False
    if q.dtype not in _HALF:
        return False
    if c.needs_grad and (86 <= gpu.sm <= 89 or 120 <= gpu.sm <= 121):
        if not (d <= 192 or (c.dropout_p == 0.0 and d > 224)):
            return False
    if c.is_causal and q.shape[2] != k.shape[2]:
        return False
    return _common_ok(c, gqa=True)


def can_use_efficient(c: SdpaCall, gpu: Gpu) -> bool:
    q, k, v = c.query, c.key, c.value
    if not (50 <= gpu.sm <= 121):
        return False
    align = _gemm_alignment(q.dtype, gpu)
    if q.shape[-1] != k.shape[-1] or q.shape[-1] % align or v.shape[-1] % align:
        return False
    if min(q.shape[-1], v.shape[-1]) <= 0:
        return False
    if gpu.major >= 8:  # storage offsets aligned to the gemm alignment
        if any((t.storage_offset() * t.element_size()) % (align * t.element_size())
               for t in (q, k, v)):  # fmt: skip
            return False
    allowed = (torch.float16, torch.float32, torch.bfloat16) if gpu.major >= 8 else (
        torch.float16, torch.float32)  # fmt: skip
    if q.dtype not in allowed:
        return False
    return _common_ok(c, gqa=True)


def can_use_cudnn(c: SdpaCall, gpu: Gpu) -> bool:
    """cuDNN's filters as torch 2.11 has them (the H100 measured took cuDNN with dropout
    0.1; later torch refuses dropout that is not a multiple of 1/16)."""
    q, k, v = c.query, c.key, c.value
    if not (80 <= gpu.sm <= 121) or q.dtype not in _HALF:
        return False
    if torch.are_deterministic_algorithms_enabled():
        return False
    if q.shape[0] > 65535 or q.shape[1] > 65535:
        return False
    d_qk, d_v = q.shape[-1], v.shape[-1]
    if d_qk > 128 or d_v > 128 or d_qk % 8 or d_v % 8:
        return False
    if k.shape[2] == 1 or (c.dropout_p != 0.0 and q.shape[2] == 1):
        return False
    return _common_ok(c, gqa=True)


_CAN_USE = {
    SdpaBackend.CUDNN: can_use_cudnn,
    SdpaBackend.FLASH: can_use_flash,
    SdpaBackend.EFFICIENT: can_use_efficient,
}


def sdpa_backend(c: SdpaCall, gpu: Gpu) -> SdpaBackend:
    """The backend CUDA's ``select_sdp_backend`` takes for this call on ``gpu``."""
    for backend in _priority(gpu):
        if not _enabled(backend):
            continue
        if backend is SdpaBackend.MATH or _CAN_USE[backend](c, gpu):
            return backend
    return SdpaBackend.MATH


def _bool_mask_to_float(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``convert_boolean_attn_mask``: True keeps (0), False masks (-inf)."""
    if mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask.logical_not(), float("-inf"), zero)


def _efficient_mask(mask: torch.Tensor, c: SdpaCall) -> torch.Tensor:
    """``preprocess_mask``: expanded to (B, H, L, S); padded to 16 in its last dimension
    (then sliced back) when its row stride is not a multiple of 16."""
    q, k = c.query, c.key
    mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if mask.stride(-2) % 16 == 0:
        return mask
    last = mask.shape[-1]
    padded = torch.nn.functional.pad(mask, (0, 16 - last % 16))
    return padded[..., :last]


def cuda_sdpa(c: SdpaCall, backend: SdpaBackend) -> torch.Tensor:
    """Run ``backend``'s aten op as CUDA's ``scaled_dot_product_attention`` runs it."""
    aten = torch.ops.aten
    q, k, v = c.query, c.key, c.value
    if backend is SdpaBackend.FLASH:
        d = q.shape[-1]
        pad = (8 - d % 8) % 8
        scale = c.scale if c.scale is not None else 1.0 / math.sqrt(d)
        if pad:
            q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
        out = aten._scaled_dot_product_flash_attention(
            q, k, v, c.dropout_p, c.is_causal, False, scale=scale
        )[0]
        return out[..., :d] if pad else out
    mask = c.attn_mask
    if mask is not None:
        mask = _bool_mask_to_float(mask, q.dtype)
    if backend is SdpaBackend.CUDNN:
        return aten._scaled_dot_product_cudnn_attention(
            q, k, v, mask, c.needs_grad, c.dropout_p, c.is_causal, False, scale=c.scale
        )[0]
    if backend is SdpaBackend.EFFICIENT:
        if mask is not None:
            mask = _efficient_mask(mask, c)
        return aten._scaled_dot_product_efficient_attention(
            q, k, v, mask, c.needs_grad, c.dropout_p, c.is_causal, scale=c.scale
        )[0]
    return aten._scaled_dot_product_attention_math(
        q, k, v, mask, c.dropout_p, c.is_causal, None, scale=c.scale, enable_gqa=c.enable_gqa
    )[0]


# -- size rules -----------------------------------------------------------------------------------
def _nbytes(shape, dtype: torch.dtype) -> int:
    return math.prod(int(s) for s in shape) * dtype.itemsize


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class _EffBwdKernel(NamedTuple):
    """One kernel of the memory-efficient attention backward (``cutlassB``): block sizes
    I (queries) and J (keys), the largest head dimension it takes, dropout or not."""

    block_i: int
    block_j: int
    max_k: int
    dropout: bool


#: ``dispatch_cutlassB_f32_sm80`` (used for sm80 to sm9x), in trial order; the first that
#: takes the head dimension (and dropout) runs.
_EFF_BWD_F32_SM80 = tuple(
    _EffBwdKernel(i, j, k, drop)
    for drop in (False, True)
    for i, j, k in ((64, 64, 32), (64, 64, 64), (128, 64, 128), (64, 64, 128),
                    (128, 64, 65536), (64, 64, 65536))
)  # fmt: skip


def _eff_bwd_kernel(dtype: torch.dtype, head_dim: int, dropout: bool, gpu: Gpu):
    """The backward kernel CUDA launches, where modelled: f32 on sm80 to sm9x; f16/bf16
    there for head dimensions up to 64 (64 x 64 blocks, dK/dV kept in registers)."""
    if not 80 <= gpu.sm < 100:
        return None
    if dtype == torch.float32:
        for kern in _EFF_BWD_F32_SM80:
            if kern.max_k >= head_dim and kern.dropout == dropout:
                return kern
        return None
    if dtype in _HALF and head_dim <= 64:
        return _EffBwdKernel(64, 64, 32 if head_dim <= 32 else 64, dropout)
    return None


def efficient_backward_workspace(b, h, m, d, kern: _EffBwdKernel) -> int:
    """Bytes of the backward's float workspace: per batch and head, one dQ accumulator tile
    (``GradQTempStorage``: 16 bytes of lock/counter, then I x J floats) per block of I
    queries and J head-dimension columns, rounded to 4 floats. f32 and register-kept dK/dV
    need no dK/dV accumulators."""
    tile = (16 + 4 * kern.block_i * kern.block_j) // 4
    per_bh = _ceil(m, kern.block_i) * _ceil(d, kern.block_j) * tile
    per_bh = _ceil(per_bh, 4) * 4
    return b * h * per_bh * 4


def _transposed_contiguous(t: torch.Tensor) -> bool:
    """Whether ``t.transpose(1, 2)`` (B, L, H, D) is contiguous: the kernels then read it
    as it is; otherwise they copy it."""
    return t.transpose(1, 2).is_contiguous()


#: An output a size rule places on the CPU (CUDA's kernel makes it there).
ON_CPU = "cpu"


def _efficient_forward(a: dict, gpu: Gpu):
    """Memory-efficient attention forward: output and logsumexp (padded to 32 queries) as
    the fake kernel makes them; the philox seed and offset are CPU scalars; f16/bf16 with a
    head dimension over 128 adds a float output accumulator (B, L, H, Dv) inside."""
    q, v = a["query"], a["value"]
    outs = {2: ON_CPU, 3: ON_CPU}
    if q.dtype in _HALF and v.shape[-1] > 128:
        b, h, m = q.shape[0], q.shape[1], q.shape[2]
        return outs, [b * m * h * v.shape[-1] * 4]
    return outs, []


def _efficient_backward(a: dict, gpu: Gpu):
    """Memory-efficient attention backward: gradients as the fake kernel makes them; inside,
    a contiguous copy of the incoming gradient (when it is not (B, L, H, D)-contiguous),
    ``delta`` (B, H, L floats; f32 computes it with two more temporaries first) and the
    workspace of :func:`efficient_backward_workspace`."""
    q, v, go = a["query"], a["value"], a["grad_out_"]
    b, h, m, d = (int(s) for s in q.shape)
    dv = int(v.shape[-1])
    kern = _eff_bwd_kernel(q.dtype, max(d, dv), float(a["dropout_p"]) > 0.0, gpu)
    if kern is None:
        return None
    temps: list = []
    if not _transposed_contiguous(go):
        temps.append(_nbytes(go.shape, go.dtype))
    if q.dtype == torch.float32:  # delta = (dO * O).sum(-1).transpose(-2, -1).contiguous()
        temps.append((b * m * h * dv * 4, b * m * h * 4))
    temps.append(b * h * m * 4)  # delta
    workspace = efficient_backward_workspace(b, h, m, d, kern)
    if workspace:
        temps.append(workspace)
    return {}, temps


def _flash_backward(a: dict, gpu: Gpu):
    """Flash attention backward (FlashAttention-2): contiguous copies of the incoming
    gradient and of the output (when not (B, L, H, D)-contiguous), ``softmax_d`` (B, H,
    L rounded up to 128, floats) and the dQ accumulator (B, L rounded to 128, H, D rounded
    to 32 (256 above 192), floats); grouped heads add expanded dK and dV."""
    q, k, go, out = a["query"], a["key"], a["grad_out"], a["out"]
    b, h, m, d = (int(s) for s in q.shape)
    n, hk = int(k.shape[2]), int(k.shape[1])
    m128 = _ceil(m, 128) * 128
    d_round = _ceil(d, 32) * 32 if d <= 192 else 256
    temps = []
    for t in (go, out):
        if not _transposed_contiguous(t):
            temps.append(_nbytes(t.shape, t.dtype))
    temps += [b * h * m128 * 4, b * m128 * h * d_round * 4]
    if hk != h:
        temps += [2 * b * n * h * d * q.element_size()]
    return {}, temps


#: Bytes cuDNN adds to a workspace or reserve request (measured: between 53 and 352 on
#: every shape; 256 rounds to the same 512-byte blocks on all of them).
_CUDNN_PAD = 256


def _cudnn_attention(a: dict, gpu: Gpu):
    """cuDNN attention forward (cuDNN 9.19): output and logsumexp (B, H, L, 1 floats) as
    the fake kernel makes them; the philox seed and offset are CUDA scalars (one 512-byte
    block each, saved for backward); inside, a workspace of one 512-byte block."""
    if gpu.sm != 90:
        return None
    return {6: 8, 7: 8}, [512]


def _cudnn_attention_backward(a: dict, gpu: Gpu):
    """cuDNN attention backward (cuDNN 9.19): gradients as the fake kernel makes them;
    inside, the incoming gradient copied to the output's strides when they differ, and one
    workspace of B x H x Lq x (Dqk + 1) floats (a float dQ accumulator and a per-row sum)
    plus :data:`_CUDNN_PAD` bytes."""
    if gpu.sm != 90:
        return None
    q, go, out = a["query"], a["grad_out"], a["out"]
    b, h, m, d = (int(s) for s in q.shape)
    temps = []
    if go.stride() != out.stride():
        temps.append(_nbytes(go.shape, go.dtype))
    temps.append(b * h * m * (d + 1) * 4 + _CUDNN_PAD)
    return {}, temps


#: op -> rule(arguments by name, gpu) -> ({output index: real bytes}, [bytes allocated inside
#: the op: an int lives until the op returns; a tuple of ints is allocated in order and freed
#: before the next entry]) or None (not modelled for these arguments).
CUDA_SIZE_RULES = {
    torch.ops.aten._scaled_dot_product_efficient_attention.default: _efficient_forward,
    torch.ops.aten._scaled_dot_product_efficient_attention_backward.default: _efficient_backward,
    torch.ops.aten._scaled_dot_product_flash_attention_backward.default: _flash_backward,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default: _cudnn_attention,
    torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default: _cudnn_attention_backward,
}

#: ops whose CUDA kernels allocate memory that no rule covers, and what it is.
NOT_MODELLED = {
    "aten::mm": "cuBLAS workspace (once per stream, before the step on a warmed-up GPU)",
    "aten::addmm": "cuBLAS workspace (once per stream, before the step on a warmed-up GPU)",
    "aten::bmm": "cuBLAS workspace (once per stream, before the step on a warmed-up GPU)",
}


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
        return self.steps * self.batch * per * self.dtype.itemsize + _CUDNN_PAD


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
    return 0 if t.is_contiguous() else _nbytes(x.shape, x.dtype)


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
        temps.append(_nbytes(hx.shape, hx.dtype))
    if cx is not None and a["grad_cy"] is None:
        temps.append(_nbytes(cx.shape, cx.dtype))
    x_copy = _time_major_copy(a, a["input"])
    out = a["output"]
    dy_copy = _time_major_copy(a, go) if go is not None else _nbytes(out.shape, out.dtype)
    data = tuple(n for n in (x_copy, dy_copy) if n) + (Out(0), Out(1), Out(2), ws)
    weight = tuple(n for n in (x_copy,) if n) + (Out(3), ws)
    return {}, [*temps, data, weight]


class Out(NamedTuple):
    """In a size rule's list of blocks: output ``index`` (of the op's outputs, flattened)
    is allocated at this point; outputs not named are allocated before every block."""

    index: int


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


CUDA_SIZE_RULES[torch.ops.aten._cudnn_rnn.default] = _cudnn_rnn
CUDA_SIZE_RULES[torch.ops.aten._cudnn_rnn_backward.default] = _cudnn_rnn_backward


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


CUDA_SIZE_RULES[torch.ops.aten.convolution.default] = _convolution
CUDA_SIZE_RULES[torch.ops.aten.convolution_backward.default] = _convolution_backward
