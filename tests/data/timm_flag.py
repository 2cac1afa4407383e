"""A timm-style model file: the model checkpoints its blocks itself while its
``grad_checkpointing`` flag is on (``set_grad_checkpointing``, as timm's models), and
``build_model`` turns it on."""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

WIDTH, DEPTH, BATCH = 64, 4, 256


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(DEPTH)))
        self.head = nn.Linear(WIDTH, 10)
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, enable=True):
        self.grad_checkpointing = enable

    def forward(self, x, y):
        if self.grad_checkpointing and not torch.jit.is_scripting():
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False)
        else:
            x = self.blocks(x)
        return nn.functional.cross_entropy(self.head(x), y)


def build_model():
    model = Net()
    model.set_grad_checkpointing(True)
    return model


def sample_batch():
    return torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,))
