"""The dashboard's timeline panel: charts, overview, filter.

Each device's chart stacks its categories' bytes, draws the total, the peak, the reserved
bytes, an estimate's limit and the steps as its :class:`.shape.Chart` says; a zoomable chart
is re-aggregated per pixel column (:mod:`.zoom`). Dragging across a chart filters the op and
allocation tables to that time range.
"""

from __future__ import annotations

from bokeh.core.properties import value
from bokeh.layouts import column, row
from bokeh.models import (
    BoxSelectTool,
    Button,
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    DataRange1d,
    Div,
    HoverTool,
    Label,
    Legend,
    LegendItem,
    Line,
    PanTool,
    Range1d,
    RangeTool,
    ResetTool,
    SaveTool,
    Scatter,
    Span,
    Step,
    Title,
    VAreaStep,
    VSpan,
    WheelZoomTool,
)

from . import data as dd
from . import js
from . import zoom as dashboard_zoom
from .kit import OVERVIEW_HEIGHT, TIMELINE_HEIGHT, bytes_ticks, cds, mark_labels, title
from .shape import Chart, Shared

_OVERVIEW_COLORS = ("#222222", "#8c564b", "#e377c2", "#7f7f7f")

#: What the time filter says when no range is picked.
FILTER_HINT = (
    "Drag across a timeline to pick a time range: the ops and blocks are filtered to it. "
    "Scroll to zoom; drag the overview's box to pan."
)


# --------------------------------------------------------------------------------------------
# 1. timeline per device, overview, time filter
# --------------------------------------------------------------------------------------------
def timeline_panel(sh: Shared):
    """The timeline of each device, the overview with its range tool, the time filter."""
    kit, v = sh.kit, sh.v
    range_tool = RangeTool(x_range=sh.x_range)
    range_tool.overlay.fill_color = "#4c72b0"
    range_tool.overlay.fill_alpha = 0.15
    overview = kit.plot(
        title="overview: drag the box to zoom",
        tools=[range_tool],
        height=OVERVIEW_HEIGHT,
        x_range=Range1d(v["x_lo"], v["x_hi"]),
        y_axis=kit.axis(visible=False),
        x_label=sh.x_label,
        toolbar_location=None,
    )
    # the dashboard on screen: window.memprofReady (the overview is in every dashboard)
    overview.js_on_change("inner_width", CustomJS(code=js.ready()))
    filters = dict(alloc_filter=sh.alloc_filter, op_filter=sh.op_filter, filter_info=sh.filter_info)
    selected = CustomJS(
        args=dict(allocs=sh.allocs, ops=sh.ops, estimate=sh.shape.estimate, **filters),
        code=js.range_selected(),
    )
    cleared = CustomJS(args=dict(filter_hint=FILTER_HINT, **filters), code=js.range_cleared())

    charts, totals = [], []
    for k, chart in enumerate(sh.shape.charts):
        src = cds(v[f"timeline{k}"], f"memprof-timeline-{chart.device}", kit)
        charts.append(_timeline_chart(sh, k, chart, src, selected, cleared))
        color = _OVERVIEW_COLORS[k % len(_OVERVIEW_COLORS)]
        step = dict(x="t", y="total", mode="after")
        if chart.zoom:  # the chart's source changes on zoom; the overview's stays whole
            src = cds(v[f"overview{k}"], f"memprof-overview-{chart.device}", kit)
        totals.append(kit.glyph(overview, src, Step, step, {"line_color": color}))
    if len(totals) > 1:  # which line is which device
        items = [
            LegendItem(label=value(c.device), renderers=[r])
            for c, r in zip(sh.shape.charts, totals)
        ]
        overview.add_layout(Legend(items=items, location="top_left", label_text_font_size="9px"))
    if not charts:
        charts.append(Div(text="<i>No memory events were recorded.</i>"))
    clear = Button(label="Clear time filter", width=140, name="memprof-clear-filter")
    clear.js_on_event("button_click", cleared)
    return column(
        title(v["timeline_title"]),
        *charts,
        overview,
        row(clear, sh.filter_info, sizing_mode="stretch_width"),
        css_classes=["memprof-timeline"],
        sizing_mode="stretch_width",
    )


