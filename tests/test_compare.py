"""compare(): the view of two profiles, outside the browser."""

import pytest
import torch
from bokeh.plotting import figure
from test_diff import Encoder, _encoder_step, _profile

import jupyter_memprof
from jupyter_memprof._views.compare import Comparison, build


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
