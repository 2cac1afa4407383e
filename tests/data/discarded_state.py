"""MiniMax's lightning attention in small: the attention returns its output and the state
it would hand to the next chunk, which the layer discards (``hidden, _ = self.attn(x)``) but
holds until it returns. The ops that made the state saved tensors for a backward that never
comes: unplanned, they live until that discarded state dies, at the layer's end; with the
attention checkpointed, nothing holds them past the attention's end. The MLP after it makes
the step's peak while they would still be alive."""

import torch
from torch import nn

WIDTH, LAYERS, BATCH, SEQ = 32, 2, 16, 64


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # (B, T, C) each
        keys, values = k.repeat(1, 1, 8), v.repeat(1, 1, 8)  # saved by the state's ops alone
        state = (keys * values).sum(dim=1)  # (B, 8C): the next chunk's
        scores = torch.softmax(q @ k.transpose(1, 2) / WIDTH**0.5, dim=-1)
        return self.out(scores @ v), state


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention()
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 8 * WIDTH), nn.GELU(), nn.Linear(8 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.attn(x)
        hidden = x + hidden
        return hidden + self.mlp(hidden)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(Layer() for _ in range(LAYERS)))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x)).pow(2).mean()


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Model()


def sample_batch() -> torch.Tensor:
    return torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(0))


def training_step(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch)
