"""A torchvision-style ResNet in plain torch (no torchvision needed), as a ckpt-plan model file.

    ckpt-plan profile examples/resnet.py --budget 160MiB

The layout is torchvision's ``resnet18``/``resnet50`` (``conv1 bn1 relu maxpool``, four
stages ``layer1..layer4``, each an ``nn.Sequential`` of residual blocks, ``avgpool fc``), so
module names are the ones a torchvision user checkpoints by hand: ``layer2.1``,
``layer3.0.downsample``. ``BasicBlock`` (two 3x3 convolutions) and ``Bottleneck`` (1x1,
3x3, 1x1 with 4x expansion) are both here; ``BLOCK`` and ``LAYERS`` pick the depth: the
default, ``Bottleneck, (2, 2, 2, 2)``, is resnet26's layout (``BasicBlock, (2, 2, 2, 2)`` is
resnet18's, ``Bottleneck, (3, 4, 6, 3)`` resnet50's). Widths are half of torchvision's and
images 128x128, so one step takes a fraction of a second on a CPU. BatchNorm's running
statistics are a forward side effect (see docs/architecture.md, "Correctness rules from the
checkpoint API"). The batch is ``(images, labels)`` and ``training_step`` computes the loss.
Weights and batch come from torch's global RNG; the caller seeds it.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

IMAGE_SIZE = 128
IN_CHANNELS = 3
WIDTHS = (32, 64, 128, 256)  # torchvision: (64, 128, 256, 512)
N_CLASSES = 100
BATCH_SIZE = 16


def conv3x3(c_in, c_out, stride=1):
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


def conv1x1(c_in, c_out, stride=1):
    return nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """conv3x3-bn-relu-conv3x3-bn, plus the input (or its 1x1 ``downsample``), then relu."""

    expansion = 1

    def __init__(self, c_in, width, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(c_in, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """conv1x1-bn-relu, conv3x3(stride)-bn-relu, conv1x1-bn to 4x width, plus the input."""

    expansion = 4

    def __init__(self, c_in, width, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv1x1(c_in, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, width * self.expansion)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


BLOCK = Bottleneck
LAYERS = (2, 2, 2, 2)  # blocks per stage


class ResNet(nn.Module):
    def __init__(self, block=BLOCK, layers=LAYERS):
        super().__init__()
        self.c_in = WIDTHS[0]
        # stem: (B, 3, 128, 128) -> conv 7x7/2 -> (B, 32, 64, 64) -> maxpool/2 -> (B, 32, 32, 32)
        self.conv1 = nn.Conv2d(IN_CHANNELS, self.c_in, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.c_in)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        # stages: 32x32 -> 16x16 -> 8x8 -> 4x4, channels WIDTHS[i] * block.expansion
        self.layer1 = self._make_layer(block, WIDTHS[0], layers[0])
        self.layer2 = self._make_layer(block, WIDTHS[1], layers[1], stride=2)
        self.layer3 = self._make_layer(block, WIDTHS[2], layers[2], stride=2)
        self.layer4 = self._make_layer(block, WIDTHS[3], layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(WIDTHS[3] * block.expansion, N_CLASSES)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, block, width, blocks, stride=1):
        downsample = None
        if stride != 1 or self.c_in != width * block.expansion:
            # the shortcut must match the block's output shape (B, 4w or w, H/s, W/s)
            downsample = nn.Sequential(
                conv1x1(self.c_in, width * block.expansion, stride),
                nn.BatchNorm2d(width * block.expansion),
            )
        stage = [block(self.c_in, width, stride, downsample)]
        self.c_in = width * block.expansion
        stage += [block(self.c_in, width) for _ in range(1, blocks)]
        return nn.Sequential(*stage)

    def forward(self, images):
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))  # (B, N_CLASSES)


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
