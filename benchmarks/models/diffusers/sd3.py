"""SD3Transformer2DModel (SD3/3.5 MMDiT, qk rms-norm). Batch: 4x32x32 latents, flow-matching
timesteps, text states, pooled projections, target."""

import torch
from diffusers import SD3Transformer2DModel


def build_model() -> torch.nn.Module:
    return SD3Transformer2DModel(
        sample_size=32,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        caption_projection_dim=32,
        pooled_projection_dim=32,
        pos_embed_max_size=32,
        qk_norm="rms_norm",
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 32, 32),
        "timesteps": torch.randint(0, 1000, (b,)).float(),
        "encoder_hidden_states": torch.randn(b, 64, 32),
        "pooled_projections": torch.randn(b, 32),
        "target": torch.randn(b, 4, 32, 32),
    }


def training_step(model, batch):
    pred = model(
        hidden_states=batch["noisy_latents"],
        timestep=batch["timesteps"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        pooled_projections=batch["pooled_projections"],
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
