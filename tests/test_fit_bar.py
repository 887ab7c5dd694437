"""Will it fit, at a glance: the limit split into tensors by category, the allocator's cache
and fragmentation, the CUDA context and the headroom (or overshoot), on real estimates."""

from __future__ import annotations

import re

import pytest
from test_estimate import _mlp, classification_step

from jupyter_memprof import estimate
from jupyter_memprof._analysis.headroom import headroom
from jupyter_memprof._analysis.limit import CUDA_CONTEXT_BYTES
from jupyter_memprof._units import format_bytes

GIB = 2**30


@pytest.fixture(scope="module")
def warm():
    model, opt, x, y = _mlp()
    classification_step(model, opt, x, y)
    return model, opt, x, y


def test_a_step_that_fits_gets_its_headroom_and_what_was_counted(warm):
    prof = estimate(classification_step, *warm, device="cuda:0", limit="8GiB")
    prof.meta["label"] = "est (estimate)"  # as the magic labels it
    fit = headroom(prof.tables, prof.meta)
    assert fit["device"] == "cuda:0" and fit["limit"] == 8 * GIB and fit["fits"]
    peak = prof.peak("cuda:0").attrs["peak_bytes"]
    reserved = prof.meta["reserved_peak_bytes"]["cuda:0"]
    assert fit["tensors"] == peak == sum(fit["categories"].values())
    assert fit["cache"] == reserved - peak
    assert fit["context"] == CUDA_CONTEXT_BYTES
    assert fit["headroom"] == 8 * GIB - reserved - CUDA_CONTEXT_BYTES
    sizes = list(fit["categories"].values())
    assert sizes == sorted(sizes, reverse=True)  # largest first
    lines = repr(prof).splitlines()
    assert lines[0] == "memory estimate 'est'"
    assert lines[1] == (
        f"  fits in the limit of 8.0 GiB on cuda:0: needs {format_bytes(fit['used'])} "
        f"(tensors {format_bytes(peak)}, allocator cache and fragmentation "
        f"{format_bytes(reserved - peak)}, CUDA context 750.8 MiB), headroom "
        f"{format_bytes(fit['headroom'])}"
    )
    # the device the question is about first: cuda:0's peak before the CPU's
    peaks = [line for line in lines if line.startswith("  peak ")]
    assert "on cuda:0" in peaks[0]
    html = prof._repr_html_()
    parts = re.findall(r'class="memprof-fit-part" title="([^"]+)" data-bytes="(\d+)"', html)
    labels = [t.rsplit(" ", 2)[0] for t, _ in parts]
    assert labels[-3:] == ["allocator cache and fragmentation", "CUDA context", "headroom"]
    assert sum(int(b) for _, b in parts) == 8 * GIB  # the bar is the limit, split
    assert "memprof-fit-limit" not in html  # no overshoot to mark
    assert "memprof-summary-oom" not in html  # said once, by the bar's verdict


def test_the_magic_label_is_not_said_twice():
    from jupyter_memprof._views.summary import _title

    s = {"label": "est (estimate)", "estimate": True}
    assert _title(s) == "memory estimate 'est'"


def test_a_step_over_the_limit_shows_the_overshoot(warm):
    prof = estimate(classification_step, *warm, device="cuda:0", limit="700MiB")
    fit = headroom(prof.tables, prof.meta)
    oom = prof.meta["oom"]
    assert not fit["fits"] and fit["at"] == "out of memory"
    assert fit["used"] == oom["bytes"] and fit["headroom"] == 700 * 2**20 - oom["bytes"] < 0
    assert fit["context"] == CUDA_CONTEXT_BYTES
    html = prof._repr_html_()
    assert "does not fit in the limit of 700.0 MiB on cuda:0" in html
    assert f"{format_bytes(-fit['headroom'])} over" in html
    assert "memprof-fit-limit" in html and "memprof-summary-oom" in html


def test_a_context_given_is_the_context_counted(warm):
    prof = estimate(classification_step, *warm, device="cuda:0", limit="1GiB", context="100MiB")
    fit = headroom(prof.tables, prof.meta)
    assert prof.meta["context"] == 100 * 2**20 == fit["context"]
    loaded_meta = dict(prof.meta)
    assert headroom(prof.tables, loaded_meta)["headroom"] == fit["headroom"]


def test_without_a_limit_there_is_no_bar(warm):
    prof = estimate(classification_step, *warm, device="cuda:0")
    assert headroom(prof.tables, prof.meta) is None
    assert "memprof-fit" not in prof._repr_html_()


def test_the_chart_fits_the_data_and_says_a_far_limit_at_its_top(warm):
    from bokeh.models import Label, Plot

    from jupyter_memprof._views.dashboard.page import build

    prof = estimate(classification_step, *warm, device="cuda:0", limit="8GiB")
    layout = build(prof).layout
    chart = next(p for p in layout.select({"type": Plot}) if "cuda:0" in (p.title.text or ""))
    reserved = prof.meta["reserved_peak_bytes"]["cuda:0"]
    assert chart.y_range.end == pytest.approx(reserved * 1.25)  # the data, not the 8 GiB
    texts = [lab.text for lab in chart.select({"type": Label})]
    assert "\u2191 limit 8.0 GiB (above this scale)" in texts
    # a limit near the data is drawn in the chart, to scale
    near = estimate(classification_step, *warm, device="cuda:0", limit=int(reserved * 1.2))
    chart = next(
        p for p in build(near).layout.select({"type": Plot}) if "cuda:0" in (p.title.text or "")
    )
    assert chart.y_range.end == pytest.approx(int(reserved * 1.2) * 1.15)
