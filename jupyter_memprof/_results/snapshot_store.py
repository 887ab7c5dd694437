"""``prof.snapshot`` in a saved profile (both formats).

``prof.snapshot`` in a saved profile: CUDA's own allocator snapshot (recorded with
``profile(snapshot=True)``) as one JSON document beside the tables, ``snapshot.json``, a
member of the zip or a file of the Parquet folder. Absent when the profile has none.

A snapshot is plain data, what ``torch.cuda.memory._snapshot()`` returns: dicts with text
keys, lists (tuples are written as lists), text, integers, finite floats, booleans and
None. Anything else is refused when the profile is saved (:func:`to_json`), before the
file is touched.

On load the document is untrusted like every other member: its size is capped
(:data:`MAX_SNAPSHOT_BYTES`, and in a zip the size and value budgets of the whole file),
it must be UTF-8 JSON nesting at most :data:`MAX_SNAPSHOT_DEPTH` deep, and its fields that
code reads (``segments``, ``device_traces``, their blocks and entries) must have the types
torch gives them (:func:`check_snapshot`). Anything wrong is one
:class:`~jupyter_memprof.ProfileFileError` line naming the file.
"""

from __future__ import annotations

import json
import math
import os

from .._errors import ProfileFileError
from .._units import format_bytes
from .checks import Bad, count_values, decode_utf8, parse_json, regular_file, shown

__all__ = [
    "MAX_SNAPSHOT_BYTES",
    "MEMBER",
    "check_plain",
    "check_snapshot",
    "check_pickle_target",
    "parse",
    "read_file",
    "to_json",
    "too_big",
    "write_pickle",
    "zip_member",
]

#: the member of the zip and the file of the Parquet folder
MEMBER = "snapshot.json"
#: the largest snapshot document read (torch keeps at most 100,000 history entries by
#: default: about 100 MiB of JSON with Python stacks)
MAX_SNAPSHOT_BYTES = 256 << 20
#: the JSON values it may hold, counted before parsing (each costs up to about 80 bytes)
MAX_SNAPSHOT_VALUES = 32 << 20
#: nesting of a snapshot (torch's: snapshot, segments, segment, blocks, block, frames,
#: frame: 7)
MAX_SNAPSHOT_DEPTH = 16
_SCALARS = (str, int, float, bool, type(None))


def to_json(snapshot: dict) -> str:
    """``snapshot`` as JSON text; raises TypeError (one line) naming the first value that
    is not plain data."""
    check_plain(snapshot)
    return json.dumps(snapshot, separators=(",", ":"), allow_nan=False)


def check_plain(snapshot: dict) -> None:
    """Raise TypeError (one line) naming the first value of ``snapshot`` that is not plain
    data (see the module docstring)."""
    if type(snapshot) is not dict:
        raise TypeError(f"prof.snapshot is {type(snapshot).__name__}, not a dict")
    stack = [(snapshot, "snapshot", 0)]
    while stack:
        value, where, depth = stack.pop()
        if type(value) is dict:
            if depth >= MAX_SNAPSHOT_DEPTH:
                raise TypeError(f"prof.snapshot nests deeper than {MAX_SNAPSHOT_DEPTH} at {where}")
            for k, v in value.items():
                if type(k) is not str:
                    raise TypeError(f"prof.snapshot has a key {k!r} that is not text at {where}")
                stack.append((v, f"{where}[{k!r}]", depth + 1))
        elif type(value) in (list, tuple):
            if depth >= MAX_SNAPSHOT_DEPTH:
                raise TypeError(f"prof.snapshot nests deeper than {MAX_SNAPSHOT_DEPTH} at {where}")
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
        elif type(value) not in _SCALARS:
            raise TypeError(
                f"prof.snapshot holds a {type(value).__name__} at {where}: only plain data "
                "(dicts, lists, text, numbers, booleans, None) is saved"
            )
        elif type(value) is float and not math.isfinite(value):
            raise TypeError(f"prof.snapshot holds {value} at {where}, which JSON cannot hold")


def _is_int(v) -> bool:
    return type(v) is int


def _list_of_dicts(v) -> bool:
    return type(v) is list and all(type(x) is dict for x in v)


def _problem(doc) -> str | None:
    """What is wrong with a loaded snapshot document, or None."""
    if type(doc) is not dict:
        return f"is {type(doc).__name__}, not a snapshot (an object)"
    if not _depth_ok(doc):
        return f"nests deeper than {MAX_SNAPSHOT_DEPTH} levels"
    segments = doc.get("segments", [])
    if not _list_of_dicts(segments):
        return "has segments that are not a list of objects"
    for i, seg in enumerate(segments):
        if not _list_of_dicts(seg.get("blocks", [])):
            return f"segment {i} has blocks that are not a list of objects"
        for key in ("device", "address", "total_size"):
            if key in seg and not _is_int(seg[key]):
                return f"segment {i} has a {key} that is not an integer"
        for block in seg.get("blocks", []):
            for key in ("address", "size"):
                if key in block and not _is_int(block[key]):
                    return f"segment {i} has a block whose {key} is not an integer"
            if "state" in block and type(block["state"]) is not str:
                return f"segment {i} has a block whose state is not text"
    traces = doc.get("device_traces", [])
    if type(traces) is not list or not all(_list_of_dicts(t) for t in traces):
        return "has device_traces that are not lists of objects"
    for d, entries in enumerate(traces):
        for entry in entries:
            if "action" in entry and type(entry["action"]) is not str:
                return f"device {d} has a trace entry whose action is not text"
            for key in ("addr", "size", "device_free", "time_us"):
                if key in entry and not _is_int(entry[key]):
                    return f"device {d} has a trace entry whose {key} is not an integer"
    return None


