"""Profiles as a Parquet folder: a file per table, ``meta.json``.

The folder is what columnar tools read directly (DuckDB, Polars, Spark, pandas):
``read_parquet('run/rank*/allocations.parquet')`` is a query over every rank's blocks. Each
table keeps its declared dtypes: ``category`` columns are Parquet dictionaries (the ordered
vocabularies keep their order and every value), ``Int64`` and ``string`` columns are nullable
Parquet columns, ``bool`` stays boolean. The object columns, ``ops.input_shapes`` (nested
lists of any depth) and ``leaks.alloc_ids``, are stored as JSON text and decoded on load. Loading never runs code:
Parquet and JSON only, and every table is coerced back to its schema.

``meta.json`` is ``{"format": "jupyter_memprof.parquet", "format_version": 1, "meta": {...}}``;
a folder is recognised as a profile by it.
"""

from __future__ import annotations

import json
import os

import pandas as pd

from .._analysis import schema as S
from .._errors import ProfileFileError
from .._io import atomic_write_dir, json_default
from .._units import format_bytes
from . import kept as K
from . import snapshot_store as SN
from .checks import (
    MAX_META_BYTES,
    Bad,
    TextBudget,
    check_meta,
    check_tables,
    check_text,
    column_kind,
    count_values,
    one_line,
    parse_json,
    regular_file,
    shape_ok,
    shown,
    size_budget,
    size_refusal,
)

__all__ = ["FORMAT", "is_profile_folder", "read_folder", "write_folder"]

FORMAT = "jupyter_memprof.parquet"
FORMAT_VERSION = 1
META = "meta.json"
#: object columns stored as JSON text
JSON_COLUMNS = {"ops": ("input_shapes",), "leaks": ("alloc_ids",)}


def is_profile_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a saved profile's ``meta.json``."""
    meta = os.path.join(os.fspath(path), META)
    try:
        if not os.path.isfile(meta) or os.path.getsize(meta) > MAX_META_BYTES:
            return False
        with open(meta, "rb") as fh:
            doc = json.loads(fh.read(MAX_META_BYTES).decode("utf-8"))
        return type(doc) is dict and doc.get("format") == FORMAT
    except (OSError, ValueError, RecursionError):
        return False


_ENCODE = json.JSONEncoder(separators=(",", ":"), default=json_default).encode


def _encode_json_column(values: pd.Series) -> list[str]:
    return [_ENCODE(v) for v in values]


def _decode_json_column(values: pd.Series) -> list:
    """Decode JSON text per row. Rows repeat a few distinct values (shapes recur), so each
    distinct text is parsed once; rows with equal text share the parsed value (nothing in
    the package changes these lists in place)."""
    if len(values) == 0:
        return []
    codes, uniques = pd.factorize(values, use_na_sentinel=False)
    parsed = json.loads("[" + ",".join(uniques.tolist()) + "]")
    return [parsed[c] for c in codes.tolist()]


def _encodings(table) -> dict:
    """Parquet encodings that keep the files small without changing any column: sorted
    integer columns (ids, start times) are delta-encoded; integer columns of few distinct
    values (judged on an evenly spaced sample) keep Parquet's dictionary; the rest (unsorted
    times, addresses, ids) are split into byte streams, which zstd compresses well."""
    import numpy as np
    import pyarrow as pa

    out = {}
    n = len(table)
    for f in table.schema:
        if not pa.types.is_integer(f.type) or n < 2:
            continue
        col = table[f.name]
        values = col.to_numpy(zero_copy_only=False) if col.null_count == 0 else None
        if values is not None and (np.diff(values) >= 0).all():
            out[f.name] = "DELTA_BINARY_PACKED"
            continue
        sample = col.take(np.linspace(0, n - 1, min(n, 1 << 16)).astype(np.int64))
        if len(sample.unique()) > 256:
            out[f.name] = "BYTE_STREAM_SPLIT"
    return out


