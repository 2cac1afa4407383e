"""LTXVideoTransformer3DModel. Batch: packed video latents (3x8x8 = 192 tokens of 8 channels),
text states with mask, timesteps, flow target."""

import torch
from diffusers import LTXVideoTransformer3DModel

F, H, W = 3, 8, 8
TXT = 32


def build_model() -> torch.nn.Module:
    return LTXVideoTransformer3DModel(
        in_channels=8,
        out_channels=8,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=16,
        cross_attention_dim=32,
        num_layers=2,
        caption_channels=32,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "packed_noisy_latents": torch.randn(b, F * H * W, 8),
        "encoder_hidden_states": torch.randn(b, TXT, 32),
        "encoder_attention_mask": torch.ones(b, TXT, dtype=torch.long),
        "timesteps": torch.randint(0, 1000, (b,)),
        "target": torch.randn(b, F * H * W, 8),
    }


def training_step(model, batch):
    pred = model(
        hidden_states=batch["packed_noisy_latents"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        timestep=batch["timesteps"],
        encoder_attention_mask=batch["encoder_attention_mask"],
        num_frames=F,
        height=H,
        width=W,
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
