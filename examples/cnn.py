"""A small ResNet-style CNN for 32x32 images (CIFAR-sized), as a ckpt-plan model file.

    ckpt-plan profile examples/cnn.py --budget 64MiB

The batch is a tuple ``(images, labels)`` and ``training_step(model, batch)`` computes
the loss, so the model itself takes only images. Convolution activations at full
resolution dwarf the few hundred thousand weights. The blocks use BatchNorm2d: in
training mode its running statistics are a forward side effect, updated twice if a
block is recomputed (see docs/architecture.md, "Correctness rules from the checkpoint
API"). Weights and batch come from torch's global RNG; the caller seeds it.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

IMAGE_SIZE = 32
IN_CHANNELS = 3
CHANNELS = (32, 64, 128)  # one stage per entry; each stage after the first halves H, W
BLOCKS_PER_STAGE = 2
N_CLASSES = 10
BATCH_SIZE = 32


class BasicBlock(nn.Module):
    """conv-bn-relu-conv-bn plus a shortcut, then relu (ResNet v1 basic block)."""

    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            # 1x1 conv so the shortcut matches the new shape (B, c_out, H/stride, W/stride)
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        # stem: (B, 3, 32, 32) -> (B, CHANNELS[0], 32, 32)
        self.stem = nn.Sequential(
            nn.Conv2d(IN_CHANNELS, CHANNELS[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(CHANNELS[0]),
            nn.ReLU(),
        )
        stages, c_in = [], CHANNELS[0]
        for i, c_out in enumerate(CHANNELS):
            stride = 1 if i == 0 else 2  # 32x32 -> 16x16 -> 8x8
            blocks = [BasicBlock(c_in, c_out, stride)]
            blocks += [BasicBlock(c_out, c_out, 1) for _ in range(BLOCKS_PER_STAGE - 1)]
            stages.append(nn.Sequential(*blocks))
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)  # (B, C, 8, 8) -> (B, C, 1, 1)
        self.fc = nn.Linear(CHANNELS[-1], N_CLASSES)

    def forward(self, images):
        x = self.stages(self.stem(images))
        return self.fc(torch.flatten(self.pool(x), 1))  # (B, N_CLASSES)


def build_model() -> nn.Module:
    return ResNet()


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH_SIZE  # read at call time: a file importing this one may set it
    images = torch.randn(batch_size, IN_CHANNELS, IMAGE_SIZE, IMAGE_SIZE)
    labels = torch.randint(0, N_CLASSES, (batch_size,))
    return (images, labels)


def training_step(model, batch):
    images, labels = batch
    return F.cross_entropy(model(images), labels)
