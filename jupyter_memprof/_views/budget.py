"""The summary's line for a capture stopped at its memory budget.

The line a summary shows when a capture was stopped at its memory budget
(``meta["memory_budget"]``, see docs/reliability.md)."""

from __future__ import annotations

from typing import Any

from .._units import format_bytes

__all__ = ["budget_phrase"]


def budget_phrase(s: dict[str, Any]) -> str | None:
    """One line when a capture was stopped at its memory budget, else None."""
    budget = s.get("memory_budget")
    if not budget or not budget.get("exceeded"):
        return None
    grown = budget.get("grown_bytes")
    by = f" by {format_bytes(grown)}" if isinstance(grown, int) else ""
    if budget.get("reason") == "machine" or budget.get("bytes") is None:
        floor = budget.get("floor_bytes")
        why = "the machine's available memory fell under " + (
            format_bytes(floor) if isinstance(floor, int) else "its floor"
        )
    else:
        why = f"over the capture's memory budget of {format_bytes(budget['bytes'])}"
    return (
        f"recording stopped: the process grew{by}, {why}; the profile holds what was "
        "recorded until then"
    )
