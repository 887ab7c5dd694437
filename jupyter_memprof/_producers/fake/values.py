"""Values a fake run gives for scalars that only decide numbers.

A fake tensor has no value, so ``.item()``, ``float(t)`` or ``if t > x:`` on a computed one
cannot be answered (``aten::_local_scalar_dense`` raises). Some of that code only chooses
numbers, not which tensors are made: an optimizer's step (HF's Adafactor compares a
parameter's RMS with ``eps`` through ``max()``), and ``GradScaler``, which skips the step when
gradients were not finite. There the run answers :data:`STAND_IN` (zero: finite gradients,
the step taken, as in a healthy training run), and the profile names each place answered
(``meta["data_dependent_scalars"]``). Anywhere else the read is an ``EstimateError``: the
value could decide which tensors exist.
"""

from __future__ import annotations

import sys

import torch

#: The ops that hand a tensor's value to Python.
SCALAR_OPS = frozenset({torch.ops.aten._local_scalar_dense.default})
#: What a scalar read inside an optimizer step or GradScaler is answered with.
STAND_IN = 0
#: Source files whose scalar reads only choose numbers (path endings, with "/").
_NUMBERS_ONLY = ("torch/amp/grad_scaler.py", "torch/cuda/amp/grad_scaler.py")


def in_numbers_only_code(in_optimizer_step: bool) -> bool:
    """Whether the read happens inside an optimizer step or torch's ``GradScaler``."""
    if in_optimizer_step:
        return True
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.replace("\\", "/").endswith(_NUMBERS_ONLY):
            return True
        f = f.f_back
    return False


def stand_in(func, args: tuple, in_optimizer_step: bool):
    """The value to answer a data-dependent scalar read with, or ``None`` (not answered)."""
    if func not in SCALAR_OPS or not in_numbers_only_code(in_optimizer_step):
        return None
    t = args[0] if args else None
    if isinstance(t, torch.Tensor) and t.dtype == torch.bool:
        return False
    if isinstance(t, torch.Tensor) and (t.dtype.is_floating_point or t.dtype.is_complex):
        return float(STAND_IN)
    return STAND_IN
