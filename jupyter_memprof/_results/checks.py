"""What a saved profile may hold, checked on load (both formats).

What a saved profile may hold, checked on load for both formats (the zip of JSON,
:mod:`.storage`, and the Parquet folder, :mod:`.parquet`).

Loading treats the file as untrusted: sizes are bounded before anything is decompressed
(:func:`size_budget`), JSON values are counted before they are parsed (:func:`value_budget`),
text is charged its rows times its longest value (:class:`TextBudget`), and every metadata
field (:data:`META_FIELDS`, :func:`check_meta`) and table (:func:`check_tables`) is checked
against its declared schema, so a profile that loads works. What is wrong is raised as
:class:`Bad` (one phrase) and turned into one :class:`ProfileFileError` naming the file.
"""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pandas as pd

from .._analysis import meta_schema as M
from .._analysis import schema as S
from .._devices import is_device_name
from .._errors import ProfileFileError
from .._units import format_bytes

#: A file may declare at most ``max(SIZE_FLOOR, MAX_RATIO * its size on disk)`` bytes of
#: uncompressed data (both formats). Real profiles compress 4 to 20 times.
MAX_RATIO = 100
SIZE_FLOOR = 32 * 2**20
#: ``meta.json`` may declare at most this much (real ones are under a few KiB).
MAX_META_BYTES = 2**20
#: Entries in a zip (a profile has eleven, and each kept window of a long run up to eleven
#: more: ``kept.MAX_WINDOWS`` of them fit).
MAX_MEMBERS = 1024
#: Nesting of JSON values kept from a file (meta values, ``ops.input_shapes``).
MAX_DEPTH = 32
#: The JSON values (counted before parsing: commas and brackets) a zip may hold: at most
#: ``max(VALUE_FLOOR, VALUES_PER_BYTE * its size)``. Parsing costs up to about 80 bytes of
#: memory per value; real profiles hold about one value per byte of the file.
VALUES_PER_BYTE = 8
VALUE_FLOOR = 2**20
#: The longest text value (op name, module, callsite, ...) a profile may hold, in characters.
MAX_TEXT = 2**16
INT64 = M.INT64


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


_utf8_ok = M.utf8_ok
is_int = M.is_int
nonneg_int = M.nonneg_int
_str = M.is_str

#: The meta keys the package writes and reads, and the check each value must pass (None,
#: or absent, always works): derived from their one declaration, ``meta_schema.META``.
META_FIELDS = {key: entry.check for key, entry in M.META.items()}


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
                f"{where}: metadata field {key!r} holds {describe(value)}, not what a "
                "profile records there"
            )
    if not _depth_ok(meta):
        raise ProfileFileError(f"{where}: the metadata nests deeper than {MAX_DEPTH} levels")
    if not _utf8_ok(json.dumps(meta, ensure_ascii=False, allow_nan=True)):
        raise ProfileFileError(f"{where}: the metadata holds text that is not valid Unicode")
    return meta


def describe(value) -> str:
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
            elif not (x is None or type(x) in (bool, float) or is_int(x) or _str(x)):
                return False
    return True


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
            vocab = set(dtype.categories)
            if isinstance(s.dtype, pd.CategoricalDtype) and set(uniques) <= vocab:
                continue  # no value it may hold is outside the vocabulary
            used = (
                set(s.dropna().unique())
                if not isinstance(s.dtype, pd.CategoricalDtype)
                else _used_categories(s)
            )
            unknown = sorted(str(u) for u in used - vocab)
            if unknown:
                return f"column {col!r} holds {unknown[0]!r}, not one of {list(dtype.categories)}"
    return None


def _used_categories(s: pd.Series) -> set:
    """The categories the rows of ``s`` (categorical) use: counted, not sorted."""
    codes = s.cat.codes.to_numpy()
    # shifted by one so that a missing value (-1) counts at 0: no copy of the present codes
    present = np.bincount(codes + np.int64(1), minlength=len(s.cat.categories) + 1)[1:] > 0
    return set(s.cat.categories[present])


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
_DEVICE_COLUMNS = ("allocations", "events", "timeline", "names", "steps", "leaks")


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
            v = _present(tables[name][col])
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


def _present(s: pd.Series) -> np.ndarray:
    """The values of an integer column that are not missing, as int64."""
    if s.dtype == np.int64:
        return s.to_numpy()
    return s.to_numpy(dtype=np.int64, na_value=0)[~s.isna().to_numpy()]


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


class _Blocks:
    """The ``alloc_id`` column of ``allocations``, to find rows by id: an id's row is
    ``id - first`` where the ids are ``first, first + 1, ...`` (as the analysis numbers
    them), else a binary search of the ids sorted once."""

    def __init__(self, ids: np.ndarray) -> None:
        self.n = len(ids)
        first = int(ids[0]) if self.n else 0
        self.dense = bool(self.n) and np.array_equal(ids, np.arange(first, first + self.n))
        self.first = first
        if not self.dense:
            self.order = np.argsort(ids, kind="stable")
            self.known = ids[self.order]

    def repeats(self) -> bool:
        """Whether an id names two rows."""
        if self.dense or self.n < 2:
            return False
        return bool((self.known[1:] == self.known[:-1]).any())

    def rows(self, values: np.ndarray) -> np.ndarray | None:
        """The row of each of ``values``; None when one is not an id."""
        if not len(values):
            return np.zeros(0, dtype=np.intp)
        if not self.n:
            return None
        if self.dense:
            rows = values - self.first
            return rows if rows.min() >= 0 and rows.max() < self.n else None
        at = np.minimum(np.searchsorted(self.known, values), self.n - 1)
        return self.order[at] if bool((self.known[at] == values).all()) else None


def _block_problem(tables: dict[str, pd.DataFrame]) -> str | None:
    """The first contradiction between the blocks and what refers to them (the analyses
    and views look blocks up by id): a vocabulary value missing, ids repeated, references
    to unknown blocks, a block without events or whose events are on another device; None
    if none."""
    for name, cols in _FILLED.items():
        for col in cols:
            if tables[name][col].isna().any():
                return f"table {name!r} column {col!r} has missing values"
    allocs = tables["allocations"]
    blocks = _Blocks(allocs["alloc_id"].to_numpy(dtype=np.int64))
    if blocks.repeats():
        return "table 'allocations' names a block twice (alloc_id repeats)"
    for name, col in _BLOCK_REFS.items():
        if blocks.rows(_present(tables[name][col])) is None:
            return f"table {name!r} column {col!r} names a block that is not in 'allocations'"
    events = tables["events"]
    rows = blocks.rows(events["alloc_id"].to_numpy(dtype=np.int64))  # all known: see above
    if np.bincount(rows, minlength=blocks.n).min(initial=1) == 0:
        return "table 'allocations' holds a block without events"
    ev_device = events["device"]
    block_device = _codes_in(allocs["device"], ev_device.cat.categories)
    if len(events) and not np.array_equal(block_device[rows], ev_device.cat.codes.to_numpy()):
        return "table 'events' puts a block on another device than 'allocations' does"
    if not _used_categories(tables["timeline"]["device"]) <= _used_categories(ev_device):
        return "table 'timeline' names a device that has no events"
    return None


def _codes_in(col: pd.Series, categories: pd.Index) -> np.ndarray:
    """The codes of a categorical ``col`` (no value missing) in ``categories``: -2 for a
    value not among them."""
    at = categories.get_indexer(col.cat.categories)
    return np.where(at >= 0, at, -2)[col.cat.codes.to_numpy()]


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
