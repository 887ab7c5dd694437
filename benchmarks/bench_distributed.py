"""FSDP2 on many ranks: real two-rank captures against ``estimate(..., world_size=N)``.

    python benchmarks/bench_distributed.py            # the table: real vs estimate per rank
    python benchmarks/bench_distributed.py --only-7b  # the 7B estimate alone (time, memory)

1. The FSDP2 Adam step of ``tests/_fsdp_worker.py`` (four blocks and a head, two gloo ranks
   on the CPU) captured for real on every rank, ``--rounds`` times: each rank's peak as
   captured, and as FSDP's own schedule frees its communication buffers (gloo's threads hold
   some longer, by a varying amount: docs/dev-notes.md, "FSDP2 and DTensors"); its
   parameters and optimizer state at the peak.
2. The same step estimated in this process as rank 0 of 2 (``world_size=2``), and of 8.
3. A 7B-parameter transformer (built from a config inside the estimated function: random
   init on fake tensors, nothing downloaded) estimated for 8 ranks on a fake ``cuda:0``: its
   wall time and the resident memory of the process that ran it (a fresh one).
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

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import jupyter_memprof  # noqa: E402

#: The 7B model: a Llama-like decoder (6.74e9 parameters).
CONFIG_7B = {"vocab": 32000, "dim": 4096, "layers": 32, "heads": 32, "ffn": 11008}
SEQ_7B = 2048


class Layer(torch.nn.Module):
    """A decoder layer: RMSNorm, attention (SDPA), RMSNorm, SwiGLU feed-forward."""

    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.RMSNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)
        self.norm2 = torch.nn.RMSNorm(dim)
        self.gate = torch.nn.Linear(dim, ffn, bias=False)
        self.up = torch.nn.Linear(dim, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, -1).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.out(att.transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Transformer(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList(Layer(dim, heads, ffn) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def params_7b() -> int:
    c = CONFIG_7B
    per_layer = 2 * c["dim"] + 4 * c["dim"] ** 2 + 3 * c["dim"] * c["ffn"]
    return 2 * c["vocab"] * c["dim"] + c["layers"] * per_layer + c["dim"]


def estimate_7b():
    """One AdamW step of the 7B model, sharded by ``fully_shard`` per layer, on 8 ranks:
    built on the meta device, sharded, then materialised shard by shard (FSDP2's recipe:
    no rank ever holds the whole model)."""
    from torch.distributed.fsdp import fully_shard

    def step(tokens):
        with torch.device("meta"):  # FSDP2's recipe: build on meta, shard, then materialise
            model = Transformer(**CONFIG_7B)
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        model.to_empty(device=tokens.device)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.02)  # random init, shard by shard
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        opt.step()
        opt.zero_grad()
        return model, opt

    tokens = torch.randint(0, CONFIG_7B["vocab"], (1, SEQ_7B))
    return jupyter_memprof.estimate(step, tokens, device="cuda:0", world_size=8)


def run_7b() -> None:
    """The 7B estimate in this process: one line of numbers for :func:`table`."""
    t0 = time.perf_counter()
    prof = estimate_7b()
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    by = prof.peak_by("category")
    a = prof.allocations
    params = int(a.loc[a["reason"] == "module parameter", "size_bytes"].sum())
    state = int(a.loc[(a["reason"] == "optimizer.state") & a["free_ns"].isna(), "size_bytes"].sum())
    print(f"7B {wall:.1f} {rss} {int(by.sum())} {params} {state} {prof.meta['world_size']}")
    print("at the peak: " + ", ".join(f"{k} {_gib(v)}" for k, v in by.items()))


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def real_runs(rounds: int, worker: str = "_fsdp_worker.py"):
    """Every rank's profile of ``rounds`` two-rank runs of ``tests/<worker>``."""
    from _spawn import spawn_ranks

    runs = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as out:
            spawn_ranks(worker, 2, out, 300)
            runs.append(jupyter_memprof.load_many(os.path.join(out, "rank*")))
    return runs


def scheduled_peak(prof) -> int:
    """A real rank's peak with FSDP's communication buffers ended when FSDP is done with
    them (as ``tests/test_distributed.py`` computes it)."""
    from test_distributed import _scheduled_peak

    return _scheduled_peak(prof)