def _timeline_chart(sh: Shared, k: int, chart: Chart, src, selected, cleared):
    """One device's stacked areas, total line, peak mark, legend, hover and time selection."""
    kit, v = sh.kit, sh.v
    wheel = WheelZoomTool(dimensions="width")
    ticker, formatter = bytes_ticks()
    y_range = DataRange1d(start=0, range_padding=0.15)
    if chart.limit:  # the limit in view, even above the peak
        y_range.end = v[f"y_end{k}"]
    p = kit.plot(
        title=v[f"chart_title{k}"],
        tools=[PanTool(dimensions="width"), wheel, ResetTool(), SaveTool()],
        active_scroll=wheel,
        # the legend below takes its rows out of the plot's height: add them
        height=TIMELINE_HEIGHT + 24 + 20 * -(-(len(chart.categories) + chart.reserved) // 2),
        x_range=sh.x_range,
        y_range=y_range,
        y_axis=kit.axis("bytes", ticker=ticker, formatter=formatter),
        x_label=sh.x_label,
    )
    areas = _stacked_areas(sh, k, chart, p, src)
    if chart.zoom:
        _zoom(sh, k, chart, p, src, areas)
    total_xy = dict(x="t", y="total")
    if chart.outline:
        kit.glyph(
            p, src, Step, {**total_xy, "mode": "after"}, {"line_color": "#333333", "line_width": 1}
        )
    # hover needs a glyph with hit testing: an invisible line through the same points
    # (line_policy "prev" reports the state in force, as the step draws it)
    total = kit.glyph(p, src, Line, total_xy, {"line_alpha": 0})
    _hover(sh, p, total, list(chart.categories))
    box = BoxSelectTool(dimensions="width", renderers=[total])
    p.add_tools(box)
    p.toolbar.active_drag = box
    p.js_on_event("selectiongeometry", selected)
    p.js_on_event("reset", cleared)
    if chart.peak:
        _peak_mark(sh, k, chart, p)
    if chart.limit:
        _limit_marks(sh, chart, p)
    if chart.steps:  # thin dotted lines where one step ends and the next begins
        steps = ColumnDataSource(data=v[f"steps{k}"], name=f"memprof-steps-{chart.device}")
        look = {"line_color": "#757575", "line_dash": "dotted", "line_width": 1}
        kit.glyph(p, steps, VSpan, dict(x="x"), look, unselected=look)
    return p


def _zoom(sh: Shared, k: int, chart: Chart, p, src, areas) -> None:
    """Re-aggregate the chart per pixel column when its time range changes: in the page,
    from the levels sent (``js/zoom.js``); the notebook's kernel answers a zoom beyond them
    through ``memprof-zoom-<device>`` (see :mod:`.zoom`)."""
    v = sh.v
    levels = cds(v[f"levels{k}"], f"memprof-levels-{chart.device}", sh.kit)
    request = ColumnDataSource(
        data=dashboard_zoom.empty_request(), name=dashboard_zoom.REQUEST.format(chart.device)
    )
    args = dict(
        src=src,
        levels=levels,
        request=request,
        plot=p,
        cats=list(chart.categories),
        renderers=areas,
        op_pool=v[f"op_pool{k}"],
        module_pool=v[f"module_pool{k}"],
        columns=v[f"lv_columns{k}"],
        finest=v[f"lv_finest{k}"],
        span=v[f"lv_end{k}"],
        x_range=sh.x_range,
    )
    callback = CustomJS(args=args, code=js.zoom())
    sh.x_range.js_on_change("start", callback)
    sh.x_range.js_on_change("end", callback)


def _stacked_areas(sh: Shared, k: int, chart: Chart, p, src) -> list:
    """The chart's stacked areas, one per category (a hidden one restacks the others), and
    their legend under the plot (with the reserved line, if drawn)."""
    kit = sh.kit
    areas = [
        kit.glyph(
            p,
            src,
            VAreaStep,
            dict(x="t", y1=f"lo_{c}", y2=f"hi_{c}", step_mode="after"),
            {"fill_color": dd.CATEGORY_COLORS[c], "fill_alpha": 0.85},
            visible=shown,
        )
        for c, shown in zip(chart.categories, chart.visible)
    ]
    cats = list(chart.categories)
    restack = CustomJS(args=dict(src=src, cats=cats, renderers=areas), code=js.restack())
    for r in areas:
        r.js_on_change("visible", restack)
    items = [LegendItem(label=c, renderers=[r]) for c, r in zip(cats, areas)]
    if chart.reserved:
        items.append(_reserved_line(sh, k, chart, p))
    if areas:
        # under the plot, in columns: at the plot's right it took a narrow panel's room
        legend = Legend(
            items=items,
            click_policy="hide",
            title="click to hide/show",
            orientation="horizontal",
            ncols=2,  # two: three ran out of a 400 px panel on the left
            label_text_font_size="11px",
            glyph_width=14,
            glyph_height=14,
        )
        p.add_layout(legend, "below")
    return areas


def _hover(sh: Shared, p, total, cats: list[str]) -> None:
    """The hover of a timeline chart on its ``total`` line: the time, the total, each
    category's bytes, the op and module running then."""
    bytes_fmt = CustomJSHover(code=js.bytes_hover())
    when = ("position", "@t{0}") if sh.shape.estimate else ("time", "@t{0.000} ms")
    tooltips = [when, ("total", "@total{custom}")]
    tooltips += [(c, f"@b_{c}{{custom}}") for c in cats]
    tooltips += [("op", "@op"), ("module", "@module")]
    formatters = {"@total": bytes_fmt, **{f"@b_{c}": bytes_fmt for c in cats}}
    p.add_tools(
        HoverTool(
            renderers=[total],
            mode="vline",
            tooltips=tooltips,
            formatters=formatters,
            point_policy="snap_to_data",
            line_policy="prev",
        )
    )


def _peak_mark(sh: Shared, k: int, chart: Chart, p) -> None:
    """The peak: a dashed line and a triangle at it, and its text under the title."""
    kit, v = sh.kit, sh.v
    x = v[f"peak_x{k}"]
    p.add_layout(Span(location=x, dimension="height", line_color="#000000", line_dash="dashed"))
    peak = ColumnDataSource(data=v[f"peak{k}"], selection_policy=kit.union)
    black = {"line_color": "black", "fill_color": "black", "hatch_color": "black"}
    kit.glyph(p, peak, Scatter, dict(x="x", y="y", marker="inverted_triangle", size=12), black)
    # said under the title, where it always fits: next to the mark, a label ran out of a
    # narrow plot on one side or the other
    p.add_layout(
        Title(
            text=v[f"peak_text{k}"],
            text_font_size="11px",
            text_font_style="normal",
            name=f"memprof-peak-{chart.device}",
        ),
        "above",
    )


def _reserved_line(sh: Shared, k: int, chart: Chart, p) -> LegendItem:
    """The caching allocator's reserved bytes: one dashed step line over the stacked live
    bytes (the gap between them is the allocator's cache and fragmentation); its legend
    item."""
    src = cds(sh.v[f"reserved{k}"], f"memprof-reserved-{chart.device}", sh.kit)
    line = sh.kit.glyph(
        p,
        src,
        Step,
        {"x": "x", "y": "y", "mode": "after"},
        {"line_color": "#6a1b9a", "line_width": 2, "line_dash": "dashed"},
    )
    return LegendItem(label=sh.v[f"reserved_label{k}"], renderers=[line])


def _limit_marks(sh: Shared, chart: Chart, p) -> None:
    """An estimate's memory limit (a horizontal line) and where it was first exceeded."""
    v = sh.v
    p.add_layout(
        Span(
            location=v["limit"],
            dimension="width",
            line_color="#d32f2f",
            line_dash="dotted",
            line_width=2,
            name=f"memprof-limit-{chart.device}",
        )
    )
    p.add_layout(
        Label(
            x=0,
            y=v["limit_label_y"],
            text=v["limit_text"],
            text_font_size="11px",
            text_color="#d32f2f",
            x_offset=4,
            y_offset=2,
        )
    )
    if chart.oom:
        p.add_layout(
            Span(
                location=v["oom_x"],
                dimension="height",
                line_color="#d32f2f",
                line_width=2,
                name=f"memprof-oom-{chart.device}",
            )
        )
        mark_labels(
            p, "oom_text", v, gap=6, x=v["oom_x"], y=v["limit"], text_font_size="11px",
            text_color="#d32f2f", y_offset=-16,
        )  # fmt: skip
