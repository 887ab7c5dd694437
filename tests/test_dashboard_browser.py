"""The dashboard as a user meets it: headless Chromium opens the exported HTML of a real
training step (and JupyterLab runs the magic), clicks, hovers, drags and reads."""

from __future__ import annotations

import os
import re

import pytest
from _browser import chromium_page, screenshot
from _jupyterlab import jupyterlab, write_notebook
from test_dashboard import LABEL, training_step_profile

pytestmark = pytest.mark.browser

VIEWS = ("memprof-timeline", "memprof-optree", "memprof-allocations", "memprof-lineage")

# Text of an element including its open shadow roots (Bokeh 3 renders in shadow DOM).
DEEP_TEXT = """el => {
  const walk = (n) => {
    const out = [];
    if (n.shadowRoot) out.push(walk(n.shadowRoot));
    for (const c of n.childNodes) {
      if (c.nodeType === 3) { const t = c.textContent.trim(); if (t) out.push(t); }
      else if (c.nodeType === 1 && c.tagName !== "STYLE" && c.tagName !== "SCRIPT") out.push(walk(c));
    }
    return out.filter(Boolean).join(" | ");
  };
  return walk(el);
}"""

# Every element in the page, through shadow roots, whose tag is `tag` and text is `text`.
COUNT_ELEMENTS = """([tag, text]) => {
  let n = 0;
  const walk = (r) => {
    for (const e of r.querySelectorAll("*")) {
      if (e.tagName === tag && e.textContent === text) n++;
      if (e.shadowRoot) walk(e.shadowRoot);
    }
  };
  walk(document);
  return n;
}"""

# Tooltip texts currently shown (Bokeh puts them in shadow roots too).
TOOLTIPS = """() => {
  const out = [];
  const walk = (r) => {
    for (const e of r.querySelectorAll("*")) {
      if (e.classList && e.classList.contains("bk-tooltip-content")) out.push(e.textContent);
      if (e.shadowRoot) walk(e.shadowRoot);
    }
  };
  walk(document);
  return out;
}"""

# Page coordinates of a data point (x field, y field, row of a named source) in the plot
# that draws that source.
TO_PAGE = """([name, xf, yf, row, dx]) => {
  const src = Bokeh.documents[0].get_model_by_name(name);
  for (const v of Bokeh.index.all_views()) {
    const rs = v.model.renderers;
    if (!rs || !v.frame || !rs.some((r) => r.data_source === src)) continue;
    const x = src.data[xf][row] + (dx || 0), y = src.data[yf][row];
    const rect = v.canvas_view.el.getBoundingClientRect();
    return [rect.left + v.frame.x_scale.compute(x), rect.top + v.frame.y_scale.compute(y)];
  }
  return null;
}"""

# Page box of the frame of the first timeline figure.
TIMELINE_FRAME = """() => {
  for (const v of Bokeh.index.all_views()) {
    const t = v.model.title;
    if (t && String(t.text).includes("live memory by category")) {
      const r = v.canvas_view.el.getBoundingClientRect(), f = v.frame.bbox;
      return [r.left + f.left, r.top + f.top, f.width, f.height];
    }
  }
  return null;
}"""


def settle(page, condition: str, arg=None) -> None:
    """Wait until ``condition`` (a JS function) holds: the views update asynchronously."""
    page.wait_for_function(condition, arg=arg, timeout=15_000)


def model_data(page, name: str, field: str):
    return page.evaluate(
        "([n, f]) => Array.from(Bokeh.documents[0].get_model_by_name(n).data[f])", [name, field]
    )


def selected(page, name: str) -> list[int]:
    return page.evaluate(
        "(n) => Array.from(Bokeh.documents[0].get_model_by_name(n).selected.indices)", name
    )


@pytest.fixture(scope="module")
def prof():
    return training_step_profile()


@pytest.fixture(scope="module")
def html_path(prof, tmp_path_factory):
    return prof.to_html(tmp_path_factory.mktemp("dash") / "dashboard.html")


@pytest.fixture
def page(html_path):
    # tall enough for the whole dashboard: full-page screenshots then need no re-layout
    with chromium_page(viewport=(1400, 1800)) as page:
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto("file://" + os.path.abspath(html_path))
        page.wait_for_function(
            "window.memprofReady !== undefined || window.memprofError !== undefined",
            timeout=30_000,
        )
        assert page.evaluate("window.memprofError") is None
        page.errors = errors
        yield page
        assert errors == []


