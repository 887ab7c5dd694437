"""Profiles as a folder of Parquet files: one per table, plus ``meta.json``.

The folder is what columnar tools read directly (DuckDB, Polars, Spark, pandas):
``read_parquet('run/rank*/allocations.parquet')`` is a query over every rank's blocks. Each
table keeps its declared dtypes: ``category`` columns are Parquet dictionaries (the ordered
vocabularies keep their order and every value), ``Int64`` and ``string`` columns are nullable
Parquet columns, ``bool`` stays boolean. The one object column, ``ops.input_shapes`` (nested
lists of any depth), is stored as JSON text and decoded on load. Loading never runs code:
Parquet and JSON only, and every table is coerced back to its schema.

``meta.json`` is ``{"format": "jupyter_memprof.parquet", "format_version": 1, "meta": {...}}``;
a folder is recognised as a profile by it.
"""

from __future__ import annotations

import json
import os

import pandas as pd

from ._analysis import schema as S
from ._errors import ProfileFileError
from ._io import atomic_write_dir

__all__ = ["FORMAT", "is_profile_folder", "read_folder", "write_folder"]

FORMAT = "jupyter_memprof.parquet"
FORMAT_VERSION = 1
META = "meta.json"
#: object columns stored as JSON text
JSON_COLUMNS = {"ops": ("input_shapes",)}


def _json_default(value):
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def is_profile_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a saved profile's ``meta.json``."""
    meta = os.path.join(os.fspath(path), META)
    if not os.path.isfile(meta):
        return False
    try:
        with open(meta, encoding="utf-8") as fh:
            return json.load(fh).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


_ENCODE = json.JSONEncoder(separators=(",", ":"), default=_json_default).encode


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


def write_folder(
    tables: dict[str, pd.DataFrame],
    meta: dict,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
) -> str:
    """Write ``tables`` and ``meta`` as a folder of Parquet files; returns the absolute path.

    Written atomically (a temporary folder renamed into place). An existing folder is
    replaced only when it is a saved profile, or with ``overwrite=True``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "meta": meta}
    meta_text = json.dumps(doc, default=_json_default)

    def write(folder: str) -> None:
        for name, df in tables.items():
            df = df.copy(deep=False)
            for col in JSON_COLUMNS.get(name, ()):
                df[col] = _encode_json_column(df[col])
            table = pa.Table.from_pandas(df, preserve_index=False)
            encodings = _encodings(table)
            pq.write_table(
                table,
                os.path.join(folder, f"{name}.parquet"),
                compression="zstd",
                use_dictionary=[c for c in table.column_names if c not in encodings],
                column_encoding=encodings,
            )
        with open(os.path.join(folder, META), "w", encoding="utf-8") as fh:
            fh.write(meta_text)

    return atomic_write_dir(
        path,
        write,
        what="saved jupyter_memprof profile folder",
        overwrite=overwrite,
        is_own_kind=is_profile_folder,
    )


def read_folder(path: str | os.PathLike) -> tuple[dict[str, pd.DataFrame], dict]:
    """Read the tables and meta written by :func:`write_folder`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.fspath(path)
    try:
        with open(os.path.join(path, META), encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise ProfileFileError(f"{path} is a folder without {META}, not a saved profile") from None
    except (OSError, ValueError) as exc:
        raise ProfileFileError(f"{path} is not a readable saved profile ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ProfileFileError(f"{path} is not a saved jupyter_memprof profile folder")
    version = doc.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ProfileFileError(
            f"{path} was saved by a newer jupyter_memprof (format {version}); upgrade to read it"
        )
    tables = {}
    for name, schema in S.TABLES.items():
        file = os.path.join(path, f"{name}.parquet")
        try:
            df = pq.read_table(file).to_pandas()
            for col in JSON_COLUMNS.get(name, ()):
                if col in df:
                    df[col] = pd.Series(_decode_json_column(df[col]), dtype=object)
            tables[name] = S.conform(df, schema, name=name)
        except FileNotFoundError:
            raise ProfileFileError(f"{path} lacks the table {name}.parquet") from None
        except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
            raise ProfileFileError(f"{file} is not a readable table ({exc})") from None
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise ProfileFileError(f"{path}: {META} holds no metadata object")
    return tables, meta
