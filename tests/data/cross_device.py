"""A stack of blocks, one of which also makes a tensor on another device in its forward.

On a machine with only a CPU, the "meta" device (shapes, no data) stands in for a second
device: the middle block builds its scale on "meta" to learn a shape, as shape-inference
code does. Checkpointing restores the RNG of only one device type besides the CPU, so the
planner must never wrap a module whose forward reaches another device; the profiler
excludes it with the reason. Batch: (x (B, 32), labels (B,)).
"""

import torch
from torch import nn

WIDTH = 32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x):
        return x + self.mlp(x)


class MetaShapeBlock(Block):
    def forward(self, x):
        width = torch.empty(x.shape, device="meta").sum(0).shape[0]  # shape only: no data
        return x + self.mlp(x) / width


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), MetaShapeBlock(), Block()])
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x, labels):
        for block in self.blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.head(x), labels)


def build_model() -> nn.Module:
    return Stack()


def sample_batch():
    return torch.randn(256, WIDTH), torch.randint(0, 10, (256,))
