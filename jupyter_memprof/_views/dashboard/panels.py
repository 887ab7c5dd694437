"""The panels: the Bokeh models of a dashboard of one shape.

A dashboard is a :class:`Shape` (what its models are: the charts, each chart's marks) and
values (texts, numbers, the data sources' columns, by name: see ``page._spec``).
:func:`build_layout` makes the models of both; the panels, top to bottom: the timeline per
device with its overview and time filter (:mod:`.timeline`), the op tree and op table, the allocations and their
lifetimes, the lineage of the clicked block.
"""

from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import (
    BooleanFilter,
    CDSView,
    CustomJS,
    Div,
    HoverTool,
    PanTool,
    Quad,
    Range1d,
    ResetTool,
    Segment,
    TapTool,
    WheelZoomTool,
)
from bokeh.transform import dodge

from . import data as dd
from . import js
from .kit import Kit, cds, color_key, data_table, title, title_text
from .shape import Built, Shape, Shared
from .timeline import FILTER_HINT, timeline_panel

_OP_HINT = (
    "Click an op (or a row of the op table) to see its forward/backward partner and the "
    "blocks it allocated."
)
_LIN_HINT = "Click a block in the allocations table or a lifetime bar to see its lineage."

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
        filter_info=Div(text=FILTER_HINT, name="memprof-filter-info", sizing_mode="stretch_width"),
    )
    top = (
        [Div(text=v["header"], sizing_mode="stretch_width", name="memprof-header")]
        if header
        else []
    )
    layout = column(
        *top,
        timeline_panel(sh),
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
