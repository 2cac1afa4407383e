"""WanTransformer3DModel (Wan 2.1 T2V style). Batch: latents (B, C=4, F=3, 16, 16), timesteps,
text states, flow target."""

import torch
from diffusers import WanTransformer3DModel


def build_model() -> torch.nn.Module:
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=2,
        rope_max_seq_len=32,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 3, 16, 16),
        "timesteps": torch.randint(0, 1000, (b,)),
        "encoder_hidden_states": torch.randn(b, 32, 32),
        "target": torch.randn(b, 4, 3, 16, 16),
    }


def training_step(model, batch):
    pred = model(
        hidden_states=batch["noisy_latents"],
        timestep=batch["timesteps"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
