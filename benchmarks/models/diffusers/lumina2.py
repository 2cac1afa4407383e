"""Lumina2Transformer2DModel (Lumina-Image 2.0). Batch: 4x32x32 latents, timesteps, caption
features with attention mask, target."""

import torch
from diffusers import Lumina2Transformer2DModel


def build_model() -> torch.nn.Module:
    return Lumina2Transformer2DModel(
        sample_size=32,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        hidden_size=32,
        num_layers=4,  # more than the refiners, as in Lumina-Image 2.0 (26 and 2)
        num_refiner_layers=2,
        num_attention_heads=2,
        num_kv_heads=1,
        multiple_of=16,
        axes_dim_rope=(4, 6, 6),
        axes_lens=(128, 64, 64),
        cap_feat_dim=32,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 32, 32),
        "timesteps": torch.rand(b),
        "encoder_hidden_states": torch.randn(b, 64, 32),
        "encoder_attention_mask": torch.ones(b, 64, dtype=torch.bool),
        "target": torch.randn(b, 4, 32, 32),
    }


def training_step(model, batch):
    pred = model(
        batch["noisy_latents"],
        batch["timesteps"],
        batch["encoder_hidden_states"],
        batch["encoder_attention_mask"],
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
