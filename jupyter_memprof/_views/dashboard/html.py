"""BokehJS for a standalone HTML file and for a notebook page.

The standalone file carries BokehJS itself (``bokeh.resources.INLINE``: no CDN, works offline).
BokehJS with its widgets and tables is ~1.9 MB of minified JavaScript, so the file stores it,
and the document's JSON, gzip-compressed and base64-encoded, and inflates both with the
browser's ``DecompressionStream`` before handing them to ``Bokeh.embed.embed_items``
(``js/page_loader.js``). That keeps a one-step dashboard well under 2 MB. When the dashboard
is on screen the page sets ``window.memprofReady`` to ``performance.now()`` (used by the
benchmark and the tests).
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import json
import os

from bokeh.core.json_encoder import serialize_json
from bokeh.embed.bundle import bundle_for_objs_and_resources
from bokeh.embed.elements import div_for_render_item
from bokeh.embed.util import (
    OutputDocumentFor,
    RenderItem,
    standalone_docs_json_and_render_items,
)
from bokeh.model import Model
from bokeh.resources import INLINE
from bokeh.util.serialization import make_globally_unique_css_safe_id, make_globally_unique_id

from ..._io import atomic_write, check_target
from .js import source

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
html, body {{ box-sizing: border-box; margin: 0; padding: 0; }}
body {{ padding: 8px 12px; font-family: system-ui, -apple-system, "Segoe UI", sans-serif; }}
#memprof-status {{ color: #555; padding: 1em 0; }}
</style>
</head>
<body>
<div id="memprof-status">Loading the memory dashboard&hellip;</div>
<noscript>This dashboard needs JavaScript.</noscript>
{divs}
<script type="application/octet-stream" id="memprof-bokehjs">{js}</script>
<script type="application/octet-stream" id="memprof-doc">{doc}</script>
<script type="application/json" id="memprof-render-items">{items}</script>
<script>{loader}</script>
</body>
</html>
"""


def _pack(text: str, level: int = 6) -> str:
    """gzip, then base64: what ``js/page_loader.js`` inflates. Level 6 is within 1% of 9's
    size on these documents at a third of its time."""
    return base64.b64encode(gzip.compress(text.encode("utf-8"), level, mtime=0)).decode("ascii")


@functools.lru_cache(maxsize=2)
def _packed_bokehjs(js: str) -> str:
    """BokehJS packed once per process (~1.9 MB; the same for every dashboard of a bokeh
    version and set of model types): 60 ms of each write otherwise."""
    return _pack(js, 9)


def standalone_html(layout, title: str) -> str:
    """One self-contained HTML page showing ``layout`` (BokehJS inlined, no network)."""
    with OutputDocumentFor([layout], always_new=False) as doc:
        docs_json, render_items = standalone_docs_json_and_render_items(
            [layout], suppress_callback_warning=True
        )
        bundle = bundle_for_objs_and_resources([doc], INLINE)
    return _page(title, docs_json, render_items[0], ";\n".join(bundle.js_raw))


def _page(title: str, docs_json: dict, item: RenderItem, js: str) -> str:
    return _PAGE.format(
        title=html.escape(title),
        divs=div_for_render_item(item),
        js=_packed_bokehjs(js),
        doc=_pack(serialize_json(docs_json)),
        # JSON inside <script>: no "</" can end the element early
        items=json.dumps([item.to_json()]).replace("</", "<\\/"),
        loader=source("page_loader.js"),
    )


@functools.lru_cache(maxsize=2)
def bokehjs(mathjax: bool = False) -> str:
    """BokehJS with its widgets and tables, read once: what ``bundle_for_objs_and_resources``
    gives for a dashboard's models (tables and widgets, no WebGL, nothing but Bokeh's own
    models; MathJax when a text holds TeX). tests/test_dashboard.py compares the two."""
    used = {"bokeh", "bokeh-widgets", "bokeh-tables"} | ({"bokeh-mathjax"} if mathjax else set())
    components = [c for c in INLINE.components if c in used]
    return ";\n".join(INLINE.clone(components=components).js_raw)


def page_html(doc_json: dict, root: Model, title: str, js: str) -> str:
    """One self-contained HTML page showing the document ``doc_json`` (see
    :func:`standalone_html`), whose root has the id of ``root``."""
    item = render_item(root)
    return _page(title, {item.docid: doc_json}, item, js)


def render_item(root: Model) -> RenderItem:
    """The render item of a document whose root has the id of ``root``."""
    return RenderItem(make_globally_unique_id(), roots={root: make_globally_unique_css_safe_id()})


@functools.cache
def notebook_bokehjs() -> str:
    """JavaScript that loads BokehJS (with widgets and tables) into a notebook page, unless
    the page has this version already (``js/notebook_loader.js``)."""
    from bokeh import __version__
    from bokeh.resources import Resources

    res = Resources(mode="inline", components=["bokeh", "bokeh-widgets", "bokeh-tables"])
    call = f"memprof_load_bokehjs({json.dumps(__version__)}, {json.dumps(res.js_raw)});"
    return source("notebook_loader.js") + "\n" + call


def display_with_bokehjs(widget) -> None:
    """Display ``widget`` (Bokeh views) in the notebook with BokehJS in front of it.

    BokehJS goes with every view, not once per kernel: a reloaded page, or the notebook in a
    second tab, has none, and jupyter_bokeh's views need ``window.Bokeh`` when they are made.
    JupyterLab runs the ``bokehjs_load`` output as a script when it arrives, before the widget's
    view exists; the output is then replaced by nothing, so the notebook file keeps no copy
    of the library. The widget's text form is empty: a front end that cannot draw widgets (a
    notebook opened before it runs, untrusted) shows nothing instead of the widget's repr.
    Outside IPython it does nothing.
    """
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover (IPython is a dependency)
        return
    if get_ipython() is None:
        return
    from bokeh.io.notebook import LOAD_MIME_TYPE

    loader = display({LOAD_MIME_TYPE: notebook_bokehjs(), "text/plain": ""}, raw=True,
                     display_id=True)  # fmt: skip
    spec = widget.get_view_spec()
    # the mark tells the JupyterLab extension this output is a dashboard (labextension/src/guard.ts)
    display(
        {"application/vnd.jupyter.widget-view+json": spec, "text/plain": ""},
        metadata={"jupyter_memprof": "dashboard"},
        raw=True,
    )
    loader.update({"text/plain": ""}, raw=True)


def is_our_page(path: str) -> bool:
    """A page :func:`standalone_html` wrote (a dashboard or a comparison): the only kind of
    file an HTML export replaces without ``overwrite=True``."""
    try:
        with open(path, "rb") as fh:
            return b'id="memprof-status"' in fh.read(4096)
    except OSError:
        return False


def write_html(prof, path, *, overwrite: bool = False) -> str:
    """Write the dashboard as one standalone, interactive HTML file; returns the path.

    BokehJS is inlined (no CDN, nothing fetched), so the file works offline and without a
    kernel; all linking (selection, lineage, time filter) runs in the page. The file is
    written atomically; an existing file is replaced when it is such a dashboard page, or
    with ``overwrite=True``.
    """
    from .page import page

    path = os.fspath(path)
    check_target(path, what="jupyter_memprof dashboard", overwrite=overwrite,
                 is_own_kind=is_our_page)  # fmt: skip
    shown = page(prof)
    js = bokehjs(mathjax=shown.tex)
    text = page_html(shown.doc, shown.root, f"jupyter_memprof: {prof.label}", js)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    atomic_write(path, write, what="jupyter_memprof dashboard", overwrite=overwrite,
                 is_own_kind=is_our_page)  # fmt: skip
    return path
