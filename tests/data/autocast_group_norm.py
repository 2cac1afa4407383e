"""Convolutional blocks with GroupNorm trained under CPU bf16 autocast, float32 weights (a
diffusers U-Net's and VAE's resnets, as accelerate's mixed precision trains them). The CPU
kernel makes a bf16 input's statistics float32 (its weight is float32) and its input
gradient bf16; torch's fake kernels made them bf16 and float32, and autograd then cast the
gradient back: a copy the real step never makes (planner/measure/kernel_layouts.py).
"""

import torch
import torch.nn.functional as F
from torch import nn

BATCH, CHANNELS, SIDE = 4, 16, 16


class Block(nn.Module):
    """A resnet block as diffusers' (conv, norm, conv): the norm takes a convolution's bf16
    output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)
        self.norm = nn.GroupNorm(4, CHANNELS)
        self.conv2 = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)

    def forward(self, x):
        return x + self.conv2(F.silu(self.norm(self.conv1(x))))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.out = nn.Conv2d(CHANNELS, CHANNELS, 1)

    def forward(self, x):
        return self.out(self.blocks(x))


def build_model():
    return Model()


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH
    shape = (batch_size, CHANNELS, SIDE, SIDE)
    return {"noisy": torch.randn(shape), "noise": torch.randn(shape)}


def training_step(model, batch):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prediction = model(batch["noisy"])
    return F.mse_loss(prediction.float(), batch["noise"])
