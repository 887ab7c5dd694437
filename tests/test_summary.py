"""The profile summary: its numbers come from real captures and the tables, its HTML is safe."""

from __future__ import annotations

import gc
import html

import pytest
import torch

import jupyter_memprof
from jupyter_memprof._analysis import schema as _schema
from jupyter_memprof._views.summary import (
    NO_ACTIVITY,
    format_bytes,
    format_seconds,
    summary,
    summary_html,
    summary_text,
)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (4000, "3.9 KiB"),
        (1536 * 1024, "1.5 MiB"),
        (1024**2 - 1, "1.0 MiB"),
        (3 * 1024**3, "3.0 GiB"),
        (-2048, "-2.0 KiB"),
    ],
)
def test_bytes_read_in_binary_units(n, text):
    assert format_bytes(n) == text


def test_seconds_read_in_a_fitting_unit():
    assert format_seconds(2.5) == "2.50 s"
    assert format_seconds(0.0452) == "45.2 ms"
    assert format_seconds(0.00031) == "310 µs"
    assert format_seconds(None) == "?"


@pytest.fixture(scope="module")
def step():
    """One real training step: Linear(256 -> 128) + SGD, with a named 1000-float input."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 128)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 256)
    with jupyter_memprof.profile(label="step", namespace={"model": model, "opt": opt}) as prof:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        kept = torch.empty(1000)
    del loss, kept
    return prof


def test_summary_numbers_are_the_tables_numbers(step):
    s = summary(step)
    assert s["label"] == "step"
    assert s["error"] is None
    assert s["empty"] is False
    assert s["ops"] == len(step.ops) > 0
    assert s["blocks"] == len(step.allocations) > 0
    assert s["events"] == len(step.events) > 0
    assert list(s["peaks"]) == ["cpu"]

    peak = s["peaks"]["cpu"]
    at_peak = step.peak("cpu")
    assert peak["bytes"] == at_peak.attrs["peak_bytes"]
    assert peak["time_ns"] == at_peak.attrs["peak_ns"]
    # the parameters (128*256 + 128 floats) and their gradients are live at the peak
    assert peak["bytes"] >= 2 * (128 * 256 + 128) * 4
    assert peak["top_categories"]["parameter"] == (128 * 256 + 128) * 4
    assert sum(peak["top_categories"].values()) == at_peak["size_bytes"].sum()
    sizes = list(peak["top_categories"].values())
    assert sizes == sorted(sizes, reverse=True)
    # the peak is inside the capture, measured from its start
    duration_s = (step.meta["end_ns"] - step.meta["start_ns"]) / 1e9
    assert 0 <= peak["offset_s"] <= duration_s
    # the timings are the capture's own, and add up: the code ran before it was read
    for key in ("wall_s", "capture_s", "analysis_s"):
        assert s[key] == step.meta[key] > 0, key
    assert s["wall_s"] * 1e9 <= step.meta["end_ns"] - step.meta["start_ns"] + 1e6


def test_text_summary_names_peak_and_categories(step):
    text = summary_text(step)
    peak = summary(step)["peaks"]["cpu"]
    assert text.splitlines()[0] == "memory profile 'step'"
    assert f"peak {format_bytes(peak['bytes'])} on cpu at " in text
    first_category = next(iter(peak["top_categories"]))
    assert first_category in text
    assert f"{len(step.ops):,} ops, {len(step.allocations):,} blocks" in text
    assert repr(step) == text


def test_html_summary_is_a_compact_block(step):
    out = summary_html(step)
    assert out.startswith('<div class="memprof-summary"')
    assert out.endswith("</div>")
    assert format_bytes(summary(step)["peaks"]["cpu"]["bytes"]) in out
    assert step._repr_html_() == out


def test_empty_capture_says_so():
    gc.collect()  # no stray frees of earlier tests' tensors inside the capture
    with jupyter_memprof.profile(label="nothing", namespace={}) as prof:
        total = sum(range(10))
    assert total == 45
    s = summary(prof)
    assert s["empty"] is True
    assert s["peaks"] == {}
    assert s["blocks"] == s["events"] == 0
    assert NO_ACTIVITY in summary_text(prof)
    assert NO_ACTIVITY in summary_html(prof)
    for name, schema in _schema.TABLES.items():
        table = prof.tables[name]
        if name in ("allocations", "events", "timeline"):
            assert len(table) == 0
        assert list(table.columns) == list(schema)


def test_a_profile_with_no_tables_at_all_summarises():
    prof = jupyter_memprof.Profile.empty(label="blank")
    s = summary(prof)
    assert s["empty"] and s["ops"] == 0
    assert s["wall_s"] is None
    assert "blank" in summary_text(prof) and NO_ACTIVITY in summary_text(prof)


def test_error_and_user_strings_are_escaped():
    evil = "<img src=x onerror=alert(1)>"
    with pytest.raises(ValueError):
        with jupyter_memprof.profile(label=evil, namespace={}) as prof:
            kept = torch.empty(1000)
            raise ValueError(f"bad {evil} & more")
    del kept
    s = summary(prof)
    assert s["error"] == f"ValueError: bad {evil} & more"
    assert s["peaks"]["cpu"]["bytes"] >= 4000
    out = summary_html(prof)
    assert "<img" not in out
    assert html.escape(evil) in out
    assert html.escape(f"ValueError: bad {evil} & more") in out
    assert f"raised ValueError: bad {evil} & more" in summary_text(prof)


def test_capture_start_end_and_devices_are_the_profiles(mlp_adam_profile):
    """One capture start, one end and one device list, which summary, dashboard and panel use."""
    from jupyter_memprof._results.profile import Profile

    prof, _ = mlp_adam_profile
    times = [
        *prof.ops["start_ns"],
        *prof.ops["end_ns"],
        *prof.events["time_ns"],
        *prof.allocations["alloc_ns"].dropna(),
        *prof.allocations["free_ns"].dropna(),
    ]
    assert prof.start_ns == prof.meta["start_ns"] <= min(times)
    assert prof.end_ns == max([prof.meta["end_ns"], *times])
    assert prof.devices == ["cpu"]
    peak = summary(prof)["peaks"]["cpu"]
    assert peak["offset_s"] == pytest.approx((peak["time_ns"] - prof.start_ns) / 1e9)

    # without the capture's own start, the tables' earliest time
    bare = Profile(**prof.tables, meta={})
    assert bare.start_ns == min(times) and bare.end_ns == max(times)
    empty = Profile.empty()
    assert empty.start_ns is None and empty.end_ns is None and empty.devices == []

    # devices in numeric order, the CPU first, whatever order the tables hold them in
    events = prof.events.assign(device=prof.events["device"].astype(object))
    names = ["cuda:10", "cuda:2", "cpu"]
    events["device"] = [names[i % 3] for i in range(len(events))]
    mixed = Profile(**{**prof.tables, "events": events}, meta={})
    assert mixed.devices == ["cpu", "cuda:2", "cuda:10"]
