"""The package's errors: each says in one line what to do."""

from __future__ import annotations


class CaptureError(ValueError):
    """The capture cannot start: a bad device or allocator setting, another capture or
    estimate running in this process, or torch's profiler running already."""


class ProfilerBusy(RuntimeError):
    """torch's profiler was started while a memory capture runs, by anything but the capture
    (another thread, or the captured code itself): torch runs one profiler at a time. Raised
    where that start was made, before torch changes anything."""


class ProfileFileError(ValueError):
    """The file is not a saved jupyter_memprof profile, or is damaged or crafted: one line
    naming the file and what is wrong. :func:`jupyter_memprof.load` raises nothing else for
    a file's content (a missing path is FileNotFoundError)."""


class EstimateError(ValueError):
    """Estimate mode cannot do what was asked (bad device or limit, an op a fake run cannot
    do, a real tensor it did not copy)."""


class ExportError(ValueError):
    """The export cannot be written as asked (unknown suffix, unknown device)."""


class DeviceError(ValueError):
    """A device name that cannot be used (:mod:`._devices`); each caller re-raises it as its
    own error (CaptureError, EstimateError) with the same line."""


class AllocatorConfigError(ValueError):
    """A ``PYTORCH_CUDA_ALLOC_CONF`` setting (from the environment or an ``allocator=``
    argument) that the caching allocator would refuse; each front end re-raises it as its own
    error with the same line."""


class MemoryBudgetExceeded(BaseException):
    """A plain capture grew past its memory budget (``profile(memory_budget=...)``): raised
    in the captured code, which it stops as Ctrl-C would; the profile keeps what was
    recorded until then (``meta["memory_budget"]``). A BaseException, as KeyboardInterrupt
    is, so that ``except Exception`` in the captured code does not hold it back."""
