"""Laguna's query norm in small: an RMSNorm (float32 weight, float32 arithmetic) given the
bf16 output of a projection under autocast. It copies its input to float32 and saves the
copy; the backward of its ``pow`` reads the copy and makes three float32 tensors of its size
before autograd lets go of it. With the norm checkpointed, the checkpoint holds the bf16
input until then too (each saved tensor's hooks hold it): not only until that last read."""

import torch
from torch import nn

WIDTH, INNER, LAYERS, BATCH, SEQ = 16, 1024, 2, 8, 64


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(INNER))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + 1e-6)).to(dtype)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, INNER)
        self.norm = Norm()
        self.down = nn.Linear(INNER, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.norm(self.up(x)))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(Layer() for _ in range(LAYERS)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).float().pow(2).mean()


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Model()


def sample_batch() -> torch.Tensor:
    return torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(0))


def training_step(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(batch)
