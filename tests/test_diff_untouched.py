"""compare/diff leave out what neither step touched (memory left from before the capture,
used by no op, alive at its end), with an option to include it; the headline is the step's
own change."""

from __future__ import annotations

import pytest
import torch

import jupyter_memprof
from jupyter_memprof._analysis.diff import untouched_ids

MIB = 2**20


def _capture(batch: int, leftover: torch.Tensor, model: torch.nn.Module):
    x = torch.randn(batch, 256)
    ns = {"model": model, "leftover": leftover, "x": x}
    with jupyter_memprof.profile(namespace=ns) as prof:
        out = model(x).relu().sum()
        out.backward()
        del out
    return prof


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    )
    leftover = torch.zeros(4 * MIB // 4)  # an earlier cell's output: 4 MiB, never used here
    return _capture(64, leftover, model), _capture(256, leftover, model), leftover


def test_untouched_blocks_are_what_existed_before_and_nothing_used(pair):
    a, _, leftover = pair
    ids = untouched_ids(a.tables)
    blocks = a.allocations[a.allocations["alloc_id"].isin(ids)]
    assert (blocks["size_bytes"] == 4 * MIB).sum() == 1
    # the model's parameters existed before too, but forward read them: touched
    names = set(blocks["name"].dropna().astype(str))
    assert "leftover" in names and not any(n.startswith("model.") for n in names)


def test_diff_leaves_out_what_neither_step_touched_unless_asked(pair):
    a, b, _ = pair
    d = jupyter_memprof.diff(a, b)
    assert d.attrs["untouched_a"] >= 4 * MIB and d.attrs["untouched_b"] >= 4 * MIB
    own_a = d.attrs["peak_a"] - d.attrs["untouched_a"]
    own_b = d.attrs["peak_b"] - d.attrs["untouched_b"]
    assert int(d["a"].sum()) == own_a and int(d["b"].sum()) == own_b
    pct = f"({(own_b - own_a) / own_a:+.0%})"
    assert d.attrs["summary"].startswith("peak +") and pct in d.attrs["summary"]
    full = jupyter_memprof.diff(a, b, untouched=True)
    assert int(full["a"].sum()) == d.attrs["peak_a"] and int(full["b"].sum()) == d.attrs["peak_b"]
    # the leftover is in the full diff, as an unchanged row, and nowhere in the default one
    assert int(full["a"].sum() - d["a"].sum()) == d.attrs["untouched_a"]
    cmp = jupyter_memprof.compare(a, b)
    assert cmp.summary == d.attrs["summary"]
    assert jupyter_memprof.compare(a, b, untouched=True).summary == full.attrs["summary"]
