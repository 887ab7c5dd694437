"""A snapshot file as plain data: pickle protocols 2-5, or JSON.

A snapshot holds only dicts, lists, tuples, strings, numbers, booleans and None, so the C
unpickler runs with a ``find_class`` that refuses every global: nothing in the file can name
a class or a function, so nothing in it runs (``REDUCE``, ``BUILD``, ``INST``, extension
codes and persistent ids all need an object only a global gives). Anything else that goes
wrong (a truncated file, an unknown opcode, a wrong stack) is one
:class:`~jupyter_memprof._errors.ProfileFileError` line naming the file.

Loading is bounded by the file: the unpickler keeps each memoised object once, so a file
whose shared references would expand to 2**60 frames is small in memory; the reader
(:mod:`.read`) walks shared lists once each.
"""

from __future__ import annotations

import io
import json
import os
import pickle

from ..._errors import ProfileFileError

__all__ = ["PICKLE_MAGIC", "is_snapshot_file", "loads", "read_file"]

#: The first byte of a pickle of protocol 2 or later (the PROTO opcode).
PICKLE_MAGIC = 0x80
#: How many bytes :func:`is_snapshot_file` reads to tell a JSON snapshot from other JSON.
_SNIFF_BYTES = 4096
_JSON_KEYS = (b'"segments"', b'"device_traces"')


class _PlainData(pickle.Unpickler):
    """The C unpickler, refusing every global: only plain data comes out."""

    def find_class(self, module: str, name: str):
        raise _Refused(f"it names {module}.{name}; a memory snapshot holds only plain data")

    def persistent_load(self, pid):
        raise _Refused("it holds a persistent id; a memory snapshot holds only plain data")


class _Refused(Exception):
    """A global or persistent id the file asked for (the message says which)."""


def shown(path: str) -> str:
    return os.path.basename(path) or path


def is_snapshot_file(path: str) -> bool:
    """Does the file at ``path`` look like a memory snapshot: a pickle (its first byte is
    the PROTO opcode) or JSON whose first 4 KiB name ``segments`` or ``device_traces``?"""
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except (IsADirectoryError, PermissionError):
        return False
    if head[:1] == bytes([PICKLE_MAGIC]):
        return True
    return head.lstrip()[:1] == b"{" and any(k in head for k in _JSON_KEYS)


def loads(data: bytes, name: str = "snapshot") -> object:
    """The plain data a snapshot's bytes hold (pickle or JSON); ``ProfileFileError`` (one
    line starting with ``name``) for anything else."""
    if data[:1] == bytes([PICKLE_MAGIC]):
        return _unpickle(data, name)
    if data.lstrip()[:1] in (b"{", b"["):
        return _from_json(data, name)
    if not data:
        raise ProfileFileError(f"{name}: the file is empty")
    raise ProfileFileError(
        f"{name}: not a memory snapshot (neither a pickle of protocol 2 to 5 nor JSON)"
    )


def read_file(path: str | os.PathLike) -> object:
    """The plain data of the snapshot file at ``path`` (see :func:`loads`)."""
    path = os.fsdecode(os.fspath(path))
    with open(path, "rb") as f:
        if f.read(1) != bytes([PICKLE_MAGIC]):
            f.seek(0)
            return loads(f.read(), shown(path))
        f.seek(0)  # a pickle is read from the file: its bytes are never all in memory
        return _unpickle(f, shown(path))


def _unpickle(data: bytes | io.BufferedIOBase, name: str) -> object:
    """The plain data of a pickle: its bytes, or a file open at its start."""
    if isinstance(data, bytes):
        head = data[:2]
    else:
        head = data.read(2)
        data.seek(0)
    protocol = head[1] if len(head) > 1 else -1
    if not 2 <= protocol <= 5:
        raise ProfileFileError(f"{name}: pickle protocol {protocol} is not one of 2 to 5")
    reader = _PlainData(io.BytesIO(data) if isinstance(data, bytes) else data)
    try:
        value = reader.load()
    except _Refused as e:
        raise ProfileFileError(f"{name}: refused: {e}") from None
    except EOFError:
        raise ProfileFileError(f"{name}: the file ends early (truncated)") from None
    except RecursionError:
        raise ProfileFileError(f"{name}: nested too deeply") from None
    except MemoryError:
        raise ProfileFileError(f"{name}: too large to read into memory") from None
    except Exception as e:  # the unpickler's own errors: bad opcodes, stack, memo
        raise ProfileFileError(f"{name}: not a readable pickle ({_one_line(e)})") from None
    return value


def _from_json(data: bytes, name: str) -> object:
    try:
        return json.loads(data)
    except RecursionError:
        raise ProfileFileError(f"{name}: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ProfileFileError(f"{name}: not readable JSON ({_one_line(e)})") from None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."
