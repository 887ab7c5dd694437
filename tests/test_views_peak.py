"""One peak per device per cell: the summary's text, its HTML and the dashboard under a
``%%memprofile`` cell read each device's peak from one computation (``_views/peaks.py``);
and what the dashboard draws from the analysis (the timelines' wide form, step boundaries)."""

from __future__ import annotations

import collections

import pandas as pd
import pytest
import torch

import jupyter_memprof
from jupyter_memprof._analysis import peak as _peak
from jupyter_memprof._analysis.steps import step_boundaries
from jupyter_memprof._analysis.timeline import live_by_category
from jupyter_memprof._frontends import cell_profile as _cell
from jupyter_memprof._units import format_bytes
from jupyter_memprof._views import peaks
from jupyter_memprof._views.dashboard import select as dashboard_select

STEP = (
    "lin_once = torch.nn.Linear(256, 128)\n"
    "out_once = lin_once(torch.randn(32, 256)).relu().sum()\n"
    "out_once.backward()\n"
)


@pytest.fixture
def in_kernel(monkeypatch):
    """Let the magic display its dashboard under the cell, as it does in a kernel."""
    monkeypatch.setattr(_cell, "in_kernel", lambda shell: True)


@pytest.fixture
def counted(monkeypatch) -> collections.Counter:
    """How often the peak analysis ran, per device (the real function, counted)."""
    calls: collections.Counter = collections.Counter()
    real = _peak.peak_point

    def peak_point(tables, device=None):
        calls[device] += 1
        return real(tables, device)

    monkeypatch.setattr(_peak, "peak_point", peak_point)
    peaks.forget()
    return calls


def test_a_cell_computes_each_devices_peak_once(shell, run, in_kernel, counted):
    result, out = run("%%memprofile -o prof_once\n" + STEP)
    assert result.success, out
    prof = shell.user_ns["prof_once"]
    assert prof.devices == ["cpu"]
    assert counted == {"cpu": 1}
    # the summary (its text printed here) and the dashboard were shown, with that peak
    peak_bytes = prof.peak("cpu").attrs["peak_bytes"]
    assert f"peak {format_bytes(peak_bytes)} on cpu" in out
    shown = dashboard_select.last_shown[0]
    assert shown.profile() is prof
    assert shown.value.timelines[0].peak_bytes == peak_bytes
    # live then: the weight and its gradient (besides what earlier cells left)
    at_peak = prof.peak("cpu")
    assert (at_peak["size_bytes"] == 128 * 256 * 4).sum() >= 2


def test_an_estimate_cell_computes_the_peak_of_each_of_its_devices_once(
    shell, run, in_kernel, counted
):
    """Adam keeps its step counters on the CPU: an estimate for cuda:0 has two devices."""
    result, out = run(
        "model_two = torch.nn.Linear(64, 32)\n"
        "opt_two = torch.optim.Adam(model_two.parameters())\n"
        "x_two = torch.randn(16, 64)\n"
        "def step_two():\n"
        "    opt_two.zero_grad()\n"
        "    model_two(x_two).square().mean().backward()\n"
        "    opt_two.step()\n"
        "step_two()\n"  # warm: Adam's state exists, its step counters on the CPU
    )
    assert result.success, out
    counted.clear()
    result, out = run("%%memprofile --estimate --device cuda:0 -o est_two\nstep_two()")
    assert result.success, out
    prof = shell.user_ns["est_two"]
    assert prof.devices == ["cpu", "cuda:0"]
    assert counted == {"cpu": 1, "cuda:0": 1}
    assert dashboard_select.last_shown[0].profile() is prof  # the dashboard was shown


# -- what the dashboard drew from the tables is the analysis' -------------------------------------
def test_the_wide_timeline_is_the_state_the_peak_analysis_sees():
    """``live_by_category`` (the timelines' wide form, once in the dashboard's code): at
    every time the categories add up to the live bytes, so its highest total is the peak."""
    with jupyter_memprof.profile() as prof:
        big = torch.ones(256, 256)  # 256 KiB
        small = torch.ones(1024)  # 4 KiB
        del big
        after = torch.ones(512)  # 2 KiB, with small still alive
    times, wide = live_by_category(prof.timeline)
    assert wide.shape == (len(times), 8) and (times[1:] > times[:-1]).all()
    peak = prof.peak("cpu").attrs
    top = int(wide.sum(axis=1).argmax())
    assert wide.sum(axis=1)[top] == peak["peak_bytes"] == 256 * 256 * 4 + 1024 * 4
    assert times[top] == peak["peak_ns"]
    assert wide.sum(axis=1)[-1] == 1024 * 4 + 512 * 4  # small and after, at the end
    del small, after


def test_step_boundaries_are_the_ends_of_all_steps_but_the_last():
    steps = pd.DataFrame({"device": ["cpu", "cuda:0", "cpu", "cpu"], "end_ns": [10, 11, 20, 30]})
    assert step_boundaries(steps, "cpu").tolist() == [10, 20]
    assert step_boundaries(steps, "cuda:0").tolist() == []
