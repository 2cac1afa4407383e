"""Writes in place into views of tensors that need a gradient, as models users bring do:
an embedding sum reshaped and then added to in place (RoCBert), and an in-place dropout on
flattened features (MobileNet). The real backward of each allocates a zeroed buffer the
size of the view's base (autograd rebuilds such a view as an ``as_strided`` of it) that fake
tensors' replayed views do not: planner/measure/view_writes.py adds it."""

import torch
from torch import nn

BATCH, TOKENS, WIDTH = 4, 16, 32


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.positions = nn.Parameter(torch.randn(TOKENS, WIDTH))
        self.features = nn.Linear(WIDTH, 2 * WIDTH)
        self.dropout = nn.Dropout(0.1, inplace=True)
        self.head = nn.Linear(TOKENS * 2 * WIDTH, 8)

    def forward(self, x):
        hidden = self.embed(x.reshape(BATCH * TOKENS, WIDTH)) * 2
        hidden = hidden.view(BATCH, TOKENS, WIDTH)
        hidden += self.positions  # in place into a view
        features = self.features(hidden).flatten(1)
        return self.head(self.dropout(features)).square().mean()


def build_model():
    return Net()


def sample_batch():
    return torch.randn(BATCH, TOKENS, WIDTH)
