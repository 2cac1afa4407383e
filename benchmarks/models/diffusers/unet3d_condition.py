"""UNet3DConditionModel (ModelScope / Zeroscope text-to-video). Batch: latents (B, 4, F=4, 16,
16), timesteps, text states, noise target."""

import torch
from diffusers import UNet3DConditionModel


def build_model() -> torch.nn.Module:
    return UNet3DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
        up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
        block_out_channels=(32, 64),
        layers_per_block=2,
        norm_num_groups=32,
        cross_attention_dim=32,
        attention_head_dim=8,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 4, 16, 16),
        "timesteps": torch.randint(0, 1000, (b,)),
        "encoder_hidden_states": torch.randn(b, 77, 32),
        "target": torch.randn(b, 4, 4, 16, 16),
    }


def training_step(model, batch):
    pred = model(
        batch["noisy_latents"],
        batch["timesteps"],
        encoder_hidden_states=batch["encoder_hidden_states"],
    ).sample
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
