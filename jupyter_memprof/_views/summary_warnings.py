"""The summary's warnings: out of memory, growth per step.

Where an estimate runs out of its memory limit (or that it fits), and what memory grows with
every step of a loop. Each phrase reads the dict :func:`.summary.summary` made and computes
nothing.
"""

from __future__ import annotations

import math
from typing import Any

from .._units import format_bytes
from .fit_bar import verdict


def oom_phrase(s: dict[str, Any]) -> str | None:
    """One line: where the estimated step would run out of memory, or that it fits."""
    if not s["estimate"] or s["limit"] is None:
        return None
    limit = format_bytes(s["limit"])
    oom = s["oom"]
    if not oom:
        fit = s.get("fit")
        return verdict(fit) if fit else f"fits in the limit of {limit}"
    where = " ".join(
        p
        for p in (
            f"in {oom['op_name']}" if oom.get("op_name") else None,
            f"({oom['module']})" if oom.get("module") else None,
            f"at {oom['callsite']}" if oom.get("callsite") else None,
            f"during {oom['phase']}" if oom.get("phase") else None,
        )
        if p
    )
    live = ", ".join(f"{c} {format_bytes(b)}" for c, b in list(oom["live_by_category"].items())[:4])
    if oom.get("cause") is None:  # a CPU device: live bytes
        return (
            f"OUT OF MEMORY: {format_bytes(oom['bytes'])} live on {oom['device']} exceeds the "
            f"limit of {limit} {where}; live then: {live}"
        )
    parts = ", ".join(
        f"{name} {format_bytes(oom.get(key) or 0)}"
        for name, key in (
            ("tensors", "tensors_bytes"),
            ("allocator cache", "cache_bytes"),
            ("CUDA context", "context_bytes"),
        )
    )
    return (
        f"OUT OF MEMORY: {oom['device']} would need {format_bytes(oom['bytes'])} ({parts}), "
        f"over the limit of {limit}{' ' + where if where else ''}; pushed over by the "
        f"{_CAUSE.get(oom['cause'], oom['cause'])}{_expandable(oom)}; live then: {live}"
    )


_CAUSE = {
    "tensors": "tensors",
    "cache": "allocator's cache (fragmentation)",
    "context": "CUDA context",
}


def _expandable(oom: dict[str, Any]) -> str:
    """What ``expandable_segments:True`` would change, as a clause."""
    other = oom.get("expandable_segments")
    if not isinstance(other, dict):
        return ""
    if other.get("fits"):
        peak = other.get("reserved_peak_bytes")
        return "; with expandable_segments:True it would fit" + (
            f" (reserved peak {format_bytes(peak)})" if isinstance(peak, int) else ""
        )
    return "; with expandable_segments:True it would still run out"


def _where(callsite: str | None) -> str | None:
    """``In[7]:5 in <module>`` -> ``cell line 5``; ``train.py:12 in fit`` -> ``train.py:12``."""
    if not callsite:
        return None
    place = callsite.split(" in ", 1)[0]
    file, _, line = place.rpartition(":")
    if file.startswith("In[") and line:
        return f"cell line {line}"
    return place


def growth_phrase(s: dict[str, Any]) -> str | None:
    """One line: ``memory grows 1.3 MiB per step: `losses` (cell line 5)``, or None."""
    g = s.get("growth")
    if not g:
        return None
    where = _where(g["callsite"])
    if g["holder"]:
        what = f"`{g['holder']}`" + (f" ({where})" if where else "")
    else:
        what = where or "blocks no variable reaches"
    more = f" and {g['leaks'] - 1} more" if g["leaks"] > 1 else ""
    line = f"memory grows {format_bytes(g['bytes_per_step'])} per step: {what}{more}"
    return f"{line}; {_severity_clause(g)}" if "severity" in g else line


def _severity_clause(g: dict[str, Any]) -> str:
    """``a note: 0.0001% of the step's peak of 12.0 MiB, 2.1e+10 steps to fill cuda:0``."""
    share = g["share"]
    if math.isinf(share):
        parts = ["no step peak to compare with"]
    else:
        pct = f"{100 * share:.2g}%" if share < 0.1 else f"{100 * share:.0f}%"
        parts = [f"{pct} of the step's peak of {format_bytes(g['step_peak'])}"]
    steps = g.get("steps_to_fill")
    if steps is not None:
        count = f"{steps:,.0f}" if steps < 1e7 else f"{steps:.1e}"
        parts.append(f"{count} steps to fill {format_bytes(g['capacity'])}")
    article = "an" if g["severity"] == "alarm" else "a"
    return f"{article} {g['severity']}: " + ", ".join(parts)
