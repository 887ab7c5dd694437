"""Training loops written as users write them with the frameworks people train with: a
closure optimizer (LBFGS, SGD with a closure), DataLoader workers, GradScaler, an EMA copy
(``AveragedModel``), HuggingFace's Trainer and Lightning. Used by tests/test_frameworks.py
and benchmarks/bench_frameworks.py.

Each loop returns a :class:`Loop`: the variables a notebook would hold (``ns``), a function
running the whole loop (``run``), and the live objects whose bytes the profile must match
(``model``, ``optimizer``). Everything is built in memory from small configs with random
weights (no downloads) and runs on the CPU in about a second.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Loop:
    ns: dict
    run: Callable[[], object]
    model: nn.Module
    optimizer: torch.optim.Optimizer | None = None
    #: optimizer steps the loop takes
    steps: int = 3
    extra: dict = field(default_factory=dict)
    #: more modules whose parameters and buffers the loop keeps (an EMA copy)
    more_modules: tuple = ()


def _bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def live_bytes(loop: Loop) -> dict[str, int]:
    """Bytes of the live objects at the end: each parameter's storage (and those of
    ``more_modules``, with their buffers), each ``.grad`` and each tensor of the optimizer's
    state (LBFGS's lists of tensors included)."""
    params = list(loop.model.parameters())
    state = 0
    if loop.optimizer is not None:
        for st in loop.optimizer.state.values():
            for v in st.values():
                for t in v if isinstance(v, (list, tuple)) else [v]:
                    if isinstance(t, torch.Tensor):
                        state += _bytes(t)
    kept = [t for m in loop.more_modules for t in (*m.parameters(), *m.buffers())]
    return {
        "parameter": sum(_bytes(p) for p in params) + sum(_bytes(t) for t in kept),
        "gradient": sum(_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer_state": state,
    }


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8))


# -- closure optimizers -----------------------------------------------------------------------
def _closure_loop(make_opt, steps: int) -> Loop:
    """An MLP trained with ``opt.step(closure)``, the optimizer made by ``make_opt(params)``."""
    model = mlp()
    opt = make_opt(model.parameters())
    x, y = torch.randn(32, 64), torch.randn(32, 8)

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    def run():
        for _ in range(steps):
            opt.step(closure)

    return Loop({"model": model, "opt": opt, "x": x, "y": y}, run, model, opt, steps)


def closure_sgd(steps: int = 3) -> Loop:
    """``opt.step(closure)``: the forward, loss and backward run inside the optimizer."""
    return _closure_loop(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), steps)


def lbfgs(steps: int = 3) -> Loop:
    """LBFGS, whose ``step(closure)`` calls the closure several times per step."""
    return _closure_loop(lambda p: torch.optim.LBFGS(p, lr=0.5, max_iter=4, history_size=3), steps)


# -- data loading -----------------------------------------------------------------------------
def dataloader(num_workers: int = 2, steps: int = 8) -> Loop:
    """A plain loop over a DataLoader; with workers, batches arrive from other processes
    through shared memory."""
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.manual_seed(1)
    data = TensorDataset(torch.randn(steps * 16, 64), torch.randn(steps * 16, 8))
    loader = DataLoader(data, batch_size=16, num_workers=num_workers)

    def run():
        for x, y in loader:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()

    return Loop({"model": model, "opt": opt, "loader": loader}, run, model, opt, steps)


# -- mixed precision, EMA ---------------------------------------------------------------------
def grad_scaler(steps: int = 3) -> Loop:
    """``torch.amp.GradScaler`` on the CPU with bf16 autocast: scale, backward, step, update."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(32, 64), torch.randn(32, 8)

    def run():
        for _ in range(steps):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    ns = {"model": model, "opt": opt, "scaler": scaler, "x": x, "y": y}
    return Loop(ns, run, model, opt, steps)


def ema(steps: int = 3) -> Loop:
    """An exponential moving average of the weights (``AveragedModel``) updated after each
    step, as in ``torch.optim.swa_utils``'s documentation."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ema_model = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.99))
    x, y = torch.randn(32, 64), torch.randn(32, 8)

    def run():
        for _ in range(steps):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            ema_model.update_parameters(model)

    ns = {"model": model, "opt": opt, "ema_model": ema_model, "x": x, "y": y}
    return Loop(ns, run, model, opt, steps, {"ema_model": ema_model}, (ema_model,))


# -- HuggingFace Trainer ----------------------------------------------------------------------
class _Tokens(torch.utils.data.Dataset):
    """Random token sequences, labels the inputs (causal language modelling)."""

    def __init__(self, n: int, length: int = 16, vocab: int = 128) -> None:
        g = torch.Generator().manual_seed(2)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def hf_trainer(steps: int = 3, **args) -> Loop:
    """``transformers.Trainer`` on a tiny GPT-2 (2 layers, width 32, random weights) for
    ``steps`` optimizer steps; ``args``: more ``TrainingArguments`` (``bf16=True``,
    ``gradient_accumulation_steps=2``, ``activation_checkpointing=True``)."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    model = GPT2LMHeadModel(config)
    out = tempfile.mkdtemp(prefix="memprof-trainer-")
    accumulate = args.get("gradient_accumulation_steps", 1)
    training = TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **args,
    )
    data = _Tokens(4 * steps * accumulate)
    trainer = Trainer(model=model, args=training, train_dataset=data)

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()

    ns = {"model": model, "trainer": trainer}
    loop = Loop(ns, run, model, None, steps)
    loop.extra["trainer"] = trainer
    return loop


def trainer_optimizer(loop: Loop) -> torch.optim.Optimizer:
    """The torch optimizer a Trainer made (inside accelerate's wrapper), once it ran."""
    opt = loop.extra["trainer"].optimizer
    return getattr(opt, "optimizer", opt)


# -- Lightning --------------------------------------------------------------------------------
def lightning(steps: int = 3) -> Loop:
    """A ``LightningModule`` trained by ``lightning.Trainer`` with automatic optimisation
    (every step's forward and backward run in a closure ``optimizer.step`` calls), the loss
    logged with ``self.log``."""
    import logging

    import lightning as pl

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.mse_loss(self.model(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    module = Regressor()
    torch.manual_seed(1)
    data = TensorDataset(torch.randn(steps * 16, 64), torch.randn(steps * 16, 8))
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="memprof-lightning-"),
    )
    loader = DataLoader(data, batch_size=16)

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, loader)

    loop = Loop({"lm": module, "trainer": trainer}, run, module, None, steps)
    loop.extra["trainer"] = trainer
    return loop


def lightning_optimizer(loop: Loop) -> torch.optim.Optimizer:
    """The torch optimizer a Lightning Trainer made, once it ran."""
    opt = loop.extra["trainer"].optimizers[0]
    return getattr(opt, "_optimizer", opt)
