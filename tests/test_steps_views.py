"""What users see of steps and leaks: the summary's growth line, the dashboard's step marks."""

import pytest
import torch
from test_steps import STEPS, _mlp

import jupyter_memprof


def _cache_leak():
    model, x, y = _mlp()
    cache = {}
    with torch.no_grad(), jupyter_memprof.profile() as prof:
        for i in range(STEPS):
            cache[i] = model(x)  # the line the summary names
            jupyter_memprof.step()
    return prof


def test_the_summary_says_how_much_grows_per_step_and_what_keeps_it():
    from jupyter_memprof._views.summary import summary, summary_html

    prof = _cache_leak()
    leak = prof.leaks().iloc[0]
    line = int(leak["callsite"].split(":")[1].split()[0])
    want = f"memory grows 1.0 KiB per step: `cache` (test_steps_views.py:{line})"
    assert summary(prof)["growth"]["bytes_per_step"] == 32 * 8 * 4
    assert want in repr(prof)
    assert "memprof-summary-growth" in summary_html(prof)
    assert "`cache` (test_steps_views.py:" in summary_html(prof)


def test_a_clean_loop_has_no_growth_line():
    from jupyter_memprof._views.summary import summary

    model, x, y = _mlp()
    with torch.no_grad(), jupyter_memprof.profile() as prof:
        for _ in range(STEPS):
            model(x)
            jupyter_memprof.step()
    assert summary(prof)["growth"] is None
    assert "grows" not in repr(prof)


def test_the_dashboard_marks_the_step_boundaries():
    from jupyter_memprof._views.dashboard.page import build

    prof = _cache_leak()
    marks = build(prof).layout.select_one({"name": "memprof-steps-cpu"})
    ends = prof.steps["end_ns"].to_numpy()[:-1]
    assert list(marks.data["x"]) == pytest.approx(((ends - prof.start_ns) / 1e6).tolist())
    model, x, y = _mlp()
    with torch.no_grad(), jupyter_memprof.profile() as one:
        model(x)
    assert build(one).layout.select_one({"name": "memprof-steps-cpu"}) is None


def test_the_growth_line_is_escaped_in_html():
    from jupyter_memprof import Profile
    from jupyter_memprof._views.summary import summary_html

    prof = _cache_leak()
    bad = "<b>bad.py:3 in <module>"
    ops, blocks = prof.ops.copy(), prof.allocations.copy()
    ops["callsite"] = ops["callsite"].astype(object).where(ops["callsite"].isna(), bad)
    # a block's own callsite is what leaks name (the line that made it)
    blocks["callsite"] = blocks["callsite"].astype(object).where(blocks["callsite"].isna(), bad)
    blocks["callsite"] = blocks["callsite"].astype("string")
    # leaks: found again from the crafted tables (None: the profile finds them)
    tables = {**prof.tables, "ops": ops, "allocations": blocks, "leaks": None}
    crafted = Profile(**tables, meta=dict(prof.meta))
    html = summary_html(crafted)
    assert "`cache` (&lt;b&gt;bad.py:3)" in html and "<b>bad" not in html
