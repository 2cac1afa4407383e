"""AllegroTransformer3DModel (Allegro text-to-video DiT). Batch: latents (B, 4, F=4, 16, 16),
caption states, timesteps, target."""

import torch
from diffusers import AllegroTransformer3DModel


def build_model() -> torch.nn.Module:
    return AllegroTransformer3DModel(
        patch_size=2,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        cross_attention_dim=32,
        sample_height=16,
        sample_width=16,
        sample_frames=4,
        caption_channels=32,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 4, 16, 16),
        "encoder_hidden_states": torch.randn(b, 32, 32),
        "timesteps": torch.randint(0, 1000, (b,)),
        "target": torch.randn(b, 4, 4, 16, 16),
    }


def training_step(model, batch):
    pred = model(
        hidden_states=batch["noisy_latents"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        timestep=batch["timesteps"],
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
