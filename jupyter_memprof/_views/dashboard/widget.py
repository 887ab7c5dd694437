"""The notebook form: the Bokeh views and the kernel's controls."""

from __future__ import annotations

import html
import keyword
import weakref

import ipywidgets as widgets
import pandas as pd
import traitlets
from bokeh.core.serialization import UnknownReferenceError
from bokeh.document import Document
from bokeh.embed.elements import div_for_render_item
from jupyter_bokeh import BokehModel

from . import data as dd
from . import zoom as dashboard_zoom
from .html import display_with_bokehjs, render_item
from .page import Page, forget, page


class BokehView(BokehModel):
    """jupyter_bokeh's widget, whose ``close`` may run twice (explicitly, then on garbage
    collection) without raising, and which shows either a Bokeh layout or a dashboard's
    :class:`~jupyter_memprof._views.dashboard.page.Page`.

    A page's models exist in the browser only, but for the data sources the kernel reads
    back: the kernel's document holds those (with the page's ids), so the browser's changes
    to them (a selection) arrive as they do for any Bokeh model, and changes to models the
    kernel does not hold (the views' ranges, texts, ...) are left to the browser."""

    _closed = False
    _page: Page | None = None

    def __init__(self, model=None, *, page: Page | None = None, **kwargs) -> None:
        self._page = page
        super().__init__(model if page is None else page.root, **kwargs)

    def update_from_model(self, model) -> None:
        if self._page is None:
            return super().update_from_model(model)
        shown = self._page
        built = shown.built
        doc = Document()
        with doc.models.freeze():  # one pass over the models, not one per root
            for root in (model, built.ops, built.allocs, built.lineage, built.lineage_all):
                doc.add_root(root)
            for src, req, _tl, _stacked in built.zoom.values():  # zoomable charts' sources
                doc.add_root(src)
                doc.add_root(req)
        item = render_item(model)
        self._model = model
        self.render_bundle = {
            "docs_json": {item.docid: shown.doc},
            "render_items": [item.to_json()],
            "div": div_for_render_item(item),
        }
        doc.on_change_dispatch_to(self)

    def _sync_model(self, model, content, buffers) -> None:
        try:
            super()._sync_model(model, content, buffers)
        except UnknownReferenceError:  # a change to a model only the browser holds
            pass

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            super().close()

    def _ipython_display_(self) -> None:
        display_with_bokehjs(self)


#: Every dashboard not yet closed, however it was shown (under a ``%%memprofile`` cell, by
#: ``prof.show()``, in a panel tab). Weak: ipywidgets' own registry keeps an open widget
#: alive until ``close()``; this only lets :func:`close_dashboards` find them.
_open: weakref.WeakSet[Dashboard] = weakref.WeakSet()


def close_dashboards(prof=None) -> int:
    """Close every open dashboard of ``prof`` (every dashboard when None), so nothing shown
    keeps its tables alive; returns how many were closed."""
    found = [d for d in list(_open) if prof is None or d.profile is prof]
    for d in found:
        d.close()
    forget(prof)  # and the selection kept for its next dashboard
    return len(found)


def close_tree(widget) -> None:
    """Close ``widget`` and every widget under it (children, layouts, styles)."""
    widget.close()
    _close_tree(widget)


def _close_tree(widget) -> None:
    """Close ``widget``'s children, grandchildren, ... and every layout and style among them
    (ipywidgets closes only the one widget; each layout and style is a widget of its own)."""
    stack = [widget]
    while stack:
        w = stack.pop()
        stack.extend(getattr(w, "children", ()) or ())
        for part in (getattr(w, "layout", None), getattr(w, "style", None)):
            if isinstance(part, widgets.Widget):
                part.close()
        if w is not widget and isinstance(w, widgets.Widget):
            w.close()


class CategoryChoice(widgets.HBox):
    """One checkbox per category, all ticked at first; ``value`` is the tuple of ticked
    categories (settable). Checkboxes wrap at narrow widths, and ticked reads as chosen (a
    multiple-select list greys every selected item out when it has no focus: it looked
    disabled)."""

    value = traitlets.Tuple()

    def __init__(self, categories: list[str]) -> None:
        self._boxes = [
            widgets.Checkbox(
                value=True, description=c, indent=False, layout=widgets.Layout(width="auto")
            )
            for c in categories
        ]
        for box in self._boxes:
            box.observe(self._ticked, names="value")
        super().__init__(
            [widgets.Label("categories"), *self._boxes],
            layout=widgets.Layout(flex_flow="row wrap", align_items="center"),
        )
        self.value = tuple(categories)

    _syncing = False

    def _ticked(self, _change) -> None:
        if not self._syncing:
            self.value = tuple(b.description for b in self._boxes if b.value)

    @traitlets.observe("value")
    def _chosen(self, change) -> None:
        self._syncing = True
        try:
            for box in self._boxes:
                box.value = box.description in change["new"]
        finally:
            self._syncing = False


