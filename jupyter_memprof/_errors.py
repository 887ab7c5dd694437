"""The package's exceptions: each says in one line what is wrong and what to do."""

from __future__ import annotations


class CaptureError(ValueError):
    """The capture cannot start (bad device, another profiler running)."""


class ProfileFileError(ValueError):
    """The file is not a saved jupyter_memprof profile (or is damaged)."""


class EstimateError(ValueError):
    """Estimate mode cannot do what was asked (bad device or limit, an op a fake run cannot
    do, a real tensor it did not copy)."""
