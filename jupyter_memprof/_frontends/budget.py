"""A capture's memory budget: stop before the machine runs out.

torch's profiler keeps every event until it stops: a capture of a cell that never ends grows
by up to 2 GB a second. While a plain capture runs, a watchdog thread reads the process's
resident memory and the machine's available memory every :data:`POLL_S` seconds, and stops
the captured code by raising :class:`MemoryBudgetExceeded` in its thread (as Ctrl-C would,
between two Python instructions, never inside an op):

- with ``memory_budget=SIZE``: once the process has grown by more than SIZE since the start
  (tensors the code makes count too);
- always (unless ``memory_budget=False``): once the machine's available memory falls under
  :func:`floor` (a tenth of the machine, at least 1 GiB, at most half of what was available
  at the start), before the machine runs out.

The capture then stops torch's profiler, reads what it recorded and says so in
``meta["memory_budget"]`` and the summary. Reading takes memory too, about 15 times the
budget at its peak, mostly torch's own result objects made at its stop (docs/reliability.md
has the measurements); a capture stopped here frees that result before the analysis. So a
cell that may not end is best given a budget of a twentieth of the memory free. Linux only
(``/proc``); elsewhere there is no watchdog.
"""

from __future__ import annotations

import ctypes
import os
import threading

from .._errors import MemoryBudgetExceeded

__all__ = ["Watchdog"]

#: how often the watchdog reads the process's memory (a capture grows up to 2 GB a second)
POLL_S = 0.05
#: the machine's available memory a capture never goes under: this share of the machine
FLOOR_SHARE = 0.1
FLOOR_MIN = 2**30


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_bytes() -> int | None:
    """The process's resident memory in bytes (None where ``/proc`` is not there)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def floor(available_at_start: int | None) -> int | None:
    """The available memory under which a capture stops: a tenth of the machine, at least
    1 GiB, at most half of what was available at the start (None without ``/proc``)."""
    total = _meminfo("MemTotal")
    if total is None or available_at_start is None:
        return None
    return min(max(int(total * FLOOR_SHARE), FLOOR_MIN), available_at_start // 2)


class Watchdog:
    """Raises :class:`MemoryBudgetExceeded` in the thread that started it once the process
    has grown by more than ``budget`` bytes; :meth:`stop` ends it, and a raise not yet
    delivered is withdrawn."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.thread_id = threading.get_ident()
        self.start_rss = rss_bytes()
        self.floor = floor(_meminfo("MemAvailable"))
        #: why it stopped the code: "budget" or "machine" (None: it did not)
        self.reason: str | None = None
        #: the growth that went over the budget (None: it never did)
        self.grown: int | None = None
        self._armed = False  # from :meth:`arm` on
        self._can = self.start_rss is not None and (budget is not None or self.floor is not None)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self) -> None:
        """Count growth from now on (once the profiler has started: its own start-up is no
        part of the budget)."""
        with self._lock:
            if self._can:
                self.start_rss = rss_bytes() or self.start_rss
                self._armed = True

    def start(self) -> Watchdog:
        """Start the thread (watching nothing until :meth:`arm`)."""
        if self._can:
            self._thread = threading.Thread(target=self._watch, name="memprof-budget", daemon=True)
            self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._done.wait(POLL_S):
            if not self._armed:
                continue
            now = rss_bytes()
            grown = None if now is None else now - self.start_rss
            if self.budget is not None and grown is not None and grown > self.budget:
                return self._fire(grown, "budget")
            if self.floor is not None:
                available = _meminfo("MemAvailable")
                if available is not None and available < self.floor:
                    return self._fire(grown, "machine")

    def _fire(self, grown: int | None, reason: str) -> None:
        with self._lock:
            if not self._armed:
                return
            self._armed = False
            self.grown, self.reason = grown or 0, reason
            _async_raise(self.thread_id, MemoryBudgetExceeded)

    def stop(self, delivered: bool) -> None:
        """End the watchdog; ``delivered``: the capture saw its exception (else a raise
        still on its way is withdrawn)."""
        with self._lock:
            self._armed = False
            if self.grown is not None and not delivered:
                _async_raise(self.thread_id, None)
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def meta(self) -> dict:
        """``meta["memory_budget"]``."""
        out: dict = {"bytes": self.budget, "exceeded": self.reason is not None}
        if self.floor is not None:
            out["floor_bytes"] = int(self.floor)
        if self.reason is not None:
            out.update(grown_bytes=int(self.grown or 0), reason=self.reason)
        return out


def _async_raise(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in the thread ``thread_id`` at its next Python instruction (None: take
    back one not yet raised). CPython's ``PyThreadState_SetAsyncExc``."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), None if exc is None else ctypes.py_object(exc)
    )