def _document_of(meta: dict) -> dict:
    """The ``meta.json`` document of a saved profile (a kept window's too)."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "meta": meta}


def write_folder(
    tables: dict[str, pd.DataFrame],
    meta: dict,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    kept: list[K.Window] = (),
    snapshot: dict | None = None,
) -> str:
    """Write ``tables`` and ``meta`` as a folder of Parquet files, a long run's ``kept``
    windows in subfolders ``kept/<i>/`` (:mod:`.kept`) and CUDA's ``snapshot`` as
    ``snapshot.json`` (:mod:`.snapshot_store`); returns the absolute path.

    Written atomically (a temporary folder renamed into place). An existing folder is
    replaced only when it is a saved profile, or with ``overwrite=True``.
    """
    doc = _document_of(meta)
    if kept:
        doc[K.KEY] = K.to_doc(list(kept))
    snapshot_json = None if snapshot is None else SN.to_json(snapshot)

    def write(folder: str) -> None:
        _write_profile(folder, tables, doc)
        if snapshot_json is not None:
            with open(os.path.join(folder, SN.MEMBER), "w", encoding="utf-8") as fh:
                fh.write(snapshot_json)
        for i, window in enumerate(kept):
            sub = os.path.join(folder, K.prefix(i))
            os.makedirs(sub)
            own = _document_of(window.meta)
            _write_profile(sub, window.tables, own)

    return atomic_write_dir(
        path,
        write,
        what="saved jupyter_memprof profile folder",
        overwrite=overwrite,
        is_own_kind=is_profile_folder,
    )


def _write_profile(folder: str, tables: dict[str, pd.DataFrame], doc: dict) -> None:
    """One profile's tables (a Parquet file each) and ``meta.json`` into ``folder``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, df in tables.items():
        df = df.copy(deep=False)
        for col in JSON_COLUMNS.get(name, ()):
            df[col] = _encode_json_column(df[col])
        table = pa.Table.from_pandas(df, preserve_index=False)
        encodings = _encodings(table)
        # a Python file, not a path: pyarrow spells paths in UTF-8, which a name of
        # another encoding (decoded with surrogate escapes) is not
        with open(os.path.join(folder, f"{name}.parquet"), "wb") as fh:
            pq.write_table(
                table,
                fh,
                compression="zstd",
                use_dictionary=[c for c in table.column_names if c not in encodings],
                column_encoding=encodings,
            )
    with open(os.path.join(folder, META), "w", encoding="utf-8") as fh:
        fh.write(json.dumps(doc, default=json_default))


def read_folder(
    path: str | os.PathLike,
) -> tuple[dict[str, pd.DataFrame], dict, list[K.Window], dict | None]:
    """Read the tables, meta, kept windows and snapshot (None when the profile has none)
    written by :func:`write_folder`.

    The folder is untrusted: sizes are checked before anything is decompressed (the sizes
    each Parquet footer declares, under the rule of :mod:`jupyter_memprof._results.checks`: at most
    ``max(SIZE_FLOOR, MAX_RATIO * bytes on disk)`` uncompressed, counting a column's rows at
    8 bytes each at least), text columns are read as dictionaries (a repeated value is not
    copied per row), and every column is checked against its declared type. Anything wrong
    is one :class:`ProfileFileError`."""
    path = os.fspath(path)
    try:
        return _read_folder(path)
    except (ProfileFileError, MemoryError):
        raise
    except Exception as exc:  # pyarrow, OSError, ...: damage, whatever its kind
        raise ProfileFileError(
            f"{shown(path)} is not a readable saved profile ({type(exc).__name__}: {one_line(exc)})"
        ) from None


def _file(path: str, name: str) -> tuple[str, int]:
    file = os.path.join(path, name)
    if not os.path.lexists(file):
        if name == META:
            raise ProfileFileError(f"{shown(path)} is a folder without {META}, not a saved profile")
        raise ProfileFileError(f"{shown(path)} lacks the table {name}")
    try:
        return file, regular_file(file, "a file of a saved profile")
    except FileNotFoundError:  # a link to nothing
        raise ProfileFileError(f"{shown(file)} is a link to nothing") from None


