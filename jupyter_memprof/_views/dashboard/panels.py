"""The panels: the Bokeh models of a dashboard of one shape.

A dashboard is a :class:`Shape` (what its models are: the charts, each chart's marks) and
values (texts, numbers, the data sources' columns, by name: see ``dashboard._spec``).
:func:`build_layout` makes the models of both; the panels, top to bottom: the timeline per
device with its overview and time filter, the op tree and op table, the allocations and their
lifetimes, the lineage of the clicked block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bokeh.core.properties import value
from bokeh.layouts import column, row
from bokeh.models import (
    BooleanFilter,
    BoxSelectTool,
    Button,
    CDSView,
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    DataRange1d,
    Div,
    HoverTool,
    Label,
    LayoutDOM,
    Legend,
    LegendItem,
    Line,
    PanTool,
    Quad,
    Range1d,
    RangeTool,
    ResetTool,
    SaveTool,
    Scatter,
    Segment,
    Span,
    Step,
    TapTool,
    Title,
    VAreaStep,
    VSpan,
    WheelZoomTool,
)
from bokeh.transform import dodge

from . import data as dd
from . import js
from . import zoom as dashboard_zoom
from .kit import (
    OVERVIEW_HEIGHT,
    TIMELINE_HEIGHT,
    Kit,
    bytes_ticks,
    cds,
    color_key,
    data_table,
    mark_labels,
    title,
    title_text,
)

_OVERVIEW_COLORS = ("#222222", "#8c564b", "#e377c2", "#7f7f7f")


_OP_HINT = (
    "Click an op (or a row of the op table) to see its forward/backward partner and the "
    "blocks it allocated."
)
_LIN_HINT = "Click a block in the allocations table or a lifetime bar to see its lineage."
_FILTER_HINT = (
    "Drag across a timeline to pick a time range: the ops and blocks are filtered to it. "
    "Scroll to zoom; drag the overview's box to pan."
)


#: The tables' columns: (field, title, width in pixels), the key ones first (a narrow panel
#: shows those and scrolls sideways to the rest, as the hint above each table says).
_OP_TABLE = (
    ("name", "op", 220),
    ("self_txt", "self alloc", 80),
    ("total_txt", "total alloc", 80),
    ("phase", "phase", 70),
    ("dur_txt", "duration", 80),
    ("module", "module", 150),
    ("callsite", "callsite", 200),
    ("start_txt", "start", 80),
    ("kind", "kind", 70),
)
_ALLOC_TABLE = (
    ("size_txt", "size", 75),
    ("name", "name", 220),
    ("category", "category", 105),
    ("op", "op", 150),
    ("lifetime", "lifetime", 90),
    ("at_peak", "at peak", 55),
    ("module", "module", 120),
    ("device", "device", 55),
)
#: Said above each table: its columns keep their widths and scroll sideways.
SCROLL_HINT = (
    "<span style='font-size:11px;color:#666'>The table scrolls: sideways for more "
    "columns, down for more rows.</span>"
)
_LINEAGE_TABLE = (
    ("t_txt", "time", 80),
    ("op_name", "op", 230),
    ("relation", "relation", 120),
    ("version", "version", 50),
    ("category", "category", 100),
    ("phase", "phase", 70),
    ("module", "module", 120),
    ("callsite", "callsite", 200),
)
#: The lineage table's fields: the contract's lineage columns, as text.
LINEAGE_VIEW_COLUMNS = tuple(field for field, _, _ in _LINEAGE_TABLE)


@dataclass
class Built:
    """A built dashboard: the Bokeh layout and the models the Python side reads (for a
    :func:`page`, whose views exist only in the browser: a stand-in for its root and the
    data sources)."""

    layout: LayoutDOM
    ops: ColumnDataSource  # the shown ops
    allocs: ColumnDataSource  # the listed blocks (then the summarised rows)
    lineage: ColumnDataSource  # the lineage on show
    lineage_all: ColumnDataSource  # every listed block's lineage (encoded)
    lineage_pool: list[str]  # the strings lineage_all's codes point into
    #: zoomable charts' sources the kernel holds (:mod:`.zoom`), by device
    zoom: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Chart:
    """What one device's timeline chart is, apart from the values it shows."""

    device: str
    categories: tuple[str, ...]  # with any bytes on the device, in display order
    visible: tuple[bool, ...]  # per category: stacked (else hidden until its legend is clicked)
    peak: bool = False  # the peak is marked, and said under the title
    reserved: bool = False  # the caching allocator's reserved bytes are drawn
    outline: bool = True  # the total is drawn as a line (not over thousands of steps)
    limit: bool = False  # an estimate's memory limit is drawn
    oom: bool = False  # and where it was first exceeded, on this device
    steps: bool = False  # the boundaries between steps are marked (a capture of a loop)
    zoom: bool = False  # re-aggregated per pixel column on zoom (more states than drawn)
    # Which side of its mark a label goes (left late in the run, to stay inside the plot)
    # depends on where the mark is: a value (see _beside), not part of the shape.