def text_of(page, css: str) -> str:
    return page.locator(css).first.evaluate(DEEP_TEXT)


def test_the_four_views_render(page, prof):
    for cls in VIEWS:
        assert page.locator(f".{cls}").first.is_visible(), cls
    for cls in ("memprof-timeline", "memprof-optree", "memprof-allocations"):
        assert page.locator(f".{cls} canvas").count() >= 1, cls
    # the allocations table lists blocks, largest first
    rows = page.locator(".memprof-allocations .slick-row")
    assert rows.count() > 5
    first = prof.allocations.sort_values(["size_bytes", "alloc_id"], ascending=[False, True])
    name = first.iloc[0]["name"]
    want = name if isinstance(name, str) else f"block {first.iloc[0]['alloc_id']}"
    assert want in rows.first.evaluate(DEEP_TEXT)
    # the timeline says what it draws, and marks the analysis' peak
    timeline = text_of(page, ".memprof-timeline")
    for c in ("parameter", "optimizer_state", "activation", "gradient"):
        assert c in timeline
    peak = prof.peak("cpu")
    peak_ms = (peak.attrs["peak_ns"] - prof.meta["start_ns"]) / 1e6
    labels = page.evaluate(
        """() => { const out = [];
             for (const m of Bokeh.documents[0].all_models) if (m.type === "Label") out.push(m.text);
             return out; }"""
    )
    assert any(f"at {peak_ms:.3f} ms" in t for t in labels), labels
    # hovering the timeline at the peak names bytes per category and the op running then
    x0, y0, w, h = page.evaluate(TIMELINE_FRAME)
    xy = page.evaluate(TO_PAGE, ["memprof-timeline-cpu", "t", "total", 0, peak_ms])
    page.mouse.move(x0 + w / 2, y0 + h / 2)
    page.mouse.move(xy[0] + 1, y0 + h / 2, steps=4)
    settle(page, f"() => ({TOOLTIPS})().some((t) => t.includes('total'))")
    tips = " ".join(page.evaluate(TOOLTIPS))
    assert "total" in tips and "op" in tips and "iB" in tips, tips
    screenshot(page, "dashboard.png")


def test_legend_hides_a_category_and_restacks_the_rest(page):
    before = model_data(page, "memprof-timeline-cpu", "hi_gradient")
    activation = model_data(page, "memprof-timeline-cpu", "b_activation")
    assert max(activation) > 0
    hi = "Bokeh.documents[0].get_model_by_name('memprof-timeline-cpu').data.hi_gradient"
    page.locator(".memprof-timeline").get_by_text("activation", exact=True).first.click()
    settle(page, f"(m) => Math.max(...{hi}) < m", max(before))
    after = model_data(page, "memprof-timeline-cpu", "hi_gradient")
    # the categories above activation come down by exactly its bytes
    assert all(abs(b - a - c) < 1e-6 for b, a, c in zip(before, after, activation, strict=True))
    page.locator(".memprof-timeline").get_by_text("activation", exact=True).first.click()
    settle(page, f"(m) => Math.max(...{hi}) === m", max(before))
    assert model_data(page, "memprof-timeline-cpu", "hi_gradient") == before


def test_clicking_an_allocation_row_shows_its_lineage(page, prof):
    names = model_data(page, "memprof-allocations", "name")
    ids = model_data(page, "memprof-allocations", "alloc_id")

    # the first listed block (largest first) created by an aten:: op during the capture
    def creator_of(aid: int) -> str | None:
        made = prof.lineage(aid).query("relation == 'allocated'")
        name = str(made["op_name"].iloc[0]) if len(made) else ""
        return name if name.startswith("aten::") else None

    row = next((r for r, aid in enumerate(ids) if aid >= 0 and creator_of(aid)), None)
    assert row is not None, "no block created by an aten:: op"
    creator = creator_of(ids[row])
    lin = prof.lineage(ids[row])
    viewport = page.locator(".memprof-allocations .slick-viewport").first
    viewport.evaluate("(el, y) => { el.scrollTop = y; }", max(0, row - 2) * 24)
    cell = page.locator(
        ".memprof-allocations .slick-cell", has_text=re.compile(f"^{re.escape(names[row])}$")
    )
    cell.first.click()
    settle(
        page,
        "() => Bokeh.documents[0].get_model_by_name('memprof-lineage').data.relation.length > 0",
    )
    assert selected(page, "memprof-allocations") == [row]
    panel = text_of(page, ".memprof-lineage")
    assert f"created by | {creator}" in panel, panel
    # the lineage table holds exactly prof.lineage(alloc_id), time ordered
    assert model_data(page, "memprof-lineage", "relation") == lin["relation"].astype(str).tolist()
    shown = page.locator(".memprof-lineage .slick-row")
    assert shown.count() >= min(len(lin), 5)
    assert "allocated" in panel and creator in shown.nth(
        list(lin["relation"].astype(str)).index("allocated")
    ).evaluate(DEEP_TEXT)
    # and the op tree highlights the creating op (and backward users)
    op_names = model_data(page, "memprof-ops", "name")
    hl = [op_names[i] for i in selected(page, "memprof-ops")]
    assert creator in hl
    screenshot(page, "dashboard-lineage.png")


