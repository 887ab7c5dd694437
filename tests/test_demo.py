"""``make demo`` serves copies of the notebooks, so that a run saved in the demo never
changes the tracked notebooks ``make test`` checks with nbval (issue 37, item 9: before,
Run All autosaved ``notebooks/quickstart.ipynb`` with outputs nbval then refused)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _make(*args: str) -> str:
    done = subprocess.run(
        ["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--ignored=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_demo_serves_copies_and_leaves_the_repository_clean(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    before = _status()
    tracked = {p.name: p.read_bytes() for p in (ROOT / "notebooks").glob("*.ipynb")}
    demo = tmp_path / "demo"
    _make("demo-notebooks", f"DEMO_DIR={demo}")
    assert {p.name: p.read_bytes() for p in demo.glob("*.ipynb")} == tracked
    # a run saved in the demo (outputs nbval would refuse) stays there
    saved = demo / "quickstart.ipynb"
    nb = json.loads(saved.read_text())
    nb["cells"][0].setdefault("outputs", []).append(
        {"output_type": "display_data", "data": {"application/vnd.bokehjs_load.v0+json": ""}}
    )
    saved.write_text(json.dumps(nb))
    _make("demo-notebooks", f"DEMO_DIR={demo}")  # again: the saved run is kept
    assert "bokehjs_load" in saved.read_text()
    assert {p.name: p.read_bytes() for p in (ROOT / "notebooks").glob("*.ipynb")} == tracked
    assert _status() == before


def test_demo_serves_the_copies_folder():
    dry = _make("-n", "demo", "BIN=.venv/bin")
    assert "--ServerApp.root_dir=.demo" in dry
    assert "root_dir=notebooks" not in dry
    assert ".demo/" in (ROOT / ".gitignore").read_text().splitlines()
