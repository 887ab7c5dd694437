"""Estimates of the models people train, written as they write them, against the real step.

    python benchmarks/bench_estimate_models.py          # every model
    python benchmarks/bench_estimate_models.py llama    # the models whose name has "llama"
    python benchmarks/bench_estimate_models.py compile  # the compiled model (slow: inductor)
    python benchmarks/bench_estimate_models.py gqa      # Llama 1B/7B/13B with GQA for cuda:0
    python benchmarks/bench_estimate_models.py whatif   # what_if(): bf16 autocast, checkpoint

Each model is a ``transformers`` model built from a tiny config (random weights, nothing
downloaded) with the optimizer, schedule and tricks its users pair it with. One step is run
for real first (warm-up: optimizer state and gradients exist), then the next step is
estimated on the CPU (``estimate(step, *objects, device="cpu")``) and captured for real
(``jupyter_memprof.profile()``); the table gives both peaks and the error. Every object the
step touches is compared before and after the estimate (``changed``: must be 0).
"""

from __future__ import annotations

import gc
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import jupyter_memprof

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from changed_by_hand import autocast_by_hand, checkpoint_by_hand

try:
    import transformers
except ImportError:  # pragma: no cover - the benchmark needs transformers
    transformers = None


# -- the models, as their users write them ----------------------------------------------------
def _seed():
    torch.manual_seed(0)


def bert():
    """BERT for sequence classification, AdamW, padded batch with an attention mask."""
    _seed()
    cfg = transformers.BertConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64, num_labels=3,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    batch = {
        "input_ids": torch.randint(0, 512, (8, 48)),
        "attention_mask": torch.ones(8, 48, dtype=torch.long),
        "labels": torch.randint(0, 3, (8,)),
    }

    def step(model, opt, batch):
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step, (model, opt, batch)


def t5_adafactor():
    """T5 with HF's Adafactor (relative step, parameter scaling), as T5 is usually trained."""
    _seed()
    cfg = transformers.T5Config(
        vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
        decoder_start_token_id=0,
    )  # fmt: skip
    model = transformers.T5ForConditionalGeneration(cfg)
    opt = transformers.optimization.Adafactor(
        model.parameters(), scale_parameter=True, relative_step=True, warmup_init=True, lr=None
    )
    src, tgt = torch.randint(0, 512, (8, 32)), torch.randint(0, 512, (8, 16))

    def step(model, opt, src, tgt):
        model(input_ids=src, labels=tgt).loss.backward()
        opt.step()
        opt.zero_grad()

    return step, (model, opt, src, tgt)


def _vit():
    _seed()
    cfg = transformers.ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, num_labels=10,
    )  # fmt: skip
    model = transformers.ViTForImageClassification(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    return model, opt, torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))


def vit_sgd():
    """ViT, SGD with Nesterov momentum."""
    model, opt, x, y = _vit()

    def step(model, opt, x, y):
        F.cross_entropy(model(pixel_values=x).logits, y).backward()
        opt.step()
        opt.zero_grad()

    return step, (model, opt, x, y)


def vit_bf16():
    """ViT under CPU bf16 autocast."""
    model, opt, x, y = _vit()

    def step(model, opt, x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(pixel_values=x).logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step, (model, opt, x, y)


def gpt2_checkpointing():
    """GPT-2 with gradient checkpointing (HF's switch), AdamW."""
    _seed()
    cfg = transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    model = transformers.GPT2LMHeadModel(cfg)
    model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ids = torch.randint(0, 512, (8, 64))

    def step(model, opt, ids):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    return step, (model, opt, ids)


def _llama_config():
    return transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip


def llama_adamw():
    """Llama (grouped-query attention), AdamW, a cosine schedule with warm-up, clipping."""
    _seed()
    model = transformers.LlamaForCausalLM(_llama_config())
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.1)
    sched = transformers.get_cosine_schedule_with_warmup(opt, 10, 100)
    ids = torch.randint(0, 512, (4, 64))
    mask = torch.ones(4, 64, dtype=torch.long)

    def step(model, opt, sched, ids, mask):
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    return step, (model, opt, sched, ids, mask)


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (as LoRA adds it)."""

    def __init__(self, base: nn.Linear, rank: int = 4, alpha: float = 8.0):
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.a.t() @ self.b.t()) * self.scale


def llama_lora():
    """LoRA on a frozen Llama: the query and value projections adapted, AdamW on the rest."""
    _seed()
    model = transformers.LlamaForCausalLM(_llama_config())
    model.requires_grad_(False)
    for layer in model.model.layers:
        layer.self_attn.q_proj = LoRALinear(layer.self_attn.q_proj)
        layer.self_attn.v_proj = LoRALinear(layer.self_attn.v_proj)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(0, 512, (4, 64))
    mask = torch.ones(4, 64, dtype=torch.long)

    def step(model, opt, ids, mask):
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    return step, (model, opt, ids, mask)


def compiled_mlp():
    """A torch.compile'd model (inductor): the estimate follows the eager code and says so."""
    _seed()
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                          nn.Linear(1024, 10))  # fmt: skip
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step(model, opt, x, y):
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    return step, (compiled, opt, x, y)


MODELS = {
    "BERT, AdamW": bert,
    "T5, Adafactor": t5_adafactor,
    "ViT, SGD Nesterov": vit_sgd,
    "ViT, bf16 autocast": vit_bf16,
    "GPT-2, gradient checkpointing": gpt2_checkpointing,
    "Llama, AdamW + cosine + clipping": llama_adamw,
    "LoRA on a frozen Llama": llama_lora,
}
#: Run only when asked for by name (compiling takes a while): the eager peak is estimated.
SLOW = {"torch.compile'd MLP (inductor)": compiled_mlp}


