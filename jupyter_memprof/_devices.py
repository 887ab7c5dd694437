"""Devices: the one parser of device names and the one order.

Every device name a user gives goes through here: :func:`parse_device` for one name
(estimate mode: any ``cuda:N``, no CUDA needed), :func:`resolve_devices` for a capture's
``device`` option (several names; the devices must exist here). A bad name raises
:class:`~jupyter_memprof._errors.DeviceError` (or :class:`CaptureError` from
:func:`resolve_devices`) with one line; callers re-raise it as their own error, the message
unchanged. Past this module a device is ``"cpu"`` or ``"cuda:N"``.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Iterable
from typing import Any

from ._errors import CaptureError, DeviceError

_USE = "use 'cpu', 'cuda' or 'cuda:N'"


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def split_devices(values: Iterable[str]) -> list[str]:
    """``["cpu,cuda:0", " cuda:1"]`` -> ``["cpu", "cuda:0", "cuda:1"]``: comma-separated
    lists split, blanks dropped (``--device`` may be given many times, each a list)."""
    return [p.strip() for v in values for p in str(v).split(",") if p.strip()]


def _parse(name: Any) -> tuple[str, int | None]:
    """The syntax: ``("cpu", None)``, or ``("cuda", N)`` (``N`` None for a bare ``cuda``)."""
    import torch

    if not isinstance(name, (str, torch.device)):
        raise DeviceError(f"device must be a string like 'cuda:0', not {name!r}")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"unknown device {name!r}: {_USE}") from None
    if dev.type == "cpu":
        return "cpu", None
    if dev.type == "cuda":
        return "cuda", dev.index
    raise DeviceError(f"device {name!r} is not supported: {_USE}")


def _check_present(name: Any, index: int | None, cuda_count: int) -> None:
    if cuda_count == 0:
        raise DeviceError(f"device {name!r} asked for, but no CUDA device is available here")
    if index is not None and index >= cuda_count:
        raise DeviceError(f"device {name!r} does not exist: {cuda_count} CUDA device(s) visible")


def parse_device(name: Any, *, need_present: bool) -> str:
    """One device name (a string or a ``torch.device``) -> ``"cpu"`` or ``"cuda:N"``; a bare
    ``"cuda"`` is ``"cuda:0"``.

    ``need_present``: the device must exist here (code will run on it); without it any
    ``cuda:N`` is accepted (estimate mode only pretends to run there). Anything else raises
    :class:`DeviceError` with one line.
    """
    kind, index = _parse(name)
    if kind == "cpu":
        return "cpu"
    if need_present:
        _check_present(name, index, _cuda_count())
    return f"cuda:{index or 0}"


_NAME = re.compile(r"cpu|cuda:[0-9]{1,6}")


def is_device_name(name: object) -> bool:
    """Whether ``name`` is a device name as records carry them (``"cpu"`` or ``"cuda:N"``,
    the producer interface's rule). Cheap and torch-free: for checking files on load."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def is_present(device: str) -> bool:
    """Whether ``device`` (as :func:`parse_device` returns it) exists in this process."""
    kind, index = _parse(device)
    return kind == "cpu" or (index or 0) < _cuda_count()


def is_cuda(value: Any) -> bool:
    """Whether ``value`` (a device string or ``torch.device``) names a CUDA device; anything
    else, a bad name included, is not (cheap: no parsing for values that are no name)."""
    import torch

    if isinstance(value, torch.device):
        return value.type == "cuda"
    if not isinstance(value, str):
        return False
    try:
        return _parse(value)[0] == "cuda"
    except DeviceError:
        return False


#: CUDA's caching allocator hands out blocks in multiples of this many bytes.
CUDA_BLOCK = 512


def cuda_block_bytes(nbytes):
    """The bytes CUDA's caching allocator holds for requests of ``nbytes`` (an int or a
    numpy array): each rounded up to a multiple of :data:`CUDA_BLOCK` (its default
    configuration; what ``torch.cuda.memory_allocated`` counts). 0 bytes allocate nothing."""
    rounded = -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK
    if isinstance(nbytes, int):
        return rounded if nbytes > 0 else nbytes
    import numpy as np

    return np.where(nbytes > 0, rounded, nbytes)


def block_bytes(device: str, nbytes: int) -> int:
    """The bytes a request of ``nbytes`` holds on ``device``: CUDA rounds it
    (:func:`cuda_block_bytes`), the CPU allocator holds what was asked."""
    return cuda_block_bytes(nbytes) if device.startswith("cuda") else nbytes


def _names_in(devices: Any) -> list[str]:
    """The device names in a list (or any iterable) of them; anything else raises
    :class:`CaptureError` with one line (``device=42`` is not a list of one device)."""
    import torch

    try:
        items = list(devices)
    except TypeError:
        items = None
    if items is None or not all(isinstance(d, (str, torch.device)) for d in items):
        raise CaptureError(
            f"device must be 'cpu', 'cuda', 'cuda:N' or a list of those, not {reprlib.repr(devices)}"
        )
    return [str(d) for d in items]


def resolve_devices(device: str | Iterable[str] | None) -> list[str]:
    """Normalise a capture's ``device`` option to a list like ``["cpu", "cuda:0"]``.

    ``None`` means the CPU plus every visible CUDA device. ``"cuda"`` means every visible
    CUDA device; ``"cuda:N"`` one of them (it must exist). Strings may be comma-separated
    lists. A bad name raises :class:`CaptureError` with the line :func:`parse_device` gives.
    """
    import torch

    cuda_count = _cuda_count()
    if device is None:
        return ["cpu", *(f"cuda:{i}" for i in range(cuda_count))]
    if isinstance(device, (str, torch.device)):
        wanted = [str(device)]
    else:
        wanted = _names_in(device)
    out: list[str] = []
    try:
        for item in split_devices(wanted):
            kind, index = _parse(item)
            if kind == "cpu":
                names = ["cpu"]
            else:
                _check_present(item, index, cuda_count)
                names = (
                    [f"cuda:{index}"]
                    if index is not None
                    else [f"cuda:{i}" for i in range(cuda_count)]
                )
            out.extend(n for n in names if n not in out)
    except DeviceError as err:
        raise CaptureError(str(err)) from None
    if not out:
        raise CaptureError(f"no device given: {_USE}")
    return out


def device_sort_key(device: str) -> tuple[int, int, str]:
    """``cpu`` first, then ``cuda:0``, ``cuda:1``, ... in numeric order, then anything else."""
    kind, _, index = str(device).partition(":")
    order = {"cpu": 0, "cuda": 1}.get(kind, 2)
    return (order, int(index) if index.isdigit() else -1, str(device))
