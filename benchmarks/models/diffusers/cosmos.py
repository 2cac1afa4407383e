"""CosmosTransformer3DModel (Cosmos-Predict1 style video DiT, condition-mask channel, no
padding mask since it needs torchvision). Batch: latents (B, 4, F=3, 16, 16), condition
mask, timesteps, text states+mask, target."""

import torch
from diffusers import CosmosTransformer3DModel

TXT = 32


def build_model() -> torch.nn.Module:
    return CosmosTransformer3DModel(
        in_channels=5,  # 4 latent channels + 1 condition-mask channel
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=2,
        mlp_ratio=2.0,
        text_embed_dim=32,
        adaln_lora_dim=8,
        max_size=(4, 32, 32),
        patch_size=(1, 2, 2),
        rope_scale=(2.0, 1.0, 1.0),
        concat_padding_mask=False,
        extra_pos_embed_type="learnable",
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 3, 16, 16),
        "condition_mask": torch.randint(0, 2, (b, 1, 3, 1, 1)).float().repeat(1, 1, 1, 16, 16),
        "timesteps": torch.rand(b),
        "encoder_hidden_states": torch.randn(b, TXT, 32),
        "attention_mask": torch.ones(b, TXT, dtype=torch.bool),
        "target": torch.randn(b, 4, 3, 16, 16),
    }


def training_step(model, batch):
    pred = model(
        hidden_states=batch["noisy_latents"],
        timestep=batch["timesteps"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        attention_mask=batch["attention_mask"],
        condition_mask=batch["condition_mask"],
        fps=24,
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