def _read_meta(path: str) -> tuple[dict, dict, int]:
    """The folder's ``meta.json``: (the document, its checked meta, its size)."""
    file, size = _file(path, META)
    where = shown(file)
    if size > MAX_META_BYTES:
        raise ProfileFileError(
            f"{where} holds {format_bytes(size)}, over {format_bytes(MAX_META_BYTES)}"
        )
    with open(file, "rb") as fh:
        data = fh.read(MAX_META_BYTES + 1)
    try:
        doc = parse_json(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ProfileFileError(f"{where} is not UTF-8 text") from None
    except Bad as bad:
        raise ProfileFileError(f"{where} {bad}") from None
    if type(doc) is not dict or doc.get("format") != FORMAT:
        raise ProfileFileError(f"{shown(path)} is not a saved jupyter_memprof profile folder")
    version = doc.get("format_version", 0)
    if type(version) is not int or version > FORMAT_VERSION:
        raise ProfileFileError(
            f"{shown(path)} was saved by a newer jupyter_memprof (format {version!r}); upgrade "
            "to read it"
        )
    return doc, check_meta(doc.get("meta", {}), path), size


def _declared(file: str) -> int:
    """What reading ``file`` may cost, from its footer: its row groups' uncompressed sizes,
    and at least 8 bytes per value.

    Only file and row-group fields are read, never a column chunk's metadata: pyarrow 26
    builds that (``RowGroupMetaData.column``) through a C++ call that is not declared to
    throw, so a damaged footer there aborts the whole process instead of raising (seen once
    in the property test of tests/test_load_hostile.py)."""
    import pyarrow.parquet as pq

    with open(file, "rb") as fh:  # not the path: see write_folder
        md = pq.read_metadata(fh)
    uncompressed = sum(max(md.row_group(i).total_byte_size, 0) for i in range(md.num_row_groups))
    return max(uncompressed, max(md.num_rows, 0) * md.num_columns * 8)


def _column(col, dtype, text: TextBudget):
    """An Arrow column as what pandas builds the declared dtype from, the table's own
    writable array (pyarrow's are read-only views); raises Bad."""
    import pyarrow as pa

    t = col.type
    kind = column_kind(dtype)
    if len(col) == 0:  # an empty column's type says nothing (pandas writes double)
        return pd.Series([], dtype=object).astype("Int64" if kind in ("int", "Int") else object)
    if kind in ("int", "Int"):
        return _integers(col, kind)
    if kind == "bool":
        if not pa.types.is_boolean(t) or col.null_count:
            raise Bad(f"is {t}, not true or false")
        return col.to_numpy(zero_copy_only=False)
    value_type = t.value_type if pa.types.is_dictionary(t) else t
    if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)) and not (
        pa.types.is_null(value_type)
    ):
        raise Bad(f"is {t}, not text")
    if pa.types.is_null(value_type):
        return pd.Series([None] * len(col), dtype=object)
    if kind != "object":  # input_shapes: JSON, bounded by the values it holds
        text.charge(len(col), _longest(col))
    if kind == "str" and str(dtype) == "string":  # kept as dense text, not a dictionary
        if pa.types.is_dictionary(t):
            col = col.cast(value_type)
        return col.to_pandas(types_mapper={value_type: S.STRING}.get)
    if kind == "vocab":
        return _vocabulary(col, dtype)
    values = col.to_pandas()
    if kind == "object":
        return _shapes(values, text)
    return values.copy()  # its codes: pyarrow's indices, read-only