def _depth_ok(value) -> bool:
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if type(v) in (list, dict):
            if d >= MAX_SNAPSHOT_DEPTH:
                return False
            stack.extend((x, d + 1) for x in (v.values() if type(v) is dict else v))
    return True


def check_snapshot(doc, where: str) -> dict:
    """The snapshot document ``doc`` (parsed JSON) when it has the shape torch gives a
    snapshot; else one :class:`ProfileFileError` line naming ``where``."""
    problem = _problem(doc)
    if problem:
        raise ProfileFileError(f"{where}: {MEMBER} {problem}")
    return doc


def parse(data: bytes, where: str) -> dict:
    """A snapshot member's bytes, parsed and checked (one ProfileFileError line)."""
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise too_big(where, len(data))
    if count_values(data) > MAX_SNAPSHOT_VALUES:
        raise ProfileFileError(
            f"{where}: {MEMBER} holds over {MAX_SNAPSHOT_VALUES:,} JSON values; refusing to "
            "parse it"
        )
    try:
        doc = parse_json(decode_utf8(data))
    except Bad as exc:
        raise ProfileFileError(f"{where}: {MEMBER} {exc}") from None
    return check_snapshot(doc, where)


def too_big(where: str, size: int) -> ProfileFileError:
    return ProfileFileError(
        f"{where}: {MEMBER} holds {format_bytes(size)}, over the "
        f"{format_bytes(MAX_SNAPSHOT_BYTES)} a snapshot may hold"
    )


def read_file(folder: str) -> dict | None:
    """The snapshot of the Parquet profile ``folder`` (None when it has none), checked."""
    file = os.path.join(folder, MEMBER)
    if not os.path.lexists(file):
        return None
    try:
        size = regular_file(file, "a snapshot document")
    except FileNotFoundError:  # a link to nothing
        raise ProfileFileError(f"{shown(file)} is a link to nothing") from None
    if size > MAX_SNAPSHOT_BYTES:
        raise too_big(shown(folder), size)
    with open(file, "rb") as fh:
        data = fh.read(MAX_SNAPSHOT_BYTES + 1)
    return parse(data, shown(folder))


def zip_member(z, where: str, stored: int):
    """The snapshot member's entry in the zip ``z`` (None when there is none), checked
    before anything is read: not encrypted, stored or deflated, and of a declared size
    under the cap."""
    import zipfile

    if MEMBER not in z.namelist():
        return None
    info = z.getinfo(MEMBER)
    if info.flag_bits & 0x1:
        raise ProfileFileError(f"{where}: {MEMBER} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ProfileFileError(
            f"{where}: {MEMBER} is compressed with method {info.compress_type}, not deflate"
        )
    if info.compress_size > stored:
        raise ProfileFileError(
            f"{where}: {MEMBER} declares more compressed bytes than the file has"
        )
    if info.file_size > MAX_SNAPSHOT_BYTES:
        raise too_big(where, info.file_size)
    return info


# -- the snapshot as torch writes it: a pickle memory_viz opens ----------------------------
def check_pickle_target(path: str | os.PathLike, *, overwrite: bool = False) -> str:
    """Raise, before anything runs, what :func:`write_pickle` would raise at ``path`` (a
    missing folder, a folder in the way, a file that is not a snapshot, without
    ``overwrite``); returns the absolute path."""
    from .._io import NotARegularFile, WriteRefused, check_target
    from .._views.snapshot_export import looks_like_snapshot

    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"the folder {folder!r} does not exist")
    try:
        return check_target(
            path, what="memory snapshot", overwrite=overwrite, is_own_kind=looks_like_snapshot
        )
    except NotARegularFile:
        raise
    except WriteRefused:
        raise WriteRefused(
            f"{path!r} exists and is not a memory snapshot: choose another path, or remove it"
        ) from None


def write_pickle(snapshot: dict, path: str | os.PathLike, *, overwrite: bool = False) -> str:
    """Write ``snapshot`` (plain data) as the pickle ``torch.cuda.memory._dump_snapshot``
    writes, which memory_viz opens; atomic (a temporary file renamed into place). An
    existing file is replaced only when it is a snapshot, or with ``overwrite=True``.
    Returns the absolute path."""
    import pickle

    from .._io import atomic_write
    from .._views.snapshot_export import PICKLE_PROTOCOL, looks_like_snapshot

    check_plain(snapshot)
    data = pickle.dumps(snapshot, protocol=PICKLE_PROTOCOL)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)

    path = os.path.expanduser(os.fspath(path))
    return atomic_write(
        path, write, what="memory snapshot", overwrite=overwrite, is_own_kind=looks_like_snapshot
    )
