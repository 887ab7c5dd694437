"""oneDNN's own memory in a CPU estimate: LSTM, bf16 matmul.

Size rules for ops whose real kernel
(oneDNN) allocates blocks a fake (meta) kernel does not make, and the ops whose kernel
memory is known not to be modelled.

A rule takes the op's arguments by schema name and returns ``({output index: real bytes},
[bytes allocated and freed inside the op])`` or ``None`` (no rule for these arguments).
Measured with torch 2.13 (oneDNN) on x86-64; docs/estimate.md.
"""

from __future__ import annotations

import functools
import os

import torch

_PAGE = 4096


def _pages(n: int) -> int:
    return -(-n // _PAGE) * _PAGE


def _good_ld(dim: int) -> int:
    """oneDNN's leading dimension for f32 RNN matrices (``rnn_utils::get_good_ld``): rounded
    up to 64 bytes, plus 64 bytes where that is a multiple of 256 elements (4K aliasing)."""
    ld = -(-dim // 16) * 16
    return ld + 16 if ld % 256 == 0 else ld


def _rnn_dims(a: dict) -> tuple[int, int, int, int] | None:
    """(steps, batch, input size, hidden size) of an f32 LSTM layer, or None (no rule)."""
    x = a["input"]
    if x.dtype != torch.float32 or x.dim() != 3 or a.get("mode", 2) != 2 or not a["train"]:
        return None  # measured: f32 LSTM (mode 2) in training only
    steps, batch = (x.shape[1], x.shape[0]) if a["batch_first"] else (x.shape[0], x.shape[1])
    return int(steps), int(batch), int(x.shape[2]), int(a["hidden_size"])


def _rnn_temporaries(steps: int, batch: int, inp: int, hidden: int) -> list[int]:
    """What ``mkldnn_rnn_layer`` (and its backward) allocate and free inside: the summed
    bias (4H), the weights reordered to oneDNN's ldigo layout (C x ld(4H) and H x ld(4H))
    and the primitive's scratchpad (gates of every step, two cell buffers, 4664 bytes)."""
    gates = _good_ld(4 * hidden)
    scratch = _pages(steps * batch * gates * 4) + 2 * _pages(batch * _good_ld(hidden) * 4) + 4664
    return [4 * hidden * 4, inp * gates * 4, hidden * gates * 4, scratch]


def _mkldnn_rnn_layer(a: dict):
    """Forward of one LSTM layer and direction on the CPU (oneDNN). The 4th output, the
    workspace the backward reads, is empty in a fake run; the real one holds the gates of
    every step, the hidden states and five state buffers, each rounded to 4 KiB pages."""
    dims = _rnn_dims(a)
    if dims is None:
        return None
    steps, batch, inp, hidden = dims
    wide, h_ld = _good_ld(max(inp, hidden)), _good_ld(hidden)
    workspace = (
        _pages(steps * batch * _good_ld(4 * hidden) * 4)
        + _pages(steps * batch * h_ld * 4)
        + 3 * _pages(2 * (steps + 1) * batch * wide * 4)
        + 2 * _pages(2 * (steps + 1) * batch * hidden * 4)
    )
    return {3: workspace}, _rnn_temporaries(steps, batch, inp, hidden)


def _mkldnn_rnn_layer_backward(a: dict):
    """Backward of one LSTM layer: the forward's temporaries again, plus the weights in the
    backward's ldgoi layout where its padded leading dimension differs from torch's."""
    dims = _rnn_dims(a)
    if dims is None:
        return None
    steps, batch, inp, hidden = dims
    temps = _rnn_temporaries(steps, batch, inp, hidden)
    temps += [4 * hidden * _good_ld(n) * 4 for n in (inp, hidden) if _good_ld(n) != n]
    return {}, temps


def _isa() -> dict:
    """The CPU's features as torch reads them (cpuinfo), once."""
    global _ISA
    if _ISA is None:
        try:
            _ISA = dict(torch._C._cpu._get_cpu_capability())
        except (AttributeError, RuntimeError):
            _ISA = {}
    return _ISA


_ISA: dict | None = None


#: ``ONEDNN_MAX_CPU_ISA`` values that leave oneDNN the AVX-512 bf16 kernels (lower ones do
#: not: AVX512_CORE took 65,664 B where the rule has 83,584 B, AVX2 none)
_ISA_LIMITS_KEPT = frozenset(
    {"ALL", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
     "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512",
     "AVX10_2_512_AMX_2"}
)  # fmt: skip


def measured_cpu() -> bool:
    """Whether this CPU is of the kind the bf16 matmul rule was measured on: AVX-512 bf16
    without AMX (oneDNN picks other kernels, with other scratch, elsewhere), and oneDNN is
    not held below it (``ONEDNN_MAX_CPU_ISA``)."""
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if limit and limit.strip().upper() not in _ISA_LIMITS_KEPT:
        return False
    return bool(_isa().get("avx512_bf16")) and not _isa().get("amx_bf16")


#: torch hands a bf16 matmul to oneDNN only above this many multiply-adds (M·K·N; ``checksize``
#: in aten/src/ATen/native/mkldnn/Matmul.cpp)
_ONEDNN_MIN_WORK = 16 * 16 * 16
_M_BLOCK, _N_BLOCK = 256, 64


def _fullest(m: int, low: int, fits=lambda blocks: True) -> int | None:
    """The block of ``low`` to 256 rows (at most M) whose blocks waste the fewest of M's rows,
    the larger of equals, among those whose count of blocks ``fits``; None if none does."""
    best = None
    for b in range(low, min(m, _M_BLOCK) + 1):
        blocks = -(-m // b)
        if fits(blocks):
            key = (-(blocks * b - m), b)
            best = max(best or key, key)
    return None if best is None else best[1]


def _m_block(m: int, n: int, threads: int, a_transposed: bool, batch: int = 1) -> int:
    """oneDNN's rows per block (brgemm matmul, AVX-512 bf16): all of M up to 256, else the
    fullest block of 32 to 256 rows (a divisor of M where there is one); then, where the
    blocks (batch x blocks of M x blocks of N of 64 columns) do not share out evenly among
    the threads, the fullest block of at least 16 rows (one block of N) or 32 whose count
    does, if it uses 3/4 of its rows or no fewer than the threads' share used; an A read
    transposed also where the blocks of M alone do not, if a block of 32 rows or more
    divides M into a count that does."""
    mb = m if m <= _M_BLOCK else _fullest(m, 32)
    n_blocks = -(-n // _N_BLOCK) * batch
    if (-(-m // mb) * n_blocks) % threads:
        low = 16 if n_blocks == 1 else 32
        even = _fullest(m, low, lambda blocks: (blocks * n_blocks) % threads == 0)
        even = min(m, low) if even is None else even
        work = -(-m // mb) * n_blocks
        rows_used = m / (-(-m // even) * even)  # cut only where it wastes no more than
        if rows_used >= min(0.75, work / (threads * -(-work // threads))):  # idle threads
            return even
        return mb
    if a_transposed and (batch * -(-m // mb)) % threads:
        even = _fullest(m, 32, lambda blocks: (batch * blocks) % threads == 0)
        if even is not None and m % even == 0:
            return even
    return mb


def _k_chunk(k: int, m: int) -> int:
    """The rows of B one thread copies at a time: K rounded up to 32, at most 512, 1024
    for K over 1024 (M > 1)."""
    if k <= 512:
        return -(-k // 32) * 32
    return 512 if k <= 1024 or m == 1 else 1024


@functools.lru_cache(maxsize=4096)  # a model repeats its shapes
def onednn_bf16_matmul_scratch(
    m: int, k: int, n: int, threads: int, a_transposed: bool = False, batch: int = 1
) -> int | None:
    """Bytes of the one scratch block oneDNN's bf16 matmul (brgemm, AVX-512 bf16 without AMX)
    takes inside ``aten::mm``/``addmm``/``bmm`` for A (M x K) @ B (K x N) with ``threads``
    threads: per thread an f32 accumulator of one block (rows by 64 columns) and B's rows
    copied in pairs (64 columns), plus 384 + 640 per thread; an A read transposed is copied
    too (2 bytes per row and K padded, once per thread, + 128). 0 where torch does not call
    oneDNN (M·K·N <= 4096), None outside the measured shapes."""
    if batch * m * k * n <= _ONEDNN_MIN_WORK:
        return 0
    a_copy = a_transposed and m > 1
    if k > 3072 or (a_copy and k > 512):
        return None
    mb = _m_block(m, n, threads, a_copy, batch)
    size = threads * (4 * mb * min(n, _N_BLOCK) + 128 * _k_chunk(k, m)) + 384 + 640 * threads
    if a_copy:
        lda = _k_chunk(k, m) + (32 if _k_chunk(k, m) % 512 == 0 else 0)
        size += threads * 2 * mb * lda + 128
    return size


def _bf16_matmul(a: dict):
    """oneDNN's scratch block inside a bf16 ``mm``/``addmm``/``bmm`` on the CPU, for
    ``torch.get_num_threads()`` threads (read when the estimate runs the op)."""
    x, y = (a["self"], a["mat2"]) if "mat2" in a and "mat1" not in a else (a["mat1"], a["mat2"])
    if x.dtype != torch.bfloat16 or y.dtype != torch.bfloat16:
        return {}, []  # f32: MKL's sgemm, nothing allocated inside (measured)
    if not torch.backends.mkldnn.is_available() or not torch._C._get_mkldnn_enabled():
        return {}, []  # torch.backends.mkldnn.flags(enabled=False): no oneDNN, no scratch
    if not measured_cpu():
        return None
    m, k, n = int(x.shape[-2]), int(x.shape[-1]), int(y.shape[-1])
    batch = int(x.shape[0]) if x.dim() == 3 else 1
    if batch * m * k * n <= _ONEDNN_MIN_WORK:
        return {}, []
    transposed = x.stride(-2) == 1 and x.stride(-1) != 1
    if (x.stride(-1) != 1 and not transposed) or n == 1 or k == 1:
        return None  # A copied by torch first; matrix-vector, outer products: not measured
    threads = torch.get_num_threads()
    size = onednn_bf16_matmul_scratch(m, k, n, threads, transposed, batch)
    return None if size is None else ({}, [size] if size else [])


#: op -> rule(arguments by name) -> ({output index: real bytes}, [bytes allocated and freed
#: inside the op]) or None. Measured with torch 2.13 (oneDNN 3.12) on x86-64; docs/estimate.md.
CPU_SIZE_RULES = {
    torch.ops.aten.mkldnn_rnn_layer.default: _mkldnn_rnn_layer,
    torch.ops.aten.mkldnn_rnn_layer_backward.default: _mkldnn_rnn_layer_backward,
    torch.ops.aten.mm.default: _bf16_matmul,
    torch.ops.aten.addmm.default: _bf16_matmul,
    torch.ops.aten.bmm.default: _bf16_matmul,
}


_MATMULS = frozenset(
    {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
)
_ONEDNN_LOW = (torch.bfloat16, torch.float16)
#: CPU flash attention, whose kernels allocate per-thread buffers no rule covers yet
_FLASH = frozenset(
    {
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    }
)
#: convolutions, whose CPU kernels allocate scratch blocks no rule covers yet
_CONVOLUTIONS = frozenset(
    {torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default}
)


def not_modelled(func, args: tuple) -> str | None:
    """What a CPU kernel allocates for itself that no rule covers, for ops known to: oneDNN's
    bf16 matmul scratch outside the measured shapes and CPUs, f16 matmuls on CPUs where
    torch gives them to oneDNN (AVX-512 FP16, AMX), convolutions and CPU flash attention."""
    if func in _CONVOLUTIONS:
        return (
            "oneDNN's convolution scratch memory: not modelled (its blocks vary with the "
            "shape and the thread count: docs/estimate.md)"
        )
    if func in _FLASH:
        return "CPU flash attention's per-thread buffers: not modelled (docs/estimate.md)"
    if func not in _MATMULS:
        return None
    low = {a.dtype for a in args if isinstance(a, torch.Tensor) and a.dtype in _ONEDNN_LOW}
    if torch.bfloat16 in low:
        return (
            "oneDNN's bf16 matmul scratch: measured on AVX-512 bf16 CPUs without AMX, "
            "K up to 3072 (an A read transposed: up to 512), not for these shapes or this CPU"
        )
    if torch.float16 in low and (_isa().get("avx512_fp16") or _isa().get("amx_fp16")):
        return "oneDNN's f16 matmul scratch memory (not measured)"
    return None
