"""The dashboard as a user meets it: headless Chromium opens the exported HTML of a real
training step (and JupyterLab runs the magic), clicks, hovers, drags and reads."""

from __future__ import annotations

import html
import os
import re

import pandas as pd
import pytest
from _browser import chromium_page, docs_image, screenshot
from _jupyterlab import jupyterlab, write_notebook
from test_dashboard import (
    EVIL_FILE,
    EVIL_MODULE,
    EVIL_TITLE,
    LABEL,
    evil_labels_profile,
    training_step_profile,
)

from jupyter_memprof._units import format_bytes
from jupyter_memprof._views.dashboard import data as dd
from jupyter_memprof._views.dashboard.page import build

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

# Elements with an id the HTML labels of test_dashboard would create, through shadow roots.
COUNT_INJECTED = """() => {
  let n = 0;
  const walk = (r) => {
    for (const e of r.querySelectorAll("*")) {
      if (e.id && e.id.startsWith("memprof-evil")) n++;
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


def js_bytes(n: float) -> str:
    """The dashboard's byte format in tooltips: the one rule of ``_units.format_bytes``,
    which ``js/units.js`` follows to the character (tests/test_browser_code.py)."""
    return format_bytes(n)


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
    if not isinstance(name, str):  # a block no variable holds: named by its op and size
        op = prof.ops.set_index("op_id").loc[int(first.iloc[0]["alloc_op_id"]), "name"]
        name = f"{op.removeprefix('aten::')} {format_bytes(int(first.iloc[0]['size_bytes']))}"
    want = name
    assert want in rows.first.evaluate(DEEP_TEXT)
    # the timeline says what it draws, and marks the analysis' peak
    timeline = text_of(page, ".memprof-timeline")
    for c in ("parameter", "optimizer_state", "activation", "gradient"):
        assert c in timeline
    peak = prof.peak("cpu")
    peak_ms = (peak.attrs["peak_ns"] - prof.meta["start_ns"]) / 1e6
    labels = page.evaluate(
        """() => { const out = [];
             for (const m of Bokeh.documents[0].all_models)
               if (m.type === "Label" || m.type === "Title") out.push(m.text);
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
    # the tooltip is the state of the point it names: its total, each category and the op
    # running then, exactly as in the drawn data (a pixel holds several points: near the peak)
    m = re.search(r"time: ([\d.]+) ms", tips)
    assert m, tips
    cats = ("parameter", "optimizer_state", "activation")
    fields = ("t", "total", "op", *(f"b_{c}" for c in cats))
    src = {f: model_data(page, "memprof-timeline-cpu", f) for f in fields}

    def shown(j: int) -> bool:
        """The tooltip is exactly point j's state (several points can share a microsecond)."""
        texts = [f"total: {js_bytes(src['total'][j])} ", f"op: {src['op'][j]} "]
        texts += [f"{c}: {js_bytes(src[f'b_{c}'][j])} " for c in cats]
        return bool(src["op"][j]) and all(t in tips for t in texts)

    same_time = [j for j, t in enumerate(src["t"]) if f"{t:.3f}" == m[1]]
    assert same_time, (m[1], tips)
    matches = [j for j in same_time if shown(j)]
    assert matches, (tips, [{f: src[f][j] for f in fields} for j in same_time])
    k = matches[0]
    px_ms = (xy[0] - x0) and (peak_ms / max(xy[0] - x0, 1))  # ms per pixel
    assert abs(src["t"][k] - peak_ms) <= 4 * px_ms + 1e-9, (src["t"][k], peak_ms)
    screenshot(page, "dashboard.png")
    docs_image("dashboard.png")


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
    alloc_ms = (a["alloc_ns"] - start).astype("Float64") / 1e6  # subtract in int64 first
    free_ms = (a["free_ns"] - start).astype("Float64") / 1e6
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


# Page box of the frame of the figure whose title contains `text`.
FRAME_OF = """(text) => {
  for (const v of Bokeh.index.all_views()) {
    const t = v.model.title;
    if (t && v.frame && String(t.text).includes(text)) {
      const r = v.canvas_view.el.getBoundingClientRect(), f = v.frame.bbox;
      return [r.left + f.left, r.top + f.top, f.width, f.height];
    }
  }
  return null;
}"""

# Resolves once the browser has painted the frames after the current one.
NEXT_PAINT = "() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))"

TIME_RANGE = (
    "() => { const r = Bokeh.documents[0].get_model_by_name('memprof-time');"
    " return [r.start, r.end]; }"
)


def test_scrolling_zooms_and_dragging_the_overview_box_pans(page):
    lo, hi = page.evaluate(TIME_RANGE)
    x0, y0, w, h = page.evaluate(TIMELINE_FRAME)
    # scroll up over the timeline at a quarter of its width: zoom in around that time
    at = lo + (hi - lo) * 0.25
    page.mouse.move(x0 + w * 0.25, y0 + h / 2)
    page.mouse.wheel(0, -400)
    settle(page, f"(w) => {{ const r = ({TIME_RANGE})(); return r[1] - r[0] < w * 0.9; }}", hi - lo)
    zlo, zhi = page.evaluate(TIME_RANGE)
    assert lo <= zlo < at < zhi <= hi
    # the time under the pointer stays under the pointer
    assert (at - zlo) / (zhi - zlo) == pytest.approx(0.25, abs=0.02)
    # every view shares the zoomed axis: the op tree and the lifetimes too
    for title in ("ops by time", "lifetimes of the listed blocks"):
        fx, _, fw, _ = page.evaluate(FRAME_OF, title)
        start = page.evaluate(
            """(t) => { for (const v of Bokeh.index.all_views()) {
                 if (v.model.title && String(v.model.title.text).includes(t))
                   return [v.frame.x_range.start, v.frame.x_range.end]; } }""",
            title,
        )
        assert start == [zlo, zhi], title
    # drag the overview's box by 80 px: the range moves by 80 px of the overview's scale
    ox, oy, ow, oh = page.evaluate(FRAME_OF, "overview")
    olo, ohi = page.evaluate(
        """() => { for (const v of Bokeh.index.all_views()) {
             const t = v.model.title;
             if (t && String(t.text).includes("overview"))
               return [v.frame.x_range.start, v.frame.x_range.end]; } }"""
    )
    cx = ox + (((zlo + zhi) / 2) - olo) / (ohi - olo) * ow
    # the box is hit-tested where it was last drawn: let the zoomed one be painted first
    page.evaluate(NEXT_PAINT)
    page.mouse.move(cx, oy + oh / 2)
    page.mouse.down()
    page.mouse.move(cx + 80, oy + oh / 2, steps=8)
    page.mouse.up()
    settle(page, f"(a) => ({TIME_RANGE})()[0] > a", zlo)
    plo, phi = page.evaluate(TIME_RANGE)
    shift = 80 / ow * (ohi - olo)
    assert plo - zlo == pytest.approx(shift, rel=0.05)
    assert phi - plo == pytest.approx(zhi - zlo, rel=1e-6)  # panned, not zoomed


def test_clicking_an_op_table_row_highlights_its_partner(page, prof):
    fi = model_data(page, "memprof-flows", "fi")
    bi = model_data(page, "memprof-flows", "bi")
    names = model_data(page, "memprof-ops", "name")
    ids = model_data(page, "memprof-ops", "op_id")
    # the first forward op (in table order) that has a backward partner
    k = min(range(len(fi)), key=lambda j: fi[j])
    f, b = fi[k], bi[k]
    viewport = page.locator(".memprof-optable .slick-viewport").first
    viewport.evaluate("(el, y) => { el.scrollTop = y; }", max(0, f - 2) * 24)
    row = page.locator(".memprof-optable .slick-row", has_text=names[f]).filter(
        has_text=re.compile("forward")
    )
    row.first.locator(".slick-cell").first.click()
    ops_sel = "Bokeh.documents[0].get_model_by_name('memprof-ops').selected.indices"
    settle(page, f"(b) => {ops_sel}.includes(b)", b)
    sel = selected(page, "memprof-ops")
    assert sel[0] == f and b in sel
    assert f"backward partner: | {names[b]}" in text_of(page, ".memprof-optree")
    pair = prof.flows[
        (prof.flows["forward_op_id"] == ids[f]) & (prof.flows["backward_op_id"] == ids[b])
    ]
    assert len(pair) == 1


def test_clicking_a_lifetime_bar_shows_its_lineage(page, prof):
    x0 = model_data(page, "memprof-allocations", "x0")
    x1 = model_data(page, "memprof-allocations", "x1")
    ids = model_data(page, "memprof-allocations", "alloc_id")
    summary = model_data(page, "memprof-allocations", "summary")
    # the listed block with the longest bar (easiest to hit)
    row = max(
        (r for r in range(len(ids)) if not summary[r] and ids[r] >= 0), key=lambda r: x1[r] - x0[r]
    )
    xy = page.evaluate(TO_PAGE, ["memprof-allocations", "x0", "y", row, (x1[row] - x0[row]) / 2])
    page.mouse.click(*xy)
    settle(
        page,
        "(r) => Bokeh.documents[0].get_model_by_name('memprof-allocations')"
        ".selected.indices[0] === r",
        row,
    )
    assert selected(page, "memprof-allocations") == [row]
    lin = prof.lineage(ids[row])
    settle(
        page,
        "(n) => Bokeh.documents[0].get_model_by_name('memprof-lineage').data.relation.length === n",
        len(lin),
    )
    assert model_data(page, "memprof-lineage", "relation") == lin["relation"].astype(str).tolist()
    assert model_data(page, "memprof-lineage", "op_name") == [
        "" if pd.isna(v) else v for v in lin["op_name"].astype(object)
    ]


@pytest.fixture(scope="module")
def big_html(tmp_path_factory):
    """A step with more ops and blocks than the dashboard draws (4,000 / 2,000)."""
    big = training_step_profile(blocks=40)
    assert len(big.ops) > dd.OP_BUDGET and len(big.allocations) > dd.ALLOC_BUDGET
    return big, big.to_html(tmp_path_factory.mktemp("big") / "big.html")


def test_headings_count_what_was_left_out(big_html):
    big, path = big_html
    built = build(big)
    shown_ops = len(built.ops.data["op_id"])
    listed = sum(not s for s in built.allocs.data["summary"])
    n_ops, n_blocks = len(big.ops), len(big.allocations)
    assert shown_ops < n_ops and listed >= dd.ALLOC_BUDGET
    with chromium_page(viewport=(1400, 1800)) as page:
        page.goto("file://" + os.path.abspath(path))
        page.wait_for_function("window.memprofReady !== undefined", timeout=60_000)
        ops_text = text_of(page, ".memprof-optree")
        assert (
            f"{shown_ops:,} of {n_ops:,} ops shown (the longest, the biggest allocators and "
            f"the ops of listed blocks, with their parents); {n_ops - shown_ops:,} left out"
        ) in ops_text, ops_text
        assert len(model_data(page, "memprof-ops", "op_id")) == shown_ops
        allocs_text = text_of(page, ".memprof-allocations")
        assert (
            f"{listed:,} of {n_blocks:,} blocks listed, largest first; the "
            f"{n_blocks - listed:,} smaller ones are summarised at the end"
        ) in allocs_text, allocs_text
        names = model_data(page, "memprof-allocations", "name")
        counts = [re.fullmatch(r"\(([\d,]+) smaller blocks, summarised\)", n) for n in names]
        counts = [int(m[1].replace(",", "")) for m in counts if m]
        assert counts and sum(counts) == n_blocks - listed


def test_every_label_kind_shows_as_text(tmp_path):
    evil = evil_labels_profile()
    path = evil.to_html(tmp_path / "evil.html")
    with chromium_page(viewport=(1400, 1800)) as page:
        page.goto("file://" + os.path.abspath(path))
        page.wait_for_function("window.memprofReady !== undefined", timeout=60_000)
        assert page.title() == f"jupyter_memprof: {EVIL_TITLE}"
        assert f"memory profile {EVIL_TITLE}" in text_of(page, ".memprof-dashboard")
        # click the module call of the HTML-named module: its details name it and its line
        names = model_data(page, "memprof-ops", "name")
        modules = model_data(page, "memprof-ops", "module")
        row = next(i for i, (n, m) in enumerate(zip(names, modules)) if n == "nn.Module: Linear")
        assert modules[row] == f"model.{EVIL_MODULE}"
        xy = page.evaluate(TO_PAGE, ["memprof-ops", "cx", "cy", row, 0])
        page.mouse.click(*xy)
        settle(
            page,
            "() => Bokeh.documents[0].get_model_by_name('memprof-op-info')"
            ".text.includes('nn.Module')",
        )
        # the op's details (HTML) hold the module path and the callsite escaped, and the
        # page shows them as text
        details = page.evaluate(
            "() => Bokeh.documents[0].get_model_by_name('memprof-op-info').text"
        )
        assert html.escape(EVIL_MODULE) in details and html.escape(EVIL_FILE) in details
        assert page.evaluate(COUNT_INJECTED) == 0
        info = text_of(page, ".memprof-optree")
        assert f"in | model.{EVIL_MODULE} | at | {EVIL_FILE}:" in info, info
        # the op table and the allocations' lineage show them as text as well
        assert page.locator(".memprof-optable").get_by_text(EVIL_MODULE).count() >= 1
        page.locator(".memprof-allocations .slick-row").first.locator(".slick-cell").first.click()
        settle(
            page,
            "() => Bokeh.documents[0].get_model_by_name('memprof-lineage')"
            ".data.relation.length > 0",
        )
        assert f"{EVIL_FILE}:" in text_of(page, ".memprof-lineage")
        assert page.evaluate(COUNT_INJECTED) == 0
        page.locator(".memprof-optable").get_by_text(LABEL, exact=True).first.click()
        settle(
            page,
            "() => Bokeh.documents[0].get_model_by_name('memprof-op-info')"
            ".text.includes('annotation')",
        )
        # and nothing became markup: no element any label would have made
        assert page.evaluate(COUNT_ELEMENTS, ["B", "x"]) == 0
        assert page.evaluate(COUNT_INJECTED) == 0


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
            page.goto(base.url("/lab/tree/dash.ipynb?reset"))
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
            # as in the standalone page: the dashboard says when it is on screen
            page.wait_for_function("window.memprofReady !== undefined", timeout=60_000)
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
