"""Run one worker script per rank of a small gloo job, bounded in time."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(__file__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(worker: str, world: int, out: str, timeout_s: float) -> None:
    """Run ``python tests/<worker> RANK WORLD PORT OUT`` for every rank at once; kill every
    rank still running after ``timeout_s`` seconds; raise with a rank's output when it
    failed."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    script = os.path.join(HERE, worker)
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(r), str(world), str(port), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout_s)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, log) in enumerate(zip(procs, logs)):
        if p.returncode != 0:
            raise AssertionError(f"rank {r} of {worker} failed:\n{log[-3000:]}")


@contextlib.contextmanager
def gloo_rank(argv: list[str]):
    """In a worker run by :func:`spawn_ranks` (``argv``: its ``sys.argv``): ``(rank, out)``,
    inside this rank's gloo process group, one intra-op thread."""
    import torch
    import torch.distributed as dist

    rank, world, port, out = int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        yield rank, out
    finally:
        dist.destroy_process_group()
