"""ChromaTransformer2DModel (Flux-derived, distilled-guidance approximator, no pooled input).
Batch: packed latents (256 tokens), text states, timesteps, target."""

import torch
from diffusers import ChromaTransformer2DModel

H = W = 16
TXT = 64


def build_model() -> torch.nn.Module:
    return ChromaTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(4, 6, 6),
        approximator_num_channels=16,
        approximator_hidden_dim=32,
        approximator_layers=2,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "packed_noisy_latents": torch.randn(b, H * W, 16),
        "encoder_hidden_states": torch.randn(b, TXT, 32),
        "timesteps": torch.rand(b),
        "target": torch.randn(b, H * W, 16),
    }


def _latent_image_ids(h, w):
    ids = torch.zeros(h, w, 3)
    ids[..., 1] = ids[..., 1] + torch.arange(h)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(w)[None, :]
    return ids.reshape(h * w, 3)


def training_step(model, batch):
    pred = model(
        hidden_states=batch["packed_noisy_latents"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        timestep=batch["timesteps"],
        img_ids=_latent_image_ids(H, W),  # deterministic position ids, (seq, 3)
        txt_ids=torch.zeros(batch["encoder_hidden_states"].shape[1], 3),
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
