"""Reformer's reversible layers in small: the model's own backward draws random numbers (a
custom autograd function that, like Reformer's, reseeds and redraws as it recomputes), so
backward moves the RNG state with or without a plan. The blocks draw nothing."""

import torch
from torch import nn

WIDTH, BATCH = 32, 64


class _ReseedingIdentity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
        torch.rand(1)  # moves the RNG: the model's own doing
        return grad


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = _ReseedingIdentity.apply(block(x))  # after the block: x requires grad
        return x.pow(2).mean()


def build_model() -> nn.Module:
    return Model()


def sample_batch() -> torch.Tensor:
    return torch.randn(BATCH, WIDTH)


def loss_fn(output: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return output
