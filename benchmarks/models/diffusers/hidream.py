"""HiDreamImageTransformer2DModel (MoE dual/single stream, T5 + per-layer Llama states). Batch:
4x32x32 latents, timesteps, T5 states, stacked Llama states, pooled, target."""

import torch
from diffusers import HiDreamImageTransformer2DModel

N_DOUBLE, N_SINGLE = 2, 2


def build_model() -> torch.nn.Module:
    return HiDreamImageTransformer2DModel(
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=N_DOUBLE,
        num_single_layers=N_SINGLE,
        attention_head_dim=16,
        num_attention_heads=2,
        caption_channels=[32, 16],  # [t5 dim, llama dim]
        text_emb_dim=32,
        num_routed_experts=2,
        num_activated_experts=2,
        axes_dims_rope=(4, 6, 6),
        max_resolution=(32, 32),
        llama_layers=list(range(N_DOUBLE + N_SINGLE)),
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 32, 32),
        "timesteps": torch.randint(0, 1000, (b,)),
        "encoder_hidden_states_t5": torch.randn(b, 16, 32),
        # llama hidden states stacked over layers: (num_llama_layers, B, seq, dim)
        "encoder_hidden_states_llama3": torch.randn(N_DOUBLE + N_SINGLE, b, 16, 16),
        "pooled_embeds": torch.randn(b, 32),
        # in train mode the model returns (B, C, num_patches, p*p)
        "target": torch.randn(b, 4, 256, 4),
    }


def training_step(model, batch):
    pred = model(
        hidden_states=batch["noisy_latents"],
        timesteps=batch["timesteps"],
        encoder_hidden_states_t5=batch["encoder_hidden_states_t5"],
        encoder_hidden_states_llama3=batch["encoder_hidden_states_llama3"],
        pooled_embeds=batch["pooled_embeds"],
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
