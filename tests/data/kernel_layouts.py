"""Blocks whose backward copies on one side only where fake kernels lay out a gradient
otherwise than the real kernels (planner/measure/kernel_layouts.py): each gets its gradient
transposed from the op after it, and the op before it reshapes the gradient it returns in a
way no view can (merging two dimensions), which copies exactly when that gradient is not
contiguous.

* ``norm``: LayerNorm's backward returns a contiguous gradient; torch's fake kernel followed
  the incoming transposed one (Swin's last stage), so the fake step copied.
* ``gate``: softplus's backward keeps the incoming transposed layout; the fake kernel made it
  contiguous (Qwen3-Next's gates), so the real step copied and the fake step did not.
* ``batch``: BatchNorm2d's backward returns the gradient in its input's (contiguous) layout;
  the fake kernel followed the incoming channels-last one.
"""

import torch
import torch.nn.functional as F
from torch import nn

BATCH, TOKENS, WIDTH, GATES = 4, 24, 32, 48  # other widths: each block's copy has its size
CHANNELS, SIDE = 8, 6


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.mix = nn.Linear(TOKENS, TOKENS)

    def forward(self, x):
        h = self.proj(x.reshape(BATCH * TOKENS, WIDTH)).view(BATCH, TOKENS, WIDTH)
        return self.mix(self.norm(h).transpose(1, 2)).transpose(1, 2)


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, GATES)
        self.mix = nn.Linear(TOKENS, TOKENS)

    def forward(self, x):
        h = self.proj(x.reshape(BATCH * TOKENS, WIDTH)).view(BATCH, TOKENS, GATES)
        return self.mix(F.softplus(h).transpose(1, 2)).transpose(1, 2)


class Batch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(GATES, CHANNELS * SIDE * SIDE)
        self.norm = nn.BatchNorm2d(CHANNELS)
        self.mix = nn.Linear(CHANNELS, CHANNELS)

    def forward(self, x):
        h = self.proj(x.mean(1)).view(BATCH, CHANNELS, SIDE, SIDE)
        return self.mix(self.norm(h).permute(0, 2, 3, 1)).mean()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = Norm()
        self.gate = Gate()
        self.batch = Batch()

    def forward(self, x):
        x = self.gate(self.norm(x))
        return x.square().mean() + self.batch(x)


def build_model():
    return Net()


def sample_batch():
    return torch.randn(BATCH, TOKENS, WIDTH)
