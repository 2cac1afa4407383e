"""Casts that autocast's cache hands to several calls (HRM's recurrent modules, tied
weights): ``a`` runs first without grad (its weights' bf16 casts made and cached there),
then twice with grad, saving the cached casts; ``b`` shares ``a``'s first weight. A
checkpointed call saves none of them, so a cast outlives the cache's clear only while a
call outside the plan still saves it, and each recomputation casts the weight again (the
cache is empty in the backward), a copy of its own. HRM's plan was 0.91% over its measured
peak before the memory model followed this."""

import torch
from torch import nn

WIDTH, BATCH, SEQ = 512, 2, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Block()
        self.b = Block()
        self.b.up.weight = self.a.up.weight  # tied: one parameter, one cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            warm = self.a(x)  # casts a's weights; the cache keeps them
        h = self.a(x + warm)
        h = self.b(h)
        h = self.a(h)
        return h.float().pow(2).mean()


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Model()


def sample_batch() -> torch.Tensor:
    return torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(0))


def training_step(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(batch)


def build_optimizer(parameters: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.01)  # no state: the backward makes the peak