def _integers(col, kind: str):
    """An Arrow integer column as int64 (``kind`` "int") or Int64 ("Int"); raises Bad."""
    import numpy as np
    import pyarrow as pa

    t = col.type
    if not pa.types.is_integer(t) and not (kind == "Int" and pa.types.is_null(t)):
        raise Bad(f"is {t}, not integers")
    if kind == "int" and col.null_count:
        raise Bad("has missing values")
    try:
        col = col.cast(pa.int64())  # safe: an unsigned value over the range raises
    except pa.ArrowInvalid:
        raise Bad("holds an integer out of the 64-bit range") from None
    if kind == "int" or not col.null_count:
        values = col.to_numpy()  # several chunks: joined into a new array
        values = values if values.flags.writeable else values.copy()
        if kind == "int":
            return values
        return pd.arrays.IntegerArray(values, np.zeros(len(values), dtype=bool))
    if col.null_count == len(col):  # nothing recorded (a snapshot's tensor ids)
        return pd.arrays.IntegerArray(
            np.zeros(len(col), dtype=np.int64), np.ones(len(col), dtype=bool)
        )
    values = np.array(col.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    mask = np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    return pd.arrays.IntegerArray(values, mask)


def _vocabulary(col, dtype: pd.CategoricalDtype) -> pd.Categorical:
    """A text column (dictionary-encoded) as the closed vocabulary ``dtype``: each chunk's
    dictionary mapped onto the vocabulary's codes; Bad naming the first value (in sorted
    order) a row holds outside it. A value the dictionary lists but no row uses is
    dropped."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    codes, unknown = [], set()
    for chunk in col.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        words = chunk.dictionary.to_pylist()  # a None among them: a missing value
        known = np.append(dtype.categories.get_indexer(words), -1).astype(np.int64)
        outside = np.array([w is not None for w in words] + [False]) & (known < 0)
        at = np.asarray(pc.fill_null(chunk.indices, len(words)).to_numpy(zero_copy_only=False))
        if outside.any():
            unknown.update(str(words[i]) for i in np.unique(at[outside[at]]))
        codes.append(known[at])
    if unknown:
        raise Bad(f"holds {sorted(unknown)[0]!r}, not one of {list(dtype.categories)}")
    return pd.Categorical.from_codes(np.concatenate(codes), dtype=dtype)


def _longest(col) -> int:
    """The longest text of an Arrow text column, in characters: of its dictionaries when it
    is dictionary-encoded (read before any row is spelled out)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    longest = 0
    for chunk in col.chunks:
        values = chunk.dictionary if pa.types.is_dictionary(chunk.type) else chunk
        if len(values):
            longest = max(longest, pc.max(pc.utf8_length(values)).as_py() or 0)
    return longest


def _shapes(values: pd.Series, text: TextBudget) -> pd.Series:
    """``ops.input_shapes`` from its JSON text: the values it holds counted before parsing
    (each distinct text once), then parsed and checked; raises Bad."""
    values = values.astype(object).where(values.notna(), "null")
    distinct = pd.unique(values.to_numpy())
    text.values -= sum(count_values(v.encode("utf-8", "surrogatepass")) for v in distinct)
    if text.values < 0:
        raise Bad("holds more values than the size rule allows; refusing to parse it")
    try:
        decoded = _decode_json_column(values)
    except RecursionError:
        raise Bad("nests too deeply") from None
    except ValueError as exc:
        raise Bad(f"holds text that is not JSON ({one_line(exc)})") from None
    parsed = {id(v): v for v in decoded}.values()  # rows share parsed values
    if not all(shape_ok(v) for v in parsed):
        raise Bad("holds values that are not lists of numbers")
    return pd.Series(decoded, dtype=object)


def _read_folder(path: str) -> tuple[dict[str, pd.DataFrame], dict, list[K.Window], dict | None]:
    doc, meta, stored = _read_meta(path)
    try:
        listed = K.from_doc(doc.get(K.KEY))
    except Bad as exc:
        raise ProfileFileError(f"{shown(os.path.join(path, META))} {exc}") from None
    tables = check_tables(_read_tables(path, S.TABLES, stored), path)
    kept = []
    for i, (keep, shares) in enumerate(listed):
        sub = os.path.join(path, K.prefix(i))
        if not os.path.isdir(sub):
            raise ProfileFileError(f"{shown(path)} lacks {K.prefix(i)}, a kept window it lists")
        _, own, size = _read_meta(sub)
        window = _read_tables(sub, K.OWN_TABLES if shares else S.TABLES, size)
        kept.append(K.Window(keep, own, window if shares else check_tables(window, sub), shares))
    return tables, meta, kept, SN.read_file(path)


def _read_tables(path: str, names, stored: int) -> dict[str, pd.DataFrame]:
    """The tables ``names`` of the profile folder ``path`` (``stored``: its ``meta.json``'s
    size), each checked against its schema; sizes first (see :func:`read_folder`)."""
    import pyarrow.parquet as pq

    files = {}
    for name in names:
        if name in S.ADDED_TABLES and not os.path.lexists(os.path.join(path, f"{name}.parquet")):
            continue  # a table added since the folder was written: empty
        files[name], size = _file(path, f"{name}.parquet")
        stored += size
    declared = 0
    for file in files.values():
        try:
            declared += _declared(file)
        except Exception as exc:  # any failure to read a footer is damage
            raise ProfileFileError(
                f"{shown(file)} is not a readable table ({one_line(exc)})"
            ) from None
    if declared > size_budget(stored):
        raise size_refusal(path, declared, stored)
    budget = TextBudget(stored)  # what text columns may spell out
    tables = {}
    for name in names:
        schema = S.TABLES[name]
        if name not in files:
            tables[name] = S.empty(schema)
            continue
        file = files[name]
        where = shown(file)
        try:
            with open(file, "rb") as fh:  # not the path: see write_folder
                have = pq.read_schema(fh).names
            missing = [
                c for c in schema if c not in have and c not in S.ADDED_COLUMNS.get(name, ())
            ]
            if missing:
                raise Bad(f"lacks columns {missing}")
            if len(set(have)) != len(have):
                raise Bad("names a column twice")
            wanted = [c for c in schema if c in have]
            text = [c for c in wanted if column_kind(schema[c]) in ("str", "vocab", "object")]
            with open(file, "rb") as fh:
                table = pq.read_table(fh, columns=wanted, read_dictionary=text)
            columns = {}
            for c, dtype in schema.items():
                if c not in have:
                    fill = S.ADDED_DEFAULTS.get((name, c))
                    columns[c] = pd.Series([fill] * table.num_rows, dtype=object)
                    continue
                try:
                    columns[c] = _column(table.column(c), dtype, budget)
                except Bad as exc:
                    raise Bad(f"column {c!r} {exc}") from None
            del table
            # each column is already its own writable array: not copied again, nor joined
            # into blocks (a copy of the whole table)
            df = pd.DataFrame(
                {
                    c: (v.reset_index(drop=True) if isinstance(v, pd.Series) else v)
                    for c, v in columns.items()
                },
                copy=False,
            )
            problem = check_text(df, schema)
            if problem:
                raise Bad(problem)
            tables[name] = S.conform(df, schema, name=name)
        except Bad as exc:
            raise ProfileFileError(f"{where}: {exc}") from None
        except ProfileFileError:
            raise
        except Exception as exc:  # pyarrow and pandas refusing damage
            raise ProfileFileError(f"{where} is not a readable table ({one_line(exc)})") from None
    return tables
