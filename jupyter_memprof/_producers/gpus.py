"""The GPU a CUDA estimate follows, and what its size rules share.

The GPU an estimate for CUDA follows (:class:`Gpu`, :func:`parse_gpu`), and what the size
rules of CUDA's kernels share (:mod:`.cuda_kernels` for attention, :mod:`.cudnn_kernels`
for cuDNN's RNNs and convolutions): byte counts and how a rule names an op's outputs."""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

import torch

__all__ = ["CUDNN_PAD", "DEFAULT_GPU", "ON_CPU", "Gpu", "Out", "ceil_div", "nbytes", "parse_gpu"]

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


def nbytes(shape, dtype: torch.dtype) -> int:
    return math.prod(int(s) for s in shape) * dtype.itemsize


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


#: Where a size rule leaves a block: on the CPU.
ON_CPU = "cpu"


class Out(NamedTuple):
    """In a size rule's list of blocks: output ``index`` (of the op's outputs, flattened)
    is allocated at this point; outputs not named are allocated before every block."""

    index: int


#: Bytes cuDNN adds to a workspace or reserve request (measured: between 53 and 352 on
#: every shape; 256 rounds to the same 512-byte blocks on all of them).
CUDNN_PAD = 256
