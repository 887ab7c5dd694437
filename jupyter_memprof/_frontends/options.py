"""Every entry point's options, checked once into frozen objects.

``profile()`` and ``%%memprofile`` read their options into :class:`CaptureOptions`;
``estimate()``, ``what_if()``, ``fit()``, ``%%memprofile --estimate``, the command line and
the pytest plugin into :class:`EstimateOptions`. Each option has one validator here and one
message: a bad value raises :class:`OptionError`, which each entry point raises once as its
own error (:func:`raised_as`: ``CaptureError``, ``EstimateError``, IPython's
``UsageError``, the command line's one line), the message unchanged.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._analysis.allocator.config import AllocatorConfig
from .._devices import parse_device, resolve_devices
from .._errors import AllocatorConfigError, CaptureError, DeviceError
from .._units import parse_bytes, shown

if TYPE_CHECKING:
    from .._producers.gpus import Gpu

__all__ = [
    "CaptureOptions",
    "EstimateOptions",
    "OptionError",
    "check_allocator",
    "check_context",
    "check_device",
    "check_devices",
    "check_gpu",
    "check_keep",
    "check_limit",
    "check_memory_budget",
    "check_size",
    "check_snapshot",
    "check_steps",
    "check_world_size",
    "raised_as",
]


class OptionError(ValueError):
    """A bad option value, in one line; each entry point raises it as its own error."""


@contextlib.contextmanager
def raised_as(error: type[Exception], prefix: str = "") -> Iterator[None]:
    """An :class:`OptionError` inside the block raised as ``error`` (its message after
    ``prefix``): where an entry point says which error its users meet."""
    try:
        yield
    except OptionError as err:
        raise error(f"{prefix}{err}") from None


# -- one validator per option ----------------------------------------------------------------
def check_device(value: Any) -> str | None:
    """An estimate's device: ``None``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (any N: no CUDA
    needed) -> ``"cpu"``/``"cuda:N"``."""
    if value is None:
        return None
    try:
        return parse_device(value, need_present=False)
    except DeviceError as err:
        raise OptionError(str(err)) from None


def check_devices(value: Any) -> tuple[str, ...]:
    """A capture's devices (they must exist here): a name, a list of names or
    comma-separated names; ``None``: the CPU and every visible CUDA device."""
    try:
        return tuple(resolve_devices(value))
    except (DeviceError, CaptureError) as err:
        raise OptionError(str(err)) from None


def check_size(name: str, value: Any) -> int | None:
    """A size option (``24GiB``, ``"1.5 GB"``, bytes) in bytes; None when not given."""
    if value is None:
        return None
    try:
        return parse_bytes(value)
    except ValueError as err:
        raise OptionError(f"{name}: {err}") from None


def check_limit(value: Any, name: str = "limit") -> int | None:
    """A memory limit: a size of more than 0 bytes, or None."""
    n = check_size(name, value)
    if n is not None and n <= 0:
        raise OptionError(f"{name} must be more than 0 bytes, not {shown(value)}")
    return n


def check_context(value: Any) -> int | None:
    """The bytes a CUDA device holds outside PyTorch (None: the documented default)."""
    return check_size("context", value)


def check_allocator(value: Any) -> AllocatorConfig:
    """The caching allocator's settings: ``value`` (a ``PYTORCH_CUDA_ALLOC_CONF`` text, or
    settings already read) when given, else the environment's."""
    from .finish import allocator_config

    try:
        return allocator_config(value)
    except AllocatorConfigError as err:
        raise OptionError(str(err)) from None


def check_gpu(value: Any) -> Gpu:
    """The GPU whose kernels a CUDA estimate follows: ``None`` (an H100), a name
    (``"A100"``) or a compute capability (``"sm90"``, ``(9, 0)``)."""
    from .._producers.gpus import parse_gpu

    try:
        return parse_gpu(value)
    except ValueError as err:
        raise OptionError(str(err)) from None


def check_world_size(value: Any) -> int | None:
    """``None`` (no process group) or a whole number of ranks from 1 up to
    :data:`~jupyter_memprof._producers.fake.dist.MAX_WORLD_SIZE`, with a torch that has
    ``torch.distributed``."""
    from .._producers.fake.dist import MAX_WORLD_SIZE

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORLD_SIZE:
        raise OptionError(
            f"world_size must be a whole number of ranks from 1 to {MAX_WORLD_SIZE:,}, not "
            f"{shown(value)}"
        )
    import torch

    if not torch.distributed.is_available():
        raise OptionError("world_size needs torch.distributed, which this torch build lacks")
    return value


