"""A tiny BatchNorm CNN model file for tests: batch is (images, labels), uses training_step."""

import torch
from torch import nn


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
        nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


def sample_batch():
    return torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))


def training_step(model, batch):
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)
