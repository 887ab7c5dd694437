"""A block's lineage and a diff as text, for terminals and HTML.

The analysis gives tables (:func:`jupyter_memprof._analysis.lineage.lineage`,
:func:`jupyter_memprof._analysis.diff.diff`); this module writes them out: times since the
capture's start, sizes with units, changes with their sign.
"""

from __future__ import annotations

import html
import math
import re

import pandas as pd

from .._analysis.diff import signed_bytes
from .._analysis.lineage import check_block, lineage
from .._units import format_bytes, format_time


# -- a block's lineage -------------------------------------------------------------------------
def lineage_text(
    tables: dict[str, pd.DataFrame], alloc_id: int, start_ns: int, *, records: bool = False
) -> str:
    """A readable account of one block for a terminal; times in ms since ``start_ns`` (the
    capture's start, :attr:`Profile.start_ns`). ``records``: the tables are an estimate's,
    whose times count records of the fake run, shown as positions ("record #12"), not ms."""
    alloc_id = check_block(tables, alloc_id)
    a = tables["allocations"].set_index("alloc_id").loc[alloc_id]
    t0 = start_ns
    label = a["name"] if pd.notna(a["name"]) else f"block {alloc_id}"
    head = f"{label}: {format_bytes(int(a['size_bytes']))} on {a['device']}, {a['category']} ({a['reason']})"
    lines = [head]
    for r in lineage(tables, alloc_id).itertuples(index=False):
        if pd.isna(r.time_ns):
            when = "  before capture"
        elif records:
            when = format_time((r.time_ns - t0) / 1e6, records=True).rjust(14)
        else:
            when = f"{(r.time_ns - t0) / 1e6:9.3f} ms"
        op = r.op_name if isinstance(r.op_name, str) else "-"
        where = " ".join(
            x
            for x in (
                f"[{r.module}]" if isinstance(r.module, str) else "",
                r.callsite if isinstance(r.callsite, str) else "",
            )
            if x
        )
        v = "" if pd.isna(r.version) else f" v{r.version}"
        lines.append(
            f"  {when}  {r.relation:<18} {op}{v} ({r.phase if isinstance(r.phase, str) else '-'}) {where}".rstrip()
        )
    return "\n".join(lines)


# -- a diff of two profiles --------------------------------------------------------------------
def ratio_text(r: float) -> str:
    """``b / a`` for people: ``'1.50x'``, ``'new'`` (only b has it), ``'gone'`` (only a), ``''``
    for NaN (neither)."""
    if r is None or math.isnan(r):
        return ""
    if math.isinf(r):
        return "new"
    if r == 0:
        return "gone"
    return f"{r:.2f}x"


def formatted_diff(d: pd.DataFrame, rows: int | None) -> pd.DataFrame:
    """The first ``rows`` rows of a diff (all with None) as text: sizes, signed changes, ratios."""
    shown = d if rows is None else d.head(rows)
    return pd.DataFrame(
        {
            "a": [format_bytes(v) for v in shown["a"]],
            "b": [format_bytes(v) for v in shown["b"]],
            "delta": [signed_bytes(int(v)) for v in shown["delta"]],
            "ratio": [ratio_text(v) for v in shown["ratio"]],
        },
        index=shown.index,
    )


def labels_line(d: pd.DataFrame) -> str:
    """``a = bs32 (peak 1.0 GiB), b = bs64 (peak 1.9 GiB)``: which profile is which."""
    at = d.attrs
    return (
        f"a = {at.get('label_a', 'a')} (peak {format_bytes(at.get('peak_a', 0))}), "
        f"b = {at.get('label_b', 'b')} (peak {format_bytes(at.get('peak_b', 0))})"
    )


CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def diff_text(d: pd.DataFrame, rows: int | None = 30) -> str:
    """A :class:`Diff` for a terminal: headline, the two profiles, then aligned rows."""
    lines = [str(d.attrs.get("summary", "")), labels_line(d)]
    if d.empty:
        return "\n".join([*lines, "(nothing live at either peak)"])
    shown = formatted_diff(d, rows)
    keys = [CONTROL_CHARS.sub("?", str(k)) for k in shown.index]
    head = [str(d.index.name or "key"), "a", "b", "delta", "ratio"]
    cols = [keys, *(shown[c].tolist() for c in ("a", "b", "delta", "ratio"))]
    widths = [max(len(h), *(len(v) for v in col)) for h, col in zip(head, cols)]
    width0 = min(widths[0], 60)

    def fmt(values: list[str]) -> str:
        first = values[0] if len(values[0]) <= width0 else values[0][: width0 - 1] + "…"
        rest = [v.rjust(w) for v, w in zip(values[1:], widths[1:])]
        return "  ".join([first.ljust(width0), *rest]).rstrip()

    lines.append(fmt(head))
    lines += [fmt([c[i] for c in cols]) for i in range(len(keys))]
    if rows is not None and len(d) > rows:
        lines.append(f"... {len(d) - rows} more rows")
    return "\n".join(lines)


def diff_html(d: pd.DataFrame, rows: int = 50) -> str:
    """A :class:`Diff` as HTML: the headline and the two profiles, then the table (escaped)."""
    shown = formatted_diff(d, rows)
    head = html.escape(str(d.attrs.get("summary", "")))
    labels = html.escape(labels_line(d))
    return f"<div><p><b>{head}</b><br>{labels}</p>{shown.to_html(escape=True)}</div>"
