"""One rank of a two-process DistributedDataParallel step on the CPU (gloo), profiled.

Run by tests/test_ranks.py as ``python _ddp_worker.py RANK WORLD_SIZE PORT OUT_DIR``: each
rank warms up one step, profiles the next, and saves its profile as ``OUT_DIR/rank{rank}``
(a Parquet folder).
"""

from __future__ import annotations

import sys

import torch
from _spawn import gloo_rank
from torch.nn.parallel import DistributedDataParallel

import jupyter_memprof


def main() -> None:
    with gloo_rank(sys.argv) as (rank, out):
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32)
        )
        # DDP copies every gradient into its bucket (gradient_as_bucket_view=False, the default)
        model = DistributedDataParallel(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        torch.manual_seed(1 + rank)  # each rank its own batch
        x, y = torch.randn(16, 64), torch.randn(16, 32)

        def step():
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

        step()
        ns = {"model": model, "net": net, "opt": opt, "x": x, "y": y}
        with jupyter_memprof.profile(namespace=ns, label=f"rank {rank}") as prof:
            step()
        prof.save(f"{out}/rank{{rank}}", format="parquet")


if __name__ == "__main__":
    main()
