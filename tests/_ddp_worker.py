"""One rank of a two-process DistributedDataParallel step on the CPU (gloo), profiled.

Run by tests/test_ranks.py as ``python _ddp_worker.py RANK WORLD_SIZE PORT OUT_DIR``: each
rank warms up one step, profiles the next, and saves its profile as ``OUT_DIR/rank{rank}``
(a Parquet folder).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jupyter_memprof


def main(rank: int, world_size: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
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
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
