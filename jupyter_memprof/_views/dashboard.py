"""The dashboard: linked Bokeh views of one profile, in a notebook or as one HTML file.

Views (each carries a CSS class that tests and users' scripts can find it by):

- ``memprof-timeline``: live bytes per category over time, one stacked chart per device, with
  the peak marked, a legend that hides/shows categories, an overview with a range tool, and a
  box select along time that filters the op tree and the allocations;
- ``memprof-optree``: ops by time and nesting depth, coloured by phase, with forward -> backward
  links; clicking an op highlights its partner op(s) and the blocks it allocated; plus the
  same ops as a table;
- ``memprof-allocations``: the blocks, largest first, and their lifetimes as bars;
- ``memprof-lineage``: the lineage of the clicked block (the columns of ``prof.lineage``),
  whose creating op and backward ops are highlighted in the op tree.

All linking happens in the browser (shared ColumnDataSources, and CustomJS whose code is in
``_views/js/``, see :mod:`.dashboard_js`), so the notebook widget and the exported file behave
the same. What is shown is cut to a level of detail a browser holds comfortably;
:mod:`.dashboard_data` says how.
"""

from __future__ import annotations

import html
import itertools
import os
import weakref
from dataclasses import dataclass

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import (
    AdaptiveTicker,
    AllIndices,
    AllLabels,
    BooleanFilter,
    BoxSelectTool,
    Button,
    CDSView,
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    CustomJSTickFormatter,
    DataTable,
    Div,
    HoverTool,
    Label,
    LayoutDOM,
    Legend,
    LegendItem,
    Range1d,
    RangeTool,
    Span,
    StringEditor,
    StringFormatter,
    TableColumn,
    TapTool,
    UnionRenderers,
)
from bokeh.plotting import figure
from bokeh.transform import dodge

from .._units import format_bytes
from . import dashboard_data as dd
from . import dashboard_js as js

TIMELINE_HEIGHT = 250
OVERVIEW_HEIGHT = 90
TABLE_HEIGHT = 280
ROW_HEIGHT = 24
_OVERVIEW_COLORS = ("#222222", "#8c564b", "#e377c2", "#7f7f7f")

_ids = itertools.count(1)

# the lineage table's columns: the contract's lineage columns, as text
LINEAGE_VIEW_COLUMNS = (
    "t_txt",
    "op_name",
    "relation",
    "version",
    "category",
    "phase",
    "module",
    "callsite",
)

_OP_HINT = (
    "Click an op (or a row of the op table) to see its forward/backward partner and the "
    "blocks it allocated."
)
_LIN_HINT = "Click a block in the allocations table or a lifetime bar to see its lineage."
_FILTER_HINT = (
    "Drag across a timeline to pick a time range: the ops and blocks are filtered to it. "
    "Scroll to zoom; drag the overview's box to pan."
)


@dataclass
class Built:
    """A built dashboard: the Bokeh layout and the models the Python side reads."""

    layout: LayoutDOM
    ops: ColumnDataSource  # the shown ops
    allocs: ColumnDataSource  # the listed blocks (then the summarised rows)
    lineage: ColumnDataSource  # the lineage on show
    lineage_all: ColumnDataSource  # every listed block's lineage (encoded)
    lineage_pool: list[str]  # the strings lineage_all's codes point into


class _Kit:
    """Stateless models every view of one dashboard shares instead of one each (Bokeh makes
    a new one per table column, axis, data source and renderer by default): fewer models to
    build and to send, the same page."""

    def __init__(self) -> None:
        self.editor = StringEditor()  # tables are not editable: never shown
        self.text = StringFormatter()
        self.union = UnionRenderers()
        self.everything = AllIndices()
        self.labels = AllLabels()

    def slim(self, p) -> None:
        """Share the kit in figure ``p``: its renderers' filters and sources' selection
        policies, its axes' label policies; renderers that are never muted (legends hide)
        get Bokeh's automatic muted glyph instead of a model of their own."""
        for r in p.renderers:
            r.muted_glyph = "auto"
            if isinstance(r.view.filter, AllIndices):
                r.view.filter = self.everything
            r.data_source.selection_policy = self.union
        for axis in (*p.xaxis, *p.yaxis):
            axis.major_label_policy = self.labels


