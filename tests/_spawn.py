"""Run one worker script per rank of a small gloo job, bounded in time."""

from __future__ import annotations

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
