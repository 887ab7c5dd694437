"""The dashboard as users meet it in a real JupyterLab (headless Debian chromium): the first
screen of a notebook that has not run, dashboards after a page reload (new cells and panel
tabs), several panel views, and a dashboard in a 400 px wide panel. One server and one
browser page serve every test here, in order."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest
from _browser import ARTIFACTS, chromium_page, chromium_path, docs_image, screenshot
from _jupyterlab import APP, jupyterlab, kernel_idle, notebook_js, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = notebook_js("views.ipynb")
CELLS = [
    "import torch\n%load_ext jupyter_memprof\n"
    "model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), "
    "torch.nn.Linear(256, 8))\n"
    "opt = torch.optim.Adam(model.parameters())\n"
    "def step(batch):\n"
    "    opt.zero_grad()\n"
    "    model(torch.randn(batch, 64)).square().mean().backward()\n"
    "    opt.step()",
    "%%memprofile -o first\nstep(32)",
]
# what jupyter_bokeh's views show when the page has no BokehJS
BROKEN = "Cannot read properties of undefined"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    chromium_path()
    root = tmp_path_factory.mktemp("lab")
    write_notebook(root / "views.ipynb", CELLS)
    shutil.copy(ROOT / "notebooks" / "quickstart.ipynb", root / "quickstart.ipynb")
    with jupyterlab(root) as base, chromium_page(viewport=(1400, 1000)) as page:
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.errors = errors
        try:
            yield base, page
        finally:
            os.makedirs(ARTIFACTS, exist_ok=True)
            shutil.copy(root / "server.log", os.path.join(ARTIFACTS, "lab-views-server.log"))


def _run_new_cell(page, source: str) -> None:
    page.evaluate(
        f"""source => {{
            const nb = {NOTEBOOK}.content;
            const n = nb.model.sharedModel.cells.length;
            nb.model.sharedModel.insertCell(n, {{cell_type: 'code', source}});
            nb.activeCellIndex = n;
            {APP}.commands.execute('notebook:run-cell');
        }}""",
        source,
    )


def _cell(page, n: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(n)


def _no_broken_views(page) -> None:
    assert page.get_by_text(BROKEN).count() == 0
    assert page.get_by_text("Click to show javascript error").count() == 0
    assert not [e for e in page.errors if "require" in e], page.errors


def _open_panel(page):
    # (a click on its side-bar tab would close it when a reload restored it open)
    page.evaluate(f"() => {{ {APP}.shell.activateById('jupyter-memprof-panel'); }}")
    return page.locator("#jupyter-memprof-panel")


def test_first_screen_of_the_quickstart_shows_no_widget_repr(lab):
    base, page = lab
    page.goto(base.url("/lab/tree/quickstart.ipynb?reset"))
    page.locator(".jp-Notebook .jp-Cell").nth(6).wait_for(timeout=60_000)
    # the stored dashboard output, before anything runs: no "Dashboard(children=(HBox(..."
    text = page.locator(".jp-Notebook").inner_text()
    assert "memory profile prof" in text  # the stored summary is there
    assert "Dashboard(" not in text and "HBox(" not in text
    stored = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text())
    outputs = [o for c in stored["cells"] for o in c.get("outputs", [])]
    views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views and all(o["data"]["text/plain"] in ("", []) for o in views)
    screenshot(page, "lab-first-screen.png")


def test_panel_views_open_as_tabs_beside_the_first(lab):
    base, page = lab
    page.goto(base.url("/lab/tree/views.ipynb?reset"))
    kernel_idle(page, NOTEBOOK)
    page.evaluate(f"() => {{ {APP}.commands.execute('notebook:run-all-cells'); }}")
    _cell(page, 1).locator(".memprof-timeline").first.wait_for(timeout=120_000)
    kernel_idle(page, NOTEBOOK)
    _run_new_cell(page, "%%memprofile -o second --no-display\nstep(64)")
    panel = _open_panel(page)
    entries = panel.locator(".memprof-entry")
    entries.nth(1).wait_for(timeout=60_000)
    for n in (0, 1):
        entries.nth(n).click()
        view = page.locator(".memprof-dashboard-tab").nth(n)
        view.locator(".memprof-timeline").first.wait_for(timeout=120_000)
    # the second view is a tab beside the first (one dock area, full size), not a new split
    bars = page.evaluate(
        """() => Array.from(document.querySelectorAll('.lm-DockPanel-tabBar')).map(
            bar => Array.from(bar.querySelectorAll('.lm-TabBar-tab'))
                .map(t => t.textContent).filter(t => t.startsWith('Memory: ')))"""
    )
    assert sorted(len(b) for b in bars if b) == [2], bars
    width = page.locator(".memprof-dashboard-tab:visible").evaluate(
        "el => el.getBoundingClientRect().width"
    )
    assert width > 500, width
    _no_broken_views(page)
    _close_views(page)


def _close_views(page) -> None:
    page.evaluate(
        "() => { for (const t of Array.from(document.querySelectorAll('.memprof-dashboard-tab')))"
        f" {{ Array.from({APP}.shell.widgets('main')).find(w => w.id === t.id).dispose(); }} }}"
    )


def test_a_dashboard_drawn_before_a_reload_draws_again(lab):
    """The notebook saved with its dashboard, the page reloaded: the widget comes back from
    the running kernel and draws (the page had no BokehJS until the panel's link loaded it)."""
    base, page = lab
    page.evaluate(f"() => {APP}.commands.execute('docmanager:save')")
    page.wait_for_function(f"() => !{NOTEBOOK}.context.model.dirty", timeout=30_000)
    page.errors.clear()
    page.reload()
    kernel_idle(page, NOTEBOOK)
    _cell(page, 1).locator(".memprof-timeline").first.wait_for(timeout=120_000)
    # drawn again: no error view is left (the first try, before BokehJS came, may have failed)
    page.wait_for_function(
        "() => !document.querySelector('.jupyter-widgets-error-widget')", timeout=60_000
    )
    assert page.get_by_text(BROKEN).count() == 0
    assert page.evaluate("() => !!(window.Bokeh && window.Bokeh.Widgets && window.Bokeh.Tables)")
    # redrawn from the running kernel's widgets: the notebook itself was not changed
    assert not page.evaluate(f"() => {NOTEBOOK}.context.model.dirty")


def test_a_new_dashboard_after_a_reload(lab):
    base, page = lab
    page.reload()
    kernel_idle(page, NOTEBOOK)
    _run_new_cell(page, "%%memprofile -o third\nstep(16)")
    last = page.locator(".jp-Notebook .jp-Cell").last
    last.locator(".memprof-timeline").first.wait_for(timeout=120_000)
    _no_broken_views(page)
    # BokehJS went with the view, then its output was replaced by nothing
    assert last.locator(".jp-OutputArea-output script").count() == 0


def test_a_panel_tab_after_a_reload(lab):
    base, page = lab
    page.reload()
    kernel_idle(page, NOTEBOOK)
    panel = _open_panel(page)
    entries = panel.locator(".memprof-entry")
    entries.nth(2).wait_for(timeout=60_000)
    entries.nth(1).click()
    tab = page.locator(".memprof-dashboard-tab")
    tab.first.locator(".memprof-timeline").first.wait_for(timeout=120_000)
    _no_broken_views(page)


CLIPPED = """root => {
  // every control and text box of the widget whose content is wider than its box
  const out = [];
  for (const el of root.querySelectorAll('button, label, .widget-label, select, input')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0) continue;
    if (el.scrollWidth > el.clientWidth + 1) out.push(el.textContent.trim() || el.tagName);
  }
  const box = root.getBoundingClientRect();
  for (const el of root.querySelectorAll('.widget-inline-hbox, .jupyter-button')) {
    const r = el.getBoundingClientRect();
    if (r.width && r.right > box.right + 1) out.push('past the edge: ' + el.textContent.trim());
  }
  return out;
}"""


# Texts Bokeh draws on its canvases (plot titles, the peak's, labels) that do not fit their plot,
# for the plots inside the element `root` (Bokeh renders into shadow roots: placed by box).
CANVAS_CLIPPED = """root => {
  const box = root.getBoundingClientRect();
  const ctx = document.createElement('canvas').getContext('2d');
  const width = (text, font) => { ctx.font = font; return ctx.measureText(text).width; };
  const out = [];
  let plots = 0, labels = 0;
  const views = new Set();
  const all = (x) => { views.add(x); for (const c of x.child_views || []) all(c); };
  for (const v of Bokeh.index.all_views()) all(v);
  {
    for (const p of views) {
      if (!p.frame || !p.canvas_view) continue;
      const r = p.canvas_view.el.getBoundingClientRect();
      if (r.width === 0 || r.left < box.left - 1 || r.right > box.right + 1) continue;
      plots++;
      const f = p.frame.bbox, W = r.width;
      // the title, and the titles under it (the peak's)
      const above = p.model.above.filter((a) => a.type === 'Title' && a !== p.model.title);
      labels += above.length;
      for (const t of [p.model.title, ...above]) {
        if (!t || !t.text) continue;
        const w = width(t.text, `${t.text_font_style} ${t.text_font_size} ${t.text_font}`);
        if (f.left + w > W) out.push(`title "${t.text}": ${Math.round(f.left + w)} > ${W}`);
      }
      for (const l of p.model.center) {
        if (l.type !== 'Label' || !l.text) continue;
        labels++;
        const w = width(l.text, `${l.text_font_style} ${l.text_font_size} ${l.text_font}`);
        const x = p.frame.x_scale.compute(l.x) + l.x_offset;
        const [a, b] = l.text_align === 'right' ? [x - w, x] : [x, x + w];
        const y = p.frame.y_scale.compute(l.y) - l.y_offset;  // the text's bottom
        if (a < f.left - 1 || b > f.right + 1 || y - 13 < f.top - 1) {
          out.push(`label "${l.text}": ${Math.round(a)}..${Math.round(b)} of ${f.left}..${f.right}, top ${y}`);
        }
      }
    }
  }
  return [plots, labels, out];
}"""


# Table column headings (in Bokeh's shadow roots) cut short, under the element `root`.
HEADINGS_CUT = """root => {
  const out = [];
  const walk = (r) => {
    for (const e of r.querySelectorAll('*')) {
      if (e.classList.contains('slick-column-name') && e.scrollWidth > e.parentElement.clientWidth)
        out.push(e.textContent);
      if (e.shadowRoot) walk(e.shadowRoot);
    }
  };
  walk(root);
  return out;
}"""


def test_a_dashboard_in_a_400px_panel_clips_nothing(lab):
    base, page = lab
    # the view beside the notebook: half of a 900 px window is a 400-odd px panel
    tab = page.locator(".memprof-dashboard-tab").first
    page.set_viewport_size({"width": 900, "height": 1000})
    page.evaluate(f"() => {{ {APP}.shell.collapseLeft(); }}")
    page.wait_for_timeout(500)
    width = tab.evaluate("el => el.getBoundingClientRect().width")
    assert 380 <= width <= 480, width
    widget = tab.locator(".memprof-widget").first
    widget.wait_for(timeout=30_000)
    page.wait_for_timeout(500)
    assert widget.evaluate(CLIPPED) == []
    plots, labels, clipped = tab.evaluate(CANVAS_CLIPPED)
    assert plots >= 4 and labels >= 1 and clipped == []
    assert tab.evaluate(HEADINGS_CUT) == []
    # the tables take the whole width
    for cls in ("memprof-allocations", "memprof-lineage"):
        table = tab.locator(f".{cls}").first.evaluate("el => el.getBoundingClientRect().width")
        assert table >= 0.9 * widget.evaluate("el => el.getBoundingClientRect().width") - 20
    screenshot(page, "lab-narrow-panel.png")
    page.screenshot(path=os.path.join(ARTIFACTS, "dashboard-panel.png"))  # the first screen
    docs_image("dashboard-panel.png")
