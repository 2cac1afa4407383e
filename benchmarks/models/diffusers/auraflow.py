"""AuraFlowTransformer2DModel (MMDiT + single DiT blocks). Batch: 4x32x32 latents, timesteps,
text states, target."""

import torch
from diffusers import AuraFlowTransformer2DModel


def build_model() -> torch.nn.Module:
    return AuraFlowTransformer2DModel(
        sample_size=32,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_mmdit_layers=2,
        num_single_dit_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        caption_projection_dim=32,
        pos_embed_max_size=256,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 32, 32),
        "timesteps": torch.rand(b),
        "encoder_hidden_states": torch.randn(b, 64, 32),
        "target": torch.randn(b, 4, 32, 32),
    }


def training_step(model, batch):
    pred = model(
        batch["noisy_latents"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        timestep=batch["timesteps"],
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
