"""FluxTransformer2DModel (Flux-dev style, guidance-embedded). Batch: packed latents (256
tokens of 4ch x 2x2), text states, pooled projections, timesteps, guidance, target."""

import torch
from diffusers import FluxTransformer2DModel

H = W = 16  # packed latent grid (a 4x32x32 latent packed 2x2 -> 16x16 tokens of 16 channels)
TXT = 64


def build_model() -> torch.nn.Module:
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "packed_noisy_latents": torch.randn(b, H * W, 16),
        "encoder_hidden_states": torch.randn(b, TXT, 32),
        "pooled_projections": torch.randn(b, 32),
        "timesteps": torch.rand(b),  # Flux takes sigmas in [0, 1]
        "guidance": torch.full((b,), 3.5),
        "target": torch.randn(b, H * W, 16),
    }


def _latent_image_ids(h, w):
    ids = torch.zeros(h, w, 3)
    ids[..., 1] = ids[..., 1] + torch.arange(h)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(w)[None, :]
    return ids.reshape(h * w, 3)


def training_step(model, batch):
    img_ids = _latent_image_ids(H, W)  # deterministic position ids, (seq, 3)
    txt_ids = torch.zeros(batch["encoder_hidden_states"].shape[1], 3)
    pred = model(
        hidden_states=batch["packed_noisy_latents"],
        timestep=batch["timesteps"],
        guidance=batch["guidance"],
        pooled_projections=batch["pooled_projections"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        txt_ids=txt_ids,
        img_ids=img_ids,
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
