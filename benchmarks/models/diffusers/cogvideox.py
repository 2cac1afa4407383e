"""CogVideoXTransformer3DModel (CogVideoX-2b style, sincos pos-embeds). Batch: latents (B, F=3,
C=4, 16, 16), text states, timesteps, v/noise target."""

import torch
from diffusers import CogVideoXTransformer3DModel

TXT = 16


def build_model() -> torch.nn.Module:
    return CogVideoXTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        time_embed_dim=32,
        text_embed_dim=32,
        num_layers=2,
        sample_width=16,
        sample_height=16,
        sample_frames=9,  # -> 3 latent frames with temporal_compression_ratio=4
        patch_size=2,
        temporal_compression_ratio=4,
        max_text_seq_length=TXT,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 3, 4, 16, 16),
        "encoder_hidden_states": torch.randn(b, TXT, 32),
        "timesteps": torch.randint(0, 1000, (b,)),
        "target": torch.randn(b, 3, 4, 16, 16),
    }


def training_step(model, batch):
    pred = model(
        hidden_states=batch["noisy_latents"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        timestep=batch["timesteps"],
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
