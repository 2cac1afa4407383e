"""A model whose unplanned step needs about 500 MB of activations for almost no compute: five
residual blocks of elementwise ops on a (65536, 128) fp32 tensor (32 MiB each). Used to show
that planning never allocates the unplanned step (a test runs it under an address-space
limit the unplanned step cannot fit in)."""

import torch
from torch import nn

ROWS, WIDTH, DEPTH = 65536, 128, 5


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(WIDTH))
        self.gain = nn.Parameter(torch.full((WIDTH,), 0.1))
        self.act = nn.Tanh()

    def forward(self, x):
        return x + self.act(x * self.scale) * self.gain  # saves x and tanh's output


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(DEPTH)))

    def forward(self, x):
        return self.blocks(x).square().mean()


def build_model():
    return Net()


def sample_batch():
    return torch.randn(ROWS, WIDTH)
