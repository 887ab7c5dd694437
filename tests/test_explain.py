"""prof.explain(): the peak in a few groups that add up to it, on real captures."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jupyter_memprof
from jupyter_memprof._analysis.diff import family
from jupyter_memprof._analysis.explain import OTHER, changes_for
from jupyter_memprof._analysis.schema import EXPLAIN


class Blocks(nn.Module):
    """Four numbered blocks and a head: their activations are one family, blocks.*."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 256), nn.ReLU()) for _ in range(4))
        self.proj = nn.ModuleList(nn.Linear(256, 64) for _ in range(4))
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        for block, proj in zip(self.blocks, self.proj):
            x = proj(block(x))
        return self.head(x)


@pytest.fixture(scope="module")
def blocks_profile():
    torch.manual_seed(0)
    model = Blocks()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(512, 64), torch.randint(0, 10, (512,))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    step()
    with jupyter_memprof.profile(namespace={"model": model, "opt": opt, "x": x, "y": y}) as p:
        step()
    return p


def test_rows_add_up_to_the_peak_exactly(blocks_profile):
    table = blocks_profile.explain()
    peak = blocks_profile.peak()
    assert list(table.columns) == list(EXPLAIN)
    assert int(table["bytes"].sum()) == peak.attrs["peak_bytes"] == int(peak["size_bytes"].sum())
    assert table.attrs["device"] == "cpu"
    assert table["share"].sum() == pytest.approx(1.0)
    # largest first, every group but the last is one (category, family)
    groups = table[table["group"] != OTHER]
    assert list(groups["bytes"]) == sorted(groups["bytes"], reverse=True)
    assert not groups.duplicated(["category", "modules"]).any()


def test_numbered_modules_are_one_family(blocks_profile):
    table = blocks_profile.explain(rows=20)
    families = set(table["modules"].dropna())
    assert "model.blocks.*" in families and "model.proj.*" in families
    assert not any(part.isdigit() for f in families for part in f.split("."))
    # the blocks' ReLU outputs (512 x 256 floats each, saved for ReLU's backward) are in there
    acts = table[(table["category"] == "activation") & (table["modules"] == "model.blocks.*")]
    assert len(acts) == 1
    row = acts.iloc[0]
    assert row["group"].startswith("activation saved by model.blocks.*")
    assert row["bytes"] % (512 * 256 * 4) == 0 and row["bytes"] >= 512 * 256 * 4
    assert row["changes"] == "checkpoint=['model.blocks.*'], autocast=torch.bfloat16, batch=0.5"
    assert row["what"] == "forward outputs saved for the backward pass"


def test_optimizer_state_and_parameters_are_explained(blocks_profile):
    table = blocks_profile.explain(rows=20)
    shapes = list(Blocks().parameters())  # the same shapes as the profiled model
    n_params = sum(int(p.numel()) * 4 for p in shapes)
    state = table[table["category"] == "optimizer_state"]
    params = table[table["category"] == "parameter"]
    # Adam's exp_avg and exp_avg_sq, and a float32 step counter per parameter
    assert int(state["bytes"].sum()) == 2 * n_params + 4 * len(shapes)
    assert int(params["bytes"].sum()) == n_params
    assert set(state["changes"]) == {"optimizer=torch.optim.SGD"}
    assert params["changes"].isna().all()


def test_rows_are_limited_and_the_rest_is_one_row(blocks_profile):
    full = blocks_profile.explain(rows=50)
    short = blocks_profile.explain(rows=2)
    assert len(short) == 3 and short["group"].iloc[-1] == OTHER
    assert int(short["bytes"].sum()) == int(full["bytes"].sum())
    assert short["bytes"].iloc[-1] == int(full["bytes"].iloc[2:].sum())
    with pytest.raises(ValueError, match="at least 1 row"):
        blocks_profile.explain(rows=0)


def test_text_names_each_group_and_what_to_try(blocks_profile):
    text = blocks_profile.explain_text(rows=20)
    first, *rest = text.splitlines()
    assert first.startswith("peak ") and first.endswith("groups:")
    assert "activation saved by model.blocks.* (mostly aten::relu)" in text
    assert "try: what_if(..., checkpoint=['model.blocks.*']" in text