def named(prof, reason: str) -> int:
    a = prof.allocations
    return int(a.loc[(a["reason"] == reason) & a["free_ns"].isna(), "size_bytes"].sum())


def estimate_small(world_size: int):
    from test_distributed import _estimate_fsdp

    t0 = time.perf_counter()
    prof = _estimate_fsdp(world_size)
    return prof, time.perf_counter() - t0


def table(rounds: int) -> None:
    runs = real_runs(rounds)
    print(f"Two-rank FSDP2 Adam step on gloo (CPU), {rounds} real runs; torch {torch.__version__}")
    print()
    print("| | peak (as captured) | peak (FSDP's schedule) | parameters | optimizer state |")
    print("|---|---:|---:|---:|---:|")
    for r in (0, 1):
        raw = [int(ps[r].peak_by("category").sum()) for ps in runs]
        sched = [scheduled_peak(ps[r]) for ps in runs]
        p = {named(ps[r], "module parameter") for ps in runs}
        s = {named(ps[r], "optimizer.state") for ps in runs}
        print(
            f"| real, rank {r} | {_kib(min(raw))} to {_kib(max(raw))} | "
            f"{_kib(statistics.median(sched))} | {', '.join(map(_kib, p))} | "
            f"{', '.join(map(_kib, s))} |"
        )
    rank0 = statistics.median(scheduled_peak(ps[0]) for ps in runs)
    for n in (2, 8):
        times, prof = [], None
        for _ in range(rounds):
            prof, t = estimate_small(n)
            times.append(t)
        peak = int(prof.peak_by("category").sum())
        vs = f" ({(peak - rank0) / rank0:+.2%} vs rank 0)" if n == 2 else ""
        print(
            f"| estimate, world_size={n} | {_kib(peak)}{vs} | (median {statistics.median(times):.2f} s) "
            f"| {_kib(named(prof, 'module parameter'))} | {_kib(named(prof, 'optimizer.state'))} |"
        )
    ddp_table(rounds)
    print()
    out_text = subprocess.run(
        [sys.executable, __file__, "--only-7b"], capture_output=True, text=True, check=True
    ).stdout
    out = out_text.split()
    _, wall, rss, peak, params, state, world = out[out.index("7B") :][:7]
    n = params_7b()
    print(
        f"7B transformer ({n / 1e9:.2f}e9 parameters, f32, sequence {SEQ_7B}), AdamW, "
        f"estimated for {world} ranks on a fake cuda:0: {float(wall):.1f} s, "
        f"{_gib(int(rss))} resident"
    )
    at_peak = out_text.split("at the peak: ", 1)[1].strip()
    print(
        f"  rank 0: peak {_gib(int(peak))} ({at_peak}); parameters {_gib(int(params))} "
        f"(model / 8 = {_gib(4 * n / 8)}); optimizer state {_gib(int(state))} "
        f"(2 x model / 8 = {_gib(8 * n / 8)})"
    )


def ddp_table(rounds: int) -> None:
    """The DDP step of ``tests/_ddp_worker.py``: real rank 0 against the estimate."""
    from test_distributed import _estimate_ddp

    runs = real_runs(rounds, "_ddp_worker.py")
    raw = [int(ps[0].peak_by("category").sum()) for ps in runs]
    print(
        f"| real DDP, rank 0 | {_kib(min(raw))} to {_kib(max(raw))} | | "
        f"{_kib(named(runs[0][0], 'module parameter'))} | "
        f"{_kib(named(runs[0][0], 'optimizer.state'))} |"
    )
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        prof = _estimate_ddp()
        times.append(time.perf_counter() - t0)
    peak = int(prof.peak_by("category").sum())
    ref = statistics.median(raw)
    print(
        f"| estimate DDP, world_size=2 | {_kib(peak)} ({(peak - ref) / ref:+.2%} vs rank 0) | "
        f"(median {statistics.median(times):.2f} s) | {_kib(named(prof, 'module parameter'))} "
        f"| {_kib(named(prof, 'optimizer.state'))} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only-7b", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.only_7b:
        run_7b()
    else:
        table(args.rounds)


if __name__ == "__main__":
    main()
