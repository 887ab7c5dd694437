"""CUDA's own kernels in an estimate: what attention allocates.

For a CUDA device: which scaled-dot-product-attention
backend CUDA takes, and what its kernels allocate that a fake run cannot see.

An estimate for CUDA computed without a GPU runs on fake CPU tensors, so composite ops
choose their CPU kernels. Where CUDA's choice changes the memory, it is made here instead:

- :func:`sdpa_backend` is CUDA's choice of attention kernel (flash, memory-efficient,
  cuDNN, math) for the tensors and the GPU (torch's ``sdp_utils.cpp``: the filters of
  each backend, in CUDA's priority order); :func:`cuda_sdpa` calls that kernel's aten op as
  CUDA's ``scaled_dot_product_attention`` calls it (padding, mask conversion, logsumexp).
- ``CUDA_SIZE_RULES`` give, per aten op, the real sizes of outputs a fake (meta) kernel
  leaves empty and the blocks the real kernel allocates and frees inside itself (same form
  as the CPU rules of :mod:`.fake.recorder`). Each is written down in docs/estimate.md with
  the shapes it was checked on.
- cuDNN's RNNs and convolutions: :mod:`.cudnn_kernels`; the GPU: :mod:`.gpus`.
- :data:`NOT_MODELLED` names the ops whose CUDA kernels allocate memory that no rule
  covers (cuDNN's and cuBLAS's workspaces, ...): an estimate lists the ones it ran.
"""

from __future__ import annotations

import enum
import math
from typing import NamedTuple

import torch

from .cudnn_kernels import CUDNN_RULES, RnnDims, allow_cudnn_rnn_backward, cudnn_lstm
from .gpus import CUDNN_PAD, DEFAULT_GPU, ON_CPU, Gpu, Out, ceil_div, nbytes, parse_gpu


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
    # torch's dense constraints take no grouped query heads here (sdp_utils.cpp:
    # check_batch_size_and_num_heads_dense<false>): GQA goes to cuDNN, flash or math
    return _common_ok(c, gqa=False)


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
    per_bh = ceil_div(m, kern.block_i) * ceil_div(d, kern.block_j) * tile
    per_bh = ceil_div(per_bh, 4) * 4
    return b * h * per_bh * 4


def _transposed_contiguous(t: torch.Tensor) -> bool:
    """Whether ``t.transpose(1, 2)`` (B, L, H, D) is contiguous: the kernels then read it
    as it is; otherwise they copy it."""
    return t.transpose(1, 2).is_contiguous()


#: An output a size rule places on the CPU (CUDA's kernel makes it there).


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
        temps.append(nbytes(go.shape, go.dtype))
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
    m128 = ceil_div(m, 128) * 128
    d_round = ceil_div(d, 32) * 32 if d <= 192 else 256
    temps = []
    for t in (go, out):
        if not _transposed_contiguous(t):
            temps.append(nbytes(t.shape, t.dtype))
    temps += [b * h * m128 * 4, b * m128 * h * d_round * 4]
    if hk != h:
        temps += [2 * b * n * h * d * q.element_size()]
    return {}, temps


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
    plus :data:`CUDNN_PAD` bytes."""
    if gpu.sm != 90:
        return None
    q, go, out = a["query"], a["grad_out"], a["out"]
    b, h, m, d = (int(s) for s in q.shape)
    temps = []
    if go.stride() != out.stride():
        temps.append(nbytes(go.shape, go.dtype))
    temps.append(b * h * m * (d + 1) * 4 + CUDNN_PAD)
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
    **CUDNN_RULES,
}

#: ops whose CUDA kernels allocate memory that no rule covers, and what it is.
NOT_MODELLED = {
    "aten::mm": "cuBLAS workspace (once per stream, before the step on a warmed-up GPU)",
    "aten::addmm": "cuBLAS workspace (once per stream, before the step on a warmed-up GPU)",
    "aten::bmm": "cuBLAS workspace (once per stream, before the step on a warmed-up GPU)",
}


__all__ = [
    "CUDA_SIZE_RULES",
    "DEFAULT_GPU",
    "NOT_MODELLED",
    "ON_CPU",
    "Gpu",
    "Out",
    "RnnDims",
    "SdpaBackend",
    "SdpaCall",
    "allow_cudnn_rnn_backward",
    "bind_sdpa",
    "cuda_sdpa",
    "cudnn_lstm",
    "parse_gpu",
    "sdpa_backend",
]
