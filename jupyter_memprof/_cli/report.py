"""Profiles, diffs and fits as JSON documents and as text.

Everything here reads what :class:`~jupyter_memprof.Profile` and the analyses already
compute (``summary()``, ``explain()``, ``leaks()``, ``first_over``); nothing is computed
twice and nothing new is decided.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .._io import json_default
from .._units import format_bytes
from .schema import FIRST_OVER, header

if TYPE_CHECKING:
    from .._results.profile import Profile


def plain(value: Any) -> Any:
    """``value`` with numpy and pandas scalars turned into JSON's own types."""
    return json.loads(json.dumps(value, default=json_default))


def _text_or_none(value: Any) -> str | None:
    if value is None:
        return None
    try:
        import pandas as pd

        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return str(value)


def limit_verdict(
    prof: Profile, limit: int | None = None, device: str | None = None
) -> dict[str, Any] | None:
    """The limit verdict of :data:`.schema.LIMIT`: ``limit`` (bytes) on ``device`` when
    given (judged as ``estimate(limit=...)`` judges it), else the limit an estimate was run
    with (``meta["limit"]``, ``meta["oom"]``); None when there is no limit."""
    if limit is None:
        if prof.meta.get("limit") is None:
            return None
        limit, device, over = int(prof.meta["limit"]), prof.meta.get("device"), prof.meta.get("oom")
    else:
        from .._analysis.allocator.config import parse_config
        from .._analysis.limit import first_over

        if device is None:
            device = prof.peak().attrs.get("device") if prof.devices else None
        config = parse_config(prof.meta.get("allocator") or None)
        over = first_over(prof.tables, limit, device, allocator=config)
    return {
        "bytes": int(limit),
        "device": device,
        "fits": over is None,
        "first_over": None if over is None else _first_over(over),
    }


def _first_over(over: dict[str, Any]) -> dict[str, Any]:
    keys = FIRST_OVER["properties"]
    out = {k: over.get(k) for k in keys if k in over or k in FIRST_OVER["required"]}
    out["live_by_category"] = over.get("live_by_category") or {}
    return plain(out)


def explain_part(prof: Profile, device: str | None = None, rows: int = 8) -> dict[str, Any]:
    """:data:`.schema.EXPLAIN`: the groups that fill ``device``'s peak (default: the
    highest)."""
    table = prof.explain(device, rows)
    groups = [
        {
            "group": str(r["group"]),
            "category": _text_or_none(r["category"]),
            "modules": _text_or_none(r["modules"]),
            "top_op": _text_or_none(r["top_op"]),
            "blocks": int(r["blocks"]),
            "bytes": int(r["bytes"]),
            "share": float(r["share"]),
            "what": _text_or_none(r["what"]),
            "changes": [c for c in (_text_or_none(r["changes"]) or "").split(", ") if c],
        }
        for r in table.to_dict("records")
    ]
    return {
        "device": table.attrs.get("device"),
        "peak_bytes": int(table.attrs.get("peak_bytes") or 0),
        "groups": groups,
    }


def leaks_part(prof: Profile) -> list[dict[str, Any]]:
    """:data:`.schema.LEAK` rows, largest first."""
    return [
        {
            "holder": _text_or_none(r["holder"]),
            "callsite": _text_or_none(r["callsite"]),
            "category": _text_or_none(r["category"]),
            "device": _text_or_none(r["device"]),
            "bytes_per_step": int(r["bytes_per_step"]),
            "steps": int(r["steps"]),
            "total_bytes": int(r["total_bytes"]),
            "blocks": len(r["alloc_ids"]) if r["alloc_ids"] is not None else 0,
            "why": _text_or_none(r["why"]),
        }
        for r in prof.leaks().to_dict("records")
    ]


#: ``report(verdict=...)`` not given: judge the limit there.
_JUDGE = object()


