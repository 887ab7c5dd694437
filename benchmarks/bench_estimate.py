"""Estimate mode: accuracy against real captures, and the one-billion-parameter scale case.

    python benchmarks/bench_estimate.py              # accuracy table + scale case
    python benchmarks/bench_estimate.py accuracy     # only the accuracy table
    python benchmarks/bench_estimate.py scale        # only the scale case

Accuracy: for every scenario in ``scenarios.py`` and the quickstart model, one warmed-up
step is estimated with ``estimate(device="cpu")`` and captured for real; the table gives
both peaks, the error, and the bytes per category at each peak where they differ.
Parameters, gradients and optimizer state (from the ``names`` table) must be equal. The
table also gives the error with the size rules off (``fake_sizes.SIZE_RULES``: blocks
kernels allocate that a fake run cannot see, docs/estimate.md) and names the ops inside which
the real kernel allocated and freed more than the estimate has (at least 0.5% of the real
peak), with the bytes, summed over the step. An LSTM scenario is added here (oneDNN RNN kernels).

Scale: one AdamW step of a ~1.2B-parameter ``nn.TransformerEncoder`` (d_model 2048,
24 layers, feed-forward 8192, batch 1 x 512 tokens), built inside the estimated function on
``device="cuda:0"``. Reports the time, the growth of the process's resident memory and the
parameter, gradient and optimizer-state bytes against 16 bytes per parameter.
"""

from __future__ import annotations

import gc
import resource
import statistics
import sys
import time
import types

import torch
import torch.nn.functional as F
from torch import nn

import jupyter_memprof
from jupyter_memprof import estimate
from jupyter_memprof._producers.fake import sizes as fake_sizes

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from scenarios import SCENARIOS


# -- helpers ---------------------------------------------------------------------------------
def _call_closure(code, globals_, cells):
    """Run a closure with its cells replaced (estimate() passes fake copies of them)."""
    fn = types.FunctionType(code, globals_, None, None, tuple(types.CellType(c) for c in cells))
    return fn()


def estimate_closure(step, **kwargs):
    """estimate() of a zero-argument closure such as the scenarios' ``step``: the objects it
    closes over are passed to estimate() so that they are copied to fake."""
    cells = [c.cell_contents for c in step.__closure__ or ()]
    return estimate(_call_closure, step.__code__, step.__globals__, cells, **kwargs)


def _role_bytes(prof, role: str) -> int:
    n = prof.names
    return int(n[(n["role"] == role) & (n["when"] == "end")]["size_bytes"].sum())


def _mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


# -- the quickstart model ----------------------------------------------------------------------
class TinyLM(nn.Module):
    """The model of notebooks/quickstart.ipynb."""

    def __init__(self, vocab=2000, d=128, layers=2, heads=4, seq=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        block = nn.TransformerEncoderLayer(
            d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False
        )

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        h = self.blocks(h, mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


def quickstart():
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 2000, (8, 65))
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()

    return {"model": model, "opt": opt, "x": x, "y": y}, step


# -- the LSTM model (oneDNN's RNN kernels allocate memory a fake run cannot see) --------------
class LSTMTagger(nn.Module):
    def __init__(self, inp=64, hidden=256, layers=2, classes=10):
        super().__init__()
        self.lstm = nn.LSTM(inp, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


def lstm_adam():
    torch.manual_seed(0)
    model = LSTMTagger()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 64, 64), torch.randint(0, 10, (16 * 64,))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x).flatten(0, 1), y).backward()
        opt.step()

    return {"model": model, "opt": opt, "x": x, "y": y}, step


# -- accuracy --------------------------------------------------------------------------------
def _estimate_without_size_rules(step):
    fake_sizes.SIZE_RULES = False
    try:
        return estimate_closure(step)
    finally:
        fake_sizes.SIZE_RULES = True


_ALLOC = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_"})


def _kernel_temporaries(prof) -> dict[str, int]:
    """Bytes allocated and freed inside one aten op call (the innermost aten op around the
    allocation that is not a bare allocation), by op name: memory a kernel uses for itself."""
    ops = prof.ops.set_index("op_id")
    parent = {int(k): int(v) for k, v in ops["parent_id"].dropna().items()}
    name = ops["name"].to_dict()

    def chain(op: int) -> list[int]:
        out = []
        while op is not None and op >= 0:
            out.append(op)
            op = parent.get(op)
        return out

    out: dict[str, int] = {}
    a = prof.allocations.dropna(subset=["alloc_op_id", "free_op_id"])
    for alloc, free, size in zip(
        a["alloc_op_id"].astype(int), a["free_op_id"].astype(int), a["size_bytes"]
    ):
        atens = [
            op for op in chain(alloc) if name[op].startswith("aten::") and name[op] not in _ALLOC
        ]
        if atens and atens[0] in chain(free):
            out[name[atens[0]]] = out.get(name[atens[0]], 0) + int(size)
    return out


def hidden_bytes(est, real, at_least: int) -> dict[str, int]:
    """Ops seen in both runs inside which the real kernel allocated and freed ``at_least``
    more bytes than the estimate has: memory a kernel uses for itself, not modelled."""
    e, r = _kernel_temporaries(est), _kernel_temporaries(real)
    return {n: r[n] - e.get(n, 0) for n in sorted(r) if r[n] - e.get(n, 0) >= at_least}


