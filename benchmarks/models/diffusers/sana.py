"""SanaTransformer2DModel (linear-attention DiT). Batch: 8x16x16 latents (patch 1 -> 256
tokens), timesteps, caption states with mask, target."""

import torch
from diffusers import SanaTransformer2DModel


def build_model() -> torch.nn.Module:
    return SanaTransformer2DModel(
        in_channels=8,
        out_channels=8,
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=2,
        num_cross_attention_heads=2,
        cross_attention_head_dim=16,
        cross_attention_dim=32,
        caption_channels=32,
        sample_size=16,
        patch_size=1,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 8, 16, 16),
        "timesteps": torch.randint(0, 1000, (b,)),
        "encoder_hidden_states": torch.randn(b, 64, 32),
        "encoder_attention_mask": torch.ones(b, 64, dtype=torch.long),
        "target": torch.randn(b, 8, 16, 16),
    }


def training_step(model, batch):
    pred = model(
        batch["noisy_latents"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        encoder_attention_mask=batch["encoder_attention_mask"],
        timestep=batch["timesteps"],
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
