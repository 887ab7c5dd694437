"""The small models the distributed tests train: an FSDP2-sharded stack of blocks, and the
step every rank (and every estimate of it) runs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

DIM = 64
BLOCKS = 4
OUT = 7  # odd: FSDP2 pads the head's shards (4 rows on each of two ranks, 7 in all)
BATCH = 32


class Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(torch.nn.Module):
    def __init__(self, d: int = DIM, n: int = BLOCKS, out: int = OUT) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n))
        self.head = torch.nn.Linear(d, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def sharded_net(mesh=None) -> Net:
    """A :class:`Net` with every block and the root sharded by ``fully_shard``."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Net()
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1 + rank)  # each rank its own batch
    return torch.randn(BATCH, DIM), torch.randn(BATCH, OUT)


def train_step(model, opt, x, y) -> None:
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.step()


def shard_bytes(shape: tuple[int, ...], world_size: int, itemsize: int = 4) -> int:
    """Bytes of one rank's FSDP2 shard of a parameter: dim 0 split in ``world_size`` chunks
    of ``ceil(rows / world_size)`` rows, the last padded to that size."""
    rows = -(-shape[0] // world_size)
    rest = 1
    for s in shape[1:]:
        rest *= s
    return rows * rest * itemsize


def local_bytes(shape: tuple[int, ...], world_size: int, rank: int, itemsize: int = 4) -> int:
    """Bytes of rank ``rank``'s part of a parameter without the padding: what a tensor made
    from the sharded parameter (Adam's ``exp_avg``) holds there."""
    chunk = -(-shape[0] // world_size)
    rows = max(0, min(chunk, shape[0] - rank * chunk))
    rest = 1
    for s in shape[1:]:
        rest *= s
    return rows * rest * itemsize
