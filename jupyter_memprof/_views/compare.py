"""Two profiles on one time axis and one byte scale, and the diff.

Each profile's timeline starts at the start of its profiled code (time 0), so the same step
lines up; both charts share the x range (zooming one zooms the other) and the y range (the
larger peak sets it). An estimate's x axis counts records of the fake run (its clock,
``meta["clock"]``), not milliseconds: an estimate against a real capture gets one x range
per chart, each labelled with what it counts, and the header says so; two estimates, or two
real captures, share one. Below them, :func:`jupyter_memprof.diff` of the two peaks by category,
module or op. A click on a row highlights that key in both charts: a category stands out
from the others, and for every key a black line traces its live bytes over time.

All linking runs in the browser (CustomJS from ``js/compare.js``), so the notebook widget and
the standalone HTML file behave the same. Nothing here is analysis: the numbers come from
the tables, :func:`.._analysis.diff.diff` and the dashboard's timeline data.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
from bokeh.layouts import column, row
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    DataTable,
    Div,
    Legend,
    LegendItem,
    Range1d,
    Select,
    Span,
    TableColumn,
)
from bokeh.plotting import figure

from .._analysis.diff import signed_bytes
from .._io import atomic_write, check_target
from .._units import format_bytes
from .dashboard import data as dd
from .dashboard import js as dashboard_js
from .dashboard.kit import bytes_axis as _bytes_axis
from .protocols import ComparisonLike
from .text import ratio_text

#: Keys per grouping that get a highlight series (the largest changes).
HIGHLIGHT_KEYS = 40
#: Points per highlight series (thinned like the timelines, peaks kept).
HIGHLIGHT_POINTS = 600
#: Diff rows per grouping shown in the table.
TABLE_ROWS = 200
GROUPINGS = ("category", "module", "op")
_WHAT = "jupyter_memprof HTML page"


def _key_series(prof, by: str, keys: list[str], device: str, fr: dd.Window) -> dict:
    """Live bytes over time of the blocks of each key (module or allocating op), thinned."""
    a = prof.allocations
    if by == "module":
        key = a["module"].astype(object)
    else:
        ops = prof.ops
        op = a["alloc_op_id"].to_numpy(dtype=np.int64, na_value=-1)
        names = ops["name"].astype(object).to_numpy() if len(ops) else np.array([], dtype=object)
        key = pd.Series(np.where(op >= 0, names[np.maximum(op, 0)] if len(ops) else None, None))
    key = key.where(key.notna(), "(none)").to_numpy(dtype=object)
    ev = prof.events
    ev = ev[ev["device"].astype(object) == device]
    act = ev["action"].astype(object).to_numpy()
    sign = np.where(act == "destroy", -1, np.where(act == "increment_version", 0, 1))
    ev_key = key[ev["alloc_id"].to_numpy()]
    t = fr.ms(ev["time_ns"])
    size = ev["size_bytes"].to_numpy() * sign
    out = {}
    for k in keys:
        m = (ev_key == k) & (sign != 0)
        if not m.any():
            out[k] = {"t": [0.0, fr.end_ms], "y": [0.0, 0.0]}
            continue
        live = np.cumsum(size[m]).astype("float64")
        tt = t[m]
        keep = dd.m4_indices(live, HIGHLIGHT_POINTS)
        tt, live = tt[keep], live[keep]
        out[k] = {
            "t": [0.0, *tt.tolist(), fr.end_ms],
            "y": [0.0, *live.tolist(), float(live[-1])],
        }
    return out


def _category_series(tl: dd.Timeline, keys: list[str]) -> dict:
    out = {}
    for k in keys:
        col = tl.columns.get(f"b_{k}")
        if col is None:
            out[k] = {"t": [float(tl.columns["t"][0]), float(tl.columns["t"][-1])], "y": [0.0, 0.0]}
        else:
            out[k] = {"t": list(map(float, tl.columns["t"])), "y": list(map(float, col))}
    return out


def _table_columns(d: pd.DataFrame) -> dict[str, list]:
    d = d.head(TABLE_ROWS)
    return {
        "key": [str(k) for k in d.index],
        "a": [format_bytes(v) for v in d["a"]],
        "b": [format_bytes(v) for v in d["b"]],
        "delta": [signed_bytes(int(v)) for v in d["delta"]],
        "ratio": [ratio_text(float(r)) for r in d["ratio"]],
        "delta_bytes": [int(v) for v in d["delta"]],
    }


@dataclass
class Built:
    layout: object
    rows: ColumnDataSource
    by: Select


def write_html(cmp: ComparisonLike, path: str | os.PathLike, *, overwrite: bool = False) -> str:
    """Write the comparison as one standalone interactive HTML file; returns the path.

    Written atomically; an existing file is replaced when it is a page this package wrote,
    or with ``overwrite=True`` (anything else raises ``FileExistsError`` before the view is
    built)."""
    from .dashboard.html import is_our_page, standalone_html

    check_target(path, what=_WHAT, overwrite=overwrite, is_own_kind=is_our_page)
    page = standalone_html(build(cmp).layout, f"jupyter_memprof: {cmp.a.label} vs {cmp.b.label}")

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(page)

    return atomic_write(path, write, what=_WHAT, overwrite=overwrite, is_own_kind=is_our_page)


def widget(cmp: ComparisonLike):
    """The comparison as a notebook widget."""
    from .dashboard.widget import BokehView

    return BokehView(build(cmp).layout)


#: The x axis of a real capture, and of an estimate (whose clock counts records, not time).
TIME_AXIS = "ms since the start of the profiled code"
ESTIMATE_AXIS = "records since the start of the profiled code ({clock}: an estimate, not time)"


def x_axis_label(prof) -> str:
    """What a profile's x axis counts: milliseconds, or for an estimate the records of its
    fake run (``meta["clock"]``), which the views draw one per "ms"."""
    if prof.meta.get("estimate"):
        return ESTIMATE_AXIS.format(clock=prof.meta.get("clock") or "op sequence")
    return TIME_AXIS


def _timeline_figure(
    side: str, title: str, tl: dd.Timeline, x_range, y_range, hl: ColumnDataSource, x_label: str
):
    src = ColumnDataSource(dict(tl.columns), name=f"memprof-compare-timeline-{side}")
    dd.stack(src.data, tl.categories, tl.categories)
    p = figure(
        height=260,
        sizing_mode="stretch_width",
        x_range=x_range,
        y_range=y_range,
        tools="xpan,xwheel_zoom,reset,save",
        active_scroll="xwheel_zoom",
        title=title,
        css_classes=[f"memprof-compare-timeline-{side}"],
    )
    p.xaxis.axis_label = x_label
    _bytes_axis(p.yaxis[0])
    areas = {
        c: p.varea_step(
            x="t",
            y1=f"lo_{c}",
            y2=f"hi_{c}",
            step_mode="after",
            source=src,
            fill_color=dd.CATEGORY_COLORS[c],
            fill_alpha=0.85,
        )
        for c in tl.categories
    }
    p.step(x="t", y="total", source=src, mode="after", line_color="#333333", line_width=1)
    line = p.step(x="t", y="y", source=hl, mode="after", line_color="#000000", line_width=3)
    items = [LegendItem(label=c, renderers=[r]) for c, r in areas.items()]
    items.append(LegendItem(label="clicked row (its own bytes)", renderers=[line]))
    p.add_layout(Legend(items=items, location="top_left"), "right")
    if tl.peak_ms is not None:  # on this chart's own clock
        p.add_layout(
            Span(location=tl.peak_ms, dimension="height", line_color="#000000", line_dash="dashed")
        )
    return p, areas


def build(cmp: ComparisonLike) -> Built:
    """The Bokeh layout of a comparison."""
    a, b = cmp.a, cmp.b
    da = cmp.diff("category")
    dev_a = da.attrs.get("device_a") or (a.devices or ["cpu"])[0]
    dev_b = da.attrs.get("device_b") or (b.devices or ["cpu"])[0]
    fa, fb = dd.window(a), dd.window(b)
    tla, tlb = dd.timeline(a, dev_a, fa), dd.timeline(b, dev_b, fb)
    top = max(tla.peak_bytes, tlb.peak_bytes, 1)
    y_range = Range1d(0, top * 1.1)
    label_a, label_b = x_axis_label(a), x_axis_label(b)
    if label_a == label_b:  # one clock: one x range, zooming one chart zooms the other
        end = max(fa.end_ms, fb.end_ms, 1e-3)
        x_a = x_b = Range1d(0, end, bounds=(0, end))
    else:  # records against milliseconds: no common unit, so each chart has its own range
        end_a, end_b = max(fa.end_ms, 1e-3), max(fb.end_ms, 1e-3)
        x_a = Range1d(0, end_a, bounds=(0, end_a))
        x_b = Range1d(0, end_b, bounds=(0, end_b))
    hl_a = ColumnDataSource({"t": [], "y": []}, name="memprof-compare-hl-a")
    hl_b = ColumnDataSource({"t": [], "y": []}, name="memprof-compare-hl-b")

    def title(p, tl, dev):
        return f"{p.label} ({dev}): peak {format_bytes(tl.peak_bytes)}"

    pa, areas_a = _timeline_figure(
        "a", "a = " + title(a, tla, dev_a), tla, x_a, y_range, hl_a, label_a
    )
    pb, areas_b = _timeline_figure(
        "b", "b = " + title(b, tlb, dev_b), tlb, x_b, y_range, hl_b, label_b
    )

    tables, series = _grouped(cmp, (tla, tlb), (dev_a, dev_b), (fa, fb))
    rows, table, by = _diff_table(tables)
    status = Div(
        text="Click a row to highlight it in both timelines.",
        css_classes=["memprof-compare-status"],
    )
    code = dashboard_js.source("compare.js")
    common = dict(
        rows=rows,
        by=by,
        tables=tables,
        series=series,
        hl_a=hl_a,
        hl_b=hl_b,
        areas_a=areas_a,
        areas_b=areas_b,
        status=status,
    )
    rows.selected.js_on_change("indices", CustomJS(args=dict(mode="select", **common), code=code))
    by.js_on_change("value", CustomJS(args=dict(mode="by", **common), code=code))

    head = Div(
        text=(
            f"<b>{html.escape(cmp.summary)}</b><br>"
            f"<span>a = {html.escape(a.label)} (peak {format_bytes(da.attrs['peak_a'])}), "
            f"b = {html.escape(b.label)} (peak {format_bytes(da.attrs['peak_b'])})</span>"
            + _clock_note(a, b)
        ),
        css_classes=["memprof-compare-summary"],
        sizing_mode="stretch_width",
    )
    layout = column(
        head,
        pa,
        pb,
        row(by, status),
        table,
        sizing_mode="stretch_width",
        css_classes=["memprof-compare"],
    )
    return Built(layout, rows, by)


def _grouped(cmp: ComparisonLike, tls, devs, frames) -> tuple[dict, dict]:
    """Per grouping: the diff table's columns, and the highlight series of its largest
    changes in both profiles."""
    tables, series = {}, {}
    for by in GROUPINGS:
        d = cmp.diff(by)
        tables[by] = _table_columns(d)
        keys = [str(k) for k in d.index[:HIGHLIGHT_KEYS]]
        if by == "category":
            sa, sb = _category_series(tls[0], keys), _category_series(tls[1], keys)
        else:
            sa = _key_series(cmp.a, by, keys, devs[0], frames[0])
            sb = _key_series(cmp.b, by, keys, devs[1], frames[1])
        series[by] = {k: {"a": sa[k], "b": sb[k]} for k in keys}
    return tables, series


def _diff_table(tables: dict):
    """The diff table (its rows, the table, the grouping select)."""
    rows = ColumnDataSource(dict(tables["category"]), name="memprof-compare-rows")
    cols = [
        TableColumn(field="key", title="key", width=320),
        TableColumn(field="a", title="a", width=90),
        TableColumn(field="b", title="b", width=90),
        TableColumn(field="delta", title="delta", width=90),
        TableColumn(field="ratio", title="ratio", width=70),
    ]
    table = DataTable(
        source=rows,
        columns=cols,
        height=260,
        sizing_mode="stretch_width",
        index_position=None,
        selectable=True,
        css_classes=["memprof-compare-table"],
    )
    by = Select(
        title="group the peaks by",
        value="category",
        options=list(GROUPINGS),
        width=200,
        name="memprof-compare-by",
        css_classes=["memprof-compare-by"],
    )
    return rows, table, by


def _clock_note(a, b) -> str:
    """The header's line on x axes when exactly one side is an estimate ('' otherwise)."""
    est = [side for side, p in (("a", a), ("b", b)) if p.meta.get("estimate")]
    if len(est) != 1:
        return ""
    real = "b" if est == ["a"] else "a"
    return (
        f'<br><span class="memprof-compare-clock">{est[0]} is an estimate: its x axis counts '
        f"records of the fake run, not time, so the two timelines have separate x axes "
        f"({real} in ms); compare their shapes and bytes, not their times.</span>"
    )


__all__ = ["build", "widget", "write_html", "x_axis_label"]
