"""Headless Debian Chromium for the browser tests (never a downloaded browser)."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager

import pytest

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.path.join(ROOT, "test-artifacts")


def chromium_path() -> str:
    """Debian's chromium; in CI its absence fails the test, elsewhere it skips it."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        msg = "Debian's chromium is not installed ('make setup' installs it as root)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@contextmanager
def chromium_page(viewport=(1400, 1000)):
    """A fresh Playwright page in headless Debian chromium, closed afterwards."""
    from playwright.sync_api import sync_playwright

    exe = chromium_path()
    with tempfile.TemporaryDirectory() as profile_dir, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile_dir,
            executable_path=exe,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": viewport[0], "height": viewport[1]},
        )
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            yield page
        finally:
            ctx.close()


def screenshot(page, name: str) -> str:
    """Save a screenshot under test-artifacts/ (kept by CI for people to look at)."""
    os.makedirs(ARTIFACTS, exist_ok=True)
    path = os.path.join(ARTIFACTS, name)
    page.screenshot(path=path, full_page=True)
    return path


def docs_image(name: str) -> None:
    """With ``MEMPROF_UPDATE_DOCS_IMAGES=1``, copy the screenshot ``name`` from
    test-artifacts/ to docs/img/ (the README's pictures come from the tests)."""
    if os.environ.get("MEMPROF_UPDATE_DOCS_IMAGES"):
        os.makedirs(os.path.join(ROOT, "docs", "img"), exist_ok=True)
        shutil.copy(os.path.join(ARTIFACTS, name), os.path.join(ROOT, "docs", "img", name))
