"""A residual MLP classifier on random features, as a ckpt-plan model file.

    ckpt-plan profile examples/mlp.py --budget 48MiB

The batch is a tuple ``(x, y)``; the model is called as ``model(*batch)``, so forward
accepts ``y`` and ignores it, and ``loss_fn(output, batch)`` turns the logits into the
loss. A wide hidden layer (4 * WIDTH) and a large batch make the per-block activations
several times the weights, so checkpointing entries of `blocks` pays off. There is no
dropout: no block needs its RNG state preserved. Weights and batch come from torch's
global RNG; the caller seeds it.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

IN_FEATURES = 64
WIDTH = 128
N_BLOCKS = 8
N_CLASSES = 10
BATCH_SIZE = 2048


class ResidualBlock(nn.Module):
    """Pre-norm residual MLP block: x + Linear(GELU(Linear(LayerNorm(x))))."""

    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x):
        # (B, d) -> (B, 4d) -> (B, d): the (B, 4d) tensors are most of what is saved
        return x + self.proj(self.gelu(self.fc(self.ln(x))))


class ResidualMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_proj = nn.Linear(IN_FEATURES, WIDTH)  # (B, IN_FEATURES) -> (B, WIDTH)
        self.blocks = nn.Sequential(*(ResidualBlock(WIDTH) for _ in range(N_BLOCKS)))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, N_CLASSES)  # (B, WIDTH) -> (B, N_CLASSES)

    def forward(self, x, y=None):
        # y is accepted only so that model(*batch) works; the loss is in loss_fn
        x = self.input_proj(x)
        x = self.blocks(x)
        return self.head(self.ln_f(x))


def build_model() -> nn.Module:
    return ResidualMLP()


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH_SIZE  # read at call time: a file importing this one may set it
    x = torch.randn(batch_size, IN_FEATURES)
    y = torch.randint(0, N_CLASSES, (batch_size,))
    return (x, y)


def loss_fn(output, batch):
    _, y = batch
    return F.cross_entropy(output, y)
