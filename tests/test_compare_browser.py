"""The comparison as a user meets it: headless Chromium opens the exported HTML of two real
training steps, clicks rows of the diff table and changes the grouping."""

from __future__ import annotations

import os

import pytest
from _browser import chromium_page, screenshot
from test_compare import two_batches
from test_dashboard_browser import DEEP_TEXT, model_data, settle

pytestmark = pytest.mark.browser

DOC = "Bokeh.documents[0]"


@pytest.fixture(scope="module")
def html_path(tmp_path_factory):
    import jupyter_memprof

    a, b = two_batches()
    return jupyter_memprof.compare(a, b).to_html(tmp_path_factory.mktemp("cmp") / "cmp.html")


@pytest.fixture
def page(html_path):
    with chromium_page(viewport=(1400, 1400)) as page:
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto("file://" + os.path.abspath(html_path))
        page.wait_for_function(
            "window.memprofReady !== undefined || window.memprofError !== undefined",
            timeout=30_000,
        )
        assert page.evaluate("window.memprofError") is None
        yield page
        assert errors == []


def fill_alphas(page, side: str) -> dict:
    return page.evaluate(
        """(side) => { const out = {};
             for (const m of Bokeh.documents[0].all_models) {
               if (m.type === "GlyphRenderer" && m.data_source.name === `memprof-compare-timeline-${side}`
                   && m.glyph.type === "VAreaStep") {
                 out[m.glyph.y2.field.slice(3)] = m.glyph.fill_alpha.value ?? m.glyph.fill_alpha;
               }
             }
             return out; }""",
        side,
    )


def click_row(page, key: str) -> None:
    keys = model_data(page, "memprof-compare-rows", "key")
    row = keys.index(key)
    cell = page.locator(".memprof-compare-table .slick-row").nth(row).locator(".slick-cell").first
    cell.click()


def test_clicking_a_category_highlights_it_in_both_timelines(page):
    summary = page.locator(".memprof-compare-summary").first.evaluate(DEEP_TEXT)
    assert summary.startswith("peak +") and "activation +" in summary
    assert "a = batch 8" in summary and "b = batch <16>" in summary  # shown as text
    assert model_data(page, "memprof-compare-hl-a", "y") == []
    click_row(page, "activation")
    settle(page, f"() => {DOC}.get_model_by_name('memprof-compare-hl-a').data.y.length > 0")
    ya = model_data(page, "memprof-compare-hl-a", "y")
    yb = model_data(page, "memprof-compare-hl-b", "y")
    assert max(yb) > max(ya) > 0  # twice the batch, more activation bytes
    for side in ("a", "b"):
        alphas = fill_alphas(page, side)
        assert alphas["activation"] > 0.5
        assert all(v < 0.5 for c, v in alphas.items() if c != "activation"), alphas
    status = page.locator(".memprof-compare-status").first.evaluate(DEEP_TEXT)
    assert status.startswith("category activation:")
    screenshot(page, "compare.png")


def test_grouping_by_module_and_clicking_a_module(page):
    page.locator(".memprof-compare-by select").first.select_option("module")
    settle(
        page,
        f"() => {DOC}.get_model_by_name('memprof-compare-rows').data.key"
        ".some((k) => k.startsWith('model.encoder.layers.'))",
    )
    keys = model_data(page, "memprof-compare-rows", "key")
    layer = next(k for k in keys if k.startswith("model.encoder.layers."))
    click_row(page, layer)
    settle(page, f"() => {DOC}.get_model_by_name('memprof-compare-hl-b').data.y.length > 0")
    assert max(model_data(page, "memprof-compare-hl-b", "y")) > 0
    assert page.evaluate("window.memprofCompareSelected") == {"group": "module", "key": layer}
    # a module is not a category: every area is drawn as usual
    assert all(v > 0.5 for v in fill_alphas(page, "a").values())


def test_an_estimate_against_a_real_capture_shows_two_labelled_x_axes(tmp_path):
    """The page of an estimate against a real capture: each chart on its own x range, labelled
    with what it counts; the header says so; a row click still highlights both."""
    from test_compare import build_estimate_pair

    import jupyter_memprof

    real, est = build_estimate_pair()
    path = jupyter_memprof.compare(real, est).to_html(tmp_path / "est.html")
    with chromium_page(viewport=(1400, 1400)) as page:
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto("file://" + os.path.abspath(path))
        page.wait_for_function(
            "window.memprofReady !== undefined || window.memprofError !== undefined",
            timeout=30_000,
        )
        assert page.evaluate("window.memprofError") is None
        head = page.locator(".memprof-compare-summary").first.evaluate(DEEP_TEXT)
        assert "b is an estimate: its x axis counts records" in head
        axes = page.evaluate(
            f"""() => {{ const out = {{}};
                 for (const m of {DOC}.all_models)
                   if ((m.type === "Plot" || m.type === "Figure") && m.title) out[m.title.text.slice(0, 1)] =
                     [m.below[0].axis_label, m.x_range.id, m.x_range.end];
                 return out; }}"""
        )
        assert axes["a"][0] == "ms since the start of the profiled code"
        assert axes["b"][0].startswith("records since the start") and "estimate" in axes["b"][0]
        assert axes["a"][1] != axes["b"][1]
        click_row(page, "activation")
        settle(page, f"() => {DOC}.get_model_by_name('memprof-compare-hl-b').data.y.length > 0")
        for side in ("a", "b"):  # both highlighted, each on its own clock
            assert max(model_data(page, f"memprof-compare-hl-{side}", "y")) > 0
            assert fill_alphas(page, side)["activation"] > 0.5
        assert errors == []
