"""Megatron-BERT's layers in small: each returns its attention probabilities beside its
output (``(output, probs)``, saved inside by the op that reads them), and the stack keeps
each layer's tuple in a loop variable, rebound when the next layer returns. With layer 0
checkpointed nothing saves its probabilities, so they die there; the memory model holds an
output the caller does not return until the caller's forward ends (it cannot see a loop
variable in the step without a plan, where autograd holds them anyway): through the head's
transient here, the step's peak."""

import torch
from torch import nn

WIDTH, BATCH, SEQ, LAYERS, SPREAD = 64, 4, 64, 2, 8


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(self.proj(x), dim=-1)
        return probs * x, probs


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Attention() for _ in range(LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            outputs = layer(x)
            x = outputs[0]
        # the head: a transient several times the activations' size, in the forward only
        with torch.no_grad():
            scale = x.repeat(1, 1, SPREAD).sin().mean()
        return (x * scale).mean()


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Model()


def sample_batch() -> torch.Tensor:
    return torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(0))
