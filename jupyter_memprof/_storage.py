"""Save and load profiles: a zip of one JSON document per table plus the metadata.

No pickle: loading a file never runs code. Dtypes are not trusted from the file; every table
is checked against its declared schema (:mod:`_schema`) and coerced back to it, so a round
trip is lossless for everything the tables hold.

Loading treats the file as untrusted. Whatever is wrong with it (damage, truncation, a
crafted file) is one :class:`ProfileFileError` naming the file and what is wrong, and a
profile that loads works: its metadata and tables are checked on load, not when a view
first reads them.

**Sizes are checked before anything is decompressed.** The members a profile reads (its
``meta.json`` and one JSON document per table) declare their uncompressed sizes in the zip's
directory; their sum may be at most :data:`SIZE_FLOOR` (32 MiB) or :data:`MAX_RATIO` (100)
times the size of the file, whichever is larger. Every member is read with a bounded read,
so a member whose header lies cannot inflate to more than it declares; a zip of more than
:data:`MAX_MEMBERS` entries, encrypted members and compression methods other than stored and
deflate are refused. The same rule, on the sizes a Parquet footer declares, guards the
Parquet folder (:mod:`_parquet`).

**So is what is built from them.** The JSON values of the members are counted as they are
read, before parsing (:func:`value_budget`: parsing costs up to about 80 bytes a value); a
table's declared rows must match its columns before a column it lacks is filled; text
columns are charged their rows times their longest value (:class:`TextBudget`: views lay
text out at its longest, in fixed-width arrays), and no text value may be longer than
:data:`MAX_TEXT` characters. The memory of a load, and of the views of what it loaded, is
therefore bounded by the file's size.

Saving is atomic (:func:`jupyter_memprof._io.atomic_write`): the zip is written to a
temporary file in the target folder and renamed into place, so a failed save leaves the
previous file as it was; an existing file is replaced only when it is a saved profile, or
with ``overwrite=True``.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import zipfile
import zlib

import numpy as np
import pandas as pd

from ._analysis import schema as S
from ._devices import is_device_name
from ._errors import ProfileFileError
from ._io import atomic_write
from ._units import format_bytes

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MAX_RATIO",
    "SIZE_FLOOR",
    "ProfileFileError",
    "read",
    "write",
]

FORMAT = "jupyter_memprof.profile"
FORMAT_VERSION = 1

#: A file may declare at most ``max(SIZE_FLOOR, MAX_RATIO * its size on disk)`` bytes of
#: uncompressed data (both formats). Real profiles compress 4 to 20 times.
MAX_RATIO = 100
SIZE_FLOOR = 32 * 2**20
#: ``meta.json`` may declare at most this much (real ones are under a few KiB).
MAX_META_BYTES = 2**20
#: Entries in a zip (a profile has nine).
MAX_MEMBERS = 64
#: Nesting of JSON values kept from a file (meta values, ``ops.input_shapes``).
MAX_DEPTH = 32
#: The JSON values (counted before parsing: commas and brackets) a zip may hold: at most
#: ``max(VALUE_FLOOR, VALUES_PER_BYTE * its size)``. Parsing costs up to about 80 bytes of
#: memory per value; real profiles hold about one value per byte of the file.
VALUES_PER_BYTE = 8
VALUE_FLOOR = 2**20
#: The longest text value (op name, module, callsite, ...) a profile may hold, in characters.
MAX_TEXT = 2**16
_INT64 = (-(2**63), 2**63 - 1)
_META = "meta.json"


def size_budget(stored: int) -> int:
    """The most uncompressed bytes a file of ``stored`` bytes may declare."""
    return max(SIZE_FLOOR, MAX_RATIO * stored)


def size_refusal(path: str, declared: int, stored: int) -> ProfileFileError:
    return ProfileFileError(
        f"{shown(path)} declares {format_bytes(declared)} of data in {format_bytes(stored)} "
        f"(over {MAX_RATIO}x its size and over {format_bytes(SIZE_FLOOR)}); refusing to "
        "decompress it"
    )


def value_budget(stored: int) -> int:
    """The most JSON values a zip of ``stored`` bytes may hold."""
    return max(VALUE_FLOOR, VALUES_PER_BYTE * stored)


def count_values(data: bytes) -> int:
    """An upper bound of the JSON values in ``data``, counted without parsing it."""
    return data.count(b",") + data.count(b"[") + data.count(b"{") + 1


class TextBudget:
    """What the text columns of one file may spell out, charged column by column before the
    text is spelled out: each column's rows times its longest value (views lay text out at
    its longest), at most :func:`size_budget` in all, and no value over :data:`MAX_TEXT`
    characters. Raises :class:`Bad`."""

    def __init__(self, stored: int) -> None:
        self.left = size_budget(stored)
        #: the JSON values left to parse (:func:`value_budget`)
        self.value_limit = self.values = value_budget(stored)

    def charge(self, rows: int, longest: int) -> None:
        if longest > MAX_TEXT:
            raise Bad(
                f"holds a text value of {longest:,} characters, over the {MAX_TEXT:,} a "
                "profile keeps"
            )
        self.left -= rows * longest
        if self.left < 0:
            raise Bad(
                "spells out more text (rows times the longest value) than the size rule allows"
            )


def shown(path: str) -> str:
    """``path`` on one line, for a message."""
    return path if path.isprintable() else ascii(path)


def one_line(exc: BaseException) -> str:
    """An exception as one short line (library messages can span several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def regular_file(path: str, what: str) -> int:
    """The size of ``path``; refuses anything but a regular file (a folder, a FIFO or a
    device would block, or read forever). A missing file is FileNotFoundError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:  # a NUL byte, a name too long, no permission, ...
        raise ProfileFileError(f"{shown(path)} cannot be read ({one_line(exc)})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ProfileFileError(f"{shown(path)} is {kind}, not {what}")
    return st.st_size


# -- checking what a file holds ------------------------------------------------------------
class Bad(Exception):
    """What is wrong with one value or column of a saved profile; the caller adds where it
    is (the JSON and the Parquet readers both use it)."""


def _depth_ok(value, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests lists and dicts at most ``limit`` deep (iterative)."""
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            if d >= limit:
                return False
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return True


def _utf8_ok(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from "\ud800" escapes
        return False
    return True


def _is_int(v) -> bool:
    return type(v) is int and _INT64[0] <= v <= _INT64[1]


def _is_num(v) -> bool:
    return (type(v) is int and _is_int(v)) or type(v) is float


def _opt(check):
    return lambda v: v is None or check(v)


def _str(v) -> bool:
    return type(v) is str and _utf8_ok(v)


def _nonneg_int(v) -> bool:
    return _is_int(v) and v >= 0


def _by_device(v, check) -> bool:
    """A dict of device name -> a value ``check`` accepts."""
    return type(v) is dict and all(is_device_name(k) and check(x) for k, x in v.items())


def _str_list(v) -> bool:
    return type(v) is list and all(_str(x) for x in v)


def _oom(v) -> bool:
    if type(v) is not dict:
        return False
    need = {"device": _str, "bytes": _is_int, "time_ns": _is_int}
    optional = {
        "limit": _is_int,
        "alloc_id": _is_int,
        "size_bytes": _is_int,
        "op_id": _is_int,
        "op_name": _str,
        "module": _str,
        "callsite": _str,
        "phase": _str,
        "tensors_bytes": _is_int,
        "cache_bytes": _is_int,
        "context_bytes": _is_int,
        "reserved_bytes": _is_int,
        "cause": _str,
        "expandable_segments": lambda x: type(x) is dict,
    }
    if any(k not in v or not check(v[k]) for k, check in need.items()):
        return False
    if any(k in v and not _opt(check)(v[k]) for k, check in optional.items()):
        return False
    live = v.get("live_by_category", {})
    return type(live) is dict and all(_str(k) and _is_int(b) for k, b in live.items())


#: The meta keys the package reads, and what each may hold (None, or absent, always works).
META_FIELDS = {
    "label": _str,
    "start_ns": _is_int,
    "end_ns": _is_int,
    "captured_at": _is_int,
    "devices": lambda v: _str_list(v) and all(is_device_name(d) for d in v),
    "estimate": lambda v: type(v) is bool,
    "simulated_cuda": lambda v: type(v) is bool,
    "with_stack": lambda v: type(v) is bool,
    "rank": _nonneg_int,
    "world_size": _nonneg_int,
    "limit": _nonneg_int,
    "oom": _oom,
    "error": _str,
    "analysis_error": _str,
    "analysis_interrupted": lambda v: type(v) is bool,
    "stop_error": _str,
    "device": _str,
    "compute_device": _str,
    "gpu": _str,
    "kernel_memory_not_modelled": lambda v: (
        type(v) is dict and all(_str(k) and _str(x) for k, x in v.items())
    ),
    "clock": _str,
    "torch_version": _str,
    "wall_s": _is_num,
    "capture_s": _is_num,
    "analysis_s": _is_num,
    "stop_s": _is_num,
    "event_count": _nonneg_int,
    "stage_s": lambda v: type(v) is dict and all(_is_num(x) for x in v.values()),
    "allocator": _str,
    "reserved_peak_bytes": lambda v: _by_device(v, _nonneg_int),
    "reserved_peak_ns": lambda v: _by_device(v, _is_int),
    "fragmentation_bytes": lambda v: _by_device(v, _nonneg_int),
    "reserved_model_error": lambda v: _by_device(v, _is_num),
}


def check_meta(meta, path: str) -> dict:
    """``meta`` if every field the package reads has the right type (or is absent or None);
    else ProfileFileError. Other keys are kept as they are (JSON values, nested at most
    :data:`MAX_DEPTH` deep, valid UTF-8)."""
    where = shown(path)
    if type(meta) is not dict:
        raise ProfileFileError(f"{where}: the metadata is not a JSON object")
    for key, check in META_FIELDS.items():
        value = meta.get(key)
        if value is not None and not check(value):
            raise ProfileFileError(
                f"{where}: metadata field {key!r} holds {_describe(value)}, not what a "
                "profile records there"
            )
    if not _depth_ok(meta):
        raise ProfileFileError(f"{where}: the metadata nests deeper than {MAX_DEPTH} levels")
    if not _utf8_ok(json.dumps(meta, ensure_ascii=False, allow_nan=True)):
        raise ProfileFileError(f"{where}: the metadata holds text that is not valid Unicode")
    return meta


def _describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def column_kind(dtype) -> str:
    if isinstance(dtype, pd.CategoricalDtype):
        return "vocab"
    return {
        "int64": "int",
        "Int64": "Int",
        "bool": "bool",
        "object": "object",
        S.OPEN_CATEGORY: "str",
        "string": "str",
    }[str(dtype)]


def shape_ok(value) -> bool:
    """An ``input_shapes`` entry: None or nested lists of scalars, at most MAX_DEPTH deep."""
    if value is None:
        return True
    if type(value) is not list:
        return False
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        for x in v:
            if type(x) is list:
                if d >= MAX_DEPTH:
                    return False
                stack.append((x, d + 1))
            elif not (x is None or type(x) in (bool, float) or _is_int(x) or _str(x)):
                return False
    return True


def _column_from_json(values, dtype, text: TextBudget):
    """The column's values as what pandas builds the declared dtype from; raises Bad."""
    if type(values) is not list:
        raise Bad(f"is {type(values).__name__}, not a list")
    kind = column_kind(dtype)
    types = set(map(type, values))
    if kind in ("int", "Int"):
        allowed = {int} if kind == "int" else {int, type(None)}
        if not types <= allowed:
            bad = sorted(t.__name__ for t in types - allowed)
            raise Bad(f"holds {', '.join(bad)} values, not integers")
        ints = [v for v in values if v is not None] if kind == "Int" else values
        if ints and (min(ints) < _INT64[0] or max(ints) > _INT64[1]):
            raise Bad("holds an integer out of the 64-bit range")
        if kind == "int":
            return np.array(values, dtype=np.int64)
        return pd.array(values, dtype="Int64")
    if kind == "bool":
        if not types <= {bool}:
            raise Bad("holds values that are not true or false")
        return np.array(values, dtype=bool)
    if kind in ("str", "vocab"):
        if not types <= {str, type(None)}:
            bad = sorted(t.__name__ for t in types - {str, type(None)})
            raise Bad(f"holds {', '.join(bad)} values, not text")
        text.charge(len(values), max((len(v) for v in values if v is not None), default=0))
        return pd.Series(values, dtype=object)
    if not all(shape_ok(v) for v in values):
        raise Bad(f"holds values that are not lists of numbers nested at most {MAX_DEPTH} deep")
    return pd.Series(values, dtype=object)


def check_text(df: pd.DataFrame, schema: dict) -> str | None:
    """The first problem with the text columns of ``df`` (already of the schema's columns):
    a value outside a closed vocabulary, text that is not valid Unicode; None if none."""
    for col, dtype in schema.items():
        kind = column_kind(dtype)
        if kind not in ("str", "vocab"):
            continue
        s = df[col]
        uniques = s.cat.categories if isinstance(s.dtype, pd.CategoricalDtype) else s.unique()
        uniques = [u for u in uniques if not (u is None or u is pd.NA or u != u)]
        if not all(type(u) is str for u in uniques):
            return f"column {col!r} holds values that are not text"
        if not _utf8_ok("".join(uniques)):
            return f"column {col!r} holds text that is not valid Unicode"
        if kind == "vocab":
            used = (
                set(s.dropna().unique())
                if not isinstance(s.dtype, pd.CategoricalDtype)
                else (set(s.cat.remove_unused_categories().cat.categories))
            )
            unknown = sorted(str(u) for u in used - set(dtype.categories))
            if unknown:
                return f"column {col!r} holds {unknown[0]!r}, not one of {list(dtype.categories)}"
    return None


#: columns holding op ids: each must be the position of an op in ``ops`` (or NA)
_OP_REFS = {
    "ops": ("parent_id", "node_id"),
    "allocations": ("alloc_op_id", "free_op_id"),
    "versions": ("op_id",),
    "events": ("op_id",),
    "flows": ("forward_op_id", "backward_op_id"),
    "uses": ("op_id",),
}
#: columns holding device strings
_DEVICE_COLUMNS = ("allocations", "events", "timeline", "names", "steps")


def check_tables(tables: dict[str, pd.DataFrame], path: str) -> dict[str, pd.DataFrame]:
    """Refuse tables that contradict each other where the analyses rely on it: ``op_id`` is
    each op's position, op references point at ops, devices are device names."""
    where = shown(path)
    ops = tables["ops"]
    n = len(ops)
    if not np.array_equal(ops["op_id"].to_numpy(), np.arange(n)):
        raise ProfileFileError(f"{where}: table 'ops' does not number its ops 0, 1, 2, ...")
    for name, cols in _OP_REFS.items():
        for col in cols:
            v = tables[name][col].dropna().to_numpy(dtype=np.int64)
            if len(v) and (v.min() < 0 or v.max() >= n):
                raise ProfileFileError(
                    f"{where}: table {name!r} column {col!r} names an op that is not in 'ops'"
                )
    for name in _DEVICE_COLUMNS:
        for device in tables[name]["device"].cat.categories:
            if not is_device_name(device):
                raise ProfileFileError(
                    f"{where}: table {name!r} names a device {device!r} that is not a device"
                )
    problem = _block_problem(tables)
    if problem:
        raise ProfileFileError(f"{where}: {problem}")
    return tables


#: columns holding block ids: each must be an ``alloc_id`` of ``allocations`` (or NA)
_BLOCK_REFS = {
    "events": "alloc_id",
    "versions": "alloc_id",
    "uses": "alloc_id",
    "names": "alloc_id",
}


#: columns every row of a real profile fills (the views look their values up)
_FILLED = {
    "allocations": ("device", "category"),
    "versions": ("category",),
    "events": ("action", "device", "category"),
    "timeline": ("device", "category"),
}


def _block_problem(tables: dict[str, pd.DataFrame]) -> str | None:
    """The first contradiction between the blocks and what refers to them (the analyses
    and views look blocks up by id): a vocabulary value missing, ids repeated, references to unknown blocks, a block
    without events or whose events are on another device; None if none."""
    for name, cols in _FILLED.items():
        for col in cols:
            if tables[name][col].isna().any():
                return f"table {name!r} column {col!r} has missing values"
    allocs = tables["allocations"]
    ids = allocs["alloc_id"].to_numpy(dtype=np.int64)
    if len(np.unique(ids)) != len(ids):
        return "table 'allocations' names a block twice (alloc_id repeats)"
    for name, col in _BLOCK_REFS.items():
        refs = tables[name][col].dropna().to_numpy(dtype=np.int64)
        if not np.isin(refs, ids).all():
            return f"table {name!r} column {col!r} names a block that is not in 'allocations'"
    events = tables["events"]
    ev_ids = events["alloc_id"].to_numpy(dtype=np.int64)
    if not np.isin(ids, ev_ids).all():
        return "table 'allocations' holds a block without events"
    block_device = pd.Series(allocs["device"].astype(object).to_numpy(), index=ids)
    if len(events) and not np.array_equal(
        block_device.reindex(ev_ids).to_numpy(), events["device"].astype(object).to_numpy()
    ):
        return "table 'events' puts a block on another device than 'allocations' does"
    timeline = set(tables["timeline"]["device"].astype(object).unique())
    if not timeline <= set(events["device"].astype(object).unique()):
        return "table 'timeline' names a device that has no events"
    return None


# -- the zip format ------------------------------------------------------------------------
def _json_default(value):
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def _table_to_json(df: pd.DataFrame) -> str:
    cols = {}
    for c in df.columns:
        s = df[c]
        if isinstance(s.dtype, pd.CategoricalDtype) or str(s.dtype) in ("string", "str"):
            cols[c] = [None if pd.isna(v) else str(v) for v in s.astype(object)]
        elif str(s.dtype) == "object":
            cols[c] = s.tolist()
        else:
            cols[c] = [None if pd.isna(v) else v for v in s.astype(object)]
    return json.dumps(
        {"columns": list(df.columns), "data": cols, "rows": len(df)}, default=_json_default
    )


def _row_count(doc: dict, schema: dict, name: str) -> int:
    """The rows of a table document: what it declares, checked against its columns (before
    anything is allocated per row); raises Bad."""
    data = doc["data"]
    present = [c for c in schema if c in data]
    missing = [c for c in schema if c not in data and c not in S.ADDED_COLUMNS.get(name, ())]
    if missing:
        raise Bad(f"lacks columns {missing}")
    lengths = {c: len(data[c]) for c in present if type(data[c]) is list}
    rows = doc.get("rows")
    if rows is not None and not _nonneg_int(rows):
        raise Bad(f"declares {_describe(rows)} rows")
    for col in present:
        if type(data[col]) is not list:
            raise Bad(f"column {col!r} is {type(data[col]).__name__}, not a list")
        if rows is None:
            rows = lengths[col]
        if lengths[col] != rows:
            raise Bad(f"column {col!r} has {lengths[col]} rows, not {rows}")
    return rows or 0


def _table_from_json(doc, schema: dict, name: str, text: TextBudget) -> pd.DataFrame:
    """One table from its parsed JSON document; raises Bad saying what is wrong."""
    if type(doc) is not dict or type(doc.get("data")) is not dict:
        raise Bad("is not a table (an object with 'data')")
    data = doc["data"]
    rows = _row_count(doc, schema, name)
    columns = {}
    for col, dtype in schema.items():
        if col not in data:  # a column added after the file was written
            columns[col] = pd.Series([None] * rows, dtype=object)
            continue
        try:
            columns[col] = _column_from_json(data[col], dtype, text)
        except Bad as exc:
            raise Bad(f"column {col!r} {exc}") from None
    df = pd.DataFrame(columns, index=pd.RangeIndex(rows))
    problem = check_text(df, schema)
    if problem:
        raise Bad(problem)
    return S.conform(df, schema, name=name)


def is_saved_profile(path: str) -> bool:
    """Whether ``path`` is a zip whose ``meta.json`` says it is a saved profile (what
    :func:`write` replaces without ``overwrite=True``)."""
    try:
        with zipfile.ZipFile(path) as z:
            info = z.getinfo(_META)
            if info.file_size > MAX_META_BYTES:
                return False
            with z.open(info) as f:
                doc = json.loads(f.read(MAX_META_BYTES))
        return type(doc) is dict and doc.get("format") == FORMAT
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, RuntimeError, EOFError, zlib.error):
        return False


def write(
    tables: dict[str, pd.DataFrame], meta: dict, path: str | os.PathLike, *, overwrite: bool = False
) -> str:
    """Write ``tables`` and ``meta`` to ``path`` (a zip of JSON); returns the absolute path.

    Atomic: written to a temporary file in the target folder and renamed into place. An
    existing file is replaced only when it is a saved profile, or with ``overwrite=True``.
    """
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "meta": meta}

    def write_zip(tmp: str) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr(_META, json.dumps(doc, default=_json_default))
            for name, df in tables.items():
                z.writestr(f"{name}.json", _table_to_json(df))

    return atomic_write(
        path,
        write_zip,
        what="saved jupyter_memprof profile",
        overwrite=overwrite,
        is_own_kind=is_saved_profile,
    )


