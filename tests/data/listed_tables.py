"""A model holding tensors in a list attribute, neither parameters nor buffers, and moving
them to its input's device in its forward (diffusers' Lumina 2 keeps its rotary tables so).
On its device ``.to`` returns the tensor itself: the real step makes no storage. The fake
step copied the tables into fake tensors at each call (10 KiB, 0.07%, under Lumina 2's
measured peak) until the model's lists were faked with its other tensors.
"""

import torch
from torch import nn

BATCH, TOKENS, WIDTH = 4, 64, 32


class Tabled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tables = [torch.randn(TOKENS, WIDTH), (torch.randn(TOKENS, WIDTH),)]
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        first = self.tables[0].to(x.device)
        second = self.tables[1][0].to(x.device)
        return self.proj(x * first + second)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Tabled() for _ in range(2))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x, y):
        for block in self.blocks:
            x = x + block(x)
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), y.flatten())


def build_model():
    return Model()


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH
    return torch.randn(batch_size, TOKENS, WIDTH), torch.randint(0, 10, (batch_size, TOKENS))
