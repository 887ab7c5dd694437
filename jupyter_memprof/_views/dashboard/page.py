"""The dashboard's front: ``build()``, ``page()``, notebook or file.

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
``_views/js/``, see :mod:`.js`), so the notebook widget and the exported file behave
the same. What is shown is cut to a level of detail a browser holds comfortably;
:mod:`.data` says how.

This module is the front: :func:`build` and :func:`page`, and what a dashboard of a profile
shows (:func:`_spec`: its shape and values). The rooms behind it:

- :mod:`.select`: which rows are shown, chosen once per profile and reused;
- :mod:`.panels`: the Bokeh models of the panels (:mod:`.kit`: the
  plots, tables and axes they are made of);
- :mod:`.template`: documents serialized once per layout and filled in.

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
from dataclasses import dataclass, replace

from bokeh.core.serialization import Serializer
from bokeh.embed.util import contains_tex_string
from bokeh.models import Column, ColumnDataSource, LayoutDOM

from ..._analysis.steps import step_boundaries
from ..._units import format_bytes
from . import data as dd
from . import zoom as dashboard_zoom
from .kit import OVERVIEW_HEIGHT, ROW_HEIGHT, TABLE_HEIGHT, TIMELINE_HEIGHT, color_key, title_text
from .panels import LINEAGE_VIEW_COLUMNS
from .panels import build_layout as _layout
from .select import (  # noqa: F401 (last_shown: the reused selection's record)
    TINY_BYTES,
    TINY_SHARE,
    Shown,
    cds_data,
    forget,
    last_shown,
    tiny_devices,
)
from .select import shown as _shown
from .shape import Built, Chart, Shape
from .template import DocTemplate, Slots

__all__ = [
    "LINEAGE_VIEW_COLUMNS",
    "OUTLINE_POINTS",
    "OVERVIEW_HEIGHT",
    "ROW_HEIGHT",
    "TABLE_HEIGHT",
    "TIMELINE_HEIGHT",
    "TINY_BYTES",
    "TINY_SHARE",
    "Built",
    "DocTemplate",
    "Page",
    "Slots",
    "build",
    "cds_data",
    "forget",
    "page",
    "tiny_devices",
]

_ids = itertools.count(1)


def _header_html(prof) -> str:
    """The summary above the views (a short header of counts when it cannot be made)."""
    try:
        from ..summary import summary_html

        return summary_html(prof)
    except Exception:  # the summary is not available: a minimal header instead
        label = html.escape(prof.label)
        devs = ", ".join(html.escape(d) for d in prof.devices) or "no device"
        return (
            f"<h2 style='margin:4px 0'>{label}</h2>"
            f"<div>{len(prof.ops):,} ops, {len(prof.allocations):,} blocks on {devs}</div>"
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


def _spec(prof, shown: Shown, *, header: bool) -> tuple[Shape, dict]:
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
        "ops_title": title_text("Ops", ops_note),
        "allocs_title": title_text("Allocations", allocs_note),
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
    notes, charts = [], []
    for k, (tl, visible) in enumerate(zip(shown.timelines, shown.visible)):
        points = len(tl.columns["t"])
        drawn = f", {points:,} drawn" if points < tl.points_in else ""
        notes.append(f"{tl.device} {tl.points_in:,} points{drawn}")
        chart, values = _chart_spec(prof, win, k, tl, visible, oom_at)
        charts.append(chart)
        v.update(values)
    notes.append(_tiny_note(shown.tiny))
    v["timeline_title"] = title_text("Memory over time", "; ".join(n for n in notes if n))
    v["lifetime_key"] = color_key("colour: category", shown.acols["category"], dd.CATEGORY_COLORS)
    return Shape(estimate, tuple(charts)), v


def _chart_spec(prof, win, k: int, tl, visible, oom_at) -> tuple[Chart, dict]:
    """Device ``k``'s chart (``tl``: its timeline, ``visible``: its categories shown) and the
    values it shows, by name; ``oom_at``: (device, ms) where an estimate ran out, or None."""
    meta = prof.meta
    estimate = bool(meta.get("estimate"))
    limit = meta.get("limit") if estimate else None
    limit_device = meta.get("device") if estimate else None
    points = len(tl.columns["t"])
    # short: a plot's title is one line, cut at the plot's edge in a narrow panel
    v = {f"chart_title{k}": f"{tl.device}: live memory by category"}
    outline = points <= OUTLINE_POINTS
    chart = Chart(tl.device, tuple(tl.categories), tuple(visible), outline=outline)
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
    boundaries = step_boundaries(prof.steps, tl.device, (prof.start_ns, prof.end_ns))
    if len(boundaries):
        v[f"steps{k}"] = {"x": win.ms(boundaries)}
        chart = replace(chart, steps=True)
    if limit is not None and limit_device in (None, tl.device):  # the limit's device only
        # the axis fits the data: a limit far above it is said at the top, not drawn
        data_top = max([tl.peak_bytes, *(reserved or {}).get("y", [])], default=0)
        near = limit <= LIMIT_IN_VIEW * max(data_top, 1)
        top = max(data_top, limit) if near else data_top
        v[f"y_end{k}"] = top * (1.15 if near else 1.25)  # room for the label above
        v["limit_label_y"] = float(limit if near else top * 1.04)
        if not near:
            v["limit_text"] = f"\u2191 limit {format_bytes(limit)} (above this scale)"
        here = oom_at is not None and oom_at[0] == tl.device
        chart = replace(chart, limit=True, oom=here)
    if tl.levels is not None:
        lv = tl.level_info
        v[f"op_pool{k}"], v[f"module_pool{k}"] = tl.pools["op"], tl.pools["module"]
        v[f"lv_columns{k}"], v[f"lv_finest{k}"], v[f"lv_end{k}"] = lv.columns, lv.finest, lv.end
        chart = replace(chart, zoom=True)
    return chart, v


#: A limit up to this many times the chart's highest point is drawn in the chart; above it,
#: the axis fits the data and the limit is said at the chart's top (a 189 MiB step under an
#: 8 GiB limit is not a flat line at the bottom).
LIMIT_IN_VIEW = 1.5

#: the text of a label that shows nothing: a space, since an empty text is Label's default,
#: which Bokeh leaves out of the document (a template's value never is)
NO_TEXT = " "


def _beside(key: str, text: str, x: float, end: float) -> dict[str, str]:
    """The texts of a mark's two labels (see :func:`mark_labels`): ``text`` right of the
    mark at ``x``, or left of it late in the run (past 60% of ``end``), to stay inside the
    plot; the other label shows nothing."""
    late = x > 0.6 * end
    return {f"{key}_after": NO_TEXT if late else text, f"{key}_before": text if late else NO_TEXT}


#: A timeline drawn from more points than this gets no line for its total (its areas show it):
#: over thousands of steps, a line is a solid black band.
OUTLINE_POINTS = 1500


def _tiny_note(tiny: list[tuple[str, int]]) -> str:
    """What the charts leave out: devices with too little memory to draw (their peaks)."""
    if not tiny:
        return ""
    peaks = ", ".join(f"{d} (peak {format_bytes(n)})" for d, n in tiny)
    return f"too small to chart: {peaks}"


@dataclass
class Page:
    """A dashboard as BokehJS receives it: the document's JSON (see :func:`page`)."""

    doc: dict  # what Document.to_json(deferred=False) gives
    root: LayoutDOM  # stands for the document's root (same id), which Python never builds
    tex: bool  # its texts hold TeX: Bokeh then bundles MathJax with BokehJS for a page
    built: Built | None = None  # the sources a notebook widget reads back (``live=True``)


