"""Writing files safely: never half a file, never someone else's file replaced by surprise.

Every file the package writes (saved profiles, HTML reports, exports) goes through
:func:`atomic_write` (or :func:`atomic_write_dir` for a folder of files): the content is written
to a temporary name in the target folder and renamed into place, so a failed or interrupted
write leaves the previous file as it was. An existing target is replaced only when it is of
the writer's own kind (``is_own_kind(path)``) or when the caller passes ``overwrite=True``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable


class WriteRefused(FileExistsError):
    """The target exists and is not ours to replace without ``overwrite=True``."""


def _target(path: str | os.PathLike) -> str:
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write {path}: the folder {folder} does not exist")
    return path


def _check_replace(
    path: str, what: str, overwrite: bool, is_own_kind: Callable[[str], bool] | None
) -> None:
    if not os.path.lexists(path) or overwrite:
        return
    if is_own_kind is not None and is_own_kind(path):
        return
    raise WriteRefused(
        f"refusing to replace {path}: it is not a {what}; pass overwrite=True to replace it"
    )


def check_target(
    path: str | os.PathLike,
    *,
    what: str = "file written by jupyter_memprof",
    overwrite: bool = False,
    is_own_kind: Callable[[str], bool] | None = None,
) -> str:
    """Raise what :func:`atomic_write` would raise before writing ``path`` (a missing folder, a
    folder in the way, a file not ours to replace); returns the absolute path. For writers of
    several files that must refuse before writing any."""
    path = _target(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {path}: it is a folder")
    _check_replace(path, what, overwrite, is_own_kind)
    return path


def atomic_write(
    path: str | os.PathLike,
    write: Callable[[str], None],
    *,
    what: str = "file written by jupyter_memprof",
    overwrite: bool = False,
    is_own_kind: Callable[[str], bool] | None = None,
) -> str:
    """Call ``write(tmp_path)`` and rename the result to ``path``; returns the absolute path."""
    path = _target(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {path}: it is a folder")
    _check_replace(path, what, overwrite, is_own_kind)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path)
    )
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_dir(
    path: str | os.PathLike,
    write: Callable[[str], None],
    *,
    what: str = "folder written by jupyter_memprof",
    overwrite: bool = False,
    is_own_kind: Callable[[str], bool] | None = None,
) -> str:
    """Call ``write(tmp_folder)`` and move the finished folder to ``path``.

    A previous folder at ``path`` is moved aside first and removed only once the new one is
    in place, so an interrupted write leaves either the old folder or the new one.
    """
    path = _target(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        if not overwrite:
            raise WriteRefused(
                f"refusing to replace {path}: it is a file, not a {what}; pass overwrite=True"
            )
    else:
        _check_replace(path, what, overwrite, is_own_kind)
    parent = os.path.dirname(path)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
    old = None
    try:
        write(tmp)
        if os.path.lexists(path):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".old", dir=parent)
            os.rmdir(old)
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not os.path.lexists(path):
            os.replace(old, path)
            old = None
        raise
    finally:
        if old is not None:
            if os.path.isdir(old) and not os.path.islink(old):
                shutil.rmtree(old, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(old)
    return path