class Dashboard(widgets.VBox):
    """Linked views of one profile, with a device choice, a category filter and a button that
    puts the clicked block's lineage into a notebook variable.

    ``selected_alloc_id`` is the block clicked in the views (synced from the browser), and
    ``lineage`` the last lineage put into a variable.
    """

    def __init__(self, prof, *, header: bool = True):
        self.profile = prof
        self._header = header
        self.lineage = None
        devs = prof.devices
        present = {str(c) for c in pd.unique(prof.allocations["category"]) if not pd.isna(c)}
        cats = [c for c in dd.CATEGORY_COLORS if c in present]
        self._device = widgets.Dropdown(
            options=[("all devices", "")] + [(d, d) for d in devs],
            value="",
            description="device",
            layout=widgets.Layout(width="220px"),
        )
        self._categories = CategoryChoice(cats)
        self._var = widgets.Text(
            value="lineage", description="variable", layout=widgets.Layout(width="220px")
        )
        self._to_var = widgets.Button(
            description="Lineage to variable",
            tooltip="Put the clicked block's lineage (prof.lineage(alloc_id)) into this variable",
            icon="arrow-right",
            layout=widgets.Layout(width="auto"),  # its whole label, at any width
        )
        self._status = widgets.HTML(value="")
        shown = page(prof, header=header, live=True)
        self._built = shown.built
        dashboard_zoom.watch(prof, shown.built.zoom)
        self._view = BokehView(page=shown)
        self._device.observe(self._rebuild, names="value")
        self._categories.observe(self._rebuild, names="value")
        self._to_var.on_click(lambda _: self.lineage_to_variable())
        controls = widgets.VBox(
            [
                widgets.HBox(
                    [self._device, self._var, self._to_var],
                    layout=widgets.Layout(flex_flow="row wrap"),  # wraps in a narrow panel
                ),
                self._categories,
            ]
        )
        super().__init__([controls, self._status, self._view])
        self.add_class("memprof-widget")
        _open.add(self)

    def _ipython_display_(self) -> None:
        display_with_bokehjs(self)

    def close(self) -> None:
        """Close the dashboard and every widget in it, and let go of the profile: a closed
        dashboard (still referenced from an old output, say) holds none of its tables."""
        _open.discard(self)
        _close_tree(self)
        super().close()
        self.profile = None
        self._built = None
        self.lineage = None

    # -- state read back from the browser ----------------------------------------------------
    @property
    def selected_alloc_id(self) -> int | None:
        """The block clicked in the allocations table or lifetime chart (one block), or None."""
        idx = list(self._built.allocs.selected.indices)
        if len(idx) != 1:
            return None
        aid = int(self._built.allocs.data["alloc_id"][idx[0]])
        return aid if aid >= 0 else None

    def lineage_to_variable(self, name: str | None = None):
        """Put ``prof.lineage(alloc_id)`` of the clicked block into the notebook namespace."""
        name = (name if name is not None else self._var.value).strip()
        if not name.isidentifier() or keyword.iskeyword(name):
            self._say(f"{name!r} is not a valid Python variable name.")
            return None
        aid = self.selected_alloc_id
        if aid is None:
            self._say("Click one block in the allocations table (or a lifetime bar) first.")
            return None
        df = self.profile.lineage(aid)
        self.lineage = df
        try:
            from IPython import get_ipython

            ip = get_ipython()
        except ImportError:  # pragma: no cover (IPython is a dependency)
            ip = None
        if ip is not None:
            ip.user_ns[name] = df
            self._say(f"lineage of block {aid} ({len(df)} rows) is now in", name)
        else:
            self._say(f"lineage of block {aid} ({len(df)} rows) is in", ".lineage")
        return df

    # -- controls -----------------------------------------------------------------------------
    def _say(self, text: str, code: str = "") -> None:
        """Show ``text`` (escaped) and, after it, ``code`` (escaped) in monospace."""
        out = html.escape(text)
        if code:
            out += f" <code>{html.escape(code)}</code>"
        self._status.value = f"<span>{out}</span>"

    def _rebuild(self, _change=None) -> None:
        device = self._device.value or None
        cats = list(self._categories.value)
        shown = page(self.profile, device, cats, header=self._header, live=True)
        self._built = shown.built
        dashboard_zoom.watch(self.profile, shown.built.zoom)
        old = self._view
        self._view = BokehView(page=shown)
        self.children = [*self.children[:-1], self._view]
        old.close()