@dataclass
class _Shared:
    """The models several views share: the time axis, the sources, filters and messages."""

    uid: str
    end_ms: float
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
    kit: _Kit
    x_label: str = "ms since capture start"
    estimate: bool = False
    limit: int | None = None  # an estimate's memory limit (bytes), drawn on its device
    oom: tuple[str, float] | None = None  # (device, x) where an estimate went over it


def _cds(columns: dict, name: str, kit: _Kit | None = None) -> ColumnDataSource:
    """A ColumnDataSource; numeric columns as numpy arrays (sent as compact binary), text
    columns as numpy arrays of ``str`` (sent as one plain list, not encoded item by item)."""
    data = {}
    for k, v in columns.items():
        arr = v if isinstance(v, np.ndarray) else None
        if arr is None and len(v):
            kinds = {type(x) for x in v}
            if kinds <= {int, np.int32, np.int64}:
                arr = np.asarray(v, dtype="int64")
            elif kinds <= {int, float, np.int64, np.float64}:
                arr = np.asarray(v, dtype="float64")
            elif kinds <= {str, np.str_}:
                arr = np.asarray(v, dtype=str)
        if arr is None or not len(arr) or arr.dtype.kind not in "iufU":
            data[k] = list(v)
        elif arr.dtype.kind == "U":
            data[k] = arr
        elif arr.dtype.kind in "iu" and np.abs(arr).max() < 2**31:
            data[k] = arr.astype("int32")
        elif arr.dtype == np.float32:
            data[k] = arr
        else:
            data[k] = arr.astype("float64")
    if kit is None:
        return ColumnDataSource(data=data, name=name)
    return ColumnDataSource(data=data, name=name, selection_policy=kit.union)


def _header_html(prof) -> str:
    try:
        from .summary import summary_html

        return summary_html(prof)
    except Exception:  # the summary is not available: a minimal header instead
        label = html.escape(prof.label)
        devs = ", ".join(html.escape(d) for d in prof.devices) or "no device"
        return (
            f"<h2 style='margin:4px 0'>{label}</h2>"
            f"<div>{len(prof.ops):,} ops, {len(prof.allocations):,} blocks on {devs}</div>"
        )


def _title(text: str, note: str = "") -> Div:
    """A section heading (``text`` is ours; ``note`` is escaped here)."""
    extra = f" <span style='color:#666;font-weight:normal'>{html.escape(note)}</span>"
    return Div(
        text=f"<div style='font-size:15px;font-weight:600;margin:10px 0 2px'>{text}"
        f"{extra if note else ''}</div>",
        sizing_mode="stretch_width",
    )


def _table(kit: _Kit, source, columns, *, height=TABLE_HEIGHT, **kwargs) -> DataTable:
    """A DataTable whose every cell is plain text (StringFormatter escapes it)."""
    return DataTable(
        source=source,
        columns=[
            TableColumn(
                field=field, title=title, formatter=kit.text, editor=kit.editor, width=width
            )
            for field, title, width in columns
        ],
        height=height,
        row_height=ROW_HEIGHT,
        index_position=None,
        reorderable=False,
        sortable=False,
        sizing_mode="stretch_width",
        **kwargs,
    )


def _bytes_axis(axis) -> None:
    """Byte ticks at round binary steps (16 KiB, 32 KiB, ...) labelled in binary units."""
    axis.ticker = AdaptiveTicker(base=2, mantissas=[1], min_interval=1, desired_num_ticks=6)
    axis.formatter = CustomJSTickFormatter(code=js.bytes_tick())


