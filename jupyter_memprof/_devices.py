"""Devices: the one parser for the ``device`` option and the one order devices are shown in."""

from __future__ import annotations

from collections.abc import Iterable

from ._errors import CaptureError


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_devices(device: str | Iterable[str] | None) -> list[str]:
    """Normalise the ``device`` option to a list like ``["cpu", "cuda:0"]``.

    ``None`` means the CPU plus every visible CUDA device. ``"cuda"`` means every visible
    CUDA device; ``"cuda:N"`` one of them.
    """
    import torch

    cuda_count = _cuda_count()
    if device is None:
        return ["cpu", *(f"cuda:{i}" for i in range(cuda_count))]
    if isinstance(device, (str, torch.device)):
        wanted = [str(device)]
    else:
        wanted = [str(d) for d in device]
    out: list[str] = []
    for item in (p.strip() for w in wanted for p in w.split(",")):
        if not item:
            continue
        try:
            dev = torch.device(item)
        except RuntimeError:
            raise CaptureError(f"unknown device {item!r}: use 'cpu', 'cuda' or 'cuda:N'") from None
        if dev.type == "cpu":
            names = ["cpu"]
        elif dev.type == "cuda":
            if cuda_count == 0:
                raise CaptureError(
                    f"device {item!r} asked for, but no CUDA device is available here"
                )
            if dev.index is not None and dev.index >= cuda_count:
                raise CaptureError(
                    f"device {item!r} does not exist: {cuda_count} CUDA device(s) visible"
                )
            names = (
                [f"cuda:{dev.index}"]
                if dev.index is not None
                else [f"cuda:{i}" for i in range(cuda_count)]
            )
        else:
            raise CaptureError(f"device {item!r} is not supported: use 'cpu', 'cuda' or 'cuda:N'")
        out.extend(n for n in names if n not in out)
    if not out:
        raise CaptureError("no device given: use 'cpu', 'cuda' or 'cuda:N'")
    return out


def device_sort_key(device: str) -> tuple[int, int, str]:
    """``cpu`` first, then ``cuda:0``, ``cuda:1``, ... in numeric order, then anything else."""
    kind, _, index = str(device).partition(":")
    order = {"cpu": 0, "cuda": 1}.get(kind, 2)
    return (order, int(index) if index.isdigit() else -1, str(device))
