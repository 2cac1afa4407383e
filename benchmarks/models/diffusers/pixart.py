"""PixArtTransformer2DModel (PixArt-alpha/sigma style). Batch: 4x32x32 latents, timesteps,
caption embeddings with mask, noise target."""

import torch
from diffusers import PixArtTransformer2DModel


def build_model() -> torch.nn.Module:
    return PixArtTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        cross_attention_dim=32,
        caption_channels=32,
        sample_size=32,
        patch_size=2,
        use_additional_conditions=False,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 32, 32),
        "timesteps": torch.randint(0, 1000, (b,)),
        "encoder_hidden_states": torch.randn(b, 64, 32),
        "encoder_attention_mask": torch.ones(b, 64, dtype=torch.long),
        "target": torch.randn(b, 4, 32, 32),
    }


def training_step(model, batch):
    pred = model(
        batch["noisy_latents"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        encoder_attention_mask=batch["encoder_attention_mask"],
        timestep=batch["timesteps"],
        added_cond_kwargs={"resolution": None, "aspect_ratio": None},
    ).sample
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