def test_clicking_a_forward_op_highlights_its_backward_partner(page, prof):
    fi = model_data(page, "memprof-flows", "fi")
    bi = model_data(page, "memprof-flows", "bi")
    left = model_data(page, "memprof-ops", "left")
    right = model_data(page, "memprof-ops", "right")
    names = model_data(page, "memprof-ops", "name")
    # the widest forward op with a backward partner (easiest to hit)
    k = max(range(len(fi)), key=lambda j: right[fi[j]] - left[fi[j]])
    f, b = fi[k], bi[k]
    dx = -(right[f] - left[f]) / 4  # left of the centre, away from the link line
    xy = page.evaluate(TO_PAGE, ["memprof-ops", "cx", "cy", f, dx])
    page.mouse.click(*xy)
    ops_sel = "Bokeh.documents[0].get_model_by_name('memprof-ops').selected.indices"
    settle(page, f"() => {ops_sel}.length >= 2")
    sel = selected(page, "memprof-ops")
    assert f in sel and b in sel
    assert k in selected(page, "memprof-flows")
    info = text_of(page, ".memprof-optree")
    assert f"backward partner: | {names[b]}" in info, info
    # what the database says: this pair is a flow of the profile
    ops_ids = model_data(page, "memprof-ops", "op_id")
    pair = prof.flows[
        (prof.flows["forward_op_id"] == ops_ids[f]) & (prof.flows["backward_op_id"] == ops_ids[b])
    ]
    assert len(pair) == 1
    # and from the other end: the backward op names its forward partner
    dx = -(right[b] - left[b]) / 4
    xy = page.evaluate(TO_PAGE, ["memprof-ops", "cx", "cy", b, dx])
    page.wait_for_timeout(600)  # two clicks closer together are one double tap to Bokeh
    page.mouse.click(*xy)
    settle(page, f"(b) => {ops_sel}[0] === b && {ops_sel}.length >= 2", b)
    assert f in selected(page, "memprof-ops")
    assert f"forward partner: | {names[f]}" in text_of(page, ".memprof-optree")


def test_record_function_label_is_shown_as_text(page):
    # in the op table
    table = page.locator(".memprof-optable")
    assert table.get_by_text(LABEL, exact=True).count() >= 1
    # in the op tree's hover tooltip
    names = model_data(page, "memprof-ops", "name")
    row = names.index(LABEL)
    xy = page.evaluate(TO_PAGE, ["memprof-ops", "cx", "cy", row, 0])
    page.mouse.move(xy[0] - 30, xy[1] + 3)
    page.mouse.move(*xy, steps=4)
    settle(page, f"(l) => ({TOOLTIPS})().some((t) => t.includes(l))", LABEL)
    assert any(LABEL in t for t in page.evaluate(TOOLTIPS))
    # in the op details after a click
    page.mouse.click(*xy)
    info = "Bokeh.documents[0].get_model_by_name('memprof-op-info').text"
    settle(page, f"() => {info}.includes('annotation')")
    assert LABEL in text_of(page, ".memprof-optree")
    # and never as markup: no <b> element holding "x" anywhere
    assert page.evaluate(COUNT_ELEMENTS, ["B", "x"]) == 0


