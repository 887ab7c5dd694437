"""Severity in proportion: a leak judged by its bytes per step against the step's peak and
the steps it would take to fill the device."""

from __future__ import annotations

import pandas as pd
import torch
from test_steps import _mlp

import jupyter_memprof
from jupyter_memprof._analysis.severity import (
    Severity,
    by_share,
    by_steps_to_fill,
    capacity,
    leak_severity,
)
from jupyter_memprof._units import format_bytes

STEPS = 6


def _steps(peak: int, device: str = "cuda:0") -> pd.DataFrame:
    return pd.DataFrame({"device": [device] * 3, "peak_bytes": [peak // 2, peak, peak]})


def test_each_rule_alone():
    assert by_share(0.02) is Severity.ALARM
    assert by_share(0.002) is Severity.WARNING
    assert by_share(1e-6) is Severity.NOTE
    assert by_steps_to_fill(5_000) is Severity.ALARM
    assert by_steps_to_fill(500_000) is Severity.WARNING
    assert by_steps_to_fill(5e9) is Severity.NOTE
    assert by_steps_to_fill(None) is Severity.NOTE


def test_the_capacity_is_the_limit_else_the_gpu_total():
    assert capacity({"limit": 8 << 30, "device": "cuda:0"}, "cuda:0") == 8 << 30
    assert capacity({"limit": 8 << 30, "device": "cuda:0"}, "cpu") is None
    meta = {"cuda_start": {"cuda:0": {"total": 80 << 30}}}
    assert capacity(meta, "cuda:0") == 80 << 30 and capacity(meta, "cuda:1") is None


def test_four_bytes_a_step_is_a_note_and_forty_mib_on_a_full_gpu_an_alarm():
    meta = {"cuda_start": {"cuda:0": {"total": 80 << 30}}}
    small = leak_severity(4, _steps(2 << 30), meta, "cuda:0")
    assert small["severity"] == "note" and small["step_peak"] == 2 << 30
    assert small["steps_to_fill"] == (78 << 30) / 4
    big = leak_severity(40 << 20, _steps(70 << 30), meta, "cuda:0")
    assert big["severity"] == "alarm" and big["steps_to_fill"] == 256  # 10 GiB / 40 MiB
    # a small share, but the device is nearly full: the worst of the two rules
    near = leak_severity(1 << 20, _steps(79 << 30), meta, "cuda:0")
    assert near["share"] < 0.001 and near["severity"] == "alarm"


def test_losses_append_loss_in_a_real_loop_is_a_note():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    )
    x, y = torch.randn(128, 256), torch.randint(0, 256, (128,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    with jupyter_memprof.profile() as prof:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss)  # a 4 B scalar kept per step
    from jupyter_memprof._views.summary import summary, summary_html

    growth = summary(prof)["growth"]
    leak = prof.leaks().iloc[0]
    assert leak["holder"] == "losses" and growth["bytes_per_step"] == leak["bytes_per_step"]
    assert growth["bytes_per_step"] == 4 and growth["step_peak"] > 2 << 20
    assert growth["severity"] == "note" and growth["share"] < 0.001
    text = repr(prof)
    line = next(li for li in text.splitlines() if "memory grows" in li)
    per_step = format_bytes(growth["bytes_per_step"])
    assert line.strip().startswith(f"memory grows {per_step} per step: `losses`")
    assert "; a note: " in line and "of the step's peak of" in line
    html = summary_html(prof)
    growth_div = html[html.index("memprof-summary-growth") :]
    assert "#d32f2f" not in growth_div.split("</div>")[0]  # not red


def test_a_big_cache_leak_is_an_alarm():
    model, x, _ = _mlp()
    cache = []
    with torch.no_grad(), jupyter_memprof.profile() as prof:
        for _ in range(STEPS):
            cache.append(model(x).repeat(64, 1))  # 64 KiB a step against a small step
            jupyter_memprof.step()
    from jupyter_memprof._views.summary import summary, summary_html

    growth = summary(prof)["growth"]
    assert growth["severity"] == "alarm" and growth["share"] >= 0.01
    assert "; an alarm: " in repr(prof)
    assert "memprof-summary-growth" in summary_html(prof)
