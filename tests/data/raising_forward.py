"""A model file whose forward raises (a bug in the user's model): profile and verify exit 4."""

import torch
from torch import nn


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x7 and 8x8)")


def build_model() -> nn.Module:
    return Broken()


def sample_batch():
    return torch.randn(4, 8)
