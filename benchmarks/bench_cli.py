"""The command line's waits: cold start of ``summary`` on a saved profile, an estimate by
import path, and what the pytest plugin costs tests without its mark.

    python benchmarks/bench_cli.py              # summary cold start + a ~150M-parameter estimate
    python benchmarks/bench_cli.py --big        # the estimate of the 1.2B-parameter step instead
    python benchmarks/bench_cli.py --pytest     # also: 2000 unmarked tests with and without the plugin

Every time is the wall time of a fresh process (``python -m jupyter_memprof ...``), the
median of ``--rounds`` runs, as a user at a terminal waits for it. Targets (issue 39):
``summary`` within 1.5 s; the 1.2B step's estimate for ``cuda:0`` within 15 s.

The estimated steps (``medium_step``, ``billion_step``) build a ``nn.TransformerEncoder`` and
run one AdamW step; estimate mode makes every tensor fake, so building costs nothing. The
1.2B one is ``bench_estimate.billion_step`` (d_model 2048, 24 layers, feed-forward 8192).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def medium_step(batch_size: int = 1, seq: int = 512):
    """~150M parameters: d_model 1024, 12 layers, feed-forward 4096; one AdamW step."""
    import torch
    from torch import nn

    layer = nn.TransformerEncoderLayer(1024, 16, 4096, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(batch_size, seq, 1024)).float().pow(2).mean().backward()
    opt.step()


def billion_step(batch_size: int = 1, seq: int = 512):
    """~1.2B parameters: d_model 2048, 24 layers, feed-forward 8192; one AdamW step."""
    import torch
    from torch import nn

    layer = nn.TransformerEncoderLayer(2048, 16, 8192, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 24, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(batch_size, seq, 2048)).float().pow(2).mean().backward()
    opt.step()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "2"}


def _wall(cmd: list[str], cwd: str, rounds: int) -> tuple[float, list[float], int]:
    times, code = [], 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        code = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True).returncode
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, code


def _saved_profile(folder: str) -> str:
    """A real capture of five Adam steps of a small MLP, saved as a zip."""
    import torch

    import jupyter_memprof

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[m for _ in range(16) for m in (torch.nn.Linear(512, 512), torch.nn.ReLU())]
    )
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(64, 512)
    with jupyter_memprof.profile() as prof:
        for _ in range(5):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    path = os.path.join(folder, "run.zip")
    prof.save(path)
    print(
        f"saved profile: {len(prof.ops):,} ops, {len(prof.allocations):,} blocks, "
        f"{os.path.getsize(path) / 2**20:.1f} MiB"
    )
    return path


def bench_summary(folder: str, rounds: int) -> None:
    path = _saved_profile(folder)
    py = [sys.executable]
    for name, cmd in [
        ("python -c pass (floor)", py + ["-c", "pass"]),
        ("python -c 'import torch' (avoided)", py + ["-c", "import torch"]),
        ("jupyter-memprof --version", py + ["-m", "jupyter_memprof", "--version"]),
        ("jupyter-memprof summary", py + ["-m", "jupyter_memprof", "summary", path]),
        (
            "jupyter-memprof summary --json",
            py + ["-m", "jupyter_memprof", "summary", path, "--json"],
        ),
        ("jupyter-memprof explain", py + ["-m", "jupyter_memprof", "explain", path]),
    ]:
        median, times, code = _wall(cmd, folder, rounds)
        spread = f"{min(times):.2f}-{max(times):.2f}"
        print(f"  {name:<38} {median:6.2f} s  (min-max {spread}, exit {code})")


def bench_estimate(folder: str, big: bool, rounds: int) -> None:
    step = "billion_step" if big else "medium_step"
    target = f"{os.path.join(HERE, 'bench_cli.py')}:{step}"
    cmd = [
        sys.executable,
        "-m",
        "jupyter_memprof",
        "estimate",
        target,
        "--device",
        "cuda:0",
        "--limit",
        "80GiB",
    ]
    median, times, code = _wall(cmd, folder, rounds)
    print(
        f"  estimate {step} for cuda:0 (whole command) {median:6.2f} s  "
        f"(min-max {min(times):.2f}-{max(times):.2f}, exit {code}; target 15 s for 1.2B)"
    )


PLAIN = """
def test_{i}():
    assert {i} + 1 > {i}
"""


def _cpu(cmd: list[str], cwd: str) -> float:
    """CPU seconds (user + system) of one run of ``cmd``: steadier than wall time on a
    shared machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_pytest(folder: str, rounds: int, n: int = 2000) -> None:
    """``n`` unmarked tests, with and without the plugin, alternating, CPU time."""
    tests = os.path.join(folder, "test_plain.py")
    with open(tests, "w") as f:
        f.write("".join(PLAIN.format(i=i) for i in range(n)))
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests]
    plugin = base + ["-p", "jupyter_memprof.pytest_plugin"]
    without, with_ = [], []
    for _ in range(rounds):
        without.append(_cpu(base, folder))
        with_.append(_cpu(plugin, folder))
    a, b = statistics.median(without), statistics.median(with_)
    print(
        f"  {n} unmarked tests, CPU time: {a:.2f} s without the plugin, {b:.2f} s with it"
        f" ({(b - a) / n * 1e6:+.0f} µs per test)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--big", action="store_true", help="estimate the 1.2B-parameter step")
    parser.add_argument("--pytest", action="store_true", help="also time the pytest plugin")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        print("cold start, wall time of a fresh process (median of rounds):")
        bench_summary(folder, args.rounds)
        bench_estimate(folder, args.big, max(1, args.rounds // 2))
        if args.pytest:
            bench_pytest(folder, args.rounds)


if __name__ == "__main__":
    main()