# Templates by shape, the latest last: a notebook session shows dashboards of one or a few.
_templates: dict[Shape, tuple[DocTemplate, dict[str, tuple[str, str]]]] = {}
_TEMPLATES_KEPT = 8
_LIVE = {
    "ops": "memprof-ops",
    "allocs": "memprof-allocations",
    "lineage": "memprof-lineage",
    "lineage_all": "memprof-lineage-all",
}


def _template(shape: Shape, values: dict) -> tuple[DocTemplate, dict[str, tuple[str, str]]]:
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
        ids.update(dashboard_zoom.template_ids(built.layout, shape))
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
        for name in _LIVE:
            source_id, selection_id = source_ids[name]
            ids[source_id], ids[selection_id] = sources[name].id, sources[name].selected.id
        built = Built(root, *(sources[name] for name in _LIVE), values["pool"])
        built.zoom = dashboard_zoom.live_sources(shape, values, shown, ids, source_ids)
    for name, data in shown.data.items():  # the data, encoded once per selection
        if name not in shown.encoded:
            shown.encoded[name] = Serializer(deferred=False).encode(data)
    doc = template.render({"header": "", **values}, ids, shown.encoded)
    if not header:  # the template's root opens with the header
        attributes = doc["roots"][0]["attributes"]
        attributes["children"] = attributes["children"][1:]
    tex = any(isinstance(t, str) and contains_tex_string(t) for t in values.values())
    return Page(doc, root, tex, built)