def _entry_count(fh, size: int) -> int | None:
    """The entry count the zip's end record declares, read before zipfile parses the
    directory (None when there is no end record where zipfile looks: it then refuses)."""
    tail = min(size, 22 + 65535)
    fh.seek(size - tail)
    data = fh.read(tail)
    at = data.rfind(b"PK\x05\x06")
    if at < 0 or len(data) - at < 22:
        return None
    return struct.unpack("<H", data[at + 10 : at + 12])[0]


def _read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, text: TextBudget) -> bytes:
    """A member's bytes, read in chunks: the JSON values in each are counted as it comes
    (:func:`count_values`), so a member over the budget is refused without being held."""
    chunks = []
    with z.open(info) as f:
        left = info.file_size + 1  # zipfile stops at the declared size
        while left > 0:
            chunk = f.read(min(left, 2**20))
            if not chunk:
                break
            left -= len(chunk)
            text.values -= count_values(chunk) - 1
            if text.values < 0:
                raise Bad(
                    f"brings the values in the file over {text.value_limit:,} (at most "
                    f"{VALUES_PER_BYTE} per byte of the file, or {VALUE_FLOOR:,}); refusing to "
                    "parse it"
                )
            chunks.append(chunk)
    data = b"".join(chunks)
    del chunks
    if len(data) != info.file_size:
        raise Bad(f"holds {len(data)} bytes, not the {info.file_size} it declares")
    return data


