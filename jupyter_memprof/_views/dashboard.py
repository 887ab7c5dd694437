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

:func:`build` makes the Bokeh models. The notebook widget and the HTML file do not: building
and serializing Bokeh's models costs about half a millisecond each in Python (a dashboard has
about two hundred), while two dashboards of the same layout differ only in texts, numbers and
data. :func:`page` fills those into the serialized document of a template built once per
layout, and gives the same JSON Bokeh would for :func:`build`'s models (tests/test_dashboard.py
compares the two).
"""

from __future__ import annotations

import html
import itertools
import os
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from bokeh.core.properties import value
from bokeh.core.serialization import Serializer
from bokeh.document import Document
from bokeh.embed.util import contains_tex_string
from bokeh.layouts import column, row
from bokeh.models import (
    AdaptiveTicker,
    AllIndices,
    AllLabels,
    BasicTicker,
    BasicTickFormatter,
    BooleanFilter,
    BoxSelectTool,
    Button,
    CDSView,
    Column,
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    CustomJSTickFormatter,
    DataRange1d,
    DataTable,
    Div,
    GlyphRenderer,
    Grid,
    HoverTool,
    Label,
    LayoutDOM,
    Legend,
    LegendItem,
    Line,
    LinearAxis,
    LinearScale,
    PanTool,
    Plot,
    Quad,
    Range1d,
    RangeTool,
    ResetTool,
    SaveTool,
    Scatter,
    Segment,
    Span,
    Step,
    StringEditor,
    StringFormatter,
    TableColumn,
    TapTool,
    Title,
    Toolbar,
    UnionRenderers,
    VAreaStep,
    VSpan,
    WheelZoomTool,
)
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
    """A built dashboard: the Bokeh layout and the models the Python side reads (for a
    :func:`page`, whose views exist only in the browser: a stand-in for its root and the
    data sources)."""

    layout: LayoutDOM
    ops: ColumnDataSource  # the shown ops
    allocs: ColumnDataSource  # the listed blocks (then the summarised rows)
    lineage: ColumnDataSource  # the lineage on show
    lineage_all: ColumnDataSource  # every listed block's lineage (encoded)
    lineage_pool: list[str]  # the strings lineage_all's codes point into


# the visual properties of a glyph, and figure()'s colour for a glyph given none
_VISUALS = ("line_", "fill_", "hatch_", "text_")
_DEFAULT_COLOR = "#1f77b4"


class _Kit:
    """Builds the dashboard's plots from Bokeh's models directly, as ``bokeh.plotting.figure``
    would (the same page), with fewer models: ``figure`` runs its option machinery for every
    plot and glyph, and gives every axis, renderer and data source models of its own that
    can be shared. Shared here: the stateless ones (scales, the "every row" filter and label
    policy, table formatter and editor, selection policy), each source's view by the
    renderers that draw that source unfiltered."""

    def __init__(self) -> None:
        self.editor = StringEditor()  # tables are not editable: never shown
        self.text = StringFormatter()
        self.union = UnionRenderers()
        self.everything = AllIndices()
        self.labels = AllLabels()
        self.scale = LinearScale()  # BokehJS derives each plot's own scales from it
        self._views: dict[int, CDSView] = {}

    def view(self, source: ColumnDataSource) -> CDSView:
        """The unfiltered view of ``source``, one per source (BokehJS keeps a view's row
        indices on its model: renderers may share one only when they draw the same source)."""
        if id(source) not in self._views:
            self._views[id(source)] = CDSView(filter=self.everything)
        return self._views[id(source)]

    def axis(self, label: str | None = None, **kwargs) -> LinearAxis:
        """A linear axis as ``figure`` makes one (``ticker`` and ``formatter`` may be given)."""
        kwargs.setdefault("ticker", BasicTicker())
        kwargs.setdefault("formatter", BasicTickFormatter())
        return LinearAxis(axis_label=label, major_label_policy=self.labels, **kwargs)

    def plot(self, *, title: str, tools: list, y_axis: LinearAxis, x_label: str,
             y_grid: bool = True, active_scroll=None, **kwargs) -> Plot:  # fmt: skip
        """A plot with ``figure``'s layout: an x axis below, ``y_axis`` left, grid lines
        along both (along y only with ``y_grid``), a title and a toolbar of ``tools``."""
        x_axis = self.axis(x_label)
        grids = [Grid(dimension=0, axis=x_axis)]
        if y_grid:
            grids.append(Grid(dimension=1, axis=y_axis))
        toolbar = Toolbar(tools=tools)
        if active_scroll is not None:
            toolbar.active_scroll = active_scroll
        kwargs.setdefault("y_range", DataRange1d())
        return Plot(
            title=Title(text=title),
            toolbar=toolbar,
            below=[x_axis],
            left=[y_axis],
            center=grids,
            x_scale=self.scale,
            y_scale=self.scale,
            sizing_mode="stretch_width",
            **kwargs,
        )

    def glyph(self, p: Plot, source: ColumnDataSource, kind, coords: dict, look: dict, *,
              selected: dict | None = None, unselected: dict | None = None, view=None,
              **kwargs) -> GlyphRenderer:  # fmt: skip
        """Add a glyph of ``kind`` to ``p`` as ``figure``'s glyph methods do: the glyph's own
        ``look`` (colours not given are figure's default, alphas 1); when rows are selected,
        the others fade (every alpha 0.1 unless ``unselected`` says otherwise) and the
        selected ones take ``selected`` (if given). Never muted (legends hide)."""
        names = [n for n in kind.properties() if n.startswith(_VISUALS)]
        base = {}
        for name in names:
            trait = name.split("_", 1)[1]
            if name in look:
                base[name] = look[name]
            elif name in ("hatch_color", "text_color"):
                base[name] = "black"
            elif trait == "color":
                base[name] = _DEFAULT_COLOR
            elif trait == "alpha":
                base[name] = 1.0
        faded = {**base, **{n: 0.1 for n in names if n.endswith("_alpha")}, **(unselected or {})}
        r = GlyphRenderer(
            glyph=kind(**coords, **base),
            nonselection_glyph=kind(**coords, **faded),
            selection_glyph="auto" if selected is None else kind(**coords, **{**base, **selected}),
            muted_glyph="auto",
            data_source=source,
            view=self.view(source) if view is None else view,
            **kwargs,
        )
        p.renderers.append(r)
        return r


@dataclass(frozen=True)
class _Chart:
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
    # Which side of its mark a label goes (left late in the run, to stay inside the plot)
    # depends on where the mark is: a value (see _beside), not part of the shape.


@dataclass(frozen=True)
class _Shape:
    """What a dashboard's models are, apart from the values they show: two dashboards of one
    shape differ only in texts, numbers and data (see :func:`page`)."""

    estimate: bool  # an estimate's clock counts records of its fake run, not ms
    charts: tuple[_Chart, ...]


@dataclass
class _Shared:
    """The models several views share (the time axis, the sources, filters and messages),
    and what the dashboard shows: its shape and values (see :func:`_spec`)."""

    shape: _Shape
    v: dict  # the values, by name
    kit: _Kit
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
        if self.shape.estimate:  # a fake run has no wall time: one "ms" per record
            return "position in the run (op sequence): an estimate"
        return "ms since capture start"


def cds_data(columns: dict) -> dict:
    """A data source's columns as sent: numeric columns as numpy arrays (sent as compact
    binary), text columns as numpy arrays of ``str`` (sent as one plain list, not encoded
    item by item)."""
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
    return data


def _cds(data: dict, name: str, kit: _Kit) -> ColumnDataSource:
    """A ColumnDataSource of ``data`` (:func:`cds_data`)."""
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


def _title_text(text: str, note: str = "") -> str:
    """A section heading's HTML (``text`` is ours; ``note`` is escaped here)."""
    extra = f" <span style='color:#666;font-weight:normal'>{html.escape(note)}</span>"
    return (
        f"<div style='font-size:15px;font-weight:600;margin:10px 0 2px'>{text}"
        f"{extra if note else ''}</div>"
    )


