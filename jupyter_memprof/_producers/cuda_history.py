"""CUDA's allocator recording its own history (``snapshot=True``).

CUDA's caching allocator recording its own history during a capture
(``profile(..., snapshot=True)``): ``torch.cuda.memory._record_memory_history`` on, the
allocator's snapshot (``torch.cuda.memory._snapshot()``: segments, blocks and the trace of
every allocation, free and out-of-memory error) taken when the capture ends, also when the
profiled code raised (a ``torch.OutOfMemoryError``: the snapshot is then the moment of the
error), and the recording turned off again.

Private torch API, so it lives with the producers. The functions that touch torch are
module attributes (:data:`RECORD`, :data:`TAKE`), looked up at each call.
"""

from __future__ import annotations

from typing import Any

from .._errors import CaptureError

__all__ = ["History", "check_devices", "oom_picture"]

#: entries kept in the allocator's ring buffer (older ones are dropped: a block alive in the
#: segments may then have no ``alloc`` entry)
MAX_ENTRIES = 1_000_000


def _record(enabled: str | None) -> None:
    import torch

    if enabled is None:
        torch.cuda.memory._record_memory_history(enabled=None)
    else:
        torch.cuda.memory._record_memory_history(
            enabled=enabled, context="all", stacks="python", max_entries=MAX_ENTRIES
        )


def _take() -> dict:
    import torch

    return torch.cuda.memory._snapshot()


RECORD = _record
TAKE = _take


def check_devices(devices: list[str]) -> None:
    """Raise :class:`CaptureError` (one line) when ``snapshot=True`` cannot record: no CUDA
    device among ``devices``, or CUDA not available."""
    import torch

    cuda = [d for d in devices if d.startswith("cuda")]
    if not cuda:
        raise CaptureError(
            "snapshot=True records CUDA's caching allocator, and this capture records no CUDA "
            f"device ({', '.join(devices) or 'none'}): leave it out on the CPU"
        )
    if not torch.cuda.is_available():
        raise CaptureError("snapshot=True needs CUDA, and torch sees no CUDA device here")


class History:
    """The allocator's history over one capture: :meth:`start`, then :meth:`take` once
    (which also stops it); :meth:`stop` is safe to call again."""

    def __init__(self) -> None:
        self.running = False
        self.snapshot: dict | None = None
        self.error: str | None = None

    def start(self) -> None:
        RECORD("all")
        self.running = True

    def take(self) -> dict | None:
        """The snapshot now, then recording off. A failure is kept in :attr:`error` (the
        capture goes on without a snapshot)."""
        if not self.running:
            return self.snapshot
        try:
            self.snapshot = TAKE()
        except Exception as err:  # the capture is worth more than its snapshot
            self.error = f"{type(err).__name__}: {err}"
        finally:
            self.stop()
        return self.snapshot

    def stop(self) -> None:
        if self.running:
            self.running = False
            RECORD(None)


def oom_picture(snapshot: dict | None) -> dict[str, Any] | None:
    """The last out-of-memory error in ``snapshot``'s device traces, with the segment
    picture of its device: ``{"device", "requested", "device_free", "free_bytes",
    "free_blocks", "segments", "largest_free"}`` (free bytes inside the allocator's
    segments: the cached blocks it could not use), or None when none is recorded."""
    if not isinstance(snapshot, dict):
        return None
    last = None
    for index, trace in enumerate(snapshot.get("device_traces") or []):
        for entry in trace if isinstance(trace, list) else []:
            if isinstance(entry, dict) and entry.get("action") == "oom":
                last = (index, entry)
    if last is None:
        return None
    index, entry = last
    free = [
        int(b.get("size", 0))
        for seg in snapshot.get("segments") or []
        if isinstance(seg, dict) and seg.get("device") == index
        for b in seg.get("blocks") or []
        if isinstance(b, dict) and b.get("state") == "inactive"
    ]
    segs = [s for s in snapshot.get("segments") or [] if isinstance(s, dict)]
    return {
        "device": f"cuda:{index}",
        "requested": int(entry.get("size", 0)),
        "device_free": int(entry.get("device_free", 0)),
        "free_bytes": sum(free),
        "free_blocks": len(free),
        "segments": sum(1 for s in segs if s.get("device") == index),
        "largest_free": max(free, default=0),
    }
