"""One rank of a two-process FSDP2 (``fully_shard``) Adam step on the CPU (gloo), profiled.

Run by tests/test_distributed.py as ``python _fsdp_worker.py RANK WORLD_SIZE PORT OUT_DIR``: each
rank warms up one step, profiles the next, and saves its profile as ``OUT_DIR/rank{rank}``
(a Parquet folder).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _dist_models import batch, sharded_net, train_step

import jupyter_memprof


def main(rank: int, world_size: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        model = sharded_net()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = batch(rank)
        train_step(model, opt, x, y)
        ns = {"model": model, "opt": opt, "x": x, "y": y}
        with jupyter_memprof.profile(namespace=ns, label=f"rank {rank}") as prof:
            train_step(model, opt, x, y)
        prof.save(f"{out}/rank{{rank}}", format="parquet")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