def build(
    prof,
    device: str | None = None,
    categories: list[str] | None = None,
    *,
    header: bool = True,
) -> Built:
    """Build the linked Bokeh views of ``prof`` (optionally one device / some categories;
    ``header=False`` leaves out the summary at the top)."""
    cats = list(categories) if categories is not None else None
    shown = _shown(prof, device, cats)
    win, sel, ops, acols, pool = shown.win, shown.sel, shown.ops, shown.acols, shown.pool
    lcols, timelines = shown.lcols, shown.timelines

    end_ms = max(win.end_ms, 1e-6)
    pad = end_ms * 0.01
    kit = _Kit()
    sh = _Shared(
        kit=kit,
        uid=f"memprof-{os.getpid()}-{next(_ids)}",
        end_ms=end_ms,
        x_range=Range1d(-pad, end_ms + pad, bounds=(-pad, end_ms + pad), name="memprof-time"),
        ops=_cds(ops.columns, "memprof-ops", kit),
        allocs=_cds(acols, "memprof-allocations", kit),
        flows=_cds(shown.flows, "memprof-flows", kit),
        lin_all=_cds(lcols, "memprof-lineage-all", kit),
        lin_view=_cds({k: [] for k in LINEAGE_VIEW_COLUMNS}, "memprof-lineage", kit),
        op_filter=BooleanFilter(name="memprof-ops-filter"),
        alloc_filter=BooleanFilter(name="memprof-allocations-filter"),
        op_info=Div(text=_OP_HINT, name="memprof-op-info", sizing_mode="stretch_width"),
        lin_info=Div(text=_LIN_HINT, name="memprof-lineage-info", sizing_mode="stretch_width"),
        filter_info=Div(text=_FILTER_HINT, name="memprof-filter-info", sizing_mode="stretch_width"),
    )
    if prof.meta.get("estimate"):
        # a fake run has no wall time: its clock counts records (one "ms" per record)
        sh.estimate, sh.x_label = True, "position in the run (op sequence): an estimate"
        sh.limit = prof.meta.get("limit")
        oom = prof.meta.get("oom")
        if oom:
            sh.oom = (str(oom["device"]), float(win.ms([int(oom["time_ns"])])[0]))
    top = [Div(text=_header_html(prof), sizing_mode="stretch_width", name="memprof-header")]
    layout = column(
        *(top if header else []),
        _timeline_panel(sh, timelines, cats),
        _op_panel(sh, ops),
        row(_allocation_panel(sh, sel), _lineage_panel(sh), sizing_mode="stretch_width"),
        sizing_mode="stretch_width",
        css_classes=["memprof-dashboard"],
        name="memprof-dashboard",
    )
    common = dict(
        uid=sh.uid,
        ops=sh.ops,
        allocs=sh.allocs,
        flows=sh.flows,
        lin_all=sh.lin_all,
        lin_view=sh.lin_view,
        pool=pool,
        op_info=sh.op_info,
        lin_info=sh.lin_info,
        op_hint=_OP_HINT,
        lin_hint=_LIN_HINT,
        estimate=sh.estimate,
    )
    sh.ops.selected.js_on_change("indices", CustomJS(args=common, code=js.op_selected()))
    sh.allocs.selected.js_on_change("indices", CustomJS(args=common, code=js.alloc_selected()))
    return Built(layout, sh.ops, sh.allocs, sh.lin_view, sh.lin_all, pool)


@dataclass
class _Shown:
    """What a dashboard of one profile shows (:mod:`.dashboard_data`), before any model."""

    win: dd.Window
    sel: dd.Allocations
    ops: dd.Ops
    acols: dict
    lcols: dict
    pool: list[str]
    flows: dict
    timelines: list[dd.Timeline]


# The last profile's selection, reused while that profile lives: the dashboard under a cell,
# then ``prof.to_html`` (or ``prof.show()`` again) choose the same rows. It holds only what the
# views derived, never a table or the profile: weak references tell whether the profile and
# each of its tables are still the very same objects, and the profile's death drops it.
_last: list = []


