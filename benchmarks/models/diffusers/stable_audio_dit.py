"""StableAudioDiTModel (Stable Audio Open DiT). Batch: audio latents (B, 8, 128), timesteps,
text+duration cross states, global duration states, target."""

import torch
from diffusers import StableAudioDiTModel
from diffusers.models.embeddings import get_1d_rotary_pos_embed

HEAD_DIM = 16


def build_model() -> torch.nn.Module:
    return StableAudioDiTModel(
        sample_size=128,
        in_channels=8,
        num_layers=2,
        attention_head_dim=HEAD_DIM,
        num_attention_heads=2,
        num_key_value_attention_heads=1,
        out_channels=8,
        cross_attention_dim=32,
        time_proj_dim=32,
        global_states_input_dim=32,
        cross_attention_input_dim=32,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 8, 128),
        "timesteps": torch.rand(b),
        "encoder_hidden_states": torch.randn(b, 32, 32),
        "global_hidden_states": torch.randn(b, 1, 32),
        "target": torch.randn(b, 8, 128),
    }


def training_step(model, batch):
    # deterministic RoPE table over (global token + audio frames), as the pipeline builds it
    rotary_embedding = get_1d_rotary_pos_embed(
        HEAD_DIM // 2,
        batch["noisy_latents"].shape[2] + batch["global_hidden_states"].shape[1],
        use_real=True,
        repeat_interleave_real=False,
    )
    pred = model(
        batch["noisy_latents"],
        batch["timesteps"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        global_hidden_states=batch["global_hidden_states"],
        rotary_embedding=rotary_embedding,
        return_dict=False,
    )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
