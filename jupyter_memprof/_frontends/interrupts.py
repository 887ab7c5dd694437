"""Ctrl-C held back while a few lines must finish.

Those lines run to their end (a profile registered, a long
run's windows joined): an interrupt that comes meanwhile is passed on once they are done."""

from __future__ import annotations

import contextlib
import signal

__all__ = ["held"]


@contextlib.contextmanager
def held():
    """Hold Ctrl-C (SIGINT) back for a block, in the main thread: an interrupt that comes
    meanwhile is passed on to the handler that was there, once the block is done."""
    caught: list[object] = []

    def hold(signum, frame) -> None:
        caught.append(frame)

    try:
        before = signal.signal(signal.SIGINT, hold)
    except (ValueError, OSError, TypeError):  # not the main thread: signals never land here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        if caught:
            if callable(before):
                before(signal.SIGINT, caught[0])
            elif before == signal.SIG_DFL:
                raise KeyboardInterrupt