def _title(text: str) -> Div:
    return Div(text=text, sizing_mode="stretch_width")


def _table(kit: _Kit, source, columns, *, height=TABLE_HEIGHT, **kwargs) -> DataTable:
    """A DataTable whose every cell is plain text (StringFormatter escapes it), as wide as
    its panel, with columns of the widths given."""
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
        # columns keep their widths (a narrow panel scrolls sideways): squeezed to the
        # panel's width they cut every value ("autograd_c", "versio")
        autosize_mode="none",
        **kwargs,
    )


def _bytes_axis(axis) -> None:
    """Byte ticks at round binary steps (16 KiB, 32 KiB, ...) labelled in binary units."""
    axis.ticker, axis.formatter = _bytes_ticks()


def _bytes_ticks() -> tuple[AdaptiveTicker, CustomJSTickFormatter]:
    return (
        AdaptiveTicker(base=2, mantissas=[1], min_interval=1, desired_num_ticks=6),
        CustomJSTickFormatter(code=js.bytes_tick()),
    )


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
    shape, values = _spec(prof, _shown(prof, device, cats), header=header)
    return _layout(shape, values, header=header)


def _spec(prof, shown: _Shown, *, header: bool) -> tuple[_Shape, dict]:
    """What a dashboard of ``prof`` shows: its shape, and the values its models hold (texts,
    numbers, the data sources' columns), by name. Every value that differs between two
    dashboards of one shape is here, and only here (templates rely on it: see :func:`page`)."""
    win, ops, sel = shown.win, shown.ops, shown.sel
    end_ms = max(win.end_ms, 1e-6)
    pad = end_ms * 0.01
    meta = prof.meta
    estimate = bool(meta.get("estimate"))
    limit = meta.get("limit") if estimate else None
    oom = meta.get("oom") if estimate else None
    oom_at = (str(oom["device"]), float(win.ms([int(oom["time_ns"])])[0])) if oom else None
    depth_rows = ops.max_depth + 1
    ops_note = ""
    if ops.left_out:
        ops_note = (
            f"{len(ops.columns['op_id']):,} of {ops.total:,} ops shown (the longest, the "
            f"biggest allocators and the ops of listed blocks, with their parents); "
            f"{ops.left_out:,} left out"
        )
    allocs_note = f"{len(sel.table):,} of {sel.total:,} blocks listed, largest first"
    if len(sel.summarised):
        allocs_note += (
            f"; the {sel.total - len(sel.table):,} smaller ones are summarised at the end"
        )
    v = {
        "uid": f"memprof-{os.getpid()}-{next(_ids)}",
        "x_lo": -pad,  # before x_hi (see Slots)
        "x_hi": end_ms + pad,
        **shown.data,
        "pool": shown.pool,
        "ops_title": _title_text("Ops", ops_note),
        "allocs_title": _title_text("Allocations", allocs_note),
        "tree_height": max(160, min(520, 60 + 22 * depth_rows)),
        "tree_rows": depth_rows,
        "lanes": len(sel.table) or 1,
    }
    if header:
        v["header"] = _header_html(prof)
    if limit is not None:
        v["limit"], v["limit_text"] = limit, f"limit {format_bytes(limit)}"
    if oom_at is not None:
        v["oom_x"] = oom_at[1]
        v.update(_beside("oom_text", f"out of memory at #{oom_at[1]:.0f}", oom_at[1], end_ms))
    notes = []
    limit_device = meta.get("device") if estimate else None
    charts = []
    for k, (tl, visible) in enumerate(zip(shown.timelines, shown.visible)):
        points = len(tl.columns["t"])
        drawn = f", {points:,} drawn" if points < tl.points_in else ""
        notes.append(f"{tl.device} {tl.points_in:,} points{drawn}")
        # short: a plot's title is one line, cut at the plot's edge in a narrow panel
        v[f"chart_title{k}"] = f"{tl.device}: live memory by category"
        outline = points <= OUTLINE_POINTS
        chart = _Chart(tl.device, tuple(tl.categories), tuple(visible), outline=outline)
        if tl.peak_ms is not None:
            v[f"peak_x{k}"], v[f"peak_y{k}"] = tl.peak_ms, tl.peak_bytes
            v[f"peak_text{k}"] = f"\u25bc peak {format_bytes(tl.peak_bytes)} at " + (
                f"#{tl.peak_ms:.0f}" if estimate else f"{tl.peak_ms:.3f} ms"
            )
            v[f"peak{k}"] = {"x": [tl.peak_ms], "y": [tl.peak_bytes]}
            chart = replace(chart, peak=True)
        reserved = dd.reserved_line(prof, tl.device, win)
        if reserved is not None:
            v[f"reserved{k}"] = reserved
            source = "recorded" if tl.device in (meta.get("reserved_model_error") or {}) else ""
            v[f"reserved_label{k}"] = f"reserved ({source or 'modelled'})"
            chart = replace(chart, reserved=True)
        boundaries = _step_boundaries(prof, tl.device)
        if len(boundaries):
            v[f"steps{k}"] = {"x": win.ms(boundaries)}
            chart = replace(chart, steps=True)
        if limit is not None and limit_device in (None, tl.device):  # the limit's device only
            top = max([tl.peak_bytes, limit, *(reserved or {}).get("y", [])])
            v[f"y_end{k}"] = top * 1.15
            here = oom_at is not None and oom_at[0] == tl.device
            chart = replace(chart, limit=True, oom=here)
        charts.append(chart)
    notes.append(_tiny_note(shown.tiny))
    v["timeline_title"] = _title_text("Memory over time", "; ".join(n for n in notes if n))
    v["lifetime_key"] = _color_key("colour: category", shown.acols["category"], dd.CATEGORY_COLORS)
    return _Shape(estimate, tuple(charts)), v