def accuracy_row(name: str, make) -> dict:
    ns, step = make()
    step()  # warm up: optimizer state and gradients exist, as in a training loop
    before = _estimate_without_size_rules(step).peak().attrs["peak_bytes"]
    est = estimate_closure(step)
    gc.collect()
    with jupyter_memprof.profile(namespace=ns) as real:
        step()
    pe, pr = est.peak().attrs["peak_bytes"], real.peak().attrs["peak_bytes"]
    ce, cr = est.peak_by("category"), real.peak_by("category")
    diffs = {
        c: int(ce.get(c, 0)) - int(cr.get(c, 0))
        for c in sorted(set(ce.index) | set(cr.index))
        if int(ce.get(c, 0)) != int(cr.get(c, 0))
    }
    exact = all(
        _role_bytes(est, r) == _role_bytes(real, r)
        for r in ("parameter", "gradient", "optimizer_state")
    )
    return {
        "scenario": name,
        "real": pr,
        "estimate": pe,
        "error": (pe - pr) / pr,
        "error_without_rules": (before - pr) / pr,
        "hidden": hidden_bytes(est, real, max(4096, pr // 200)),
        "state_exact": exact,
        "category_diffs": diffs,
    }


def accuracy() -> list[dict]:
    rows = [accuracy_row(name, make) for name, make in SCENARIOS.items()]
    rows.append(accuracy_row("quickstart TinyLM + AdamW", quickstart))
    rows.append(accuracy_row("lstm_adam (LSTM 64-256 x2 + Linear, Adam)", lstm_adam))
    print(
        "| scenario | real peak | estimated peak | error | error without size rules "
        "| params, grads, optimizer state | kernel memory not modelled |"
    )
    print("|---|---:|---:|---:|---:|---|---|")
    for r in rows:
        exact = "equal" if r["state_exact"] else "DIFFER"
        hidden = ", ".join(f"{op} {_mib(n)}" for op, n in r["hidden"].items()) or "none"
        print(
            f"| {r['scenario']} | {_mib(r['real'])} | {_mib(r['estimate'])} | "
            f"{100 * r['error']:+.2f}% | {100 * r['error_without_rules']:+.2f}% | {exact} "
            f"| {hidden} |"
        )
    print()
    for r in rows:
        if r["category_diffs"]:
            parts = ", ".join(f"{c} {d:+,} B" for c, d in r["category_diffs"].items())
            print(f"- {r['scenario']}: at the peak, estimate minus real: {parts}")
    return rows


# -- scale -----------------------------------------------------------------------------------
def billion_step(batch: int = 1, seq: int = 512):
    """Build a 24-layer TransformerEncoder (d_model 2048, ff 8192) and run one AdamW step."""
    layer = nn.TransformerEncoderLayer(2048, 16, 8192, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 24, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, seq, 2048)
    opt.zero_grad()
    model(x).float().pow(2).mean().backward()
    opt.step()


def scale(rounds: int = 3) -> dict:
    times, growth = [], []
    prof = None
    for _ in range(rounds):
        gc.collect()
        rss0 = _rss_bytes()
        t0 = time.perf_counter()
        prof = estimate(billion_step, device="cuda:0")
        times.append(time.perf_counter() - t0)
        growth.append(_rss_bytes() - rss0)
    assert prof is not None
    n_params = 24 * (4 * 2048 * 2048 + 4 * 2048 + 2 * 2048 * 8192 + 8192 + 2048 + 4 * 2048)
    params, grads = _role_bytes(prof, "parameter"), _role_bytes(prof, "gradient")
    state = _role_bytes(prof, "optimizer_state")
    n_tensors = len([p for p in prof.names["role"] if p == "parameter"]) // 2 or 1
    out = {
        "parameters": n_params,
        "median_s": statistics.median(times),
        "times_s": times,
        "rss_growth_first": growth[0],
        "rss_growth_median": statistics.median(growth),
        "param_bytes": params,
        "grad_bytes": grads,
        "state_bytes": state,
        "peak_bytes": prof.peak().attrs["peak_bytes"],
        "ops": len(prof.ops),
        "blocks": len(prof.allocations),
    }
    print(f"{n_params:,} parameters, {n_tensors} tensors per role (start and end rows)")
    print(f"estimate(device='cuda:0'): {', '.join(f'{t:.1f} s' for t in times)}")
    print(f"resident memory growth per round: {', '.join(_mib(g) for g in growth)}")
    print(
        f"parameters {params:,} B, gradients {grads:,} B, optimizer state {state:,} B "
        f"(16 B/param = {16 * n_params:,} B; total {params + grads + state:,} B)"
    )
    print(f"peak {_mib(out['peak_bytes'])}, {out['ops']:,} ops, {out['blocks']:,} blocks")
    return out


if __name__ == "__main__":
    torch.set_num_threads(2)
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("all", "accuracy"):
        accuracy()
    if what in ("all", "scale"):
        scale()
