"""Blocks with no child modules: each holds its weights as ``nn.Parameter``s and computes
with ``torch`` functions (as hand-written and research models often do). Checkpointing a
block frees its activations like any other block's, though it is a leaf of the module tree.
"""

import torch
import torch.nn.functional as F
from torch import nn

WIDTH, HIDDEN, BLOCKS, BATCH = 64, 256, 8, 256


class FunctionalBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm_weight = nn.Parameter(torch.ones(WIDTH))
        self.w_in = nn.Parameter(torch.randn(HIDDEN, WIDTH) * WIDTH**-0.5)
        self.w_out = nn.Parameter(torch.randn(WIDTH, HIDDEN) * HIDDEN**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(x, (WIDTH,), self.norm_weight)
        h = torch.tanh(F.linear(h, self.w_in))
        return x + F.linear(h * torch.sigmoid(h), self.w_out)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(FunctionalBlock() for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).pow(2).mean()


def build_model() -> nn.Module:
    return Model()


def sample_batch():
    return torch.randn(BATCH, WIDTH)
