"""HunyuanVideoTransformer3DModel (dual+single stream, token refiner, guidance-embedded).
Batch: latents (B, 4, F=3, 16, 16), text states+mask, pooled, timesteps, guidance, target."""

import torch
from diffusers import HunyuanVideoTransformer3DModel

TXT = 32


def build_model() -> torch.nn.Module:
    return HunyuanVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=2,
        num_single_layers=2,
        num_refiner_layers=2,
        mlp_ratio=2.0,
        patch_size=2,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=32,
        pooled_projection_dim=32,
        rope_axes_dim=(4, 6, 6),
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 3, 16, 16),
        "timesteps": torch.randint(0, 1000, (b,)),
        "encoder_hidden_states": torch.randn(b, TXT, 32),
        "encoder_attention_mask": torch.ones(b, TXT, dtype=torch.long),
        "pooled_projections": torch.randn(b, 32),
        "guidance": torch.full((b,), 6000.0),  # guidance scale * 1000, as the pipeline passes it
        "target": torch.randn(b, 4, 3, 16, 16),
    }


def training_step(model, batch):
    pred = model(
        hidden_states=batch["noisy_latents"],
        timestep=batch["timesteps"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        encoder_attention_mask=batch["encoder_attention_mask"],
        pooled_projections=batch["pooled_projections"],
        guidance=batch["guidance"],
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
