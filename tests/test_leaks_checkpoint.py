"""One leak, one row: a gradient-checkpointed GPT-2 evaluated in a loop that keeps every
step's loss (and so its graph) in a list."""

from __future__ import annotations

import gc

import pytest
import torch

import jupyter_memprof
from jupyter_memprof._analysis.leaks import adopt_unheld

transformers = pytest.importorskip("transformers")


def test_checkpointed_gpt2_eval_loop_leak_is_one_row():
    """Before: two rows, the second (the RNG state each checkpointed block saves, 5,056 B,
    kept by checkpoint's frame that only autograd's saved-tensor hooks reach) with no
    holder, although `del losses` frees both."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    model = transformers.GPT2LMHeadModel(cfg)
    model.gradient_checkpointing_enable()
    model.train()
    ids = torch.randint(0, 512, (4, 64))
    losses = []
    with jupyter_memprof.profile() as prof:
        for _ in range(4):
            losses.append(model(input_ids=ids, labels=ids).loss)
            jupyter_memprof.step()
    leaks = prof.leaks()
    assert len(leaks) == 1, leaks
    row = leaks.iloc[0]
    assert row["holder"] == "losses" and row["steps"] == 4
    sizes = prof.allocations.set_index("alloc_id").loc[row["alloc_ids"], "size_bytes"]
    rng = len(torch.get_rng_state().untyped_storage())
    assert (sizes == rng).sum() == 2 * 4  # one RNG state per checkpointed block and step
    alive = prof.allocations[
        prof.allocations["free_ns"].isna() & prof.allocations["alloc_ns"].notna()
    ]
    made_in_steps = alive[alive["alloc_id"].isin(row["alloc_ids"])]
    assert row["total_bytes"] == int(made_in_steps["size_bytes"].sum())
    del losses
    gc.collect()


def test_unheld_blocks_from_another_line_keep_their_own_row():
    import pandas as pd

    survivors = pd.DataFrame(
        {
            "alloc_id": [1, 2, 3, 4],
            "step": [0, 1, 0, 1],
            "size": [10, 10, 5, 5],
            "device": ["cpu"] * 4,
            "category": ["activation"] * 4,
            "callsite": ["a.py:1", "a.py:1", "b.py:2", "a.py:1"],
            "holder": pd.Series(["xs", "xs", None, None], dtype=object),
            "path": pd.Series(["xs[0]", "xs[1]", None, None], dtype=object),
            "key": [("holder", "xs", "cpu")] * 2
            + [("site", "b.py:2", "activation", "cpu")]
            + [("site", "a.py:1", "activation", "cpu")],
        }
    )
    out = adopt_unheld(survivors)
    assert out["holder"].tolist() == ["xs", "xs", None, "xs"]
    assert out["key"].iloc[3] == ("holder", "xs", "cpu")