def _key(prof, device: str | None, cats: list[str] | None) -> tuple:
    """What the selection depends on besides the tables: the choice, the window, the clock."""
    meta = prof.meta
    return (
        device,
        None if cats is None else tuple(cats),
        prof.start_ns,
        prof.end_ns,
        bool(meta.get("estimate")),
        meta.get("limit"),
    )


def _reusable(prof, key: tuple) -> bool:
    if not _last:
        return False
    ref, old_key, tables = _last[0], _last[1], _last[2]
    if ref() is not prof or old_key != key:
        return False
    now = prof.tables
    return tables.keys() == now.keys() and all(tables[k]() is now[k] for k in now)


def _remember(prof, key: tuple, shown: _Shown) -> None:
    def dropped(ref) -> None:  # the profile died: its selection goes with it
        if _last and _last[0] is ref:
            _last.clear()

    try:
        ref = weakref.ref(prof, dropped)
        tables = {k: weakref.ref(df) for k, df in prof.tables.items()}
    except TypeError:  # a profile-like object without weak references: no reuse
        return
    _last[:] = [ref, key, tables, shown]


def _shown(prof, device: str | None, cats: list[str] | None) -> _Shown:
    key = _key(prof, device, cats)
    if _reusable(prof, key):
        return _last[3]
    forget(None)
    win = dd.window(prof)
    devs = [device] if device is not None else prof.devices
    peaks = {dev: dd.peak_or_none(prof, dev) for dev in devs}
    sel = dd.select_allocations(prof, device, cats, peaks=peaks)
    alloc_ids = sel.table["alloc_id"].astype("int64").tolist()
    lin = dd.lineage_rows(prof, alloc_ids)
    ops = dd.select_ops(prof, win, dd.must_show_ops(sel, lin, dd.OP_BUDGET // 2))
    acols = dd.allocation_columns(prof, sel, ops, win)
    lcols, pool, lin0, lin1 = dd.lineage_columns(prof, lin, alloc_ids, ops, win)
    acols["lin0"] = np.asarray(lin0 + [0] * len(sel.summarised), dtype=np.int64)
    acols["lin1"] = np.asarray(lin1 + [0] * len(sel.summarised), dtype=np.int64)
    shown = _Shown(
        win,
        sel,
        ops,
        acols,
        lcols,
        pool,
        dd.flow_columns(prof, ops),
        [dd.timeline(prof, dev, win, peak=peaks[dev]) for dev in devs],
    )
    _remember(prof, key, shown)
    return shown


def forget(prof=None) -> None:
    """Drop the reused selection of ``prof`` (of any profile when None)."""
    if _last and (prof is None or _last[0]() is prof or _last[0]() is None):
        _last.clear()


# --------------------------------------------------------------------------------------------
# 1. timeline per device, overview, time filter
# --------------------------------------------------------------------------------------------
def _timeline_panel(sh: _Shared, timelines: list[dd.Timeline], cats: list[str] | None):
    pad = sh.x_range.end - sh.end_ms
    overview = figure(
        height=OVERVIEW_HEIGHT,
        sizing_mode="stretch_width",
        x_range=Range1d(-pad, sh.end_ms + pad),
        toolbar_location=None,
        tools="",
        title="overview: drag the box to zoom every view",
    )
    overview.yaxis.visible = False
    overview.xaxis.axis_label = sh.x_label
    range_tool = RangeTool(x_range=sh.x_range)
    range_tool.overlay.fill_color = "#4c72b0"
    range_tool.overlay.fill_alpha = 0.15
    overview.add_tools(range_tool)
    filters = dict(alloc_filter=sh.alloc_filter, op_filter=sh.op_filter, filter_info=sh.filter_info)
    selected = CustomJS(
        args=dict(allocs=sh.allocs, ops=sh.ops, estimate=sh.estimate, **filters),
        code=js.range_selected(),
    )
    cleared = CustomJS(args=dict(filter_hint=_FILTER_HINT, **filters), code=js.range_cleared())

    charts = []
    for k, tl in enumerate(timelines):
        visible = [c for c in tl.categories if cats is None or c in cats]
        dd.stack(tl.columns, tl.categories, visible)
        src = _cds(tl.columns, f"memprof-timeline-{tl.device}", sh.kit)
        charts.append(_timeline_chart(sh, tl, src, visible, selected, cleared))
        overview.step(
            x="t",
            y="total",
            source=src,
            mode="after",
            line_color=_OVERVIEW_COLORS[k % len(_OVERVIEW_COLORS)],
            **({"legend_label": tl.device} if len(timelines) > 1 else {}),
        )
    sh.kit.slim(overview)
    if overview.legend:
        overview.legend.location = "top_left"
        overview.legend.label_text_font_size = "9px"
    if not charts:
        charts.append(Div(text="<i>No memory events were recorded.</i>"))
    clear = Button(label="Clear time filter", width=140, name="memprof-clear-filter")
    clear.js_on_event("button_click", cleared)
    return column(
        _title("Memory over time"),
        *charts,
        overview,
        row(clear, sh.filter_info, sizing_mode="stretch_width"),
        css_classes=["memprof-timeline"],
        sizing_mode="stretch_width",
    )


def _timeline_chart(sh, tl: dd.Timeline, src, visible, selected, cleared):
    """One device's stacked areas, total line, peak mark, legend, hover and time selection."""
    points = len(tl.columns["t"])
    note = f"{tl.points_in:,} points" + (f", {points:,} drawn" if points < tl.points_in else "")
    p = figure(
        height=TIMELINE_HEIGHT,
        sizing_mode="stretch_width",
        x_range=sh.x_range,
        tools="xpan,xwheel_zoom,reset,save",
        active_scroll="xwheel_zoom",
        title=f"{tl.device}: live memory by category ({note}); drag to pick a time range",
    )
    p.yaxis.axis_label = "bytes"
    p.y_range.start = 0
    p.y_range.range_padding = 0.15
    p.xaxis.axis_label = sh.x_label
    _bytes_axis(p.yaxis[0])
    areas = [
        p.varea_step(
            x="t",
            y1=f"lo_{c}",
            y2=f"hi_{c}",
            step_mode="after",
            source=src,
            fill_color=dd.CATEGORY_COLORS[c],
            fill_alpha=0.85,
            visible=c in visible,
        )
        for c in tl.categories
    ]
    restack = CustomJS(args=dict(src=src, cats=tl.categories, renderers=areas), code=js.restack())
    for r in areas:
        r.js_on_change("visible", restack)
    if areas:
        legend = Legend(
            items=[LegendItem(label=c, renderers=[r]) for c, r in zip(tl.categories, areas)],
            click_policy="hide",
            location="top_left",
            title="click to hide/show",
        )
        p.add_layout(legend, "right")
    p.step(x="t", y="total", source=src, mode="after", line_color="#333333", line_width=1)
    # hover needs a glyph with hit testing: an invisible line through the same points
    # (line_policy "prev" reports the state in force, as the step draws it)
    total = p.line(x="t", y="total", source=src, line_alpha=0)
    bytes_fmt = CustomJSHover(code=js.bytes_hover())
    when = ("position", "@t{0}") if sh.estimate else ("time", "@t{0.000} ms")
    tooltips = [when, ("total", "@total{custom}")]
    tooltips += [(c, f"@b_{c}{{custom}}") for c in tl.categories]
    tooltips += [("op", "@op"), ("module", "@module")]
    formatters = {"@total": bytes_fmt, **{f"@b_{c}": bytes_fmt for c in tl.categories}}
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
    box = BoxSelectTool(dimensions="width", renderers=[total])
    p.add_tools(box)
    p.toolbar.active_drag = box
    p.js_on_event("selectiongeometry", selected)
    p.js_on_event("reset", cleared)
    if tl.peak_ms is not None:
        p.add_layout(
            Span(location=tl.peak_ms, dimension="height", line_color="#000000", line_dash="dashed")
        )
        p.scatter(
            x=[tl.peak_ms], y=[tl.peak_bytes], marker="inverted_triangle", size=12, color="black"
        )
        late = tl.peak_ms > 0.6 * sh.end_ms  # keep the label inside the plot
        p.add_layout(
            Label(
                x=tl.peak_ms,
                y=tl.peak_bytes,
                text=f"peak {format_bytes(tl.peak_bytes)} at "
                + (f"#{tl.peak_ms:.0f}" if sh.estimate else f"{tl.peak_ms:.3f} ms"),
                text_font_size="11px",
                text_align="right" if late else "left",
                x_offset=-8 if late else 8,
                y_offset=4,
                name=f"memprof-peak-{tl.device}",
            )
        )
    _limit_marks(sh, tl, p)
    sh.kit.slim(p)
    return p


def _limit_marks(sh: _Shared, tl: dd.Timeline, p) -> None:
    """An estimate's memory limit (a horizontal line) and where it was first exceeded."""
    if sh.limit is None:
        return
    p.y_range.end = max(tl.peak_bytes, sh.limit) * 1.15
    p.add_layout(
        Span(
            location=sh.limit,
            dimension="width",
            line_color="#d32f2f",
            line_dash="dotted",
            line_width=2,
            name=f"memprof-limit-{tl.device}",
        )
    )
    p.add_layout(
        Label(
            x=0,
            y=sh.limit,
            text=f"limit {format_bytes(sh.limit)}",
            text_font_size="11px",
            text_color="#d32f2f",
            x_offset=4,
            y_offset=2,
        )
    )
    if sh.oom is not None and sh.oom[0] == tl.device:
        x = sh.oom[1]
        p.add_layout(
            Span(
                location=x,
                dimension="height",
                line_color="#d32f2f",
                line_width=2,
                name=f"memprof-oom-{tl.device}",
            )
        )
        late = x > 0.6 * sh.end_ms
        p.add_layout(
            Label(
                x=x,
                y=sh.limit,
                text=f"out of memory at #{x:.0f}",
                text_font_size="11px",
                text_color="#d32f2f",
                text_align="right" if late else "left",
                x_offset=-6 if late else 6,
                y_offset=-16,
            )
        )


# --------------------------------------------------------------------------------------------
# 2-3. op tree with forward -> backward links, and the op table
# --------------------------------------------------------------------------------------------
def _op_panel(sh: _Shared, ops: dd.Ops):
    depth_rows = ops.max_depth + 1
    tree = figure(
        height=max(160, min(520, 60 + 22 * depth_rows)),
        sizing_mode="stretch_width",
        x_range=sh.x_range,
        y_range=Range1d(depth_rows, 0),
        tools="xpan,xwheel_zoom,reset",
        active_scroll="xwheel_zoom",
        title="ops by time and nesting depth (colour: phase); "
        "lines link forward ops to their backward ops",
    )
    tree.yaxis.axis_label = "depth"
    tree.xaxis.axis_label = sh.x_label
    tree.ygrid.visible = False
    quads = tree.quad(
        left="left",
        right="right",
        top="top",
        bottom="bottom",
        source=sh.ops,
        view=CDSView(filter=sh.op_filter),
        fill_color="color",
        line_color="color",
        fill_alpha=0.85,
        selection_fill_alpha=1.0,
        selection_line_color="#000000",
        selection_line_width=2,
        nonselection_fill_alpha=0.25,
        nonselection_line_alpha=0.25,
    )
    links = tree.segment(
        x0="x0",
        y0="y0",
        x1="x1",
        y1="y1",
        source=sh.flows,
        line_color="#777777",
        line_alpha=0.35,
        selection_line_color="#000000",
        selection_line_alpha=1.0,
        selection_line_width=2.5,
        nonselection_line_alpha=0.15,
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
    sh.kit.slim(tree)
    link_tips = [("forward", "@fname"), ("backward", "@bname"), ("seq_nr", "@seq_nr")]
    tree.add_tools(
        HoverTool(renderers=[quads], tooltips=op_tips),
        HoverTool(renderers=[links], tooltips=link_tips),
        # clicking an op always selects it (the default "toggle" would unselect a partner)
        TapTool(renderers=[quads], mode="replace"),
    )
    op_table = _table(
        sh.kit,
        sh.ops,
        [
            ("name", "op", 300),
            ("kind", "kind", 70),
            ("phase", "phase", 70),
            ("module", "module", 150),
            ("callsite", "callsite", 200),
            ("start_txt", "start", 80),
            ("dur_txt", "duration", 80),
            ("self_txt", "self alloc", 85),
            ("total_txt", "total alloc", 85),
        ],
        height=220,
        view=CDSView(filter=sh.op_filter),
        scroll_to_selection=True,
        css_classes=["memprof-optable"],
        name="memprof-optable",
    )
    note = ""
    if ops.left_out:
        note = (
            f"{len(ops.columns['op_id']):,} of {ops.total:,} ops shown (the longest, the "
            f"biggest allocators and the ops of listed blocks, with their parents); "
            f"{ops.left_out:,} left out"
        )
    return column(
        _title("Ops", note),
        tree,
        sh.op_info,
        op_table,
        css_classes=["memprof-optree"],
        sizing_mode="stretch_width",
    )


# --------------------------------------------------------------------------------------------
# 4. allocations: table and lifetimes
# --------------------------------------------------------------------------------------------
def _allocation_panel(sh: _Shared, sel: dd.Allocations):
    table = _table(
        sh.kit,
        sh.allocs,
        [
            ("name", "name", 220),
            ("category", "category", 110),
            ("size_txt", "size", 80),
            ("device", "device", 55),
            ("op", "op", 170),
            ("module", "module", 120),
            ("lifetime", "lifetime", 90),
            ("at_peak", "at peak", 55),
        ],
        view=CDSView(filter=sh.alloc_filter),
        scroll_to_selection=True,
        name="memprof-allocations-table",
    )
    lanes = len(sel.table) or 1
    life = figure(
        height=260,
        sizing_mode="stretch_width",
        x_range=sh.x_range,
        y_range=Range1d(lanes, -1),
        tools="xpan,xwheel_zoom,ywheel_zoom,reset",
        active_scroll="xwheel_zoom",
        title="lifetimes of the listed blocks (allocation to free; colour: category)",
    )
    life.yaxis.visible = False
    life.xaxis.axis_label = sh.x_label
    life.ygrid.visible = False
    bars = life.quad(
        left="x0",
        right="x1",
        top=dodge("y", -0.45),
        bottom=dodge("y", 0.45),
        source=sh.allocs,
        view=CDSView(filter=sh.alloc_filter),
        fill_color="color",
        line_color="color",
        selection_line_color="#000000",
        selection_line_width=2,
        nonselection_fill_alpha=0.25,
        nonselection_line_alpha=0.25,
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
    sh.kit.slim(life)
    note = f"{len(sel.table):,} of {sel.total:,} blocks listed, largest first"
    if len(sel.summarised):
        note += f"; the {sel.total - len(sel.table):,} smaller ones are summarised at the end"
    return column(
        _title("Allocations", note),
        table,
        life,
        css_classes=["memprof-allocations"],
        sizing_mode="stretch_width",
    )


# --------------------------------------------------------------------------------------------
# 5. lineage of the clicked block
# --------------------------------------------------------------------------------------------
def _lineage_panel(sh: _Shared):
    table = _table(
        sh.kit,
        sh.lin_view,
        [
            ("t_txt", "time", 80),
            ("op_name", "op", 230),
            ("relation", "relation", 120),
            ("version", "version", 50),
            ("category", "category", 100),
            ("phase", "phase", 70),
            ("module", "module", 120),
            ("callsite", "callsite", 200),
        ],
        selectable=False,
        name="memprof-lineage-table",
    )
    return column(
        _title("Lineage"),
        sh.lin_info,
        table,
        css_classes=["memprof-lineage"],
        sizing_mode="stretch_width",
    )
