"""The README's dashboard pictures, from real runs: a training step of a small Llama (built from
a config with random weights: nothing is downloaded), profiled as a user would, and an
estimate of the same step on cuda:0 under an 8 GiB limit (the fit bar), each exported with
``to_html`` and photographed in headless Chromium (Debian's, via tests/_browser.py).

Run by hand (``make screenshots`` or ``.venv/bin/python benchmarks/screenshots.py``); writes
``docs/img/dashboard.png`` (1400 px wide), ``docs/img/dashboard-panel.png`` (a 400 px panel)
and ``docs/img/dashboard-estimate.png`` (the estimate's summary and timeline), or into
``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from _browser import chromium_page  # noqa: E402

import jupyter_memprof  # noqa: E402


def llama():
    """A two-layer Llama with random weights, an AdamW optimizer and a batch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, config.vocab_size, (4, 128))
    return model, opt, batch


def train_step(model, opt, batch):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def photograph(html: str, png: str, width: int, height: int | None = None) -> None:
    """Open ``html`` at ``width`` px, wait for the dashboard, save ``png`` (the whole page,
    or its top ``height`` px)."""
    with chromium_page(viewport=(width, height or 1000)) as page:
        page.goto("file://" + os.path.abspath(html))
        page.wait_for_function("window.memprofReady !== undefined", timeout=120_000)
        page.wait_for_timeout(300)  # the last paint
        page.screenshot(path=png, full_page=height is None)
    print(f"wrote {png}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img"), help="folder to write")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model, opt, batch = llama()
    train_step(model, opt, batch)  # a warm-up step: the optimizer's state exists
    with jupyter_memprof.profile(label="Llama training step") as prof:
        train_step(model, opt, batch)
    est = jupyter_memprof.estimate(train_step, model, opt, batch, device="cuda:0", limit="8GiB")
    with tempfile.TemporaryDirectory() as tmp:
        step_html = prof.to_html(os.path.join(tmp, "step.html"))
        est_html = est.to_html(os.path.join(tmp, "estimate.html"))
        photograph(step_html, os.path.join(args.out, "dashboard.png"), 1400)
        photograph(step_html, os.path.join(args.out, "dashboard-panel.png"), 400)
        photograph(est_html, os.path.join(args.out, "dashboard-estimate.png"), 1100, 900)


if __name__ == "__main__":
    main()