def _digits(text: str) -> int | None:
    """``text`` as a whole number when it is ASCII digits only (``"²"`` and other digits
    ``str.isdigit`` accepts are not), else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 12 else None


def check_steps(value: Any) -> int | None:
    """The steps per window of a long run: a whole number from 1 to
    :data:`~.long_run.MAX_STEPS` (ASCII digits as text too), or None (no long run)."""
    from .long_run import MAX_STEPS

    if value is None:
        return None
    if isinstance(value, str) and _digits(value.strip()) is not None:
        value = _digits(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_STEPS:
        raise OptionError(
            f"steps needs the number of steps per window, a whole number from 1 to "
            f"{MAX_STEPS:,} (got {shown(value)})"
        )
    return value


def check_keep(value: Any) -> tuple[str | int, ...]:
    """Which steps of a long run keep their window's full tables: ``"first"``, ``"peak"``,
    ``"last"`` and step numbers, as an iterable or one comma-separated string (None: the
    default, all three words)."""
    from .long_run import DEFAULT_KEEP, MAX_STEPS, KeptStep

    if value is None:
        return DEFAULT_KEEP
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, Iterable):
        raise OptionError(f"keep lists steps: first, peak, last or numbers (got {shown(value)})")
    out: list[str | int] = []
    for item in items:
        text = item.strip().lower() if isinstance(item, str) else item
        if isinstance(text, str) and _digits(text) is not None:
            text = _digits(text)
        if isinstance(text, str) and text in KeptStep.values():
            out.append(text)
        elif isinstance(text, int) and not isinstance(text, bool) and 0 <= text <= MAX_STEPS:
            out.append(text)
        elif text != "":
            raise OptionError(
                f"keep: {shown(item)} is not a step to keep; use first, peak, last or a step "
                f"number up to {MAX_STEPS:,}"
            )
    return tuple(dict.fromkeys(out))


def check_snapshot(value: Any, on: tuple[str, ...]) -> str | bool:
    """``snapshot=``: False (None too), True, or a path the pickle is written to (checked
    first: its folder exists, a file there is a snapshot; returned absolute), for a capture
    of the devices ``on`` (one of them CUDA)."""
    if value is None or value is False:
        return False
    path = True if value is True else _snapshot_path(value)
    from .._producers.cuda_history import check_devices as check_cuda

    try:
        check_cuda(list(on))
    except CaptureError as err:
        raise OptionError(str(err)) from None
    return path


def _snapshot_path(value: Any) -> str:
    from .._results.snapshot_store import check_pickle_target

    try:
        return check_pickle_target(value)
    except (OSError, TypeError) as err:
        where = os.fspath(value) if isinstance(value, (str, os.PathLike)) else value
        raise OptionError(f"snapshot={where!r}: {err}") from None


def check_memory_budget(value: Any) -> int | bool:
    """``memory_budget=``: None (the default: only the machine's floor: True), a size (the
    growth allowed, in bytes) or False (no watchdog)."""
    if value is None or value is False:
        return value is None
    return check_limit(value, "memory_budget")


def whole(text: Any) -> Any:
    """A number typed as text (``--world-size 4``) as an int; other text is passed on as it
    is, for the option's validator to refuse in its own words."""
    if not isinstance(text, str):
        return text
    digits = text.strip()
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) < 20 else text


# -- the objects -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CaptureOptions:
    """A real capture's options, checked (``profile()``, ``%%memprofile``): ``snapshot``
    is False, True or the absolute path the pickle goes to; ``keep`` is None without
    ``steps``; ``memory_budget`` is False for a long run (windows bound its memory)."""

    devices: tuple[str, ...]
    allocator: AllocatorConfig
    with_stack: bool = True
    steps: int | None = None
    keep: tuple[str | int, ...] | None = None
    snapshot: str | bool = False
    memory_budget: int | bool = True

    @classmethod
    def from_kwargs(
        cls,
        *,
        device: Any = None,
        allocator: Any = None,
        with_stack: bool = True,
        steps: Any = None,
        keep: Any = None,
        snapshot: Any = False,
        memory_budget: Any = None,
    ) -> CaptureOptions:
        """``profile()``'s keyword arguments, each checked (:class:`OptionError`)."""
        on = check_devices(device)
        shot = check_snapshot(snapshot, on)
        config = check_allocator(allocator)
        n = check_steps(steps)
        if n is None and keep is not None:
            raise OptionError("keep needs steps (it says which windows of a long run to keep)")
        return cls(
            devices=on,
            allocator=config,
            with_stack=bool(with_stack),
            steps=n,
            keep=None if n is None else check_keep(keep),
            snapshot=shot,
            memory_budget=check_memory_budget(memory_budget) if n is None else False,
        )


@dataclass(frozen=True)
class EstimateOptions:
    """An estimate's options, checked (``estimate()``, ``what_if()``, ``fit()``, the magic's
    ``--estimate``, ``jupyter-memprof estimate``/``fit``, ``memory_limit`` marks)."""

    device: str | None
    limit: int | None
    allocator: AllocatorConfig
    context: int | None
    gpu: Gpu
    world_size: int | None = None

    @classmethod
    def from_kwargs(
        cls,
        *,
        device: Any = None,
        limit: Any = None,
        allocator: Any = None,
        context: Any = None,
        gpu: Any = None,
        world_size: Any = None,
    ) -> EstimateOptions:
        """``estimate()``'s keyword arguments, each checked (:class:`OptionError`); the
        sizes and the allocator first, which need no torch (a command line's bad
        ``--limit`` is said at once)."""
        return cls(
            limit=check_limit(limit),
            context=check_context(context),
            allocator=check_allocator(allocator),
            device=check_device(device),
            gpu=check_gpu(gpu),
            world_size=check_world_size(world_size),
        )

    @classmethod
    def parse(cls, **text: Any) -> EstimateOptions:
        """The same options typed as text (the magic's line, the command line): a number of
        ranks may be digits."""
        if "world_size" in text:
            text["world_size"] = whole(text["world_size"])
        return cls.from_kwargs(**text)
