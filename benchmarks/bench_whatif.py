"""what_if(): each change's predicted peak against a real capture of the same step changed by
hand.

    python benchmarks/bench_whatif.py

For every scenario in ``scenarios.py``, the quickstart model and a GPT-2 built by
``transformers`` from a small config (random weights, nothing downloaded; skipped when
``transformers`` is not installed), one warmed-up step is estimated by ``what_if`` with each
change that applies (activation checkpointing of some modules, CPU autocast to bfloat16,
another optimizer, twice the batch), and the same step is changed by hand
(``changed_by_hand.py``), warmed up and captured for real. The table gives the peak
estimated as is, the predicted peak, the real one and the error of the prediction.
"""

from __future__ import annotations

import functools
import gc
import sys
import time

import torch

import jupyter_memprof
from jupyter_memprof import what_if

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_estimate import quickstart
from changed_by_hand import autocast_by_hand, cells_of, checkpoint_by_hand, doubled, run_closure
from scenarios import SCENARIOS

#: Modules checkpointed per scenario (None: the scenario has no submodule to checkpoint).
CHECKPOINT = {
    "MLP + Adam": ["model.2"],
    "CNN (conv, BN, in-place ReLU, dropout) + SGD momentum": ["model.conv2", "model.bn2"],
    "TransformerEncoderLayer + AdamW": ["model.self_attn", "model.linear1"],
    "activation checkpointing + SGD": None,  # checkpointed already
    "bare nn.Parameters + RMSprop": None,
    "in-place writes through views + SGD": ["model.fc1"],
    "Embedding + Adagrad": ["model.emb"],
    "quickstart TinyLM + AdamW": ["model.blocks.layers.*"],
}
SGD_MOMENTUM = functools.partial(torch.optim.SGD, momentum=0.9)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _new_optimizer(opt):
    """The optimizer to swap to: SGD with momentum for adaptive ones, Adam for SGD."""
    return torch.optim.Adam if isinstance(opt, torch.optim.SGD) else SGD_MOMENTUM


def _real(ns, code, globals_, cells, old) -> int:
    """The real peak of the closure on ``cells``; the namespace names those objects (``old``:
    the closure's own cells, replaced by ``cells`` where they differ)."""
    swap = {id(o): n for o, n in zip(old, cells) if o is not n}
    ns = {k: swap.get(id(v), v) for k, v in ns.items()}
    gc.collect()
    with jupyter_memprof.profile(namespace=ns) as prof:
        run_closure(code, globals_, cells)
    return prof.peak().attrs["peak_bytes"]


def scenario_rows(name: str, make) -> list[dict]:
    rows = []
    changes = {
        "checkpoint": CHECKPOINT.get(name),
        "autocast": torch.bfloat16,
        "optimizer": None,
        "batch": 2,
    }
    for change, value in changes.items():
        ns, step = make()
        step()
        model, opt = ns.get("model"), ns["opt"]
        if change == "checkpoint" and value is None:
            continue
        if change == "autocast" and model is None:
            continue
        if change == "optimizer":
            value = _new_optimizer(opt)
        code, globals_, cells = step.__code__, step.__globals__, cells_of(step)
        t0 = time.perf_counter()
        cmp = what_if(run_closure, code, globals_, cells, **{change: value})
        seconds = time.perf_counter() - t0
        if change == "checkpoint":
            checkpoint_by_hand(model, [p.removeprefix("model.") for p in value])
        elif change == "autocast":
            autocast_by_hand(model, value)
        elif change == "batch":
            cells = doubled(cells)
        else:
            params = model.parameters() if model is not None else opt.param_groups[0]["params"]
            new = value(params, lr=1e-3)
            cells = [new if c is opt else c for c in cells]
            run_closure(code, globals_, cells)  # warmed up, as what_if's new optimizer is
        real = _real(ns, code, globals_, cells, cells_of(step))
        rows.append(_row(name, change, value, cmp, real, seconds))
    return rows


def _row(name, change, value, cmp, real, seconds) -> dict:
    predicted = cmp.b.peak().attrs["peak_bytes"]
    return {
        "scenario": name,
        "change": cmp.b.label.split(", ", 1)[1] if ", " in cmp.b.label else change,
        "as_is": cmp.a.peak().attrs["peak_bytes"],
        "predicted": predicted,
        "real": real,
        "error": (predicted - real) / real,
        "seconds": seconds,
    }


def gpt2_rows() -> list[dict]:
    try:
        import transformers
    except ImportError:
        print("(transformers is not installed: the GPT-2 rows are left out)")
        return []
    rows = []

    def make():
        torch.manual_seed(0)
        config = transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=500,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = transformers.GPT2LMHeadModel(config).train()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3), torch.randint(0, 500, (4, 32))

    def step(model, opt, ids):
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    changes = {
        "checkpoint": ["model.transformer.h.*"],
        "autocast": torch.bfloat16,
        "optimizer": SGD_MOMENTUM,
        "batch": 2,
    }
    for change, value in changes.items():
        model, opt, ids = make()
        step(model, opt, ids)
        t0 = time.perf_counter()
        cmp = what_if(step, model, opt, ids, **{change: value})
        seconds = time.perf_counter() - t0
        if change == "checkpoint":
            checkpoint_by_hand(model, ["transformer.h.0", "transformer.h.1"])
        elif change == "autocast":
            autocast_by_hand(model, value)
        elif change == "batch":
            ids = torch.cat([ids, ids])
        else:
            opt = value(model.parameters(), lr=1e-3)
            step(model, opt, ids)
        gc.collect()
        with jupyter_memprof.profile() as prof:
            step(model, opt, ids)
        real = prof.peak().attrs["peak_bytes"]
        rows.append(
            _row("GPT-2 (transformers, 2 layers, d 64) + AdamW", change, value, cmp, real, seconds)
        )
    return rows


def main() -> list[dict]:
    torch.set_num_threads(1)
    rows = []
    for name, make in [*SCENARIOS.items(), ("quickstart TinyLM + AdamW", quickstart)]:
        rows += scenario_rows(name, make)
    rows += gpt2_rows()
    print("| scenario | change | estimated as is | predicted | real, changed by hand | error |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['scenario']} | `{r['change']}` | {_mib(r['as_is'])} | {_mib(r['predicted'])} "
            f"| {_mib(r['real'])} | {100 * r['error']:+.2f}% |"
        )
    worst = max(rows, key=lambda r: abs(r["error"]))
    times = sorted(r["seconds"] for r in rows)
    print(
        f"\n{len(rows)} changes; largest error {100 * worst['error']:+.2f}% "
        f"({worst['scenario']}, {worst['change']}); what_if() took "
        f"{times[len(times) // 2]:.2f} s (median, two estimates each)"
    )
    return rows


if __name__ == "__main__":
    main()
