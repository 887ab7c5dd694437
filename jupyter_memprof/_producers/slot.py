"""The process's one capture slot: one capture or estimate at a time, whatever the thread."""

from __future__ import annotations

import contextlib
import logging
import threading
import types
from collections.abc import Callable, Iterator

from .._errors import CaptureError

__all__ = ["SLOT", "Claim", "exclusive"]

log = logging.getLogger(__name__)


class _Slot:
    """The one capture or estimate this process runs at a time, whatever the thread.

    torch's profiler is one per process (a second one started from another thread crashes
    the process when the first stops), and both producers install global module and
    optimizer hooks; torch's own "profiler enabled" flag is per thread, so it cannot see a
    capture in another thread. Every producer claims this slot before it changes anything
    global and frees it once everything is undone.

    A claim whose thread has ended without freeing it (a capture started and never
    finished there) is abandoned: the next claim, or :meth:`free_abandoned`, undoes what it
    left behind (its ``abandon`` callback) and takes the slot over.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held while the slot is taken
        self._state = threading.Lock()  # guards _holder against a concurrent take-over
        self._holder: Claim | None = None

    def claim(self, what: str, owner=None, abandon: Callable[[], object] | None = None) -> Claim:
        """Take the slot for ``what`` ("capture" or "estimate"), or raise CaptureError.
        With ``owner``, the claim is stored as ``owner._claim`` before anything else can
        happen (an interrupt included), so the owner can always free it. ``abandon`` undoes
        what the claimant changed globally, should its thread end without freeing it."""
        if not self._lock.acquire(blocking=False):
            if not (self.free_abandoned() and self._lock.acquire(blocking=False)):
                raise CaptureError(self._busy(what))
        try:
            claim = Claim(self, what, threading.current_thread(), abandon)
            self._holder = claim
            if owner is not None:
                owner._claim = claim
        except BaseException:
            self._holder = None
            self._lock.release()
            raise
        return claim

    def free_abandoned(self) -> bool:
        """Free the slot if the thread holding it has ended (True when it did so)."""
        with self._state:
            claim = self._holder
            if claim is None or claim.thread.is_alive():
                return False
            self._holder, claim._slot = None, None  # its own release() now does nothing
        try:
            if claim.abandon is not None:
                claim.abandon()
        except Exception:
            log.warning("undoing an abandoned memory %s failed", claim.what, exc_info=True)
        finally:
            self._lock.release()
        return True

    def _busy(self, what: str) -> str:
        holder = self._holder  # None while the holder is between acquire and this line
        running, where = "a memory capture or estimate", ""
        if holder is not None:
            running = f"a memory {holder.what}"
            where = (
                " in this thread"
                if holder.thread is threading.current_thread()
                else f" in thread {holder.thread.name!r}"
            )
        return (
            f"{running} is already running{where}: one capture or estimate at a time per "
            f"process; start this {what} after it has finished"
        )

    def _free(self, claim: Claim) -> None:
        with self._state:
            if self._holder is not claim:  # taken over after its thread ended
                return
            self._holder = None
        self._lock.release()


class Claim:
    """The slot taken by one capture or estimate; :meth:`release` frees it (once)."""

    def __init__(
        self, slot: _Slot, what: str, thread: threading.Thread, abandon: Callable[[], object] | None
    ) -> None:
        self._slot: _Slot | None = slot
        self.what = what
        self.thread = thread
        self.abandon = abandon

    def release(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot._free(self)


SLOT = _Slot()


@contextlib.contextmanager
def exclusive(what: str) -> Iterator[None]:
    """Hold the process's one capture slot for a block (estimate mode's fake run)."""
    holder = types.SimpleNamespace(_claim=None)
    try:
        SLOT.claim(what, owner=holder)
        yield
    finally:
        if holder._claim is not None:
            holder._claim.release()
