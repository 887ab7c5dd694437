"""Layouts from a 400 px side panel to a full screen: nothing clipped, the tables' key
columns first and a hint that they scroll (headless Chromium on the exported page of a real
training step)."""

from __future__ import annotations

import os

import pytest
from _browser import chromium_page, screenshot
from test_dashboard import training_step_profile

pytestmark = pytest.mark.browser

# Every Bokeh layout element (a shadow host: plots, tables, texts, buttons, rows and columns;
# renderers inside a plot's canvas have boxes that say nothing of what is drawn) with a box:
# its box, and the page's own width.
BOXES = """() => {
  const out = [];
  const walk = (r) => {
    for (const e of r.querySelectorAll("*")) {
      if (e.shadowRoot) {
        const b = e.getBoundingClientRect();
        const layout = /bk-(Column|Row|Figure|Plot|Div|DataTable|Button)\b/;
        if (b.width > 0 && b.height > 0 && layout.test(String(e.className)))
          out.push({cls: String(e.className), left: b.left, right: b.right});
        walk(e.shadowRoot);
      }
    }
  };
  walk(document);
  return {boxes: out, inner: window.innerWidth,
    scroll: document.documentElement.scrollWidth};
}"""

# The header cells of a table (by model name): their text and box, left to right.
HEADERS = """(name) => {
  const out = [];
  const walk = (r) => {
    for (const e of r.querySelectorAll(".slick-header-column")) {
      const b = e.getBoundingClientRect();
      out.push({text: e.textContent.trim(), left: b.left, right: b.right});
    }
    for (const e of r.querySelectorAll("*")) if (e.shadowRoot) walk(e.shadowRoot);
  };
  walk(document);
  return out;
}"""


@pytest.fixture(scope="module")
def html_path(tmp_path_factory):
    prof = training_step_profile()
    return prof.to_html(tmp_path_factory.mktemp("layout") / "dashboard.html")


# 400: a side panel; 550: the dashboard's half of a 1100 px window split with a notebook
@pytest.mark.parametrize("width", [400, 550, 1400])
def test_nothing_is_clipped_and_the_tables_say_they_scroll(html_path, width):
    with chromium_page(viewport=(width, 1200)) as page:
        page.goto("file://" + os.path.abspath(html_path))
        page.wait_for_function("window.memprofReady !== undefined", timeout=60_000)
        got = page.evaluate(BOXES)
        screenshot(page, f"dashboard-{width}px.png")
        assert got["scroll"] <= got["inner"]  # the page never scrolls sideways
        clipped = [b for b in got["boxes"] if b["left"] < -1 or b["right"] > got["inner"] + 1]
        assert clipped == [], [(b["cls"], round(b["left"]), round(b["right"])) for b in clipped]
        text = page.evaluate("document.body.innerText") + page.evaluate(
            """() => { let t = ""; const w = (r) => { for (const e of r.querySelectorAll("*"))
              { if (e.shadowRoot) { t += e.shadowRoot.textContent; w(e.shadowRoot); } } };
              w(document); return t; }"""
        )
        assert text.count("The table scrolls: sideways for more columns") == 3
        headers = page.evaluate(HEADERS)
        visible = [h["text"] for h in headers if 0 <= h["left"] and h["right"] <= width]
        # the key columns first: the allocations' size and name, the ops' op and its bytes
        for key in ("size", "name", "op", "self alloc"):
            assert key in visible, (key, visible)