def test_html_escapes_user_names():
    from jupyter_memprof._views.explain import explain_html

    prof = jupyter_memprof.Profile.empty()
    table = prof.explain()
    assert table.empty and table.attrs["peak_bytes"] == 0
    table.loc[0] = ["<b>x</b>", "activation", "<m>", None, None, 1, 8, 1.0, "w", None]
    html = explain_html(table)
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html


def test_changes_per_category():
    assert changes_for("temporary", "optimizer", "model.*") == ["optimizer={'foreach': False}"]
    assert changes_for("temporary", "forward", None) == ["autocast=torch.bfloat16", "batch=0.5"]
    assert changes_for("gradient", "backward", "model.fc") == ["set_to_none=True"]
    assert changes_for("input", None, None) == ["batch=0.5"]
    # the top of a tree is not checkpointed on its own
    assert changes_for("activation", "forward", "model")[0] == "autocast=torch.bfloat16"
    assert family("model.blocks.3.attn") == "model.blocks.*"


@pytest.fixture
def clean(shell):
    """The names a test's cells bind are deleted afterwards: the IPython shell is shared by
    the whole test session, and a capture counts every storage its namespace holds."""
    before = set(shell.user_ns)
    yield
    for name in set(shell.user_ns) - before:
        if not name.startswith("_"):
            del shell.user_ns[name]


def test_magic_explain_option(shell, run, clean):
    result, out = run(
        "%%memprofile -o p_explain --explain\n"
        "lin_explain = torch.nn.Linear(64, 64)\n"
        "lin_explain(torch.randn(8, 64, requires_grad=True)).sum().backward()"
    )
    assert result.success, out
    prof = shell.user_ns["p_explain"]
    assert prof.explain_text() in out
    assert "for: " in out


def test_magic_estimate_explain_names_the_biggest_saving(shell, run, clean):
    result, out = run(
        "mlp_sav = torch.nn.Sequential(\n"
        "    torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64), torch.nn.ReLU(),\n"
        "    torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))\n"
        "opt_sav = torch.optim.Adam(mlp_sav.parameters())\n"
        "x_sav = torch.randn(512, 64)\n"
    )
    assert result.success, out
    before = {k: v.clone() for k, v in shell.user_ns["mlp_sav"].state_dict().items()}
    result, out = run(
        "%%memprofile --estimate --explain -o est_sav\n"
        "opt_sav.zero_grad()\n"
        "mlp_sav(x_sav).sum().backward()\n"
        "opt_sav.step()"
    )
    assert result.success, out
    est = shell.user_ns["est_sav"]
    assert est.meta["estimate"]
    assert est.explain_text() in out
    lines = out.splitlines()
    head = next(line for line in lines if line.startswith("biggest saving: "))
    assert "each change alone, estimated:" in out
    assert "  batch=0.5" in out and "autocast=torch.bfloat16" in out
    # halving the batch of 512 rows saves most here: activations dominate the peak
    assert head.startswith("biggest saving: batch=0.5: peak ")
    # the notebook's objects are as before
    after = shell.user_ns["mlp_sav"].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert shell.user_ns["x_sav"].shape == (512, 64)
    assert all(p.grad is None for p in shell.user_ns["mlp_sav"].parameters())


def test_cell_savings_table():
    from jupyter_memprof._frontends.whatif import suggestions

    table = jupyter_memprof.Profile.empty().explain()
    table.loc[0] = [
        "g",
        "activation",
        "m.b.*",
        None,
        None,
        1,
        8,
        1.0,
        "w",
        "checkpoint=['m.b.*'], autocast=torch.bfloat16, batch=0.5",
    ]
    table.loc[1] = ["h", "temporary", "m", None, None, 1, 8, 1.0, "w", "batch=0.5"]
    got = suggestions(table)
    assert [t for t, _ in got] == ["checkpoint=['m.b.*']", "autocast=torch.bfloat16", "batch=0.5"]
    assert got[0][1] == {"checkpoint": ["m.b.*"]} and got[1][1] == {"autocast": torch.bfloat16}
