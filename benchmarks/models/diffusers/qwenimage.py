"""QwenImageTransformer2DModel (MMDiT with 3-axis MSRoPE). Batch: packed latents (16x16 = 256
tokens of 4ch x 2x2), text states+mask, timesteps, flow target."""

import torch
from diffusers import QwenImageTransformer2DModel

H = W = 16  # packed grid
TXT = 32


def build_model() -> torch.nn.Module:
    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,  # proj_out emits patch_size**2 * out_channels = 16 per token
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(4, 6, 6),
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "packed_noisy_latents": torch.randn(b, H * W, 16),
        "encoder_hidden_states": torch.randn(b, TXT, 32),
        "encoder_hidden_states_mask": torch.ones(b, TXT, dtype=torch.long),
        "timesteps": torch.rand(b),  # sigmas in [0, 1]
        "target": torch.randn(b, H * W, 16),
    }


def training_step(model, batch):
    b = batch["packed_noisy_latents"].shape[0]
    pred = model(
        hidden_states=batch["packed_noisy_latents"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        encoder_hidden_states_mask=batch["encoder_hidden_states_mask"],
        timestep=batch["timesteps"],
        img_shapes=[(1, H, W)] * b,
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
