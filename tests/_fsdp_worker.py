"""One rank of a two-process FSDP2 (``fully_shard``) Adam step on the CPU (gloo), profiled.

Run by tests/test_distributed.py as ``python _fsdp_worker.py RANK WORLD_SIZE PORT OUT_DIR``: each
rank warms up one step, profiles the next, and saves its profile as ``OUT_DIR/rank{rank}``
(a Parquet folder).
"""

from __future__ import annotations

import sys

import torch
from _dist_models import batch, sharded_net, train_step
from _spawn import gloo_rank

import jupyter_memprof


def main() -> None:
    with gloo_rank(sys.argv) as (rank, out):
        model = sharded_net()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = batch(rank)
        train_step(model, opt, x, y)
        ns = {"model": model, "opt": opt, "x": x, "y": y}
        with jupyter_memprof.profile(namespace=ns, label=f"rank {rank}") as prof:
            train_step(model, opt, x, y)
        prof.save(f"{out}/rank{{rank}}", format="parquet")


if __name__ == "__main__":
    main()
