"""The arguments an op writes in place, from torch's schemas.

A write is a new version of the tensor written. Looking a schema up costs ~100 µs in torch,
so each answer is kept per (op name, number of arguments) in :data:`SCHEMAS`; the event
reader reads that cache directly and calls :func:`mutable_arguments` only on a miss.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C._profiler import _TensorMetadata

#: what :data:`SCHEMAS` holds for an op whose overloads of one arity disagree
AMBIGUOUS = object()
#: (op name, number of arguments) -> its arguments' write flags (None: not a dispatcher op)
SCHEMAS: dict[tuple[str, int], Any] = {}


def mutable_arguments(name: str, inputs: list) -> tuple[bool, ...] | None:
    """Which arguments the op ``name`` may write in place, from its registered schemas.

    ``None`` means "not a dispatcher op" (a ``record_function`` label, an autograd node):
    such names never have ``::`` or have no registered schema. Schema lookup costs ~100 µs
    in torch, so the answer is cached per (name, number of arguments) and names without
    ``::`` are rejected before any lookup. Only when overloads with the same arity disagree
    do we match argument types per call (rare).
    """
    key = (name, len(inputs))
    hit = SCHEMAS.get(key, AMBIGUOUS)
    if hit is AMBIGUOUS and key not in SCHEMAS:
        hit = SCHEMAS[key] = _lookup(name, len(inputs))
    if hit is AMBIGUOUS:
        return _match_types(name, inputs)
    return hit


def _schemas(name: str) -> list:
    if "::" not in name:
        return []
    try:
        return list(torch._C._jit_get_schemas_for_operator(name))
    except RuntimeError:
        return []


def _writes(schema) -> tuple[bool, ...]:
    return tuple(bool(getattr(a.alias_info, "is_write", False)) for a in schema.arguments)


def _lookup(name: str, n_inputs: int):
    schemas = _schemas(name)
    if not schemas:
        return None
    flags = {_writes(s) for s in schemas if len(s.arguments) == n_inputs}
    if not flags:
        # A dispatcher op recorded with an unexpected arity: assume it writes nothing
        # rather than everything (a spurious version bump would mislabel the tensor).
        return (False,) * n_inputs
    if len(flags) == 1:
        return flags.pop()
    return AMBIGUOUS


def _match_types(name: str, inputs: list) -> tuple[bool, ...]:
    """Union of the write flags of the overloads whose argument types fit ``inputs``."""
    out = [False] * len(inputs)
    for schema in _schemas(name):
        if len(schema.arguments) != len(inputs):
            continue
        if all(_type_fits(v, a.type) for v, a in zip(inputs, schema.arguments)):
            for i, w in enumerate(_writes(schema)):
                out[i] |= w
    return tuple(out)


def _type_fits(value, schema_type) -> bool:
    if isinstance(schema_type, torch._C.OptionalType):
        return value is None or _type_fits(value, schema_type.getElementType())
    if isinstance(schema_type, torch._C.AnyType):
        return True
    if isinstance(schema_type, torch._C.TensorType):
        return isinstance(value, _TensorMetadata)
    if isinstance(schema_type, torch._C.ListType):
        return isinstance(value, list)
    if isinstance(schema_type, torch._C.BoolType):
        return isinstance(value, bool)
    if isinstance(schema_type, torch._C.IntType):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(schema_type, (torch._C.FloatType, torch._C.NumberType)):
        return isinstance(value, (int, float, complex))
    return value is None or not isinstance(value, _TensorMetadata)
