"""The CPU's kernels' own memory in an estimate (oneDNN's LSTM).

Size rules for ops whose real kernel
(oneDNN) allocates blocks a fake (meta) kernel does not make, and the ops whose kernel
memory is known not to be modelled.

A rule takes the op's arguments by schema name and returns ``({output index: real bytes},
[bytes allocated and freed inside the op])`` or ``None`` (no rule for these arguments).
Measured with torch 2.13 (oneDNN) on x86-64; docs/estimate.md.
"""

from __future__ import annotations

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


#: op -> rule(arguments by name) -> ({output index: real bytes}, [bytes allocated and freed
#: inside the op]) or None. Measured with torch 2.13 (oneDNN) on x86-64; docs/estimate.md.
CPU_SIZE_RULES = {
    torch.ops.aten.mkldnn_rnn_layer.default: _mkldnn_rnn_layer,
    torch.ops.aten.mkldnn_rnn_layer_backward.default: _mkldnn_rnn_layer_backward,
}


_MATMULS = frozenset(
    {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
)
_ONEDNN_LOW = (torch.bfloat16, torch.float16)


def not_modelled(func, args: tuple) -> str | None:
    """What a CPU kernel allocates for itself that no rule covers, for ops known to: oneDNN's
    bf16/f16 matmuls take a scratch block inside (seen in backward ``aten::mm`` under CPU
    autocast: ViT -3.7% without it), whose size was not measured."""
    if func in _MATMULS and any(
        isinstance(a, torch.Tensor) and a.dtype in _ONEDNN_LOW for a in args
    ):
        return "oneDNN's bf16/f16 matmul scratch memory (not measured)"
    return None
