"""A small transformer with fused attention (``F.scaled_dot_product_attention``), Linears
with and without biases, and dropout: every kind of op a selective policy saves or must
leave alone."""

import torch
from torch import nn
from torch.nn import functional as F

WIDTH, HEADS, TOKENS, BATCH = 32, 4, 16, 2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)  # runs as mm
        self.proj = nn.Linear(WIDTH, WIDTH)  # runs as addmm
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, HEADS, width // HEADS).unbind(2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.dropout(self.proj(out.transpose(1, 2).reshape(batch, tokens, width)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), y.flatten())


def build_model() -> nn.Module:
    return Model()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (
        torch.randn(BATCH, TOKENS, WIDTH, generator=generator),
        torch.randint(0, 10, (BATCH, TOKENS), generator=generator),
    )
