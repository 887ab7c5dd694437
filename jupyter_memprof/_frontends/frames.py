"""A caller's names, read without keeping its locals alive."""

from __future__ import annotations

import inspect
import sys
from types import FrameType

#: Before Python 3.13 (PEP 667), ``frame.f_locals`` of a function's frame is a snapshot dict
#: stored in the frame and kept until the frame ends: reading it holds a reference to every
#: local variable of the moment, so a tensor the code ``del``s afterwards stays alive.
_SNAPSHOT_LOCALS = sys.version_info < (3, 13)
#: references to the snapshot when only the frame holds it: the frame's, ``caller_names``'s
#: variable and ``sys.getrefcount``'s argument
_HELD_BY_FRAME_ONLY = 3


def caller_names(frame: FrameType | None) -> dict:
    """The globals and locals of ``frame``, locals winning, as a new dict.

    On Python before 3.13 the frame's snapshot of a function's locals is emptied again once
    read, so reading names does not extend any variable's life. CPython refreshes that
    snapshot whenever something asks for it (``locals()``, a debugger, a trace function)
    before using it, so emptying it loses nothing. It is left as it is when anything else
    holds it (the code's own ``env = locals()``, a debugger): then the holder keeps those
    variables alive anyway, and sees what it expects. Module and class frames, whose
    ``f_locals`` is their real namespace, are left alone.
    """
    if frame is None:
        return {}
    ns = dict(frame.f_globals)
    local = frame.f_locals
    ns.update(local)
    if (
        _SNAPSHOT_LOCALS
        and frame.f_code.co_flags & inspect.CO_OPTIMIZED
        and sys.getrefcount(local) <= _HELD_BY_FRAME_ONLY
    ):
        local.clear()
    return ns
