"""A zoom's kernel side: the notebook dashboard re-aggregated.

The page redraws a zoomable chart from the levels sent with it (``js/zoom.js``, see
:mod:`.levels`); zoomed in beyond the finest level sent, it writes the window
(``lo``, ``hi`` in ms, ``px``: the chart's width in pixels) into the data source
``memprof-zoom-<device>``. In a notebook the kernel holds that source and the chart's
(``memprof-timeline-<device>``), under the page's ids (see :func:`.dashboard.page`), and
answers by setting the chart's data from every state of the device
(:func:`.levels.zoomed`): every local peak in its pixel column at any zoom.
"""

from __future__ import annotations

import weakref

from bokeh.models import ColumnDataSource

from . import data as dd
from . import levels
from .select import cds_data

#: the names of a zoomable chart's two sources the kernel holds, by device
TIMELINE = "memprof-timeline-{}"
REQUEST = "memprof-zoom-{}"


def empty_request() -> dict[str, list]:
    return {"lo": [], "hi": [], "px": [], "level": []}


def template_ids(layout, shape) -> dict[str, tuple[str, str]]:
    """The template ids of the zoomable charts' sources (and of their selections), by name."""
    wanted = set()
    for chart in shape.charts:
        if chart.zoom:
            wanted |= {TIMELINE.format(chart.device), REQUEST.format(chart.device)}
    if not wanted:
        return {}
    found = {}
    for model in layout.references():
        if isinstance(model, ColumnDataSource) and model.name in wanted:
            found[model.name] = (model.id, model.selected.id)
    return found


def live_sources(shape, values: dict, shown, ids: dict, template_ids: dict) -> dict:
    """For a notebook page: the kernel's copies of each zoomable chart's sources, under the
    page's ids (added to ``ids``), by device: (timeline source, request source, the
    chart's :class:`.data.Timeline`, its stacked categories)."""
    out = {}
    for k, chart in enumerate(shape.charts):
        if not chart.zoom:
            continue
        dev = chart.device
        src = ColumnDataSource(data=dict(values[f"timeline{k}"]), name=TIMELINE.format(dev))
        req = ColumnDataSource(data=empty_request(), name=REQUEST.format(dev))
        for model in (src, req):
            source_id, selection_id = template_ids[model.name]
            ids[source_id], ids[selection_id] = model.id, model.selected.id
        tl = shown.timelines[k]
        stacked = [c for c, on in zip(tl.categories, shown.visible[k]) if on]
        out[dev] = (src, req, tl, stacked)
    return out


def answer(prof, src: ColumnDataSource, tl, stacked: list[str], request: dict) -> bool:
    """Set ``src``'s data to the view the page asked for (``request``: the data of a
    ``memprof-zoom-<device>`` source); False for an empty or malformed request."""
    try:
        lo, hi, px = float(request["lo"][0]), float(request["hi"][0]), int(request["px"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        return False
    if not hi > lo or px <= 0:
        return False
    cols = levels.zoomed(prof, tl, lo, hi, min(px, 8192))
    dd.stack(cols, tl.categories, stacked)
    src.data = cds_data(cols)
    return True


def watch(prof, sources: dict) -> None:
    """Answer every request of the page's zoomable charts (``sources``: from
    :func:`live_sources`) while the sources and the profile live (the sources hold no
    reference to it: a closed dashboard lets its profile go)."""
    ref = weakref.ref(prof)
    for src, req, tl, stacked in sources.values():

        def changed(_attr, _old, new, src=src, tl=tl, stacked=stacked) -> None:
            prof = ref()
            if prof is not None:
                answer(prof, src, tl, stacked, new)

        req.on_change("data", changed)
