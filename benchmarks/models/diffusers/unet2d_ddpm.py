"""UNet2DModel (DDPM-style pixel-space UNet). Batch: noisy 3x32x32 images, integer timesteps,
noise target."""

import torch
from diffusers import UNet2DModel


def build_model() -> torch.nn.Module:
    return UNet2DModel(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64),
        layers_per_block=2,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=32,
        attention_head_dim=8,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy": torch.randn(b, 3, 32, 32),
        "timesteps": torch.randint(0, 1000, (b,)),
        "target": torch.randn(b, 3, 32, 32),
    }


def training_step(model, batch):
    pred = model(batch["noisy"], batch["timesteps"]).sample
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
