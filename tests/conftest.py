import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _torch_threads():
    # Two cores in CI: keep torch from oversubscribing while tests run.
    import torch

    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True, scope="session")
def _no_unnamed_survey():
    # A capture counts on the CPU every tensor no name reaches: here those of other tests,
    # of fixtures and of test modules. Tests of that survey ask for `unnamed_survey`.
    # (Session scope: set before any fixture of a wider scope profiles.)
    from jupyter_memprof._producers import unnamed

    unnamed.ENABLED = False
    yield
    unnamed.ENABLED = True


@pytest.fixture
def unnamed_survey(monkeypatch):
    """Captures in this test look for the CPU's storages that no name reaches."""
    from jupyter_memprof._producers import unnamed

    monkeypatch.setattr(unnamed, "ENABLED", True)


@pytest.fixture(scope="session")
def mlp_adam_profile():
    """One real Adam step of a small MLP (fc1 -> relu -> fc2), profiled once per session."""
    import torch

    import jupyter_memprof

    torch.manual_seed(0)

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(64, 128)
            self.fc2 = torch.nn.Linear(128, 10)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    y = torch.randint(0, 10, (32,))
    ns = {"model": model, "opt": opt, "x": x, "y": y}
    with jupyter_memprof.profile(namespace=ns) as prof:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    ns["loss"] = loss
    return prof, ns


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))


def profile_scenario(make, **kwargs):
    """Warm up one step, then profile one step of a scenario from benchmarks/scenarios.py."""
    import jupyter_memprof

    ns, step = make(**kwargs)
    step()
    with jupyter_memprof.profile(namespace=ns) as prof:
        step()
    return prof, ns


@pytest.fixture(scope="session")
def ipython_shell():
    """The one IPython shell of the test session (IPython allows one singleton per process)."""
    from IPython.testing import globalipapp

    # look the function up at call time: the first call replaces it with the shell's own
    return globalipapp.get_ipython()


@pytest.fixture(scope="module")
def shell(ipython_shell):
    """The shell with the extension loaded, for one test module."""
    ip = ipython_shell
    ip.run_cell("%load_ext jupyter_memprof", store_history=True)
    ip.run_cell("import torch, torch.nn.functional as F", store_history=True)
    yield ip
    ip.run_cell("%unload_ext jupyter_memprof", store_history=True)


@pytest.fixture
def run(shell, capsys):
    """Run a cell as a notebook does; returns (ExecutionResult, everything it printed)."""

    def run_cell(source: str):
        capsys.readouterr()
        result = shell.run_cell(source, store_history=True)
        captured = capsys.readouterr()
        return result, captured.out + captured.err

    return run_cell
