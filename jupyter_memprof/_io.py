"""Safe writes: never half a file, no file replaced by surprise.

Every file the package writes (saved profiles, HTML reports, exports) goes through
:func:`atomic_write` (or :func:`atomic_write_dir` for a folder of files): the content is written
to a temporary name in the target folder and renamed into place, so a failed or interrupted
write leaves the previous file as it was. An existing target is replaced only when it is of
the writer's own kind (``is_own_kind(path)``) or when the caller passes ``overwrite=True``.

Files and folders are created as any file the user writes: with the mode the user's umask
gives (``0o666 & ~umask``, folders ``0o777 & ~umask``); a file that replaces another keeps
the permission bits of the one it replaces. A target that exists and is not a regular file
(a FIFO, a socket, a device) is refused before anything opens it, so a write never blocks;
a file the user cannot read is refused as such. Temporary names stay short whatever the
target's name (a name of up to 255 bytes can be written).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable


class WriteRefused(FileExistsError):
    """The target exists and is not ours to replace without ``overwrite=True``."""


class NotARegularFile(WriteRefused):
    """The target is a FIFO, a socket or a device: never opened, never replaced."""


def _target(path: str | os.PathLike) -> str:
    path = os.path.abspath(os.path.expanduser(os.fsdecode(os.fspath(path))))
    folder = os.path.dirname(path)
    try:
        is_folder = stat.S_ISDIR(os.stat(folder).st_mode)
    except PermissionError:
        raise PermissionError(f"cannot write {path}: you may not enter {folder}") from None
    except OSError:
        is_folder = False
    if not is_folder:
        raise FileNotFoundError(f"cannot write {path}: the folder {folder} does not exist")
    return path


def _check_replace(
    path: str, what: str, overwrite: bool, is_own_kind: Callable[[str], bool] | None
) -> None:
    if not os.path.lexists(path):
        return
    _check_kind(path, folder_ok=False)
    if overwrite:
        return
    _check_readable(path)
    if is_own_kind is not None and is_own_kind(path):
        return
    raise WriteRefused(
        f"refusing to replace {path}: it is not a {what}; pass overwrite=True to replace it"
    )


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _check_kind(path: str, *, folder_ok: bool) -> None:
    """Refuse a target that is not a regular file (or a folder, where ``folder_ok``) without
    opening it: opening a FIFO blocks, a device may never end."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # a link to nothing: replaced like a file
        return
    if stat.S_ISREG(mode) or (folder_ok and stat.S_ISDIR(mode)):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"cannot write {path}: it is a folder")
    raise NotARegularFile(f"refusing to write {path}: it is {_kind(mode)}, not a regular file")


def _check_readable(path: str) -> None:
    """Refuse a target the user cannot read (so cannot tell whether it is ours) with that
    reason, not as a file of the wrong kind."""
    need = os.R_OK | os.X_OK if os.path.isdir(path) else os.R_OK
    if os.access(path, need):
        return
    try:
        owner = os.stat(path).st_uid
    except OSError:
        return
    whose = " (it belongs to another user)" if owner != os.getuid() else ""
    raise PermissionError(f"cannot replace {path}: you may not read it{whose}")


def _temp_name(path: str, suffix: str) -> str:
    """A fresh name next to ``path``: a dot, at most 32 characters of its name, a random
    part and ``suffix`` (short enough whatever the length of the name)."""
    base = os.path.basename(path)[:32]
    return os.path.join(os.path.dirname(path), f".{base}.{secrets.token_hex(6)}{suffix}")


def _new_file(path: str) -> str:
    """Create an empty temporary file next to ``path`` with the mode of an ordinary new file
    (the umask applies)."""
    while True:
        tmp = _temp_name(path, ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except PermissionError:
            raise PermissionError(
                f"cannot write {path}: the folder {os.path.dirname(path)} is not writable"
            ) from None
        break
    os.close(fd)
    return tmp


def _keep_mode(path: str, tmp: str) -> None:
    """Give the finished ``tmp`` the permission bits of the ``path`` it replaces (of the same
    kind, file or folder), once nothing more is written into it."""
    with contextlib.suppress(OSError):
        old, new = os.stat(path), os.stat(tmp)
        if stat.S_IFMT(old.st_mode) == stat.S_IFMT(new.st_mode):
            os.chmod(tmp, stat.S_IMODE(old.st_mode))


def _new_folder(path: str, suffix: str) -> str:
    """Create an empty folder next to ``path`` (the umask applies)."""
    while True:
        tmp = _temp_name(path, suffix)
        try:
            os.mkdir(tmp, 0o777)
        except FileExistsError:
            continue
        except PermissionError:
            raise PermissionError(
                f"cannot write {path}: the folder {os.path.dirname(path)} is not writable"
            ) from None
        return tmp


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
    path = check_target(path, what=what, overwrite=overwrite, is_own_kind=is_own_kind)
    tmp = _new_file(path)
    try:
        write(tmp)
        _keep_mode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _check_replace_folder(
    path: str, what: str, overwrite: bool, is_own_kind: Callable[[str], bool] | None
) -> None:
    if not os.path.lexists(path) or overwrite:
        return
    _check_readable(path)
    if is_own_kind is not None and is_own_kind(path):
        return
    raise WriteRefused(
        f"refusing to replace {path}: it is not a {what}; pass overwrite=True to replace it"
    )


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
        _check_kind(path, folder_ok=False)
        if not overwrite:
            raise WriteRefused(
                f"refusing to replace {path}: it is a file, not a {what}; pass overwrite=True"
            )
    else:
        _check_replace_folder(path, what, overwrite, is_own_kind)
    tmp = _new_folder(path, ".tmp")
    old = None
    try:
        write(tmp)
        _keep_mode(path, tmp)
        if os.path.lexists(path):
            old = _new_folder(path, ".old")
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


def json_default(value):
    """How values JSON cannot write are written in every file the package saves: numpy
    scalars as their Python value, sets and tuples as lists, anything else as its text."""
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
