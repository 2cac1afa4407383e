"""A model file whose forward checkpoints its blocks itself, unconditionally (a
``torch.utils.checkpoint.checkpoint`` call in its code, no flag to switch it off)."""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

WIDTH, DEPTH, BATCH = 64, 4, 256


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x, y):
        for index, block in enumerate(self.blocks):
            # the first two blocks are always checkpointed by the model's own code
            x = checkpoint(block, x, use_reentrant=False) if index < 2 else block(x)
        return nn.functional.cross_entropy(self.head(x), y)


def build_model():
    return Net()


def sample_batch():
    return torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,))
