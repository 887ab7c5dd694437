"""What a file ``load`` accepts must do, shared by the tests of damaged and crafted files."""

from __future__ import annotations

import jupyter_memprof
from jupyter_memprof import ProfileFileError


def works(p) -> None:
    """What a loaded profile, and each of its kept windows, must do without failing."""
    for q in (p, *p.kept.values()):
        repr(q), str(q), q.label, q.start_ns, q.end_ns, q.devices, q.summary()
        q.peak()
        q.peak_by("category")


def check_load(path) -> None:
    """``path`` loads and works, or is refused with one ``ProfileFileError`` line."""
    try:
        p = jupyter_memprof.load(path)
    except ProfileFileError as exc:
        assert "\n" not in str(exc)
        return
    works(p)
