"""MochiTransformer3DModel (asymmetric MMDiT video model). Batch: latents (B, 4, F=3, 16, 16),
text states+mask, timesteps, target."""

import torch
from diffusers import MochiTransformer3DModel

TXT = 32


def build_model() -> torch.nn.Module:
    return MochiTransformer3DModel(
        patch_size=2,
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=2,
        pooled_projection_dim=16,
        in_channels=4,
        text_embed_dim=32,
        time_embed_dim=16,
        max_sequence_length=TXT,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 3, 16, 16),
        "encoder_hidden_states": torch.randn(b, TXT, 32),
        "encoder_attention_mask": torch.ones(b, TXT, dtype=torch.long),
        "timesteps": torch.randint(0, 1000, (b,)),
        "target": torch.randn(b, 4, 3, 16, 16),
    }


def training_step(model, batch):
    pred = model(
        hidden_states=batch["noisy_latents"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        timestep=batch["timesteps"],
        encoder_attention_mask=batch["encoder_attention_mask"],
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
