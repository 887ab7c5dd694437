"""compare(): the view of two profiles, outside the browser."""

import pytest
import torch
from bokeh.plotting import figure
from test_diff import Encoder, _encoder_step, _profile, real_and_estimate

import jupyter_memprof
from jupyter_memprof._results.comparison import Comparison
from jupyter_memprof._views.compare import build


def two_batches():
    """The same encoder step at batch 8 and 16 (labels "batch 8", "batch 16")."""
    torch.manual_seed(0)
    model = Encoder()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    a = _profile(*_encoder_step(model, opt, 8), "batch 8")
    b = _profile(*_encoder_step(model, opt, 16), "batch <16>")
    return a, b


@pytest.fixture(scope="module")
def pair():
    return two_batches()


def test_compare_holds_the_diffs_and_the_summary(pair):
    a, b = pair
    c = jupyter_memprof.compare(a, b)
    assert isinstance(c, Comparison)
    d = c.diff("module")
    assert d.equals(jupyter_memprof.diff(a, b, by="module"))
    assert c.summary == jupyter_memprof.diff(a, b).attrs["summary"]
    assert repr(c).splitlines()[0] == c.summary


def test_both_timelines_share_one_time_axis_and_one_byte_scale(pair):
    a, b = pair
    built = build(jupyter_memprof.compare(a, b))
    plots = [f for f in built.layout.references() if isinstance(f, figure)]
    plots.sort(key=lambda f: f.title.text)
    assert len(plots) == 2
    pa, pb = plots
    assert pa.x_range is pb.x_range and pa.y_range is pb.y_range
    assert pa.x_range.start == 0
    top = max(a.peak().attrs["peak_bytes"], b.peak().attrs["peak_bytes"])
    assert pa.y_range.end >= top
    # the table starts grouped by category, largest change first
    rows = built.rows.data
    assert rows["key"][0] == "activation"
    assert rows["delta"][0].startswith("+")


def test_to_html_writes_one_file_and_escapes_labels(pair, tmp_path):
    a, b = pair
    path = jupyter_memprof.compare(a, b).to_html(tmp_path / "cmp.html")
    page = open(path, encoding="utf-8").read()
    assert page.startswith("<!DOCTYPE html>")
    assert "<title>jupyter_memprof: batch 8 vs batch &lt;16&gt;</title>" in page
    assert "cdn.bokeh.org" not in page
    # written again over its own file; another file is not replaced by surprise
    jupyter_memprof.compare(a, b).to_html(path)
    other = tmp_path / "notes.html"
    other.write_text("my notes")
    with pytest.raises(FileExistsError):
        jupyter_memprof.compare(a, b).to_html(other)
    assert other.read_text() == "my notes"


def test_compare_takes_saved_files(pair, tmp_path):
    a, b = pair
    pa, pb = a.save(tmp_path / "a.memprof"), b.save(tmp_path / "b.memprof")
    c = jupyter_memprof.compare(pa, pb)
    assert c.diff().equals(jupyter_memprof.diff(a, b))
    with pytest.raises(TypeError, match="must be a Profile or the path"):
        jupyter_memprof.compare(a, None)


def test_the_panel_asks_the_kernel_to_compare_two_profiles(pair):
    from jupyter_memprof._frontends import comm, session

    a, b = pair
    sa, sb = session.add(a), session.add(b)
    try:
        reply = comm._compare_reply({"type": "compare", "sids": [sa, sb]})
        assert reply == {
            "type": "compare",
            "sids": [sa, sb],
            "summary": jupyter_memprof.compare(a, b).summary,
        }
        for bad in ([sa], [sa, sa], [sa, "x"], [sa, True], None):
            reply = comm._compare_reply({"type": "compare", "sids": bad})
            assert reply == {
                "type": "error",
                "message": "compare needs two different profile ids",
                "request": "compare",
                "sid": None,
            }
        gone = comm._compare_reply({"type": "compare", "sids": [sa, 10**9]})
        assert gone["type"] == "error" and "no profile" in gone["message"]
    finally:
        session.release(sa)
        session.release(sb)


def test_the_notebook_widget_is_the_bokeh_view(pair):
    from jupyter_bokeh import BokehModel

    a, b = pair
    widget = jupyter_memprof.compare(a, b).show()
    try:
        assert isinstance(widget, BokehModel)
    finally:
        widget.close()


EVIL = '<img id="memprof-evil" src=x onerror="alert(1)">'


