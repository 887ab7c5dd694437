"""Save and load profiles: a zip of one JSON document per table plus the metadata.

No pickle: loading a file never runs code. Dtypes are not trusted from the file; every table
is coerced back to its declared schema (:mod:`_schema`), so a round trip is lossless for
everything the tables hold.
"""

from __future__ import annotations

import json
import os
import zipfile

import pandas as pd

from ._analysis import schema as S
from ._errors import ProfileFileError

__all__ = ["FORMAT", "FORMAT_VERSION", "ProfileFileError", "read", "write"]

FORMAT = "jupyter_memprof.profile"
FORMAT_VERSION = 1


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


def _table_from_json(text: str, schema: dict, name: str) -> pd.DataFrame:
    doc = json.loads(text)
    data = doc["data"]
    for col in S.ADDED_COLUMNS.get(name, ()):
        if col not in data and isinstance(doc.get("rows"), int):
            data[col] = [None] * doc["rows"]
    missing = [c for c in schema if c not in data]
    if missing:
        raise ProfileFileError(f"table {name!r} in the file lacks columns {missing}")
    df = pd.DataFrame({c: pd.Series(data[c], dtype=object) for c in schema})
    if "input_shapes" in df:
        df["input_shapes"] = df["input_shapes"].astype(object)
    for col, dtype in schema.items():
        if str(dtype) in ("int64",):
            df[col] = df[col].astype("int64")
        elif str(dtype) == "Int64":
            df[col] = pd.array(df[col].tolist(), dtype="Int64")
        elif str(dtype) == "bool":
            df[col] = df[col].astype(bool)
    return S.conform(df, schema, name=name)


def write(tables: dict[str, pd.DataFrame], meta: dict, path: str | os.PathLike) -> str:
    """Write ``tables`` and ``meta`` to ``path`` (a zip of JSON); returns the path."""
    path = os.fspath(path)
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "meta": meta}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("meta.json", json.dumps(meta, default=_json_default))
        for name, df in tables.items():
            z.writestr(f"{name}.json", _table_to_json(df))
    return path


def read(path: str | os.PathLike) -> tuple[dict[str, pd.DataFrame], dict]:
    """Read the tables and meta written by :func:`write` (never executes code from the file),
    or, for a folder, by :func:`jupyter_memprof._parquet.write_folder`."""
    path = os.fspath(path)
    if os.path.isdir(path):
        from ._parquet import read_folder

        return read_folder(path)
    try:
        with zipfile.ZipFile(path) as z:
            meta = json.loads(z.read("meta.json"))
            if meta.get("format") != FORMAT:
                raise ProfileFileError(f"{path} is not a saved jupyter_memprof profile")
            if meta.get("format_version", 0) > FORMAT_VERSION:
                raise ProfileFileError(
                    f"{path} was saved by a newer jupyter_memprof (format {meta['format_version']}); upgrade to read it"
                )
            tables = {
                name: _table_from_json(z.read(f"{name}.json").decode(), schema, name)
                for name, schema in S.TABLES.items()
            }
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as exc:
        raise ProfileFileError(
            f"{path} is not a readable jupyter_memprof profile ({exc})"
        ) from None
    return tables, meta.get("meta", {})
