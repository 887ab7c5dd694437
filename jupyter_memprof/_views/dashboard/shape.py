"""The dashboard's shape: its charts, the models panels share.

A dashboard is a :class:`Shape` (what its models are: the charts, each chart's marks) and
values (texts, numbers, the data sources' columns, by name: see ``page._spec``);
:class:`Shared` is what the panels of one dashboard draw with, :class:`Built` what the
Python side reads back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bokeh.models import BooleanFilter, ColumnDataSource, Div, LayoutDOM, Range1d

from .kit import Kit


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
