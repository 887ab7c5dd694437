"""A memory snapshot's dashboard as a user meets it: headless Chromium opens the exported
HTML of a snapshot made from a real CPU training run (tests/_snapshots.py), with its
devices, categories from frames and blocks older than its history."""

from __future__ import annotations

import os

import pytest
from _browser import chromium_page
from _snapshots import record
from test_dashboard_browser import DEEP_TEXT
from test_snapshot_categories import _train

import jupyter_memprof as jm

pytestmark = pytest.mark.browser


def test_a_snapshots_dashboard_renders_its_categories(tmp_path):
    snap, _ = record(_train)
    n = len(snap["device_traces"][0])
    snap["device_traces"][0] = snap["device_traces"][0][n // 4 :]  # a wrapped ring buffer
    prof = jm.load_snapshot(snap, label="snapshot <b>x</b>")
    path = prof.to_html(tmp_path / "snapshot.html")
    with chromium_page(viewport=(1400, 1800)) as page:
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto("file://" + os.path.abspath(path))
        page.wait_for_function(
            "window.memprofReady !== undefined || window.memprofError !== undefined",
            timeout=30_000,
        )
        assert page.evaluate("window.memprofError") is None
        timeline = page.locator(".memprof-timeline").first.evaluate(DEEP_TEXT)
        for category in ("parameter", "optimizer_state", "activation", "gradient"):
            assert category in timeline
        assert "cuda:0" in timeline
        rows = page.locator(".memprof-allocations .slick-row")
        assert rows.count() > 5
        # the label is text, never markup
        assert page.locator("b:text-is('x')").count() == 0
        assert errors == []