def _step_boundaries(prof, device: str) -> np.ndarray:
    """Where one step of ``prof.steps`` ends and the next begins, on ``device`` (ns)."""
    steps = prof.steps
    ends = steps[(steps["device"].astype(object) == device).to_numpy()]["end_ns"].to_numpy()
    return ends[:-1].astype(np.int64)


#: the text of a label that shows nothing: a space, since an empty text is Label's default,
#: which Bokeh leaves out of the document (a template's value never is)
_NO_TEXT = " "


def _beside(key: str, text: str, x: float, end: float) -> dict[str, str]:
    """The texts of a mark's two labels (see :func:`_mark_labels`): ``text`` right of the
    mark at ``x``, or left of it late in the run (past 60% of ``end``), to stay inside the
    plot; the other label shows nothing."""
    late = x > 0.6 * end
    return {f"{key}_after": _NO_TEXT if late else text, f"{key}_before": text if late else _NO_TEXT}


def _mark_labels(p, key: str, v: dict, *, gap: int, **style) -> None:
    """A mark's label as two Labels, one each side of it, of which the values fill one
    (:func:`_beside`): which side depends on the values, so it is no part of the shape."""
    for side, align, offset in (("after", "left", gap), ("before", "right", -gap)):
        p.add_layout(Label(text=v[f"{key}_{side}"], text_align=align, x_offset=offset, **style))


