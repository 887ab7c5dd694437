"""Small, deterministic training steps used by the category benchmark and the tests.

Each scenario returns ``(namespace, step)``: the variables a notebook would hold (model,
optimizer, batch) and a function running one training step. Everything is built in memory
(no downloads) and runs on the CPU in well under a second.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def classification_step(model, opt, x, y):
    """One optimizer step of a classifier: zero the gradients, cross-entropy, backward, step."""

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def mlp_adam():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    return {"model": model, "opt": opt, "x": x, "y": y}, classification_step(model, opt, x, y)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        x = F.max_pool2d(self.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(self.relu(self.bn2(self.conv2(x))), 2)
        return self.head(self.drop(x.flatten(1)))


def cnn_sgd():
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))

    return {"model": model, "opt": opt, "x": x, "y": y}, classification_step(model, opt, x, y)


def transformer_adamw():
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(
        d_model=64, nhead=4, dim_feedforward=128, dropout=0.1, batch_first=True
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32, 64)

    def step():
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    return {"model": model, "opt": opt, "x": x}, step


class CheckpointedMLP(nn.Module):
    def __init__(self, width=256, blocks=4):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(blocks)
        )
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def checkpointing_sgd():
    torch.manual_seed(0)
    model = CheckpointedMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    return {"model": model, "opt": opt, "x": x, "y": y}, classification_step(model, opt, x, y)


def bare_parameters_rmsprop():
    torch.manual_seed(0)
    w1 = nn.Parameter(torch.randn(128, 256) * 0.05)
    b1 = nn.Parameter(torch.zeros(256))
    w2 = nn.Parameter(torch.randn(256, 10) * 0.05)
    opt = torch.optim.RMSprop([w1, b1, w2], lr=1e-3)
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))

    def step():
        opt.zero_grad()
        h = torch.tanh(x @ w1 + b1)
        F.cross_entropy(h @ w2, y).backward()
        opt.step()

    return {"w1": w1, "b1": b1, "w2": w2, "opt": opt, "x": x, "y": y}, step


class InplaceViews(nn.Module):
    """Writes through views: a slice of the hidden state is activated in place."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(128, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        h = self.fc1(x)
        h[:, 128:].mul_(0.5)  # in-place through a view of h
        h.relu_()  # in place on the whole block
        return self.fc2(h)


def inplace_views_sgd():
    torch.manual_seed(0)
    model = InplaceViews()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))

    return {"model": model, "opt": opt, "x": x, "y": y}, classification_step(model, opt, x, y)


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5000, 64)
        self.fc = nn.Linear(64, 2)

    def forward(self, tokens):
        return self.fc(self.emb(tokens).mean(1))


def embedding_adagrad():
    torch.manual_seed(0)
    model = Bag()
    opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
    tokens, y = torch.randint(0, 5000, (32, 20)), torch.randint(0, 2, (32,))

    return {"model": model, "opt": opt, "tokens": tokens, "y": y}, classification_step(
        model, opt, tokens, y
    )


SCENARIOS = {
    "MLP + Adam": mlp_adam,
    "CNN (conv, BN, in-place ReLU, dropout) + SGD momentum": cnn_sgd,
    "TransformerEncoderLayer + AdamW": transformer_adamw,
    "activation checkpointing + SGD": checkpointing_sgd,
    "bare nn.Parameters + RMSprop": bare_parameters_rmsprop,
    "in-place writes through views + SGD": inplace_views_sgd,
    "Embedding + Adagrad": embedding_adagrad,
}
