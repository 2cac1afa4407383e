"""UNet2DConditionModel, SDXL-style (text_time added conditioning, linear projection, 2-layer
transformers). Batch: latents, timesteps, text states, pooled text_embeds, time_ids, noise
target."""

import torch
from diffusers import UNet2DConditionModel


def build_model() -> torch.nn.Module:
    return UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=2,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=80,  # 6 * 8 (time_ids) + 32 (text_embeds)
        cross_attention_dim=64,
        norm_num_groups=32,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 32, 32),
        "timesteps": torch.randint(0, 1000, (b,)),
        "encoder_hidden_states": torch.randn(b, 77, 64),
        "text_embeds": torch.randn(b, 32),
        "time_ids": torch.randn(b, 6),
        "target": torch.randn(b, 4, 32, 32),
    }


def training_step(model, batch):
    added_cond_kwargs = {"text_embeds": batch["text_embeds"], "time_ids": batch["time_ids"]}
    pred = model(
        batch["noisy_latents"],
        batch["timesteps"],
        batch["encoder_hidden_states"],
        added_cond_kwargs=added_cond_kwargs,
    ).sample
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
