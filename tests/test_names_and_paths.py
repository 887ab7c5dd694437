"""``-o`` never replaces a module and says when it replaces another value; ``load`` expands
``{rank}`` as ``save`` does; ``load_many`` refuses the same file twice (issue 37, item 10)."""

from __future__ import annotations

import os

import pytest
import torch
from IPython.core.error import UsageError

import jupyter_memprof


@pytest.fixture(scope="module")
def prof():
    with jupyter_memprof.profile(namespace={}) as p:
        torch.ones(1000)
    return p


@pytest.mark.parametrize("name", ["torch", "F", "jupyter_memprof", "os"])
def test_output_refuses_a_name_holding_a_module(shell, run, name):
    shell.run_cell("import os, jupyter_memprof")
    module = shell.user_ns[name]
    result, out = run(f"%%memprofile -o {name}\nran_o = torch.ones(10)")
    assert isinstance(result.error_in_exec, UsageError)
    assert out.strip() == (
        f"UsageError: -o {name}: {name!r} holds the module {module.__name__!r}; choose another name"
    )
    assert shell.user_ns[name] is module and "ran_o" not in shell.user_ns


def test_output_says_when_it_replaces_a_value(shell, run):
    shell.user_ns["model_o"] = torch.nn.Linear(2, 2)
    result, out = run("%%memprofile --no-display -o model_o\nh_o = torch.ones(10)")
    assert result.success
    assert out.strip() == (
        "%%memprofile: -o model_o replaces 'model_o' (a Linear) with the profile"
    )
    assert isinstance(shell.user_ns["model_o"], jupyter_memprof.Profile)
    _, again = run("%%memprofile --no-display -o model_o\nh_o = torch.ones(10)")
    assert again.strip() == ""  # a profile replaced by a profile: nothing to say


def test_output_leaves_a_module_the_cell_bound(shell, run):
    result, out = run("%%memprofile --no-display -o mod_o\nimport math as mod_o")
    assert result.success
    assert "'mod_o' holds a module, left as it is; the profile is in _memprof" in out
    assert shell.user_ns["mod_o"].__name__ == "math"
    assert isinstance(shell.user_ns["_memprof"], jupyter_memprof.Profile)


def test_load_expands_rank_as_save_does(prof, tmp_path):
    path = prof.save(os.path.join(tmp_path, "rank{rank}.memprof"))
    assert path.endswith("rank0.memprof")
    loaded = jupyter_memprof.load(os.path.join(tmp_path, "rank{rank}.memprof"))
    assert len(loaded.allocations) == len(prof.allocations)


def test_load_many_refuses_the_same_file_twice(prof, tmp_path):
    a = prof.save(tmp_path / "a.memprof")
    os.link(a, tmp_path / "b.memprof")
    for paths in ([a, a], [a, str(tmp_path / "." / "a.memprof")], [a, tmp_path / "b.memprof"]):
        with pytest.raises(ValueError) as info:
            jupyter_memprof.load_many(paths)
        msg = str(info.value)
        assert "\n" not in msg and "is the same profile as" in msg
    assert len(jupyter_memprof.load_many([a]).profiles) == 1