def decode_utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise Bad("is not UTF-8 text") from None


def parse_json(text: str):
    """``text`` as JSON; raises :class:`Bad` saying what is wrong with it."""
    try:
        return json.loads(text)
    except RecursionError:
        raise Bad("nests too deeply") from None
    except ValueError as exc:
        raise Bad(f"is not JSON ({one_line(exc)})") from None


def _read_zip(z: zipfile.ZipFile, path: str, stored: int) -> tuple[dict, dict]:
    where = shown(path)
    infos = z.infolist()
    if len(infos) > MAX_MEMBERS:
        raise ProfileFileError(f"{where} holds {len(infos)} entries, not a saved profile")
    present = set(z.namelist())
    names = [
        _META,
        *(
            f"{name}.json"
            for name in S.TABLES
            if name not in S.ADDED_TABLES or f"{name}.json" in present
        ),
    ]
    try:
        members = {n: z.getinfo(n) for n in names}
    except KeyError:
        if _META not in z.namelist():
            raise ProfileFileError(f"{where} is not a saved jupyter_memprof profile") from None
        lacking = [n for n in names if n not in z.namelist()]
        raise ProfileFileError(f"{where} lacks the table {lacking[0]}") from None
    for n, info in members.items():
        if info.flag_bits & 0x1:
            raise ProfileFileError(f"{where}: {n} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ProfileFileError(
                f"{where}: {n} is compressed with method {info.compress_type}, not deflate"
            )
        if info.compress_size > stored:
            raise ProfileFileError(f"{where}: {n} declares more compressed bytes than the file has")
    declared = sum(info.file_size for info in members.values())
    if declared > size_budget(stored):
        raise size_refusal(path, declared, stored)
    if members[_META].file_size > MAX_META_BYTES:
        raise ProfileFileError(
            f"{where}: {_META} declares {format_bytes(members[_META].file_size)}, over "
            f"{format_bytes(MAX_META_BYTES)}"
        )

    text = TextBudget(stored)  # what the members left to parse may hold and spell out

    def load(n: str):
        try:
            text.values -= 1
            return parse_json(decode_utf8(_read_member(z, members[n], text)))
        except Bad as exc:
            raise ProfileFileError(f"{where}: {n} {exc}") from None

    doc = load(_META)
    if type(doc) is not dict or doc.get("format") != FORMAT:
        raise ProfileFileError(f"{where} is not a saved jupyter_memprof profile")
    version = doc.get("format_version", 0)
    if not _is_int(version):
        raise ProfileFileError(f"{where}: format_version is {_describe(version)}, not a number")
    if version > FORMAT_VERSION:
        raise ProfileFileError(
            f"{where} was saved by a newer jupyter_memprof (format {version}); upgrade to read it"
        )
    meta = check_meta(doc.get("meta", {}), path)
    tables = {}
    for name, schema in S.TABLES.items():
        if f"{name}.json" not in members:  # a table added since the file was written
            tables[name] = S.empty(schema)
            continue
        try:
            tables[name] = _table_from_json(load(f"{name}.json"), schema, name, text)
        except Bad as exc:
            raise ProfileFileError(f"{where}: table {name!r} {exc}") from None
        except ProfileFileError:  # from reading the member
            raise
        except (ValueError, TypeError, OverflowError) as exc:  # pandas refusing a cast
            raise ProfileFileError(f"{where}: table {name!r} ({one_line(exc)})") from None
    return check_tables(tables, path), meta


def read(path: str | os.PathLike) -> tuple[dict[str, pd.DataFrame], dict]:
    """Read the tables and meta written by :func:`write`, checking sizes before anything is
    decompressed (see the module's docstring) and every table and field on the way; never
    executes code from the file. Raises FileNotFoundError when there is no such file and
    :class:`ProfileFileError` (one line) for anything else wrong with it."""
    path = os.fspath(path)
    where = shown(path)
    stored = regular_file(path, "a saved profile file")
    try:
        with open(path, "rb") as fh:
            count = _entry_count(fh, stored)
            if count is not None and count > MAX_MEMBERS:
                raise ProfileFileError(f"{where} holds {count} entries, not a saved profile")
            fh.seek(0)
            with zipfile.ZipFile(fh) as z:
                return _read_zip(z, path, stored)
    except ProfileFileError:
        raise
    except MemoryError:
        raise
    except zipfile.BadZipFile as exc:
        raise ProfileFileError(
            f"{where} is not a readable saved profile ({one_line(exc)})"
        ) from None
    except Exception as exc:  # zlib.error, EOFError, OSError, ...: damage, whatever its kind
        raise ProfileFileError(
            f"{where} is not a readable saved profile ({type(exc).__name__}: {one_line(exc)})"
        ) from None
