"""Every peak at every zoom: the timeline of a profile of any size is aggregated per pixel
column, and re-aggregated when the view zooms (dashboard_levels.py, js/zoom.js), checked
against the tables of a synthetic long job (tests/_synthetic.py) whose local peaks are known.
"""

from __future__ import annotations

import numpy as np
import pytest
from _synthetic import local_peaks, synthetic_profile, total_bytes

from jupyter_memprof._views.dashboard import data as dd
from jupyter_memprof._views.dashboard import levels
from jupyter_memprof._views.dashboard.page import forget


@pytest.fixture(scope="module")
def big():
    prof = synthetic_profile(300_000, per_step=500)
    yield prof
    forget(prof)


def _column_maxima(t, total, lo, hi, columns):
    """The highest of ``total`` in each of ``columns`` slices of [lo, hi) (NaN: none)."""
    inside = (t >= lo) & (t < hi)
    col = ((t[inside] - lo) / (hi - lo) * columns).astype(np.int64).clip(0, columns - 1)
    out = np.full(columns, -np.inf)
    np.maximum.at(out, col, total[inside])
    out[np.isinf(out)] = np.nan
    return out


def _peaks_within_a_column(drawn_t, drawn_total, truth, lo, hi):
    """Every column's true highest value is drawn in that column or a neighbour (the
    columns just outside [lo, hi) count as neighbours), and nothing drawn in a column is
    higher than the truth of it and its neighbours."""
    columns = len(truth)
    w = (hi - lo) / columns
    t, total = np.asarray(drawn_t, dtype=float), np.asarray(drawn_total, dtype=float)
    drawn = _column_maxima(t, total, lo - w, hi + w, columns + 2)  # one more at each side
    near_drawn = np.fmax(np.fmax(drawn[:-2], drawn[1:-1]), drawn[2:])
    has = ~np.isnan(truth)
    assert (near_drawn[has] >= truth[has]).all(), np.flatnonzero(near_drawn[has] < truth[has])
    padded = np.concatenate([[np.nan], truth, [np.nan]])
    near_true = np.fmax(np.fmax(padded[:-2], padded[1:-1]), padded[2:])
    seen = ~np.isnan(drawn[1:-1]) & ~np.isnan(near_true)
    assert (drawn[1:-1][seen] <= near_true[seen]).all()


def test_every_level_keeps_the_highest_and_lowest_state_of_each_column():
    rng = np.random.default_rng(1)
    n = 50_000
    t = np.cumsum(rng.exponential(1.0, n))
    total = np.cumsum(rng.normal(0, 1, n))
    lv = levels.build(t, total, 0.0, float(t[-1]) + 1, columns=64, budget=20_000)
    assert len(lv.keep) <= 20_000 and lv.finest >= 3
    assert (np.diff(lv.keep) > 0).all()
    for level in range(lv.finest + 1):
        ncol = lv.columns << level
        col = np.clip((t / (t[-1] + 1) * ncol).astype(np.int64), 0, ncol - 1)
        kept = lv.keep[lv.level <= level]
        for agg in (np.maximum, np.minimum):
            want = np.full(ncol, np.nan)
            got = np.full(ncol, np.nan)
            fill = -np.inf if agg is np.maximum else np.inf
            want[:], got[:] = fill, fill
            agg.at(want, col, total)
            agg.at(got, col[kept], total[kept])
            assert np.array_equal(want, got), level
        # the first and last state of each column too
        firsts = np.flatnonzero(np.concatenate([[True], col[1:] != col[:-1]]))
        assert np.isin(firsts, kept).all()
    # a level is the coarser levels' states and more
    assert np.bincount(lv.level).min() > 0


def test_a_big_timeline_opens_at_level_zero_with_every_column_peak(big):
    win = dd.window(big)
    tl = dd.timeline(big, "cuda:0", win)
    assert tl.points_in == len(big.events)
    assert tl.levels is not None
    assert len(tl.columns["t"]) <= dd.TIMELINE_POINTS + 2
    assert len(tl.levels["t"]) <= levels.STATE_BUDGET
    t_ns, total = total_bytes(big)
    # the first view: every column of the level-0 grid holds its true peak
    columns = tl.level_info.columns
    truth = local_peaks(big, win.start_ns, win.end_ns, columns)
    drawn_ns = np.asarray(tl.columns["t"]) * 1e6
    _peaks_within_a_column(drawn_ns, tl.columns["total"], truth, 0, win.end_ns - win.start_ns)
    assert tl.peak_bytes == int(total.max()) == int(np.max(tl.columns["total"]))
    # every drawn point is an exact state of the tables
    at = np.searchsorted(t_ns, np.round(np.asarray(tl.columns["t"][1:-1]) * 1e6).astype(np.int64))
    assert np.array_equal(total[at], np.asarray(tl.columns["total"][1:-1]))