@dataclass(frozen=True)
class Shape:
    """What a dashboard's models are, apart from the values they show: two dashboards of one
    shape differ only in texts, numbers and data (see :func:`page`)."""

    estimate: bool  # an estimate's clock counts records of its fake run, not ms
    charts: tuple[Chart, ...]


@dataclass
class Shared:
    """The models several views share (the time axis, the sources, filters and messages),
    and what the dashboard shows: its shape and values (see :func:`_spec`)."""

    shape: Shape
    v: dict  # the values, by name
    kit: Kit
    x_range: Range1d
    ops: ColumnDataSource
    allocs: ColumnDataSource
    flows: ColumnDataSource
    lin_all: ColumnDataSource
    lin_view: ColumnDataSource
    op_filter: BooleanFilter
    alloc_filter: BooleanFilter
    op_info: Div
    lin_info: Div
    filter_info: Div

    @property
    def x_label(self) -> str:
        """The time axis' label: ms, or an estimate's positions in its run."""
        if self.shape.estimate:  # a fake run has no wall time: one "ms" per record
            return "position in the run (op sequence): an estimate"
        return "ms since capture start"


def build_layout(shape: Shape, v: dict, *, header: bool) -> Built:
    """The models of a dashboard of ``shape`` showing the values ``v`` (:func:`_spec`)."""
    kit = Kit()
    sh = Shared(
        shape=shape,
        v=v,
        kit=kit,
        x_range=Range1d(v["x_lo"], v["x_hi"], bounds=(v["x_lo"], v["x_hi"]), name="memprof-time"),
        ops=cds(v["ops"], "memprof-ops", kit),
        allocs=cds(v["allocs"], "memprof-allocations", kit),
        flows=cds(v["flows"], "memprof-flows", kit),
        lin_all=cds(v["lineage_all"], "memprof-lineage-all", kit),
        lin_view=cds({k: [] for k in LINEAGE_VIEW_COLUMNS}, "memprof-lineage", kit),
        op_filter=BooleanFilter(name="memprof-ops-filter"),
        alloc_filter=BooleanFilter(name="memprof-allocations-filter"),
        op_info=Div(text=_OP_HINT, name="memprof-op-info", sizing_mode="stretch_width"),
        lin_info=Div(text=_LIN_HINT, name="memprof-lineage-info", sizing_mode="stretch_width"),
        filter_info=Div(text=_FILTER_HINT, name="memprof-filter-info", sizing_mode="stretch_width"),
    )
    top = (
        [Div(text=v["header"], sizing_mode="stretch_width", name="memprof-header")]
        if header
        else []
    )
    layout = column(
        *top,
        _timeline_panel(sh),
        _op_panel(sh),
        # one above the other, each the full width: side by side, each table got half a
        # panel's width and cut its columns
        _allocation_panel(sh),
        _lineage_panel(sh),
        sizing_mode="stretch_width",
        css_classes=["memprof-dashboard"],
        name="memprof-dashboard",
    )
    common = dict(
        uid=v["uid"],
        ops=sh.ops,
        allocs=sh.allocs,
        flows=sh.flows,
        lin_all=sh.lin_all,
        lin_view=sh.lin_view,
        pool=v["pool"],
        op_info=sh.op_info,
        lin_info=sh.lin_info,
        op_hint=_OP_HINT,
        lin_hint=_LIN_HINT,
        estimate=shape.estimate,
    )
    sh.ops.selected.js_on_change("indices", CustomJS(args=common, code=js.op_selected()))
    sh.allocs.selected.js_on_change("indices", CustomJS(args=common, code=js.alloc_selected()))
    return Built(layout, sh.ops, sh.allocs, sh.lin_view, sh.lin_all, v["pool"])


def _scroll_hint(name: str) -> Div:
    return Div(text=SCROLL_HINT, sizing_mode="stretch_width", name=name)


# --------------------------------------------------------------------------------------------
# 1. timeline per device, overview, time filter
# --------------------------------------------------------------------------------------------
def _timeline_panel(sh: Shared):
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
    cleared = CustomJS(args=dict(filter_hint=_FILTER_HINT, **filters), code=js.range_cleared())

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


