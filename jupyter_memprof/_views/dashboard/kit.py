"""The dashboard's Bokeh parts: plots, glyphs, tables, byte axes.

:class:`Kit` makes plots and glyphs from Bokeh's models directly, as ``bokeh.plotting.figure``
would, with fewer models; the functions below make the tables, headings, keys and labels
every panel of :mod:`.panels` uses (and the byte axis :mod:`.compare` uses).
"""

from __future__ import annotations

import html

from bokeh.models import (
    AdaptiveTicker,
    AllIndices,
    AllLabels,
    BasicTicker,
    BasicTickFormatter,
    CDSView,
    ColumnDataSource,
    CustomJSTickFormatter,
    DataRange1d,
    DataTable,
    Div,
    GlyphRenderer,
    Grid,
    Label,
    LinearAxis,
    LinearScale,
    Plot,
    StringEditor,
    StringFormatter,
    TableColumn,
    Title,
    Toolbar,
    UnionRenderers,
)

from . import js

TIMELINE_HEIGHT = 250
OVERVIEW_HEIGHT = 90
TABLE_HEIGHT = 280
ROW_HEIGHT = 24

# the visual properties of a glyph, and figure()'s colour for a glyph given none
_VISUALS = ("line_", "fill_", "hatch_", "text_")
_DEFAULT_COLOR = "#1f77b4"


class Kit:
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


def cds(data: dict, name: str, kit: Kit) -> ColumnDataSource:
    """A ColumnDataSource of ``data`` (:func:`cds_data`)."""
    return ColumnDataSource(data=data, name=name, selection_policy=kit.union)


def title_text(text: str, note: str = "") -> str:
    """A section heading's HTML (``text`` is ours; ``note`` is escaped here)."""
    extra = f" <span style='color:#666;font-weight:normal'>{html.escape(note)}</span>"
    return (
        f"<div style='font-size:15px;font-weight:600;margin:10px 0 2px'>{text}"
        f"{extra if note else ''}</div>"
    )


def title(text: str) -> Div:
    """A section heading (HTML from :func:`title_text`) as wide as its panel."""
    return Div(text=text, sizing_mode="stretch_width")


def data_table(kit: Kit, source, columns, *, height=TABLE_HEIGHT, **kwargs) -> DataTable:
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


def bytes_axis(axis) -> None:
    """Byte ticks at round binary steps (16 KiB, 32 KiB, ...) labelled in binary units."""
    axis.ticker, axis.formatter = bytes_ticks()


def bytes_ticks() -> tuple[AdaptiveTicker, CustomJSTickFormatter]:
    """A ticker at round binary steps and its formatter (binary units, in the browser)."""
    return (
        AdaptiveTicker(base=2, mantissas=[1], min_interval=1, desired_num_ticks=6),
        CustomJSTickFormatter(code=js.bytes_tick()),
    )


def mark_labels(p, key: str, v: dict, *, gap: int, **style) -> None:
    """A mark's label as two Labels, one each side of it, of which the values fill one
    (:func:`_beside`): which side depends on the values, so it is no part of the shape."""
    for side, align, offset in (("after", "left", gap), ("before", "right", -gap)):
        p.add_layout(Label(text=v[f"{key}_{side}"], text_align=align, x_offset=offset, **style))


def color_key(title: str, values, colors: dict[str, str]) -> str:
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
