"""Every table's schema and vocabulary, declared once.

A schema maps column -> dtype. :func:`empty` builds a typed empty table and :func:`conform`
coerces a freshly built (or freshly loaded) table to its schema, so every table a user sees
has the same columns and dtypes whether it holds a million rows or none.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from .._vocab import Action, Category, OpKind, Phase, Pool, Relation, Role, Source

__all__ = ["Action", "Category", "OpKind", "Phase", "Pool", "Relation", "Role", "Source"]


def _cat(values: list[str], ordered: bool = False) -> pd.CategoricalDtype:
    return pd.CategoricalDtype(values, ordered=ordered)


CATEGORY_DTYPE = _cat(Category.values(), ordered=True)
PHASE_DTYPE = _cat(Phase.values())
KIND_DTYPE = _cat(OpKind.values())
ACTION_DTYPE = _cat(Action.values())
RELATION_DTYPE = _cat(Relation.values())
ROLE_DTYPE = _cat(Role.values())
POOL_DTYPE = _cat(Pool.values())
SOURCE_DTYPE = _cat(Source.values())
STRING = pd.StringDtype()
# Open vocabularies (op names, devices): categories are whatever occurs.
OPEN_CATEGORY = "category"

OPS = {
    "op_id": "int64",
    "parent_id": "Int64",
    "depth": "int64",
    "name": OPEN_CATEGORY,
    "kind": KIND_DTYPE,
    "start_ns": "int64",
    "end_ns": "int64",
    "thread": "int64",
    "seq_nr": "Int64",
    "phase": PHASE_DTYPE,
    "module": STRING,
    "callsite": STRING,
    "input_shapes": "object",
    "self_alloc_bytes": "int64",
    "total_alloc_bytes": "int64",
    "flops": "Int64",
    # extension: the data-flow node this op belongs to (the outermost dispatcher op or
    # autograd node around it, itself if it is one); NA outside any such op.
    "node_id": "Int64",
}

ALLOCATIONS = {
    "alloc_id": "int64",
    "tensor_id": "Int64",
    "device": OPEN_CATEGORY,
    "ptr": "int64",
    "size_bytes": "int64",
    "alloc_ns": "Int64",
    "free_ns": "Int64",
    "alloc_op_id": "Int64",
    "free_op_id": "Int64",
    "category": CATEGORY_DTYPE,
    "reason": STRING,
    "name": STRING,
    # extension: the module the block belongs to, and why (see _analysis/categories.py)
    "module": STRING,
    "module_reason": STRING,
    # extension: the Python line that made the block (its allocating op's callsite, or the
    # recorded stack's innermost user frame where a producer records stacks instead of ops)
    "callsite": STRING,
}

VERSIONS = {
    "tensor_id": "int64",
    "version": "int64",
    "alloc_id": "int64",
    "category": CATEGORY_DTYPE,
    "start_ns": "Int64",
    "op_id": "Int64",
    # extension: the rule that set `category`
    "reason": STRING,
}

EVENTS = {
    "time_ns": "int64",
    "action": ACTION_DTYPE,
    "alloc_id": "int64",
    "tensor_id": "Int64",
    "version": "Int64",
    "device": OPEN_CATEGORY,
    "size_bytes": "int64",
    "category": CATEGORY_DTYPE,
    # extension: the op during which it happened (NA for preexisting blocks)
    "op_id": "Int64",
    # extension: the device allocator's reserved bytes right after the event (CUDA's caching
    # allocator, as torch's profiler records it); NA where none was recorded
    "reserved_bytes": "Int64",
}

TIMELINE = {
    "time_ns": "int64",
    "device": OPEN_CATEGORY,
    "category": CATEGORY_DTYPE,
    "bytes": "int64",
}

FLOWS = {
    "seq_nr": "int64",
    "forward_op_id": "int64",
    "backward_op_id": "int64",
}

# extension: the data-flow edges. One row per (data-flow node, tensor) the node reads or
# writes, with the version it saw; `mutated` says the node wrote it in place (which created
# version + 1).
USES = {
    "op_id": "int64",
    "tensor_id": "int64",
    "alloc_id": "Int64",
    "version": "int64",
    "mutated": "bool",
}

# extension: tensors the live session knows by name (model parameters and buffers, their
# gradients, optimizer state, notebook variables), read from the objects themselves when the
# capture starts ("start") and when it ends ("end"), and matched to blocks.
NAMES = {
    "name": STRING,
    "role": ROLE_DTYPE,
    "device": OPEN_CATEGORY,
    "ptr": "int64",
    "size_bytes": "int64",
    "when": _cat(["start", "end"]),
    "alloc_id": "Int64",
    # the module holding the tensor (of its parameter, for gradients and optimizer state)
    "module": STRING,
}

# The CUDA caching allocator's segments (cudaMalloc'd ranges; with expandable segments, each
# mapped range), recorded or modelled (_analysis/allocator/model.py). `free_ns` NA: still reserved
# at the end.
SEGMENTS = {
    "segment_id": "int64",
    "device": OPEN_CATEGORY,
    "pool": POOL_DTYPE,
    "size_bytes": "int64",
    "alloc_ns": "int64",
    "free_ns": "Int64",
    "source": SOURCE_DTYPE,
}

# one row per (step, device): a step ends at each optimizer.step(), or where the code marks
# it (jupyter_memprof.step(), torch's profiler.step()); see _analysis/steps.py
STEPS = {
    "step": "int64",
    "device": OPEN_CATEGORY,
    "start_ns": "int64",
    "end_ns": "int64",
    "peak_bytes": "int64",
    "live_start_bytes": "int64",
    "live_end_bytes": "int64",
    "growth_bytes": "int64",
    # the category whose live bytes grew most over a step that grew; NA when it did not
    "growth_category": CATEGORY_DTYPE,
    # the step ends at a step boundary (False: the tail after the last one, or no boundary)
    "complete": "bool",
}

# groups of blocks made step after step and never freed (_analysis/leaks.py), found once
# when a run is analysed; a profile's ``leaks`` table, read with Profile.leaks()
LEAKS = {
    "holder": STRING,
    "callsite": STRING,
    "category": CATEGORY_DTYPE,
    "device": OPEN_CATEGORY,
    "bytes_per_step": "int64",
    "steps": "int64",
    "total_bytes": "int64",
    "alloc_ids": "object",
    "why": STRING,
}

# a long run (profile(steps=N)): the blocks alive at the end of a window, carried into the
# next ones until they are freed (_analysis/windows.py). Not a table of a Profile.
CARRIED = {
    "alloc_id": "int64",  # numbered across the run: the window's id plus the ids before it
    "device": OPEN_CATEGORY,
    "ptr": "int64",
    "size_bytes": "int64",
    "alloc_ns": "Int64",  # NA: alive before the run
    "step": "int64",  # the run's step that made it; -1: before the run
    "category": CATEGORY_DTYPE,
    "callsite": STRING,
}

LINEAGE = {
    "time_ns": "Int64",
    "op_id": "Int64",
    "op_name": STRING,
    "relation": RELATION_DTYPE,
    "version": "Int64",
    "category": CATEGORY_DTYPE,
    "phase": PHASE_DTYPE,
    "module": STRING,
    "callsite": STRING,
}

#: :meth:`Profile.explain`: the peak in a few groups (not a stored table).
EXPLAIN = {
    "group": STRING,
    "category": CATEGORY_DTYPE,
    "modules": STRING,  # the module, or family of numbered modules (`model.blocks.*`)
    "phase": PHASE_DTYPE,  # the phase of the ops that allocated most of the group's bytes
    "top_op": STRING,  # the op that allocated most of the group's bytes
    "blocks": "int64",
    "bytes": "int64",
    "share": "float64",  # of the peak
    "what": STRING,  # what that memory is for
    "changes": STRING,  # what_if() keywords that could cut it
}

#: Changes tried on an estimated cell (``%%memprofile --estimate --explain``), each alone:
#: the estimated peak with it and the saving (the peak as is minus that; not a stored table).
SAVINGS = {
    "change": STRING,  # the what_if() keywords
    "peak_bytes": "int64",
    "saving": "int64",
}

TABLES: dict[str, dict] = {
    "ops": OPS,
    "allocations": ALLOCATIONS,
    "versions": VERSIONS,
    "events": EVENTS,
    "timeline": TIMELINE,
    "flows": FLOWS,
    "uses": USES,
    "names": NAMES,
    "segments": SEGMENTS,
    "steps": STEPS,
    "leaks": LEAKS,
}

#: Tables added after files of format 1 were first written: a saved profile without one
#: loads with it empty (``steps`` and ``leaks``: made from the other tables by ``load``).
ADDED_TABLES: tuple[str, ...] = ("segments", "steps", "leaks")


#: Columns added after files of format 1 were first written: a saved table without them
#: loads with them missing (NA).
ADDED_COLUMNS: dict[str, tuple[str, ...]] = {
    "allocations": ("module", "module_reason", "callsite"),
    "names": ("module",),
    "events": ("reserved_bytes",),
    "steps": ("complete",),
}

#: The value a column of :data:`ADDED_COLUMNS` takes in a table saved without it, where NA
#: is not one (``steps.complete``: True; the tail of a capture saved then cannot be told).
ADDED_DEFAULTS: dict[tuple[str, str], object] = {("steps", "complete"): True}


class SchemaError(ValueError):
    """A table does not have the columns its schema declares."""


_EMPTY: dict[int, tuple[dict, pd.DataFrame]] = {}


def empty(schema: dict) -> pd.DataFrame:
    """A table with no rows, the schema's columns and dtypes (a fresh copy each call).

    Building one costs pandas about 10 ms per table, paid by every capture (the profile's
    placeholder tables, and the tables a small step leaves empty), so each schema's empty
    table is built once and copied.
    """
    hit = _EMPTY.get(id(schema))
    if hit is None or hit[0] is not schema:
        df = pd.DataFrame({c: pd.Series([], dtype=d) for c, d in schema.items()})
        hit = _EMPTY[id(schema)] = (schema, df)
    return hit[1].copy()


def conform(df: pd.DataFrame, schema: dict, *, name: str = "table") -> pd.DataFrame:
    """Return ``df`` with exactly the schema's columns, in order, cast to their dtypes, and a
    fresh 0..n-1 index. Columns already of the right dtype are not touched."""
    missing = [c for c in schema if c not in df.columns]
    if missing:
        raise SchemaError(f"{name} is missing columns {missing}")
    casts = {}
    for col, dtype in schema.items():
        have = df[col].dtype
        if isinstance(dtype, str) and dtype == OPEN_CATEGORY:
            if not isinstance(have, pd.CategoricalDtype):
                casts[col] = "category"
        elif isinstance(dtype, pd.CategoricalDtype):
            if not (isinstance(have, pd.CategoricalDtype) and have == dtype):
                casts[col] = dtype
        elif str(have) != str(dtype):
            casts[col] = dtype
    out = df[list(schema)]
    if casts:
        out = out.astype(casts)
    index = out.index
    if not (isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1):
        out = out.reset_index(drop=True)
    return out


# -- building columns ----------------------------------------------------------------------
# A long capture has hundreds of thousands of rows per table, most columns holding a few
# distinct values. pandas builds string and categorical columns from Python objects one
# element at a time (checking, converting and hashing each); these build the same columns
# from codes into the few distinct values, or hand the strings to pyarrow in one call.


def strings(values) -> pd.api.extensions.ExtensionArray:
    """A :data:`STRING` array of Python strings (None or NaN: missing), as
    ``pd.array(values, dtype=STRING)`` builds it."""
    try:
        arr = pa.array(values, type=pa.large_string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):  # not all strings: pandas converts
        return pd.array(list(values), dtype=STRING)
    return pd.array(arr, dtype=STRING)


def taken_strings(codes: np.ndarray, values) -> pd.api.extensions.ExtensionArray:
    """A :data:`STRING` array holding ``values[code]`` for each code (negative: missing)."""
    codes = np.asarray(codes)
    table = pa.array(list(values), type=pa.large_string(), from_pandas=True)
    if not len(table):
        return pd.array(pa.nulls(len(codes), pa.large_string()), dtype=STRING)
    return pd.array(table.take(pa.array(codes, mask=codes < 0)), dtype=STRING)


def no_strings(n: int) -> pd.api.extensions.ExtensionArray:
    """A :data:`STRING` array of ``n`` missing values."""
    return pd.array(pa.nulls(n, pa.large_string()), dtype=STRING)


def codes_of(dtype: pd.CategoricalDtype) -> dict:
    """Each category of a closed vocabulary -> its code."""
    return {c: i for i, c in enumerate(dtype.categories)}


def categorical(values, dtype: pd.CategoricalDtype) -> pd.Categorical:
    """``pd.Categorical(values, dtype=dtype)`` for an object array of few distinct values:
    each distinct value is looked up once. Values outside the vocabulary are missing."""
    codes, uniques = pd.factorize(np.asarray(values, dtype=object))
    lookup = codes_of(dtype)
    table = np.array([lookup.get(u, -1) for u in uniques] + [-1], dtype=np.int64)
    return pd.Categorical.from_codes(table[codes], dtype=dtype)


def open_categorical(values) -> pd.Categorical:
    """``pd.Categorical(values)`` (categories: the distinct values, sorted) for an object
    array of strings."""
    values = np.asarray(values, dtype=object)
    codes, uniques = pd.factorize(values, sort=True)
    if not len(uniques):  # nothing but missing values: pandas picks the categories' dtype
        return pd.Categorical(values)
    return pd.Categorical.from_codes(codes, categories=pd.Index(uniques))


def integers(values: np.ndarray, missing: np.ndarray) -> pd.arrays.IntegerArray:
    """A nullable ``Int64`` array of ``values`` (int64), missing where ``missing``."""
    return pd.arrays.IntegerArray(np.asarray(values, dtype=np.int64), np.asarray(missing, bool))


def open_categorical_codes(codes: np.ndarray, categories: pd.Index) -> pd.Categorical:
    """:func:`open_categorical` of ``categories[codes]`` (negative: missing), reusing the
    categories when they already are the sorted distinct values present."""
    codes = np.asarray(codes)
    used = np.zeros(len(categories), dtype=bool)
    used[codes[codes >= 0]] = True
    if used.all() and categories.is_unique and categories.is_monotonic_increasing:
        return pd.Categorical.from_codes(codes, categories=categories)
    values = np.asarray(categories, dtype=object)[np.maximum(codes, 0)]
    return open_categorical(np.where(codes >= 0, values, None))
