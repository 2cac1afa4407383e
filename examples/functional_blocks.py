"""A stack of blocks with no child modules, as a ckpt-plan model file.

    ckpt-plan profile examples/functional_blocks.py --budget 40MiB

Each block holds its weights as ``nn.Parameter``s and computes with ``torch`` functions
(``F.layer_norm``, ``F.linear``), as hand-written and research models often do. It is a
leaf of the module tree, yet checkpointing it frees its activations like any block made of
``nn.Linear`` layers: ckpt-plan judges a candidate by what checkpointing it frees, not by
whether it has children. There is no dropout. Weights and batch come from torch's global
RNG; the caller seeds it.
"""

import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 64
HIDDEN = 256
N_BLOCKS = 8
BATCH_SIZE = 256


class FunctionalBlock(nn.Module):
    """x + W_out · swish(tanh(W_in · layer_norm(x))), with raw parameters."""

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
        self.blocks = nn.ModuleList(FunctionalBlock() for _ in range(N_BLOCKS))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).pow(2).mean()


def build_model() -> nn.Module:
    return Model()


def sample_batch(batch_size=None) -> torch.Tensor:
    batch_size = batch_size or BATCH_SIZE  # read at call time: a file importing this one may set it
    return torch.randn(batch_size, WIDTH)
