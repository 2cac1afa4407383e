"""RecurrentGemma's RG-LRU in small: each block resets its scan's state, and the scan starts
from that state and keeps its last step on itself (``self.state = ...``). Checkpointed alone,
the scan's recomputation starts from the state its forward left: the same ops and shapes
(fake tensors cannot tell), other values. Each block and the head also hold a plain MLP,
safe to checkpoint."""

import torch
from torch import nn

WIDTH, LAYERS, BATCH, SEQ = 32, 2, 64, 16


class Scan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(WIDTH, WIDTH)
        self.state: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = self.state if self.state is not None else torch.zeros_like(x[:, 0])  # (B, C)
        a = torch.sigmoid(self.gate(x))  # (B, T, C)
        h = torch.tanh(a * x + start[:, None])  # (B, T, C)
        self.state = h[:, -1]
        return h


class Mlp(nn.Module):
    def __init__(self, out: int) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.scan = Scan()
        self.out = nn.Linear(WIDTH, WIDTH)
        self.mlp = Mlp(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.scan.state = None
        x = x + self.out(self.scan(torch.relu(self.inp(x))))
        return x + self.mlp(x)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = Mlp(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).pow(2).mean()


def build_model() -> nn.Module:
    return Model()


def sample_batch() -> torch.Tensor:
    return torch.randn(BATCH, SEQ, WIDTH)


def loss_fn(output: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return output
