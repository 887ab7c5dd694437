"""Files and runners shared by the tests of the command line, the pytest plugin and the MCP
server: real saved profiles, a module of steps to estimate, the CLI in a subprocess."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: A module the estimate and fit commands import by MODULE:FUNCTION. Its parameters:
#: Linear(1024, 4096) and Linear(4096, 1024) in float32, 33,574,912 bytes (a multiple of
#: CUDA's 512-byte rounding for each tensor).
STEPS = """
import torch
from torch import nn


def step(batch_size=8):
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(batch_size, 1024)
    model(x).sum().backward()
    opt.step()


def needs_arguments(model, batch):
    return model(batch)


def reads_values():
    return torch.randn(3).sum().item()


NOT_A_FUNCTION = 3
"""
PARAMETER_BYTES = (1024 * 4096 + 4096 + 4096 * 1024 + 1024) * 4


def env() -> dict[str, str]:
    """The subprocesses import this worktree's package, with one torch thread."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def write_steps(folder: pathlib.Path) -> None:
    (folder / "cli_steps.py").write_text(STEPS)


def save_profiles(folder: pathlib.Path) -> dict[str, object]:
    """Two real captures of a small training loop, saved: ``clean.zip`` (three steps),
    ``leak.zip`` (four steps, each appending a 64 KiB tensor to ``kept``) and
    ``clean.parquet``; returns the loaded ``clean`` and ``leak`` profiles."""
    import torch

    import jupyter_memprof

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(32, 64)
    ns = {"model": model, "opt": opt, "x": x}
    with jupyter_memprof.profile(namespace=ns) as clean:
        for _ in range(3):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    kept: list = []
    ns["kept"] = kept
    with jupyter_memprof.profile(namespace=ns) as leak:
        for _ in range(4):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            kept.append(torch.randn(128, 128))
    clean.save(folder / "clean.zip")
    clean.save(folder / "clean.parquet", format="parquet")
    leak.save(folder / "leak.zip")
    jupyter_memprof.release(clean)
    jupyter_memprof.release(leak)
    return {"clean": jupyter_memprof.load(folder / "clean.zip"), "leak": leak}


def run_cli(
    *args: str,
    cwd: pathlib.Path | str | None = None,
    timeout: float = 300,
    python: tuple[str, ...] = (),
):
    """``python [PYTHON] -m jupyter_memprof ARGS``: (exit code, stdout, stderr)."""
    out = subprocess.run(
        [sys.executable, *python, "-m", "jupyter_memprof", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env(),
        timeout=timeout,
    )
    return out.returncode, out.stdout, out.stderr


#: Runs the console script's entry point once per argv in one process (the installed
#: ``jupyter-memprof`` script calls ``jupyter_memprof._cli.main:run``), and prints a JSON
#: list of {argv, code, stdout, stderr}.
DRIVER = """
import contextlib, io, json, sys
from jupyter_memprof._cli.main import run
out = []
for argv in json.loads(sys.argv[1]):
    o, e = io.StringIO(), io.StringIO()
    sys.argv = ["jupyter-memprof", *argv]
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        try:
            run()
            code = 0
        except SystemExit as stop:
            code = stop.code
    out.append({"argv": argv, "code": code, "stdout": o.getvalue(), "stderr": e.getvalue()})
print(json.dumps(out))
"""


def run_many(argvs: list[list[str]], cwd: pathlib.Path | str | None = None, timeout: float = 600):
    """The console script's entry point on each argv, in one subprocess."""
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(argvs)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env(),
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
