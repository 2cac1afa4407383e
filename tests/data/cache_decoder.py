"""An encoder-decoder whose cross-attention caches keys/values, as Hugging Face's does.

The decoder makes a cache per forward; the first call of each cross-attention layer computes
keys and values from the encoder output and stores them, later calls read them back. A layer
recomputed by activation checkpointing finds its cache entry filled and takes the other
branch: it saves fewer tensors for backward, and torch.utils.checkpoint raises
CheckpointError. Checkpointing the whole decoder is safe: its recomputation makes a fresh
cache. Batch: (source (B, S, 16), target (B, T, 16), labels (B, T)).
"""

import math

import torch
from torch import nn

WIDTH = 16


class CachedCrossAttention(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.q = nn.Linear(WIDTH, WIDTH)
        self.k = nn.Linear(WIDTH, WIDTH)
        self.v = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, memory, cache):
        if self.index in cache:  # filled by an earlier call: reuse, as a generation step would
            k, v = cache[self.index]
        else:
            k, v = self.k(memory), self.v(memory)  # (B, S, C)
            cache[self.index] = (k, v)
        scores = self.q(x) @ k.transpose(-2, -1) / math.sqrt(WIDTH)  # (B, T, S)
        return x + torch.softmax(scores, dim=-1) @ v


class DecoderLayer(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.cross = CachedCrossAttention(index)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x, memory, cache):
        x = self.cross(x, memory, cache)
        return x + self.mlp(x)


class Decoder(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(i) for i in range(depth))

    def forward(self, x, memory):
        cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for layer in self.layers:
            x = layer(x, memory, cache)
        return x


class EncoderDecoder(nn.Module):
    def __init__(self, depth: int = 2) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )
        self.decoder = Decoder(depth)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, source, target, labels):
        logits = self.head(self.decoder(target, self.encoder(source)))  # (B, T, 10)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def build_model() -> nn.Module:
    return EncoderDecoder()


def sample_batch():
    return (torch.randn(4, 24, WIDTH), torch.randn(4, 12, WIDTH), torch.randint(0, 10, (4, 12)))