# -- the comparison ------------------------------------------------------------------------------
def _state(obj):
    """Tensors and plain attributes reachable from a model, optimizer or scheduler."""
    if isinstance(obj, nn.Module):
        return {k: v.detach().clone() for k, v in obj.state_dict().items()}
    if hasattr(obj, "state_dict"):
        return repr(obj.state_dict())
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    return repr(obj)


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def compare(make) -> dict:
    """One warm-up step, then the next step estimated and run for real."""
    step, objs = make()
    step(*objs)
    before = [_state(o) for o in objs]
    t0 = time.perf_counter()
    est = jupyter_memprof.estimate(step, *objs, device="cpu")
    seconds = time.perf_counter() - t0
    changed = sum(not _same(a, _state(o)) for a, o in zip(before, objs))
    del before  # the copies would be live blocks the real capture finds in this frame
    gc.collect()
    with jupyter_memprof.profile() as real:
        step(*objs)
    pe, pr = int(est.peak().attrs["peak_bytes"]), int(real.peak().attrs["peak_bytes"])
    return {
        "estimate": pe,
        "real": pr,
        "error": (pe - pr) / pr,
        "seconds": seconds,
        "changed": changed,
        "notes": {
            **(est.meta.get("kernel_memory_not_modelled") or {}),
            **{f"eager: {n}": "" for n in est.meta.get("compiled_as_eager") or []},
        },
    }


# -- what_if(): the predicted change against the step changed by hand ----------------------------
#: (model, change, value, the same change by hand)
WHAT_IF = [
    ("ViT, SGD Nesterov", "autocast", torch.bfloat16,
     lambda m: autocast_by_hand(m, torch.bfloat16)),
    ("ViT, bf16 autocast", "checkpoint", ["vit.layers.*"],
     lambda m: checkpoint_by_hand(m, ["vit.layers.0", "vit.layers.1"])),
    ("GPT-2, gradient checkpointing", "autocast", torch.bfloat16,
     lambda m: autocast_by_hand(m, torch.bfloat16)),
]  # fmt: skip


def what_if_row(name: str, change: str, value, by_hand) -> dict:
    """One warm-up step, ``what_if()`` of the next with the change, then the step changed by
    hand, warmed up again and captured."""
    step, objs = MODELS[name]()
    step(*objs)
    cmp = jupyter_memprof.what_if(step, *objs, device="cpu", **{change: value})
    by_hand(objs[0])
    step(*objs)
    gc.collect()
    with jupyter_memprof.profile() as real:
        step(*objs)
    pe, pr = int(cmp.b.peak().attrs["peak_bytes"]), int(real.peak().attrs["peak_bytes"])
    return {"estimate": pe, "real": pr, "error": (pe - pr) / pr}


#: Llama sizes with grouped-query attention (8 key/value heads), estimated for cuda:0.
LLAMA_SIZES = {
    "1B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, vocab_size=128256),
    "7B": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
               num_attention_heads=32, vocab_size=32000),
    "13B": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                num_attention_heads=40, vocab_size=32000),
}  # fmt: skip


def llama_gqa_for_cuda(size: str, tokens: int = 2048) -> tuple[float, int]:
    """One AdamW step of a bf16 Llama of ``size`` (built on the meta device: no memory),
    batch 1 x ``tokens``, estimated for ``cuda:0``: (seconds, peak bytes)."""
    cfg = transformers.LlamaConfig(
        **LLAMA_SIZES[size], num_key_value_heads=8, attn_implementation="sdpa"
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (1, tokens))

    def step(model, opt, ids):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    t0 = time.perf_counter()
    prof = jupyter_memprof.estimate(step, model, opt, ids, device="cuda:0")
    return time.perf_counter() - t0, int(prof.peak("cuda:0").attrs["peak_bytes"])


def main(argv: list[str]) -> int:
    if transformers is None:
        print("needs transformers")
        return 1
    if argv == ["gqa"]:
        for size in LLAMA_SIZES:
            seconds, peak = llama_gqa_for_cuda(size)
            print(
                f"Llama {size:>3} (GQA, bf16) for cuda:0: {peak / 2**30:6.1f} GiB in {seconds:.1f} s"
            )
        return 0
    if argv == ["whatif"]:
        print(f"{'model':31} {'what_if':28} {'predicted':>12} {'real':>12} {'error':>8}")
        for name, change, value, by_hand in WHAT_IF:
            r = what_if_row(name, change, value, by_hand)
            what = f"{change}={value}"
            print(f"{name:31} {what:28} {r['estimate']:>12,} {r['real']:>12,} {r['error']:>+8.2%}")
        return 0
    wanted = [a.lower() for a in argv]
    print(f"{'model':34} {'estimate':>12} {'real':>12} {'error':>8} {'s':>5} changed")
    for name, make in {**MODELS, **SLOW}.items():
        if wanted and not any(w in name.lower() for w in wanted):
            continue
        if name in SLOW and not wanted:
            continue
        r = compare(make)
        print(
            f"{name:34} {r['estimate']:>12,} {r['real']:>12,} {r['error']:>+8.2%} "
            f"{r['seconds']:>5.1f} {r['changed']}"
            + (f"  not modelled: {', '.join(r['notes'])}" if r["notes"] else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