# --------------------------------------------------------------------------------------------
# 2-3. op tree with forward -> backward links, and the op table
# --------------------------------------------------------------------------------------------
def _op_panel(sh: Shared):
    """The op tree (ops by time and depth, forward -> backward links) and the op table."""
    kit, v = sh.kit, sh.v
    wheel = WheelZoomTool(dimensions="width")
    tree = kit.plot(
        title="ops by time and nesting depth",
        tools=[PanTool(dimensions="width"), wheel, ResetTool()],
        active_scroll=wheel,
        height=v["tree_height"],
        x_range=sh.x_range,
        y_range=Range1d(v["tree_rows"], 0),
        y_axis=kit.axis("depth"),
        y_grid=False,
        x_label=sh.x_label,
    )
    quads = kit.glyph(
        tree,
        sh.ops,
        Quad,
        dict(left="left", right="right", top="top", bottom="bottom"),
        {"fill_color": "color", "line_color": "color", "fill_alpha": 0.85},
        selected={"fill_alpha": 1.0, "line_color": "#000000", "line_width": 2},
        unselected={"fill_alpha": 0.25, "line_alpha": 0.25},
        view=CDSView(filter=sh.op_filter),
    )
    links = kit.glyph(
        tree,
        sh.flows,
        Segment,
        dict(x0="x0", y0="y0", x1="x1", y1="y1"),
        {"line_color": "#777777", "line_alpha": 0.35},
        selected={"line_color": "#000000", "line_alpha": 1.0, "line_width": 2.5},
        unselected={"line_alpha": 0.15},
    )
    op_tips = [
        ("op", "@name"),
        ("kind", "@kind"),
        ("phase", "@phase"),
        ("module", "@module"),
        ("callsite", "@callsite"),
        ("start", "@start_txt"),
        ("duration", "@dur_txt"),
        ("self bytes", "@self_txt"),
        ("total bytes", "@total_txt"),
    ]
    link_tips = [("forward", "@fname"), ("backward", "@bname"), ("seq_nr", "@seq_nr")]
    tree.add_tools(
        HoverTool(renderers=[quads], tooltips=op_tips),
        HoverTool(renderers=[links], tooltips=link_tips),
        # clicking an op always selects it (the default "toggle" would unselect a partner)
        TapTool(renderers=[quads], mode="replace"),
    )
    op_table = data_table(
        sh.kit,
        sh.ops,
        _OP_TABLE,
        height=220,
        view=CDSView(filter=sh.op_filter),
        scroll_to_selection=True,
        css_classes=["memprof-optable"],
        name="memprof-optable",
    )
    key = color_key("colour: phase", dd.PHASE_COLORS, dd.PHASE_COLORS)
    key = key.replace("</div>", "; grey lines link forward ops to their backward ops</div>")
    return column(
        title(v["ops_title"]),
        Div(text=key, sizing_mode="stretch_width", name="memprof-phase-key"),
        tree,
        sh.op_info,
        _scroll_hint("memprof-optable-hint"),
        op_table,
        css_classes=["memprof-optree"],
        sizing_mode="stretch_width",
    )


# --------------------------------------------------------------------------------------------
# 4. allocations: table and lifetimes
# --------------------------------------------------------------------------------------------
def _allocation_panel(sh: Shared):
    """The listed blocks as a table and their lifetimes as bars."""
    table = data_table(
        sh.kit,
        sh.allocs,
        _ALLOC_TABLE,
        view=CDSView(filter=sh.alloc_filter),
        scroll_to_selection=True,
        name="memprof-allocations-table",
    )
    kit = sh.kit
    wheel = WheelZoomTool(dimensions="width")
    life = kit.plot(
        title="lifetimes of the listed blocks",
        tools=[PanTool(dimensions="width"), wheel, WheelZoomTool(dimensions="height"), ResetTool()],
        active_scroll=wheel,
        height=260,
        x_range=sh.x_range,
        y_range=Range1d(sh.v["lanes"], -1),
        y_axis=kit.axis(visible=False),
        y_grid=False,
        x_label=sh.x_label,
    )
    bars = kit.glyph(
        life,
        sh.allocs,
        Quad,
        dict(left="x0", right="x1", top=dodge("y", -0.45), bottom=dodge("y", 0.45)),
        {"fill_color": "color", "line_color": "color"},
        selected={"line_color": "#000000", "line_width": 2},
        unselected={"fill_alpha": 0.25, "line_alpha": 0.25},
        view=CDSView(filter=sh.alloc_filter),
    )
    tips = [
        ("block", "@name"),
        ("size", "@size_txt"),
        ("category", "@category"),
        ("op", "@op"),
        ("module", "@module"),
        ("lifetime", "@lifetime"),
    ]
    life.add_tools(
        HoverTool(renderers=[bars], tooltips=tips), TapTool(renderers=[bars], mode="replace")
    )
    return column(
        title(sh.v["allocs_title"]),
        _scroll_hint("memprof-allocations-hint"),
        table,
        Div(text=sh.v["lifetime_key"], sizing_mode="stretch_width", name="memprof-category-key"),
        life,
        css_classes=["memprof-allocations"],
        sizing_mode="stretch_width",
    )


# --------------------------------------------------------------------------------------------
# 5. lineage of the clicked block
# --------------------------------------------------------------------------------------------
def _lineage_panel(sh: Shared):
    """The lineage of the clicked block (filled in the browser)."""
    table = data_table(
        sh.kit,
        sh.lin_view,
        _LINEAGE_TABLE,
        selectable=False,
        name="memprof-lineage-table",
    )
    return column(
        title(title_text("Lineage")),
        sh.lin_info,
        _scroll_hint("memprof-lineage-hint"),
        table,
        css_classes=["memprof-lineage"],
        sizing_mode="stretch_width",
    )
