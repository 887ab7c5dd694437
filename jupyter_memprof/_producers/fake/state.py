"""What a fake run keeps as it was, and what it runs differently.

- **Random number generators**: the step may draw numbers (dropout's masks are fake, but a
  data pipeline's ``torch.randint``, Python's ``random`` or NumPy's generator are not);
  :func:`real_state_kept` saves every generator's state before the run and puts it back
  after, so the real training run draws the same numbers as if no estimate had been made.
- **torch.compile**: a fake run follows eager code. Compiled modules and functions
  (:func:`compiled_names`) run their original Python while the run lasts (:func:`eager`),
  and the profile says that the eager peak was estimated (``meta["compiled_as_eager"]``).
"""

from __future__ import annotations

import contextlib
import logging
import random
import sys
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def quiet_fake_logs() -> Iterator[None]:
    """torch's fake tensors log the whole traceback of a meta kernel that fails (a shape
    error) before raising it; the run reports it as one line instead."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def real_state_kept() -> Iterator[None]:
    """Save the random generators' states (torch's CPU and CUDA ones, Python's ``random``,
    NumPy's global one when NumPy is loaded) and restore them when the block ends."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    py = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py)
        if np_state is not None:
            np.random.set_state(np_state)


def compiled_names(objects: list[Any]) -> list[str]:
    """Names of the ``torch.compile``'d modules and functions among ``objects`` (a compiled
    module's ``OptimizedModule`` wrapper, a module compiled in place with ``.compile()``, a
    compiled function), and of compiled modules inside the modules given."""
    names: list[str] = []
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for m in obj.modules():
                name = _compiled_module(m)
                if name is not None and name not in names:
                    names.append(name)
        elif callable(obj) and getattr(obj, "_torchdynamo_orig_callable", None) is not None:
            orig = obj._torchdynamo_orig_callable
            names.append(f"{getattr(orig, '__name__', type(orig).__name__)}()")
    return names


def _compiled_module(m: torch.nn.Module) -> str | None:
    if getattr(m, "_compiled_call_impl", None) is not None:
        return type(m).__name__
    orig = getattr(m, "_orig_mod", None)
    if isinstance(orig, torch.nn.Module) and type(m).__name__ == "OptimizedModule":
        return type(orig).__name__
    return None


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """torch.compile off while the block lasts: compiled modules and functions run their
    original eager code (what a fake run can follow)."""
    import torch._dynamo  # loaded already: something was compiled

    with torch._dynamo.config.patch(disable=True):
        yield


# -- code outside torch that asks whether a tensor is fake --------------------------------------
class _AskedOutsideTorch(type):
    """``isinstance(t, torch._subclasses.FakeTensor)`` answered for the code that asks: torch's
    own modules get the truth (their meta kernels need it); any other code (a library that
    takes another path when it sees a fake tensor, thinking it is being traced) is told no,
    as it would be told on the real step."""

    def __instancecheck__(cls, obj) -> bool:
        return _torch_asks() and isinstance(obj, _FAKE)

    def __subclasscheck__(cls, sub) -> bool:
        return _torch_asks() and issubclass(sub, _FAKE)


def _torch_asks() -> bool:
    name = sys._getframe(2).f_globals.get("__name__", "")
    return name == "torch" or name.startswith("torch.")


class FakeTensorForTorchOnly(metaclass=_AskedOutsideTorch):
    """What ``torch._subclasses.FakeTensor`` names while a fake run lasts (:func:`as_real`)."""


_FAKE = torch._subclasses.fake_tensor.FakeTensor


@contextlib.contextmanager
def as_real() -> Iterator[None]:
    """While the block lasts, code outside torch that checks for fake tensors through
    ``torch._subclasses.FakeTensor`` (transformers' ``is_tracing()``: another mask-building
    path, data-dependent checks skipped) finds none, so it takes the path the real step
    takes. One general rule, not a patch per library; torch's own code still sees them."""
    import torch._subclasses as subclasses

    saved = subclasses.FakeTensor
    subclasses.FakeTensor = FakeTensorForTorchOnly
    try:
        yield
    finally:
        subclasses.FakeTensor = saved


# -- errors torch's own code raises on fake tensors ---------------------------------------------
#: What torch's Python code raises when it meets something a fake run does not have.
_INTERNAL = (AssertionError, RuntimeError, TypeError, NotImplementedError, AttributeError)


def internal_error(exc: BaseException, namer) -> Exception | None:
    """One :class:`~jupyter_memprof.EstimateError` line for an exception raised inside torch's
    own code during a fake run (an ``AssertionError`` of FakeTensorMode, a ``TypeError`` of a
    kernel wrapper), naming it, torch's line and the user's line; ``None`` for exceptions the
    user's code raised itself (they propagate as they are)."""
    from ..._errors import EstimateError

    if not isinstance(exc, _INTERNAL) or isinstance(exc, EstimateError):
        return None
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename.replace("\\", "/"))
        tb = tb.tb_next
    if not frames or "/torch/" not in frames[-1]:
        return None
    site = None
    tb = exc.__traceback__
    while tb is not None:  # the innermost user frame
        code = tb.tb_frame.f_code
        name = code.co_filename.replace("\\", "/")
        if "/torch/" not in name and namer.is_user(code.co_filename):
            site = namer.label(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    text = (str(exc).strip().splitlines() or [""])[0][:300]
    where = f" at {site}" if site else ""
    return EstimateError(
        f"{type(exc).__name__} inside torch ({frames[-1].rsplit('/torch/', 1)[-1]}) on fake "
        f"tensors{where}: {text or 'no message'}; if the step runs for real, the estimate "
        "cannot follow this code: pass every tensor, module and optimizer it reads to the "
        "estimate, or estimate the step without it"
    )
