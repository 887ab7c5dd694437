"""The pytest plugin in a real pytest run (a subprocess): memory_limit budgets estimated on
a CPU-only machine, real budgets, the memprof fixture, --memprof-save, and nothing done for
tests without the mark."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

import pytest
from _cli_support import env

import jupyter_memprof

TESTS = """
import sys

import pytest


def test_a_unmarked_test_pays_nothing():
    assert "jupyter_memprof._cli.budget" not in sys.modules
    assert "torch" not in sys.modules


def step(batch):
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(batch, 1024)
    model(x).sum().backward()
    opt.step()


@pytest.mark.memory_limit("2 GiB", device="cuda:0")
def test_b_over_the_cuda_budget():
    step(65536)


@pytest.mark.memory_limit("2 GiB", device="cuda:0")
def test_c_within_the_cuda_budget():
    step(64)


@pytest.mark.memory_limit("1 GiB", device="cpu", estimate=False)
@pytest.mark.memory_limit("2 GiB", device="cuda:0")
def test_d_a_cpu_budget_run_for_real_and_a_cuda_one():
    step(64)


@pytest.mark.memory_limit("1 MiB", device="cpu", estimate=False)
def test_e_over_a_real_cpu_budget():
    step(64)


REAL = []


@pytest.fixture(scope="module")
def model():
    import torch

    REAL.append(torch.nn.Linear(4096, 4096))
    return REAL[0]


@pytest.mark.memory_limit("2 GiB", device="cuda:0")
def test_f_fixtures_become_fake(model):
    import torch

    assert model is not REAL[0]
    model(torch.randn(8, 4096)).sum().backward()
    assert model.weight.grad is not None


def test_f_the_real_fixture_is_untouched(model):
    assert model is REAL[0] and model.weight.grad is None


def test_g_fixture(memprof):
    import torch

    with memprof as prof:
        w = torch.zeros(256, 1024)
    assert prof is memprof.profile
    assert prof.peak().attrs["peak_bytes"] == 256 * 1024 * 4
    est = memprof.estimate(step, 64, device="cuda:0")
    assert est.meta["estimate"] and memprof.profiles == [prof, est]
    memprof.assert_fits("4 GiB", device="cuda:0")
    del w


@pytest.mark.memory_limit("lots")
def test_h_bad_mark():
    pass
"""


def _plugin_args() -> list[str]:
    """``-p`` the plugin unless the installed package registers it already."""
    eps = importlib.metadata.entry_points(group="pytest11")
    installed = any(ep.value == "jupyter_memprof.pytest_plugin" for ep in eps)
    return [] if installed else ["-p", "jupyter_memprof.pytest_plugin"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "test_budgets.py").write_text(TESTS)
    saved = folder / "saved"
    cmd = [sys.executable, "-m", "pytest", *_plugin_args(), "-p", "no:cacheprovider", "-rA"]
    cmd += ["--memprof-save", str(saved), "test_budgets.py"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=folder, env=env(), timeout=600)
    outcomes = dict(
        (name, word)
        for word, name in re.findall(
            r"^(PASSED|FAILED|ERROR) test_budgets.py::(\w+)", proc.stdout, re.M
        )
    )
    return proc, outcomes, saved


def test_outcomes(run):
    proc, outcomes, _ = run
    assert outcomes == {
        "test_a_unmarked_test_pays_nothing": "PASSED",
        "test_b_over_the_cuda_budget": "FAILED",
        "test_c_within_the_cuda_budget": "PASSED",
        "test_d_a_cpu_budget_run_for_real_and_a_cuda_one": "PASSED",
        "test_e_over_a_real_cpu_budget": "FAILED",
        "test_f_fixtures_become_fake": "PASSED",
        "test_f_the_real_fixture_is_untouched": "PASSED",
        "test_g_fixture": "PASSED",
        "test_h_bad_mark": "FAILED",
    }, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 1


def _section(stdout: str, test: str) -> str:
    start = stdout.index(f"_ {test} _")
    end = stdout.find("\n____", start + 1)
    return stdout[start : end if end > 0 else None]


def test_a_step_over_its_cuda_budget_names_the_largest_group_at_the_peak(run):
    proc, _, _ = run
    text = _section(proc.stdout, "test_b_over_the_cuda_budget")
    assert "memory_limit('2 GiB', device='cuda:0'): OVER 2.0 GiB on cuda:0: needs" in text
    assert "memory estimate 'test_b_over_the_cuda_budget'" in text  # said once, not twice

    def step(batch):
        import torch
        from torch import nn

        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(batch, 1024)).sum().backward()
        opt.step()

    prof = jupyter_memprof.estimate(step, 65536, device="cuda:0")
    jupyter_memprof.release(prof)
    largest = prof.explain("cuda:0").iloc[0]
    assert f"% {largest['group']}" in text.replace("%  ", "% ")
    assert text.index(largest["group"]) < text.index("for: ")


def test_a_real_cpu_budget_and_a_bad_mark(run):
    proc, _, _ = run
    text = _section(proc.stdout, "test_e_over_a_real_cpu_budget")
    assert "memory_limit('1 MiB', device='cpu', estimate=False): OVER 1.0 MiB on cpu" in text
    assert "memory profile 'test_e_over_a_real_cpu_budget'" in text
    text = _section(proc.stdout, "test_h_bad_mark")
    assert "memory_limit: " in text and "lots" in text


def test_failing_tests_keep_their_profiles(run):
    _, _, saved = run
    names = sorted(p.name for p in saved.iterdir())
    assert names == [
        "test_budgets.py_test_b_over_the_cuda_budget.html",
        "test_budgets.py_test_b_over_the_cuda_budget.zip",
        "test_budgets.py_test_e_over_a_real_cpu_budget.html",
        "test_budgets.py_test_e_over_a_real_cpu_budget.zip",
    ]
    prof = jupyter_memprof.load(saved / "test_budgets.py_test_b_over_the_cuda_budget.zip")
    assert prof.meta["estimate"] and prof.devices == ["cuda:0"]
    assert prof.meta["oom"]["device"] == "cuda:0"