def report(
    prof: Profile,
    *,
    command: str,
    source: str,
    limit: int | None = None,
    device: str | None = None,
    rows: int = 8,
    verdict: Any = _JUDGE,
    leaks: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The :data:`.schema.REPORT` of one profile. ``ok`` is false when it goes over the
    limit, and for ``leaks`` also when memory grows with every step. ``verdict`` and
    ``leaks``, when the caller has them already: :func:`limit_verdict` of ``limit`` on
    ``device``, and :func:`leaks_part`."""
    summary = prof.summary()
    peaks = [
        {
            "device": dev,
            "bytes": int(p["bytes"]),
            "categories": {str(k): int(v) for k, v in (p.get("top_categories") or {}).items()},
            "reserved_bytes": None if p.get("reserved_bytes") is None else int(p["reserved_bytes"]),
        }
        for dev, p in summary["peaks"].items()
    ]
    if verdict is _JUDGE:
        verdict = limit_verdict(prof, limit, device)
    if leaks is None:
        leaks = leaks_part(prof)
    ok = verdict is None or verdict["fits"]
    if command == "leaks":
        ok = ok and not leaks
    return {
        **header(command),
        "source": source,
        "label": prof.label,
        "estimate": bool(prof.meta.get("estimate")),
        "devices": list(prof.devices),
        "peaks": peaks,
        "limit": verdict,
        "leaks": leaks,
        "explain": explain_part(prof, device, rows),
        "ok": ok,
    }


# -- text for people ---------------------------------------------------------------------
def verdict_text(verdict: dict[str, Any] | None) -> str | None:
    """One line: fits, or where it first goes over the limit."""
    if verdict is None:
        return None
    limit = format_bytes(verdict["bytes"])
    where = verdict["device"] or "its devices"
    over = verdict["first_over"]
    if over is None:
        return f"fits {limit} on {where}"
    at = over.get("op_name") or "an op"
    if over.get("module"):
        at += f" in {over['module']}"
    if over.get("callsite"):
        at += f" ({over['callsite']})"
    cause = f", {over['cause']} pushed it over" if over.get("cause") else ""
    return f"OVER {limit} on {over['device']}: needs {format_bytes(over['bytes'])} at {at}{cause}"


def leaks_text(leaks: list[dict[str, Any]]) -> str:
    if not leaks:
        return "no memory grows with every step"
    lines = [f"{len(leaks)} group{'s' if len(leaks) != 1 else ''} of blocks grow every step:"]
    for leak in leaks:
        held = f" held by {leak['holder']}" if leak["holder"] else ""
        made = f", made at {leak['callsite']}" if leak["callsite"] else ""
        lines.append(
            f"  {format_bytes(leak['bytes_per_step']):>11}/step  {leak['category']} on"
            f" {leak['device']}{held}{made} ({leak['steps']} steps)"
        )
        if leak["why"]:
            lines.append(f"               {leak['why']}")
    return "\n".join(lines)


def diff_document(d, a: str, b: str) -> dict[str, Any]:
    """:data:`.schema.DIFF` of a :class:`~jupyter_memprof._results.diff.Diff`."""
    attrs = d.attrs
    rows = [
        {
            "key": str(key),
            "a": int(r["a"]),
            "b": int(r["b"]),
            "delta": int(r["delta"]),
            "ratio": None
            if r["ratio"] != r["ratio"] or abs(r["ratio"]) == float("inf")
            else float(r["ratio"]),
        }
        for key, r in d.iterrows()
    ]
    return {
        **header("diff"),
        "a": a,
        "b": b,
        "by": str(attrs.get("by")),
        "peak_a": int(attrs.get("peak_a") or 0),
        "peak_b": int(attrs.get("peak_b") or 0),
        "device_a": attrs.get("device_a"),
        "device_b": attrs.get("device_b"),
        "summary": str(attrs.get("summary") or ""),
        "rows": rows,
        "ok": True,
    }


def fit_document(result, source: str) -> dict[str, Any]:
    """:data:`.schema.FIT` of a :class:`~jupyter_memprof.Fit`."""
    tried = [
        {"batch": int(r.batch), "peak_bytes": int(r.peak_bytes), "fits": bool(r.fits)}
        for r in result.tried.itertuples()
    ]
    chosen = None
    if result.profile is not None:
        chosen = report(
            result.profile,
            command="estimate",
            source=source,
            limit=result.limit,
            device=result.device,
        )
    return {
        **header("fit"),
        "source": source,
        "device": result.device,
        "limit_bytes": int(result.limit),
        "batch": result.batch,
        "tried": tried,
        "report": chosen,
        "ok": result.batch is not None,
    }
