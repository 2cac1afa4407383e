"""A forward that draws its path: in training, the body skips each layer with probability
0.5, drawn from torch's RNG in its forward (as LayerDrop does, under a name ckpt-plan does
not switch off), so what a forward of the body runs depends on the RNG state it starts from
(a recomputation replays it)."""

import torch
from torch import nn

WIDTH, LAYERS, BATCH, SEQ = 32, 6, 8, 16


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # (B, T, C) each
        weights = torch.softmax(q @ k.transpose(1, 2) / WIDTH**0.5, dim=-1)  # (B, T, T)
        return x + self.out(weights @ v)


class Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Attention() for _ in range(LAYERS))
        self.skip_probability = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.training and torch.rand([]) < self.skip_probability:
                continue
            x = layer(x)
        return x


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = Body()
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).pow(2).mean()


def build_model() -> nn.Module:
    return Model()


def sample_batch() -> torch.Tensor:
    return torch.randn(BATCH, SEQ, WIDTH)


def loss_fn(output: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return output
