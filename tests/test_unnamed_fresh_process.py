"""tests/test_unnamed_baseline.py run in a fresh process, where the tensors alive are its
own: the survey of what no name reaches counts every tensor of the process, and the test
process of the whole suite holds the tensors, fixtures and threads of hundreds of tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_the_unnamed_baseline_tests_pass_in_a_fresh_process():
    env = {**os.environ, "MEMPROF_UNNAMED_FRESH_PROCESS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:nbval",
         str(HERE / "test_unnamed_baseline.py")],
        cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1]
