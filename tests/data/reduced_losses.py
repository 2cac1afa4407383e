"""A small denoiser trained as diffusion models are: the loss is ``F.mse_loss`` of its noise
prediction, plus the three other losses whose kernels reduce into the storage they wrote
each element's loss into (planner/measure/kernel_layouts.py). Each scalar loss holds a
storage of its input's size from the forward's end to the end of the backward, at the
step's peak; torch's fake kernels made each a 4-byte scalar (16 KiB under a small UNet).
"""

import torch
import torch.nn.functional as F
from torch import nn

BATCH, CHANNELS, SIDE = 4, 8, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)
        self.norm = nn.GroupNorm(4, CHANNELS)

    def forward(self, x):
        return x + self.conv(F.silu(self.norm(x)))


class Denoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block(), Block())
        self.out = nn.Conv2d(CHANNELS, CHANNELS, 1)

    def forward(self, x):
        return self.out(self.blocks(x))


def build_model():
    return Denoiser()


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH
    shape = (batch_size, CHANNELS, SIDE, SIDE)
    return {"noisy": torch.randn(shape), "noise": torch.randn(shape), "mask": torch.rand(shape)}


def training_step(model, batch):
    prediction = model(batch["noisy"])
    loss = F.mse_loss(prediction, batch["noise"])
    loss = loss + F.smooth_l1_loss(prediction, batch["noise"], reduction="sum") * 1e-3
    loss = loss + F.binary_cross_entropy(torch.sigmoid(prediction), batch["mask"])
    return loss + F.soft_margin_loss(prediction, batch["noise"].sign())
