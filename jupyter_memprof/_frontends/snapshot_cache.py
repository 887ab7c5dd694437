"""A big snapshot's profile cached, so its next open is fast.

The first :func:`~jupyter_memprof.load_snapshot` of a file of :data:`MIN_BYTES` or more saves
its profile as a Parquet folder (:meth:`Profile.save`, atomic) under the cache folder; the next
open of the same file (same absolute path, size and modification time, same device) loads
that folder instead (:func:`jupyter_memprof._results.profile.load`, checked as every saved
profile is). A copy that cannot be written or read is skipped: the snapshot is read again.

The cache folder is ``$JUPYTER_MEMPROF_CACHE`` when set (``off`` or ``0``: no cache), else
``$XDG_CACHE_HOME/jupyter_memprof/snapshots`` (``~/.cache/...``). Delete it at any time.
"""

from __future__ import annotations

import hashlib
import os

from .._errors import ProfileFileError
from .._results import profile as _profile
from .._results.profile import Profile

__all__ = ["MIN_BYTES", "cache_dir", "lookup", "store"]

#: Snapshots smaller than this are read again each time (it is about as fast).
MIN_BYTES = 16 * 2**20
#: Part of the key: a copy made by an older reader is not used.
_VERSION = "1"


def cache_dir() -> str | None:
    """Where copies go, or None when caching is off."""
    env = os.environ.get("JUPYTER_MEMPROF_CACHE")
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "no", "false") else env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jupyter_memprof", "snapshots")


def _folder(path: str, device: int | None) -> str | None:
    root = cache_dir()
    if root is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_size < MIN_BYTES:
        return None
    key = f"{_VERSION}\0{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{device}"
    name = os.path.basename(path)[:40]
    return os.path.join(root, f"{name}.{hashlib.sha256(key.encode()).hexdigest()[:24]}")


def lookup(path: str, device: int | None) -> Profile | None:
    """The cached profile of the snapshot at ``path``, or None."""
    folder = _folder(path, device)
    if folder is None or not os.path.isdir(folder):
        return None
    try:
        prof = _profile.load(folder)
    except (ProfileFileError, OSError):
        return None
    prof.meta["snapshot_cached"] = True
    return prof


def store(prof: Profile, path: str, device: int | None) -> None:
    """Save ``prof`` as the cached copy of the snapshot at ``path`` (if it is big enough and
    caching is on); nothing when it cannot be written."""
    folder = _folder(path, device)
    if folder is None:
        return
    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        prof.save(folder, format="parquet", overwrite=True)
    except (OSError, ValueError):
        pass
