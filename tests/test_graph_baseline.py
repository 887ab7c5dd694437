"""Memory that only the autograd graphs of live tensors hold counts in what was live before
the capture, named by its path (issue 37, item 8: before, four kept losses showed as four
4-byte inputs, and the activations their graphs saved were not counted)."""

from __future__ import annotations

import torch

import jupyter_memprof


def test_graphs_of_kept_losses_count_in_the_baseline():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    )
    outs = []
    for _ in range(4):
        outs.append(model(torch.randn(512, 256)).sum())
    with jupyter_memprof.profile(namespace={"model": model, "outs": outs}) as prof:
        torch.ones(10)
    params = sum(p.numel() * 4 for p in model.parameters())
    # each graph saved its input (512x256) and the ReLU's result (512x1024, also the second
    # Linear's input): 2.5 MiB per kept loss
    saved = 4 * (512 * 256 * 4 + 512 * 1024 * 4)
    assert prof.meta["baseline_bytes"] == {"cpu": params + 4 * 4 + saved}
    start = prof.names[(prof.names["when"] == "start").to_numpy()]
    held = start[(start["role"] == "held").to_numpy()]
    assert sorted(set(held["name"])) == sorted(
        f"outs[{i}].grad_fn…{node}"
        for i in range(4)
        for node in ("AddmmBackward0._saved_mat1", "ReluBackward0._saved_result")
    )
    assert int(held.drop_duplicates("alloc_id")["size_bytes"].sum()) == saved
    assert "live before the capture on cpu: 12.0 MiB" in str(prof)


def test_a_graph_whose_backward_ran_holds_nothing():
    model = torch.nn.Linear(64, 64)
    loss = model(torch.randn(8, 64)).sum()
    loss.backward()
    with jupyter_memprof.profile(namespace={"model": model, "loss": loss}) as prof:
        torch.ones(10)
    start = prof.names[(prof.names["when"] == "start").to_numpy()]
    assert not (start["role"] == "held").any()
