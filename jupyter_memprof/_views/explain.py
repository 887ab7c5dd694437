"""The peak explained as text and HTML: one line per group.

The peak explained (:func:`jupyter_memprof._analysis.explain.explain`) as text and HTML:
one line per group with its bytes, its share of the peak, what it is for and the changes
that could cut it. Nothing here is analysis: the rows come from the table as they are."""

from __future__ import annotations

import html

import pandas as pd

from .._units import format_bytes


def headline(table: pd.DataFrame) -> str:
    """``peak 12.3 MiB on cpu, in 5 groups:``."""
    n = len(table)
    device = table.attrs.get("device") or "no device"
    total = format_bytes(int(table.attrs.get("peak_bytes", 0)))
    return f"peak {total} on {device}, in {n} group{'s' if n != 1 else ''}:"


def explain_text(table: pd.DataFrame) -> str:
    """The table for a terminal: the headline, then per group its bytes and share, the
    group, and indented lines for what it is for and what could cut it."""
    lines = [headline(table)]
    for r in table.itertuples():
        lines.append(f"{format_bytes(int(r.bytes)):>11} {100 * r.share:5.1f}%  {r.group}")
        lines.append(f"{'':19}for: {r.what}")
        if isinstance(r.changes, str) and r.changes:
            lines.append(f"{'':19}try: what_if(..., {r.changes})")
    return "\n".join(lines)


def explain_html(table: pd.DataFrame) -> str:
    """The table as an escaped HTML table (module paths and op names come from user code)."""
    rows = []
    for r in table.itertuples():
        changes = r.changes if isinstance(r.changes, str) else ""
        cells = (format_bytes(int(r.bytes)), f"{100 * r.share:.1f}%", r.group, r.what, changes)
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("bytes", "share", "group", "for", "what_if changes"))
    return (
        f"<div><p><b>{html.escape(headline(table))}</b></p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def savings_text(savings: pd.DataFrame) -> str:
    """The changes tried on an estimate, largest saving first, under a headline naming the
    biggest (nothing when none was tried)."""
    if savings.empty:
        return ""
    peak = int(savings.attrs.get("peak_bytes", 0))
    top = savings.iloc[0]
    lines = []
    if top["saving"] > 0:
        lines.append(
            f"biggest saving: {top['change']}: peak {format_bytes(int(top['peak_bytes']))} "
            f"({_signed(-int(top['saving']), peak)})"
        )
    lines.append("each change alone, estimated:")
    for r in savings.itertuples():
        lines.append(f"  {_signed(-int(r.saving), peak):>22}  {r.change}")
    return "\n".join(lines)


def _signed(delta: int, total: int) -> str:
    """``-2.8 MiB, -24%``."""
    sign = "-" if delta < 0 else "+"
    share = f", {sign}{abs(delta) / total:.0%}" if total else ""
    return f"{sign}{format_bytes(abs(delta))}{share}"


def savings_html(savings: pd.DataFrame) -> str:
    """:func:`savings_text` as escaped preformatted HTML."""
    text = savings_text(savings)
    return f"<pre>{html.escape(text)}</pre>" if text else ""
