"""A step that does not reproduce itself: the loss adds a term that grows with every step
run in the process (as kernels with atomic adds give other bits on every run), and a buffer
counts those steps (as a model drawing its own seeds keeps them). Two unplanned steps from
the same seed differ, so they are no bit-exact reference."""

import torch
from torch import nn

_steps = 0


def build_model() -> nn.Module:
    model = nn.Sequential(
        nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 32)),
        nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 32)),
    )
    model.register_buffer("steps", torch.zeros(()))
    return model


def sample_batch():
    return torch.randn(512, 32)


def training_step(model: nn.Module, batch) -> torch.Tensor:
    global _steps
    _steps += 1
    model.steps.fill_(_steps)
    return model(batch).pow(2).mean() * (1 + _steps * 1e-3)
