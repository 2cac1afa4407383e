"""UNet2DConditionModel, SD 1.5-style (cross-attention on text states). Batch: 4x32x32 latents,
timesteps, text embeddings, noise target."""

import torch
from diffusers import UNet2DConditionModel


def build_model() -> torch.nn.Module:
    return UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=2,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=32,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 32, 32),
        "timesteps": torch.randint(0, 1000, (b,)),
        "encoder_hidden_states": torch.randn(b, 77, 32),
        "target": torch.randn(b, 4, 32, 32),
    }


def training_step(model, batch):
    pred = model(batch["noisy_latents"], batch["timesteps"], batch["encoder_hidden_states"]).sample
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
