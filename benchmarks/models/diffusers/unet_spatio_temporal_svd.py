"""UNetSpatioTemporalConditionModel (Stable Video Diffusion). Batch: (B, F=4, 8, 16, 16) noisy
latents concat image latents, timesteps, image embedding, added_time_ids, target."""

import torch
from diffusers import UNetSpatioTemporalConditionModel


def build_model() -> torch.nn.Module:
    return UNetSpatioTemporalConditionModel(
        sample_size=16,
        in_channels=8,
        out_channels=4,
        down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
        up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
        block_out_channels=(32, 64),
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=24,  # 3 added time ids * 8
        layers_per_block=2,
        cross_attention_dim=32,
        num_attention_heads=(2, 4),
        num_frames=4,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "latent_model_input": torch.randn(b, 4, 8, 16, 16),
        "timesteps": torch.randn(b) * 0.25,  # EDM c_noise = log(sigma) / 4
        "encoder_hidden_states": torch.randn(b, 1, 32),  # CLIP image embedding
        "added_time_ids": torch.randint(0, 128, (b, 3)).float(),  # fps, motion_bucket_id, noise_aug
        "target": torch.randn(b, 4, 4, 16, 16),
    }


def training_step(model, batch):
    pred = model(
        batch["latent_model_input"],
        batch["timesteps"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        added_time_ids=batch["added_time_ids"],
    ).sample
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