#: A timeline drawn from more points than this gets no line for its total (its areas show it):
#: over thousands of steps, a line is a solid black band.
OUTLINE_POINTS = 1500


def _color_key(title: str, values, colors: dict[str, str]) -> str:
    """An HTML key of the colours of ``values`` that occur (in ``colors``' order): it wraps
    at any width, where a legend inside a plot takes the plot's room."""
    present = set(map(str, values))
    items = "".join(
        f"<span style='white-space:nowrap;margin-right:10px'>"
        f"<span style='display:inline-block;width:10px;height:10px;background:{color};"
        f"margin-right:4px'></span>{html.escape(name)}</span> "
        for name, color in colors.items()
        if name in present
    )
    return f"<div style='font-size:12px;color:#444'>{html.escape(title)}: {items}</div>"


def _tiny_note(tiny: list[tuple[str, int]]) -> str:
    """What the charts leave out: devices with too little memory to draw (their peaks)."""
    if not tiny:
        return ""
    peaks = ", ".join(f"{d} (peak {format_bytes(n)})" for d, n in tiny)
    return f"too small to chart: {peaks}"


def _layout(shape: _Shape, v: dict, *, header: bool) -> Built:
    """The models of a dashboard of ``shape`` showing the values ``v`` (:func:`_spec`)."""
    kit = _Kit()
    sh = _Shared(
        shape=shape,
        v=v,
        kit=kit,
        x_range=Range1d(v["x_lo"], v["x_hi"], bounds=(v["x_lo"], v["x_hi"]), name="memprof-time"),
        ops=_cds(v["ops"], "memprof-ops", kit),
        allocs=_cds(v["allocs"], "memprof-allocations", kit),
        flows=_cds(v["flows"], "memprof-flows", kit),
        lin_all=_cds(v["lineage_all"], "memprof-lineage-all", kit),
        lin_view=_cds({k: [] for k in LINEAGE_VIEW_COLUMNS}, "memprof-lineage", kit),
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


# --------------------------------------------------------------------------------------------
# what is shown, chosen once per profile
# --------------------------------------------------------------------------------------------
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
    timelines: list[dd.Timeline]  # stacked: the categories chosen, the others hidden
    visible: list[list[bool]]  # per timeline and category: stacked
    tiny: list[tuple[str, int]]  # devices too small to chart, and their peaks
    data: dict = field(default_factory=dict)  # every data source's columns, as sent ...
    encoded: dict = field(default_factory=dict)  # ... and as Bokeh serializes them


# The last profile's selection, reused while that profile lives: the dashboard under a cell,
# then ``prof.to_html`` (or ``prof.show()`` again) choose the same rows. It holds only what the
# views derived, never a table or the profile: weak references tell whether the profile and
# each of its tables are still the very same objects, and the profile's death drops it.
_last: list = []


def _key(prof, device: str | None, cats: list[str] | None) -> tuple:
    """What the selection depends on besides the tables: the choice, the window (the
    capture's start and end: from the metadata, else from the tables), the clock."""
    meta = prof.meta
    return (
        device,
        None if cats is None else tuple(cats),
        meta.get("start_ns"),
        meta.get("end_ns"),
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
    ops = dd.select_ops(prof, win, dd.must_show_ops(prof, sel, lin, dd.OP_BUDGET // 2))
    acols = dd.allocation_columns(prof, sel, ops, win)
    lcols, pool, lin0, lin1 = dd.lineage_columns(prof, lin, alloc_ids, ops, win)
    acols["lin0"] = np.asarray(lin0 + [0] * len(sel.summarised), dtype=np.int64)
    acols["lin1"] = np.asarray(lin1 + [0] * len(sel.summarised), dtype=np.int64)
    tiny = tiny_devices(peaks)
    charted = [dev for dev in devs if dev not in dict(tiny)]
    timelines = [dd.timeline(prof, dev, win, peak=peaks[dev]) for dev in charted]
    visible = []
    for tl in timelines:
        chosen = [c for c in tl.categories if cats is None or c in cats]
        dd.stack(tl.columns, tl.categories, chosen)
        visible.append([c in chosen for c in tl.categories])
    flows = dd.flow_columns(prof, ops)
    shown = _Shown(win, sel, ops, acols, lcols, pool, flows, timelines, visible, tiny)
    data = {"ops": ops.columns, "allocs": acols, "flows": flows, "lineage_all": lcols}
    data.update({f"timeline{k}": tl.columns for k, tl in enumerate(timelines)})
    shown.data = {name: cds_data(columns) for name, columns in data.items()}
    _remember(prof, key, shown)
    return shown


#: A device whose peak is under this many bytes, and under :data:`TINY_SHARE` of the largest
#: device's peak, gets no chart (its peak is in the summary): 208 B of optimizer step
#: counters on the CPU next to a GPU's gigabytes say nothing a full-size chart could show.
TINY_BYTES = 64 * 1024
TINY_SHARE = 0.01


def tiny_devices(peaks: dict) -> list[str]:
    """The devices of ``peaks`` (device -> PeakPoint or None) too small to chart, with their
    peaks in bytes."""
    sizes = {dev: p.peak_bytes for dev, p in peaks.items() if p is not None}
    largest = max(sizes.values(), default=0)
    return [(dev, n) for dev, n in sizes.items() if n < TINY_BYTES and n < TINY_SHARE * largest]


def forget(prof=None) -> None:
    """Drop the reused selection of ``prof`` (of any profile when None)."""
    if _last and (prof is None or _last[0]() is prof or _last[0]() is None):
        _last.clear()


# --------------------------------------------------------------------------------------------
# pages: the document's JSON from a template per shape
# --------------------------------------------------------------------------------------------
class Slots:
    """Stand-ins for the values a :class:`DocTemplate` leaves open.

    Each stand-in is a value that nothing else in a document takes (a marked string, a number
    far beyond any pixel or byte count), of the type the real value has, so that Bokeh's
    property checks accept it and its places in the serialized document can be found. Whole
    data sources are left open with a one-column stand-in whose name is marked. Numbers stand
    in growing in the order they are asked for: a range's start asked before its end keeps
    the two in order, as Bokeh requires of bounds."""

    _INT = 10**15  # integers from here: one per slot
    _FLOAT = 2.0**600  # floats from here (exactly representable steps)

    def __init__(self) -> None:
        self.keys: dict[Any, str] = {}

    def stand_in(self, key: str, value):
        n = len(self.keys)
        if isinstance(value, bool):
            raise TypeError(f"{key}: a flag changes what is built, it is not a value")
        if isinstance(value, int):
            mark = self._INT + n
        elif isinstance(value, float):
            mark = self._FLOAT * (1 + n / 2**20)
        else:
            mark = f"\x00memprof-slot:{key}\x00"
        self.keys[(type(mark), mark)] = key
        return {mark: []} if isinstance(value, dict) else mark

    def key(self, value) -> str | None:
        """The slot ``value`` stands in for, or None."""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return self.keys.get((type(value), value))
        if isinstance(value, dict) and value.get("type") == "map":  # a data source's data
            entries = value.get("entries") or ()
            if len(entries) == 1:
                return self.keys.get((str, entries[0][0]))
        return None


class _Slot:
    """The place of a value in a template."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key


class _Id:
    """A model id in a template (each document made from it gets its own)."""

    __slots__ = ("id",)

    def __init__(self, id: str) -> None:
        self.id = id


class _Dict(dict):
    """A part of a template holding a slot or a model id (what :meth:`DocTemplate.render`
    fills in); everything else in a template is shared by every document made from it."""


class _List(list):
    """A list of a template holding a slot or a model id (see :class:`_Dict`)."""


_serial = itertools.count(1)


class DocTemplate:
    """A Bokeh document serialized once, with some values left open (:class:`Slots`).

    :meth:`render` makes the JSON of a document from it, as Bokeh would serialize the same
    models holding other values: the slots filled with the values given, encoded by Bokeh's
    serializer, and every model under a fresh id (or the id of a live model standing for
    it), so documents made from one template can share a page."""

    def __init__(self, root, slots: Slots) -> None:
        doc = Document()
        doc.add_root(root)
        self.root_id = root.id
        self._slots = slots
        self._tree = self._compile(doc.to_json(deferred=False))
        self.name = root.name

    def _compile(self, node):
        key = self._slots.key(node)
        if key is not None:
            return _Slot(key)
        if isinstance(node, dict):
            out = {k: self._compile(v) for k, v in node.items()}
            if "id" in node and isinstance(node["id"], str):
                out["id"] = _Id(node["id"])
            dynamic = "id" in node or any(
                isinstance(v, (_Slot, _Dict, _List)) for v in out.values()
            )
            return _Dict(out) if dynamic else node
        if isinstance(node, (list, tuple)):
            out = [self._compile(v) for v in node]
            if any(isinstance(v, (_Slot, _Dict, _List)) for v in out):
                return _List(out)
            return node
        return node

    def render(
        self, values: dict, ids: dict[str, str] | None = None, encoded: dict | None = None
    ) -> dict:
        """The document's JSON (what ``Document.to_json(deferred=False)`` gives) with
        ``values`` in its slots; ``ids`` maps template ids to the ids of live models;
        ``encoded``: some of the values as Bokeh's serializer encodes them, by slot."""
        encode = Serializer(deferred=False).encode
        encoded = encoded or {}
        filled = {k: encoded[k] if k in encoded else encode(v) for k, v in values.items()}
        suffix = f"-{next(_serial)}"
        ids = ids or {}

        def fill(node):
            t = type(node)
            if t is _Dict:
                return {k: fill(v) for k, v in node.items()}
            if t is _List:
                return [fill(v) for v in node]
            if t is _Slot:
                return filled[node.key]
            if t is _Id:
                return ids.get(node.id) or node.id + suffix
            return node

        return fill(self._tree)


@dataclass
class Page:
    """A dashboard as BokehJS receives it: the document's JSON (see :func:`page`)."""

    doc: dict  # what Document.to_json(deferred=False) gives
    root: LayoutDOM  # stands for the document's root (same id), which Python never builds
    tex: bool  # its texts hold TeX: Bokeh then bundles MathJax with BokehJS for a page
    built: Built | None = None  # the sources a notebook widget reads back (``live=True``)


# Templates by shape, the latest last: a notebook session shows dashboards of one or a few.
_templates: dict[_Shape, tuple[DocTemplate, dict[str, tuple[str, str]]]] = {}
_TEMPLATES_KEPT = 8
_LIVE = {
    "ops": "memprof-ops",
    "allocs": "memprof-allocations",
    "lineage": "memprof-lineage",
    "lineage_all": "memprof-lineage-all",
}


def _template(shape: _Shape, values: dict) -> tuple[DocTemplate, dict[str, tuple[str, str]]]:
    """The document template of ``shape`` (built with stand-ins for every value, once per
    shape), and the template ids of the sources a widget reads (and of their selections)."""
    hit = _templates.pop(shape, None)
    if hit is None:
        slots = Slots()
        stand_ins = {k: slots.stand_in(k, v) for k, v in values.items()}
        stand_ins.setdefault("header", slots.stand_in("header", ""))
        built = _layout(shape, stand_ins, header=True)
        sources = {name: getattr(built, name) for name in _LIVE}
        ids = {name: (src.id, src.selected.id) for name, src in sources.items()}
        hit = (DocTemplate(built.layout, slots), ids)
        while len(_templates) >= _TEMPLATES_KEPT:
            del _templates[next(iter(_templates))]
    _templates[shape] = hit
    return hit


def page(
    prof,
    device: str | None = None,
    categories: list[str] | None = None,
    *,
    header: bool = True,
    live: bool = False,
) -> Page:
    """The dashboard of ``prof`` (as :func:`build` makes it) as BokehJS receives it.

    Its models are not built: the document's JSON is filled in from a template of the same
    shape, made the first time that shape is shown, so a dashboard costs its selection of
    what to draw and the encoding of its data, not Bokeh's per-model work. ``live=True``
    also builds the data sources a notebook widget reads back (the selection), under the
    ids the document gives them."""
    cats = list(categories) if categories is not None else None
    shown = _shown(prof, device, cats)
    shape, values = _spec(prof, shown, header=header)
    template, source_ids = _template(shape, values)
    root = Column(name=template.name)
    ids = {template.root_id: root.id}
    built = None
    if live:
        data = {**values, "lineage": {k: [] for k in LINEAGE_VIEW_COLUMNS}}
        sources = {name: ColumnDataSource(data=data[name], name=_LIVE[name]) for name in _LIVE}
        for name, (source_id, selection_id) in source_ids.items():
            ids[source_id], ids[selection_id] = sources[name].id, sources[name].selected.id
        built = Built(root, *(sources[name] for name in _LIVE), values["pool"])
    for name, data in shown.data.items():  # the data, encoded once per selection
        if name not in shown.encoded:
            shown.encoded[name] = Serializer(deferred=False).encode(data)
    doc = template.render({"header": "", **values}, ids, shown.encoded)
    if not header:  # the template's root opens with the header
        attributes = doc["roots"][0]["attributes"]
        attributes["children"] = attributes["children"][1:]
    tex = any(isinstance(t, str) and contains_tex_string(t) for t in values.values())
    return Page(doc, root, tex, built)


# --------------------------------------------------------------------------------------------
# 1. timeline per device, overview, time filter
# --------------------------------------------------------------------------------------------
def _timeline_panel(sh: _Shared):
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
    filters = dict(alloc_filter=sh.alloc_filter, op_filter=sh.op_filter, filter_info=sh.filter_info)
    selected = CustomJS(
        args=dict(allocs=sh.allocs, ops=sh.ops, estimate=sh.shape.estimate, **filters),
        code=js.range_selected(),
    )
    cleared = CustomJS(args=dict(filter_hint=_FILTER_HINT, **filters), code=js.range_cleared())

    charts, totals = [], []
    for k, chart in enumerate(sh.shape.charts):
        src = _cds(v[f"timeline{k}"], f"memprof-timeline-{chart.device}", kit)
        charts.append(_timeline_chart(sh, k, chart, src, selected, cleared))
        color = _OVERVIEW_COLORS[k % len(_OVERVIEW_COLORS)]
        step = dict(x="t", y="total", mode="after")
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
        _title(v["timeline_title"]),
        *charts,
        overview,
        row(clear, sh.filter_info, sizing_mode="stretch_width"),
        css_classes=["memprof-timeline"],
        sizing_mode="stretch_width",
    )


def _timeline_chart(sh: _Shared, k: int, chart: _Chart, src, selected, cleared):
    """One device's stacked areas, total line, peak mark, legend, hover and time selection."""
    kit, v = sh.kit, sh.v
    wheel = WheelZoomTool(dimensions="width")
    ticker, formatter = _bytes_ticks()
    y_range = DataRange1d(start=0, range_padding=0.15)
    if chart.limit:  # the limit in view, even above the peak
        y_range.end = v[f"y_end{k}"]
    p = kit.plot(
        title=v[f"chart_title{k}"],
        tools=[PanTool(dimensions="width"), wheel, ResetTool(), SaveTool()],
        active_scroll=wheel,
        # the legend below takes its rows out of the plot's height: add them
        height=TIMELINE_HEIGHT + 24 + 20 * -(-(len(chart.categories) + chart.reserved) // 3),
        x_range=sh.x_range,
        y_range=y_range,
        y_axis=kit.axis("bytes", ticker=ticker, formatter=formatter),
        x_label=sh.x_label,
    )
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
            ncols=3,
            label_text_font_size="11px",
            glyph_width=14,
            glyph_height=14,
        )
        p.add_layout(legend, "below")
    total_xy = dict(x="t", y="total")
    if chart.outline:
        kit.glyph(
            p, src, Step, {**total_xy, "mode": "after"}, {"line_color": "#333333", "line_width": 1}
        )
    # hover needs a glyph with hit testing: an invisible line through the same points
    # (line_policy "prev" reports the state in force, as the step draws it)
    total = kit.glyph(p, src, Line, total_xy, {"line_alpha": 0})
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
    box = BoxSelectTool(dimensions="width", renderers=[total])
    p.add_tools(box)
    p.toolbar.active_drag = box
    p.js_on_event("selectiongeometry", selected)
    p.js_on_event("reset", cleared)
    if chart.peak:
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
    if chart.limit:
        _limit_marks(sh, chart, p)
    if chart.steps:  # thin dotted lines where one step ends and the next begins
        steps = ColumnDataSource(data=v[f"steps{k}"], name=f"memprof-steps-{chart.device}")
        look = {"line_color": "#757575", "line_dash": "dotted", "line_width": 1}
        kit.glyph(p, steps, VSpan, dict(x="x"), look, unselected=look)
    return p


def _reserved_line(sh: _Shared, k: int, chart: _Chart, p) -> LegendItem:
    """The caching allocator's reserved bytes: one dashed step line over the stacked live
    bytes (the gap between them is the allocator's cache and fragmentation); its legend
    item."""
    src = _cds(sh.v[f"reserved{k}"], f"memprof-reserved-{chart.device}", sh.kit)
    line = sh.kit.glyph(
        p,
        src,
        Step,
        {"x": "x", "y": "y", "mode": "after"},
        {"line_color": "#6a1b9a", "line_width": 2, "line_dash": "dashed"},
    )
    return LegendItem(label=sh.v[f"reserved_label{k}"], renderers=[line])


def _limit_marks(sh: _Shared, chart: _Chart, p) -> None:
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
            y=v["limit"],
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
        _mark_labels(
            p, "oom_text", v, gap=6, x=v["oom_x"], y=v["limit"], text_font_size="11px",
            text_color="#d32f2f", y_offset=-16,
        )  # fmt: skip


# --------------------------------------------------------------------------------------------
# 2-3. op tree with forward -> backward links, and the op table
# --------------------------------------------------------------------------------------------
def _op_panel(sh: _Shared):
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
    key = _color_key("colour: phase", dd.PHASE_COLORS, dd.PHASE_COLORS)
    key = key.replace("</div>", "; grey lines link forward ops to their backward ops</div>")
    return column(
        _title(v["ops_title"]),
        Div(text=key, sizing_mode="stretch_width", name="memprof-phase-key"),
        tree,
        sh.op_info,
        op_table,
        css_classes=["memprof-optree"],
        sizing_mode="stretch_width",
    )


# --------------------------------------------------------------------------------------------
# 4. allocations: table and lifetimes
# --------------------------------------------------------------------------------------------
def _allocation_panel(sh: _Shared):
    table = _table(
        sh.kit,
        sh.allocs,
        [
            ("name", "name", 300),
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
        _title(sh.v["allocs_title"]),
        table,
        Div(text=sh.v["lifetime_key"], sizing_mode="stretch_width", name="memprof-category-key"),
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
        _title(_title_text("Lineage")),
        sh.lin_info,
        table,
        css_classes=["memprof-lineage"],
        sizing_mode="stretch_width",
    )