class _Tags(__import__("html.parser").parser.HTMLParser):
    """The start tags an HTML parser finds in a string (what a browser would build)."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)


def test_the_header_escapes_labels_that_are_markup(pair):
    import dataclasses
    import html

    from bokeh.models import Div

    a, b = pair
    evil_b = dataclasses.replace(b, meta={**b.meta, "label": EVIL})
    built = build(jupyter_memprof.compare(a, evil_b))
    head = next(
        d
        for d in built.layout.references()
        if isinstance(d, Div) and "memprof-compare-summary" in d.css_classes
    )
    assert "img" not in _Tags(head.text).tags  # the label is text, not an element
    assert "&lt;img id=&quot;memprof-evil&quot;" in head.text
    assert f"b = {EVIL} (peak " in html.unescape(head.text)


def build_estimate_pair():
    """A real capture of a warmed-up step and an estimate of the same step."""
    return real_and_estimate(8)


@pytest.fixture(scope="module")
def estimate_pair():
    return build_estimate_pair()


def test_an_estimate_and_a_real_capture_get_their_own_labelled_x_axes(estimate_pair, pair):
    from bokeh.models import Div

    real, est = estimate_pair
    built = build(jupyter_memprof.compare(real, est))
    plots = sorted(
        (f for f in built.layout.references() if isinstance(f, figure)), key=lambda f: f.title.text
    )
    pa, pb = plots
    assert pa.title.text.startswith("a = real") and pb.title.text.startswith("b = ")
    # records and milliseconds have no common unit: one range each, each axis says what it counts
    assert pa.x_range is not pb.x_range and pa.y_range is pb.y_range
    assert pa.xaxis[0].axis_label == "ms since the start of the profiled code"
    assert pb.xaxis[0].axis_label == (
        f"records since the start of the profiled code ({est.meta['clock']}: an estimate, not time)"
    )
    assert "ms" not in pb.xaxis[0].axis_label.split()
    # each range spans its own profile's clock
    assert pb.x_range.end == pytest.approx((est.end_ns - est.start_ns) / 1e6)
    assert pa.x_range.end == pytest.approx((real.end_ns - real.start_ns) / 1e6)
    head = next(
        d
        for d in built.layout.references()
        if isinstance(d, Div) and "memprof-compare-summary" in d.css_classes
    )
    assert "b is an estimate: its x axis counts records" in head.text
    # the other way round, and two estimates share one range again
    rev = build(jupyter_memprof.compare(est, real))
    assert "a is an estimate" in rev.layout.children[0].text
    same = build(jupyter_memprof.compare(est, est))
    pa, pb = (f for f in same.layout.references() if isinstance(f, figure))
    assert pa.x_range is pb.x_range and "estimate" in pa.xaxis[0].axis_label
    assert "is an estimate" not in same.layout.children[0].text
    # two real captures: one shared time axis, no note
    a, b = pair
    two = build(jupyter_memprof.compare(a, b))
    assert "is an estimate" not in two.layout.children[0].text


def test_compare_an_estimate_against_the_real_capture(estimate_pair):
    real, est = estimate_pair
    assert est.meta["estimate"] is True and not real.meta.get("estimate")
    c = jupyter_memprof.compare(real, est)
    d = c.diff("category")
    assert d.equals(jupyter_memprof.diff(real, est))
    for cat in ("parameter", "gradient", "optimizer_state"):
        assert d.loc[cat, "a"] > 0 and d.loc[cat, "delta"] == 0, cat
    peak_a, peak_b = d.attrs["peak_a"], d.attrs["peak_b"]
    assert abs(peak_b - peak_a) <= 0.02 * peak_a, (peak_a, peak_b)
    rows = build(c).rows.data
    for cat in ("parameter", "gradient", "optimizer_state"):
        assert rows["delta"][rows["key"].index(cat)] == "0 B"


def test_to_html_overwrite_replaces_a_foreign_file_only_when_asked(pair, tmp_path):
    a, b = pair
    other = tmp_path / "notes.html"
    other.write_text("my notes")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        jupyter_memprof.compare(a, b).to_html(other)
    assert other.read_text() == "my notes"
    path = jupyter_memprof.compare(a, b).to_html(other, overwrite=True)
    assert open(path, encoding="utf-8").read().startswith("<!DOCTYPE html>")
    # a missing folder fails before anything is built or written
    with pytest.raises(FileNotFoundError):
        jupyter_memprof.compare(a, b).to_html(tmp_path / "nope" / "cmp.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.html"]


def test_the_table_formats_deltas_and_ratios_like_diff(pair):
    # one formatter for both (jupyter_memprof._views.text): the view's table and str(diff)
    from jupyter_memprof._views.text import formatted_diff as _formatted

    a, b = pair
    c = jupyter_memprof.compare(a, b)
    rows = build(c).rows.data
    want = _formatted(c.diff("category"), None)
    assert rows["key"] == want.index.tolist()
    assert rows["delta"] == want["delta"].tolist() and rows["ratio"] == want["ratio"].tolist()
    assert rows["delta"][0].startswith("+") and rows["ratio"][0].endswith("x")