@pytest.mark.parametrize("zoom", [10, 1_000, 50_000])
def test_the_kernel_answers_a_zoom_with_every_column_peak(big, zoom):
    win = dd.window(big)
    tl = dd.timeline(big, "cuda:0", win)
    end = win.end_ms
    lo = end * 0.37
    hi = lo + end / zoom
    px = 800
    cols = levels.zoomed(big, tl, lo, hi, px)
    assert len(cols["t"]) <= 4 * px + 2
    truth = local_peaks(big, round(lo * 1e6), round(hi * 1e6), px)
    _peaks_within_a_column(np.asarray(cols["t"]) * 1e6, cols["total"], truth, lo * 1e6, hi * 1e6)
    assert set(cols) >= {"t", "total", "op", "module", *(f"b_{c}" for c in tl.categories)}


ZOOM = """([lo, hi]) => {
  const r = Bokeh.documents[0].get_model_by_name('memprof-time');
  r.setv({start: lo, end: hi});
}"""

DRAWN = """() => {
  const doc = Bokeh.documents[0];
  const d = doc.get_model_by_name('memprof-timeline-cuda:0').data;
  const plot = doc.all_models && [...doc.all_models].find(
    (m) => m.type === 'Plot' && m.title && m.title.text.startsWith('cuda:0'));
  return {t: Array.from(d.t), total: Array.from(d.total), zoom: window.memprofZoom,
    px: plot ? plot.inner_width : null};
}"""


@pytest.mark.browser
def test_the_page_zoomed_three_times_keeps_every_peak(big, tmp_path):
    from _browser import chromium_page

    path = tmp_path / "big.html"
    big.to_html(str(path))
    end_ms = dd.window(big).end_ms
    with chromium_page(viewport=(1200, 900)) as page:
        page.goto(path.as_uri())
        page.wait_for_function("window.memprofReady !== undefined", timeout=120_000)
        lo, hi = 0.0, end_ms
        for _ in range(3):  # each zoom 3x narrower (to 27x: within the levels sent)
            width = (hi - lo) / 3
            lo, hi = lo + (hi - lo) * 0.41, lo + (hi - lo) * 0.41 + width
            page.evaluate(ZOOM, [lo, hi])
            page.wait_for_function(
                f"window.memprofZoom && window.memprofZoom.hi === {hi}", timeout=30_000
            )
            drawn = page.evaluate(DRAWN)
            px = int(drawn["px"] or 1000)
            assert drawn["zoom"]["level"] == drawn["zoom"]["want"]  # within the levels sent
            truth = local_peaks(big, round(lo * 1e6), round(hi * 1e6), px)
            t = np.asarray(drawn["t"]) * 1e6
            _peaks_within_a_column(t, drawn["total"], truth, lo * 1e6, hi * 1e6)


def test_a_notebook_dashboard_answers_a_zoom_beyond_the_levels_from_the_kernel(big):
    from jupyter_memprof._views.dashboard.widget import Dashboard

    dash = Dashboard(big, header=False)
    try:
        src, req, tl, _stacked = dash._built.zoom["cuda:0"]
        # the kernel's copies carry the page's ids: the browser's changes reach them
        doc = dash._view.render_bundle["docs_json"]
        text = str(doc)
        assert src.id in text and req.id in text
        end = dd.window(big).end_ms
        lo, hi, px = end * 0.6, end * 0.6 + end / 100_000, 900  # beyond the levels sent
        req.data = {"lo": [lo], "hi": [hi], "px": [px], "level": [20]}
        truth = local_peaks(big, round(lo * 1e6), round(hi * 1e6), px)
        t = np.asarray(src.data["t"]) * 1e6
        _peaks_within_a_column(t, src.data["total"], truth, lo * 1e6, hi * 1e6)
        assert {"lo_activation", "hi_activation", "op"} <= set(src.data)
        req.data = {"lo": [], "hi": [], "px": [], "level": []}  # nothing asked: unchanged
        assert np.array_equal(np.asarray(src.data["t"]) * 1e6, t)
    finally:
        dash.close()


def test_a_zoomable_dashboard_from_its_template_is_what_bokeh_builds():
    from test_dashboard import _bokeh_json, _canonical

    from jupyter_memprof._views.dashboard import page as D

    prof = synthetic_profile(20_000, per_step=200)
    shape, values = D._spec(prof, D._shown(prof, None, None), header=True)
    assert [c.zoom for c in shape.charts] == [True]
    template, ids = D._template(shape, values)
    assert {"memprof-timeline-cuda:0", "memprof-zoom-cuda:0"} <= set(ids)
    want = _bokeh_json(D._layout(shape, values, header=True).layout)
    assert _canonical(template.render(values)) == _canonical(want)
    forget(prof)