def test_a_time_range_filters_ops_and_allocations(page, prof):
    x0, y0, w, h = page.evaluate(TIMELINE_FRAME)
    # drag around the peak, where ops certainly ran (a capture has idle stretches)
    lo, hi = page.evaluate(
        "() => { const r = Bokeh.documents[0].get_model_by_name('memprof-time');"
        " return [r.start, r.end]; }"
    )
    peak_ms = (prof.peak().attrs["peak_ns"] - prof.meta["start_ns"]) / 1e6
    ops_ms = (prof.ops["start_ns"] - prof.meta["start_ns"]) / 1e6
    a_ms, b_ms = peak_ms - 0.02 * (hi - lo), peak_ms + 0.02 * (hi - lo)
    assert ((ops_ms >= a_ms) & (ops_ms <= b_ms)).any()
    page.mouse.move(x0 + (a_ms - lo) / (hi - lo) * w, y0 + h / 2)
    page.mouse.down()
    page.mouse.move(x0 + (b_ms - lo) / (hi - lo) * w, y0 + h / 2, steps=8)
    page.mouse.up()
    flags_js = "Bokeh.documents[0].get_model_by_name('memprof-allocations-filter').booleans"
    settle(page, f"() => {flags_js} !== null")
    text = text_of(page, ".memprof-timeline")
    m = re.search(r"([\d.]+) – ([\d.]+) ms: (\d+) of (\d+) listed blocks alive", text)
    assert m, text
    t0, t1, alive, listed = float(m[1]), float(m[2]), int(m[3]), int(m[4])
    assert 0 < alive < listed
    # the same count straight from the allocations table
    a = prof.allocations
    start = prof.meta["start_ns"]
    alloc_ms = (a["alloc_ns"].astype("Float64") - start) / 1e6
    free_ms = (a["free_ns"].astype("Float64") - start) / 1e6
    live = (alloc_ms.fillna(-1e18) <= t1 + 1e-3) & (free_ms.fillna(1e18) >= t0 - 1e-3)
    assert abs(int(live.sum()) - alive) <= 2  # ends of the range are rounded in the text
    flags = page.evaluate(
        "() => Bokeh.documents[0].get_model_by_name('memprof-allocations-filter').booleans"
    )
    assert sum(flags) == alive
    ops_flags = page.evaluate(
        "() => Bokeh.documents[0].get_model_by_name('memprof-ops-filter').booleans"
    )
    assert 0 < sum(ops_flags) < len(ops_flags)
    screenshot(page, "dashboard-time-filter.png")
    page.locator(".memprof-timeline").get_by_text("Clear time filter").click()
    settle(page, f"() => {flags_js} === null")
    assert (
        page.evaluate(
            "() => Bokeh.documents[0].get_model_by_name('memprof-allocations-filter').booleans"
        )
        is None
    )


# --- JupyterLab -------------------------------------------------------------------------------
NOTEBOOK_CELLS = [
    "import torch\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.LayerNorm(32), torch.nn.ReLU(),\n"
    "                            torch.nn.Linear(32, 32))\n"
    "opt = torch.optim.Adam(model.parameters())\n"
    "x = torch.randn(64, 32)",
    "%load_ext jupyter_memprof",
    "%%memprofile -o prof\nloss = model(x).square().mean()\nloss.backward()\nopt.step()",
]


def test_dashboard_renders_in_jupyterlab_from_the_magic(tmp_path):
    write_notebook(tmp_path / "dash.ipynb", NOTEBOOK_CELLS)
    with jupyterlab(tmp_path) as base:
        with chromium_page(viewport=(1400, 1000)) as page:
            page.goto(f"{base}/lab/tree/dash.ipynb?reset")
            page.wait_for_function(
                "window.jupyterapp && window.jupyterapp.shell.currentWidget "
                "&& window.jupyterapp.shell.currentWidget.sessionContext "
                "&& window.jupyterapp.shell.currentWidget.sessionContext.session "
                "&& window.jupyterapp.shell.currentWidget.sessionContext.session.kernel "
                "&& window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
                timeout=90_000,
            )
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            for cls in VIEWS:
                page.locator(f".{cls}").first.wait_for(state="visible", timeout=120_000)
            rows = page.locator(".memprof-allocations .slick-row")
            assert rows.count() > 3
            # linked in the notebook too: a click shows the lineage, without the kernel
            rows.nth(0).locator(".slick-cell").first.click()
            page.locator(".memprof-lineage .slick-row").first.wait_for(timeout=10_000)
            assert "relation" in text_of(page, ".memprof-lineage")
            # and the selection reaches the kernel: put the lineage into a variable
            page.get_by_role("button", name="Lineage to variable").click()
            page.get_by_text(re.compile(r"rows\) is now in")).wait_for(timeout=20_000)
            screenshot(page, "dashboard-jupyterlab.png")
