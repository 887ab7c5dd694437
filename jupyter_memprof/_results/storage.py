"""Profiles saved and loaded as a zip: a JSON document per table.

No pickle: loading a file never runs code. Dtypes are not trusted from the file; every table
is checked against its declared schema (:mod:`_schema`) and coerced back to it, so a round
trip is lossless for everything the tables hold.

Loading treats the file as untrusted. Whatever is wrong with it (damage, truncation, a
crafted file) is one :class:`ProfileFileError` naming the file and what is wrong, and a
profile that loads works: its metadata and tables are checked on load, not when a view
first reads them.

**Sizes are checked before anything is decompressed.** The members a profile reads (its
``meta.json``, one JSON document per table, and the same for each kept window of a long run
under ``kept/<i>/``, :mod:`.kept`) declare their uncompressed sizes in the zip's
directory; their sum may be at most :data:`.checks.SIZE_FLOOR` (32 MiB) or :data:`.checks.MAX_RATIO` (100)
times the size of the file, whichever is larger. Every member is read with a bounded read,
so a member whose header lies cannot inflate to more than it declares; a zip of more than
:data:`MAX_MEMBERS` entries, encrypted members and compression methods other than stored and
deflate are refused. The same rule, on the sizes a Parquet footer declares, guards the
Parquet folder (:mod:`.parquet`).

**So is what is built from them.** The JSON values of the members are counted as they are
read, before parsing (:func:`value_budget`: parsing costs up to about 80 bytes a value); a
table's declared rows must match its columns before a column it lacks is filled; text
columns are charged their rows times their longest value (:class:`TextBudget`: views lay
text out at its longest, in fixed-width arrays), and no text value may be longer than
:data:`.checks.MAX_TEXT` characters. The memory of a load, and of the views of what it loaded, is
therefore bounded by the file's size.

Saving is atomic (:func:`jupyter_memprof._io.atomic_write`): the zip is written to a
temporary file in the target folder and renamed into place, so a failed save leaves the
previous file as it was; an existing file is replaced only when it is a saved profile, or
with ``overwrite=True``.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
import zlib

import numpy as np
import pandas as pd

from .._analysis import schema as S
from .._errors import ProfileFileError
from .._io import atomic_write, json_default
from .._units import format_bytes
from . import kept as K
from . import snapshot_store as SN
from .checks import (
    INT64,
    MAX_DEPTH,
    MAX_MEMBERS,
    MAX_META_BYTES,
    VALUE_FLOOR,
    VALUES_PER_BYTE,
    Bad,
    TextBudget,
    check_meta,
    check_tables,
    check_text,
    column_kind,
    count_values,
    decode_utf8,
    describe,
    is_int,
    nonneg_int,
    one_line,
    parse_json,
    regular_file,
    shape_ok,
    shown,
    size_budget,
    size_refusal,
)

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ProfileFileError",
    "read",
    "write",
]
FORMAT = "jupyter_memprof.profile"
FORMAT_VERSION = 1
_META = "meta.json"


# -- the zip format ------------------------------------------------------------------------
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
        if ints and (min(ints) < INT64[0] or max(ints) > INT64[1]):
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
        {"columns": list(df.columns), "data": cols, "rows": len(df)}, default=json_default
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
    if rows is not None and not nonneg_int(rows):
        raise Bad(f"declares {describe(rows)} rows")
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
            columns[col] = pd.Series([S.ADDED_DEFAULTS.get((name, col))] * rows, dtype=object)
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


def _document_of(meta: dict) -> dict:
    """The ``meta.json`` document of a saved profile (a kept window's too)."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "meta": meta}


def write(
    tables: dict[str, pd.DataFrame],
    meta: dict,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    kept: list[K.Window] = (),
    snapshot: dict | None = None,
) -> str:
    """Write ``tables`` and ``meta`` to ``path`` (a zip of JSON), a long run's ``kept``
    windows under ``kept/<i>/`` (:mod:`.kept`) and CUDA's ``snapshot`` as ``snapshot.json``
    (:mod:`.snapshot_store`); returns the absolute path.

    Atomic: written to a temporary file in the target folder and renamed into place. An
    existing file is replaced only when it is a saved profile, or with ``overwrite=True``.
    """
    doc = _document_of(meta)
    if kept:
        doc[K.KEY] = K.to_doc(list(kept))
    snapshot_json = None if snapshot is None else SN.to_json(snapshot)

    def write_zip(tmp: str) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr(_META, json.dumps(doc, default=json_default))
            if snapshot_json is not None:
                z.writestr(SN.MEMBER, snapshot_json)
            for name, df in tables.items():
                z.writestr(f"{name}.json", _table_to_json(df))
            for i, window in enumerate(kept):
                at = K.prefix(i)
                own = _document_of(window.meta)
                z.writestr(at + _META, json.dumps(own, default=json_default))
                for name, df in window.tables.items():
                    z.writestr(f"{at}{name}.json", _table_to_json(df))

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


def _members(
    z: zipfile.ZipFile, where: str, stored: int, at: str = "", only=None
) -> dict[str, zipfile.ZipInfo]:
    """The members of the profile stored under ``at`` (the main one: ""; a kept window:
    its prefix): its meta and a document per table (``only`` those), checked before
    anything is read."""
    present = set(z.namelist())
    names = [
        at + _META,
        *(
            f"{at}{name}.json"
            for name in (only or S.TABLES)
            if name not in S.ADDED_TABLES or f"{at}{name}.json" in present
        ),
    ]
    lacking = [n for n in names if n not in present]
    if lacking:
        if not at and _META in lacking:
            raise ProfileFileError(f"{where} is not a saved jupyter_memprof profile")
        what = "" if lacking[0].endswith(_META) else "the table "
        raise ProfileFileError(f"{where} lacks {what}{lacking[0]}")
    members = {n: z.getinfo(n) for n in names}
    for n, info in members.items():
        if info.flag_bits & 0x1:
            raise ProfileFileError(f"{where}: {n} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ProfileFileError(
                f"{where}: {n} is compressed with method {info.compress_type}, not deflate"
            )
        if info.compress_size > stored:
            raise ProfileFileError(f"{where}: {n} declares more compressed bytes than the file has")
    meta = members[at + _META]
    if meta.file_size > MAX_META_BYTES:
        raise ProfileFileError(
            f"{where}: {at}{_META} declares {format_bytes(meta.file_size)}, over "
            f"{format_bytes(MAX_META_BYTES)}"
        )
    return members


def _document(doc, where: str) -> dict:
    """A ``meta.json`` document, checked to be one this package wrote and can read."""
    if type(doc) is not dict or doc.get("format") != FORMAT:
        raise ProfileFileError(f"{where} is not a saved jupyter_memprof profile")
    version = doc.get("format_version", 0)
    if not is_int(version):
        raise ProfileFileError(f"{where}: format_version is {describe(version)}, not a number")
    if version > FORMAT_VERSION:
        raise ProfileFileError(
            f"{where} was saved by a newer jupyter_memprof (format {version}); upgrade to read it"
        )
    return doc


def _declared(members: list[dict[str, zipfile.ZipInfo]], path: str, stored: int) -> None:
    declared = sum(info.file_size for m in members for info in m.values())
    if declared > size_budget(stored):
        raise size_refusal(path, declared, stored)


def _read_zip(z: zipfile.ZipFile, path: str, stored: int) -> tuple[dict, dict, list, dict | None]:
    where = shown(path)
    infos = z.infolist()
    if len(infos) > MAX_MEMBERS:
        raise ProfileFileError(f"{where} holds {len(infos)} entries, not a saved profile")
    main = _members(z, where, stored)
    snapshot_info = SN.zip_member(z, where, stored)
    if snapshot_info is not None:  # counted in the file's budgets like every member
        main[SN.MEMBER] = snapshot_info
    _declared([main], path, stored)
    text = TextBudget(stored)  # what the members left to parse may hold and spell out

    def load(n: str, members: dict[str, zipfile.ZipInfo]):
        try:
            text.values -= 1
            return parse_json(decode_utf8(_read_member(z, members[n], text)))
        except Bad as exc:
            raise ProfileFileError(f"{where}: {n} {exc}") from None

    doc = _document(load(_META, main), where)
    try:
        listed = K.from_doc(doc.get(K.KEY))
    except Bad as exc:
        raise ProfileFileError(f"{where}: {_META} {exc}") from None
    windows = [
        _members(z, where, stored, K.prefix(i), K.OWN_TABLES if shares else None)
        for i, (_, shares) in enumerate(listed)
    ]
    _declared([main, *windows], path, stored)
    meta = check_meta(doc.get("meta", {}), path)
    tables = check_tables(_tables(load, main, "", S.TABLES, where, text), path)
    kept = []
    for i, ((keep, shares), members) in enumerate(zip(listed, windows)):
        at, label = K.prefix(i), f"{path}, kept window {i}"
        own = check_meta(_document(load(at + _META, members), where).get("meta", {}), label)
        names = K.OWN_TABLES if shares else S.TABLES
        window = _tables(load, members, at, names, where, text)
        kept.append(K.Window(keep, own, window if shares else check_tables(window, label), shares))
    snapshot = None
    if snapshot_info is not None:
        try:
            text.values -= 1
            snapshot = SN.parse(_read_member(z, snapshot_info, text), where)
        except Bad as exc:
            raise ProfileFileError(f"{where}: {SN.MEMBER} {exc}") from None
    return tables, meta, kept, snapshot


def _tables(load, members: dict, at: str, names, where: str, text: TextBudget) -> dict:
    """The tables ``names`` of the profile stored under ``at``, each checked against its
    schema (one absent from the file because it was added later: empty)."""
    tables = {}
    for name in names:
        schema = S.TABLES[name]
        member = f"{at}{name}.json"
        if member not in members:  # a table added since the file was written
            tables[name] = S.empty(schema)
            continue
        try:
            tables[name] = _table_from_json(load(member, members), schema, name, text)
        except Bad as exc:
            raise ProfileFileError(f"{where}: table {at + name!r} {exc}") from None
        except ProfileFileError:  # from reading the member
            raise
        except (ValueError, TypeError, OverflowError) as exc:  # pandas refusing a cast
            raise ProfileFileError(f"{where}: table {at + name!r} ({one_line(exc)})") from None
    return tables


def read(
    path: str | os.PathLike,
) -> tuple[dict[str, pd.DataFrame], dict, list[K.Window], dict | None]:
    """Read the tables, meta, kept windows and snapshot (None when the profile has none)
    written by :func:`write`, checking sizes
    before anything is decompressed (see the module's docstring) and every table and field
    on the way; never executes code from the file. Raises FileNotFoundError when there is no such file and
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
