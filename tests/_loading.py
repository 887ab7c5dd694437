"""Files for ``load`` and what it must do with them, shared by the tests of damaged and
crafted files."""

from __future__ import annotations

import os
import zipfile

import pytest

import jupyter_memprof
from jupyter_memprof import ProfileFileError


def zip_of(path, members: dict[str, bytes]) -> str:
    """A zip at ``path`` holding ``members`` (name -> bytes), deflated."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return os.fspath(path)


def refused(path, match: str | None = None) -> str:
    """``load(path)`` raises one ProfileFileError line naming ``path`` (and saying
    ``match``); returns it."""
    with pytest.raises(ProfileFileError) as info:
        jupyter_memprof.load(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    if match:
        assert match in msg, msg
    return msg


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
