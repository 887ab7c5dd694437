"""The JSON documents that ``--json`` prints, declared once.

Every document is one JSON object with ``schema`` (:data:`NAME`), ``schema_version``
(:data:`VERSION`) and ``command``. :data:`SCHEMA` is a JSON Schema (draft 2020-12) of all
of them; ``jupyter-memprof schema`` prints it and docs/cli.md repeats it (a test keeps the two
equal). A change that removes or renames a field, or changes its meaning, raises
:data:`VERSION`; new optional fields do not.
"""

from __future__ import annotations

from typing import Any

NAME = "jupyter-memprof-cli"
VERSION = 1

_INT = {"type": "integer"}
_STR = {"type": "string"}
_NULL_INT = {"type": ["integer", "null"]}
_NULL_STR = {"type": ["string", "null"]}
_BYTES_BY_KEY = {"type": "object", "additionalProperties": {"type": "integer"}}


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """An object with these properties, all of ``required`` present."""
    return {
        "type": "object",
        "required": sorted(required),
        "properties": {**required, **(optional or {})},
    }


def _header(*commands: str) -> dict[str, Any]:
    return {
        "schema": {"const": NAME},
        "schema_version": {"const": VERSION},
        "command": {"enum": list(commands)},
    }


#: One device's peak: allocated bytes at the peak, the categories live then (largest first),
#: and on CUDA the caching allocator's reserved peak (null elsewhere).
PEAK = _obj(
    {
        "device": _STR,
        "bytes": _INT,
        "categories": _BYTES_BY_KEY,
        "reserved_bytes": _NULL_INT,
    }
)

#: Where a step first goes over a limit (``first_over`` in the analysis): the op, module and
#: line that made the block that crossed it, and the bytes live then by category.
FIRST_OVER = _obj(
    {
        "device": _STR,
        "bytes": _INT,
        "size_bytes": _INT,
        "op_name": _NULL_STR,
        "module": _NULL_STR,
        "callsite": _NULL_STR,
        "phase": _NULL_STR,
        "live_by_category": _BYTES_BY_KEY,
    },
    {"cause": _NULL_STR, "tensors_bytes": _INT, "cache_bytes": _INT, "context_bytes": _INT},
)

#: The limit verdict: ``fits`` is false when the step goes over ``bytes`` on ``device``.
LIMIT = _obj(
    {
        "bytes": _INT,
        "device": _NULL_STR,
        "fits": {"type": "boolean"},
        "first_over": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/first_over"}]},
    }
)

#: One group of blocks live at the peak (``Profile.explain``); the groups' bytes add up to
#: the peak exactly.
GROUP = _obj(
    {
        "group": _STR,
        "category": _NULL_STR,
        "modules": _NULL_STR,
        "top_op": _NULL_STR,
        "blocks": _INT,
        "bytes": _INT,
        "share": {"type": "number"},
        "what": _NULL_STR,
        "changes": {"type": "array", "items": _STR},
    }
)

EXPLAIN = _obj(
    {
        "device": _NULL_STR,
        "peak_bytes": _INT,
        "groups": {"type": "array", "items": {"$ref": "#/$defs/group"}},
    }
)

#: Memory that grows with every step (``Profile.leaks``), largest first.
LEAK = _obj(
    {
        "holder": _NULL_STR,
        "callsite": _NULL_STR,
        "category": _NULL_STR,
        "device": _NULL_STR,
        "bytes_per_step": _INT,
        "steps": _INT,
        "total_bytes": _INT,
        "blocks": _INT,
        "why": _NULL_STR,
    }
)

#: summary, explain, leaks and estimate: one profile (a file or an estimate) reported.
REPORT = _obj(
    {
        **_header("summary", "explain", "leaks", "estimate"),
        "source": _STR,
        "label": _STR,
        "estimate": {"type": "boolean"},
        "devices": {"type": "array", "items": _STR},
        "peaks": {"type": "array", "items": {"$ref": "#/$defs/peak"}},
        "limit": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/limit"}]},
        "leaks": {"type": "array", "items": {"$ref": "#/$defs/leak"}},
        "explain": {"$ref": "#/$defs/explain"},
        "ok": {"type": "boolean"},
    },
    {"saved": {"type": "array", "items": _STR}},
)

DIFF = _obj(
    {
        **_header("diff"),
        "a": _STR,
        "b": _STR,
        "by": _STR,
        "peak_a": _INT,
        "peak_b": _INT,
        "device_a": _NULL_STR,
        "device_b": _NULL_STR,
        "summary": _STR,
        "rows": {
            "type": "array",
            "items": _obj(
                {
                    "key": _STR,
                    "a": _INT,
                    "b": _INT,
                    "delta": _INT,
                    "ratio": {"type": ["number", "null"]},
                }
            ),
        },
        "ok": {"type": "boolean"},
    }
)

FIT = _obj(
    {
        **_header("fit"),
        "source": _STR,
        "device": _NULL_STR,
        "limit_bytes": _INT,
        "batch": _NULL_INT,
        "tried": {
            "type": "array",
            "items": _obj({"batch": _INT, "peak_bytes": _INT, "fits": {"type": "boolean"}}),
        },
        "report": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/report"}]},
        "ok": {"type": "boolean"},
    }
)

#: html and convert: what was written where.
WRITTEN = _obj(
    {
        **_header("html", "convert"),
        "source": _STR,
        "output": _STR,
        "format": {"enum": ["html", "zip", "parquet", "snapshot"]},
        "ok": {"type": "boolean"},
    }
)

#: What ``--json`` prints instead when the command fails (exit code 2).
ERROR = _obj(
    {
        "schema": {"const": NAME},
        "schema_version": {"const": VERSION},
        "command": _NULL_STR,
        "error": _STR,
        "ok": {"const": False},
    }
)

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": f"{NAME} {VERSION}",
    "oneOf": [
        {"$ref": "#/$defs/report"},
        {"$ref": "#/$defs/diff"},
        {"$ref": "#/$defs/fit"},
        {"$ref": "#/$defs/written"},
        {"$ref": "#/$defs/error"},
    ],
    "$defs": {
        "report": REPORT,
        "diff": DIFF,
        "fit": FIT,
        "written": WRITTEN,
        "error": ERROR,
        "peak": PEAK,
        "limit": LIMIT,
        "first_over": FIRST_OVER,
        "explain": EXPLAIN,
        "group": GROUP,
        "leak": LEAK,
    },
}


def header(command: str | None) -> dict[str, Any]:
    """The fields every document starts with."""
    return {"schema": NAME, "schema_version": VERSION, "command": command}
