"""ControlNetModel (SD 1.5-style) being trained on its own residuals. Batch: latents,
timesteps, text states, 3x64x64 conditioning image, and one target per residual."""

import torch
from diffusers import ControlNetModel

# shapes (C, H, W) of the 6 down-block residuals and the mid-block residual for the config below
DOWN_SHAPES = [(32, 32, 32)] * 3 + [(32, 16, 16)] + [(64, 16, 16)] * 2
MID_SHAPE = (64, 16, 16)


def build_model() -> torch.nn.Module:
    return ControlNetModel(
        in_channels=4,
        conditioning_channels=3,
        block_out_channels=(32, 64),
        layers_per_block=2,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=32,
        conditioning_embedding_out_channels=(16, 32),
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    batch = {
        "noisy_latents": torch.randn(b, 4, 32, 32),
        "timesteps": torch.randint(0, 1000, (b,)),
        "encoder_hidden_states": torch.randn(b, 77, 32),
        # conditioning embedding downsamples once with (16, 32): 64x64 -> 32x32 latent grid
        "controlnet_cond": torch.randn(b, 3, 64, 64),
        "target_mid": torch.randn(b, *MID_SHAPE),
    }
    for i, s in enumerate(DOWN_SHAPES):
        batch[f"target_down_{i}"] = torch.randn(b, *s)
    return batch


def training_step(model, batch):
    down_block_res_samples, mid_block_res_sample = model(
        batch["noisy_latents"],
        batch["timesteps"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        controlnet_cond=batch["controlnet_cond"],
        return_dict=False,
    )
    # The zero-initialised output convs make every residual 0 at init, so a plain sum of
    # mean squares would give all-zero gradients; regress each residual to a target instead.
    loss = torch.nn.functional.mse_loss(mid_block_res_sample.float(), batch["target_mid"].float())
    for i, r in enumerate(down_block_res_samples):
        loss = loss + torch.nn.functional.mse_loss(r.float(), batch[f"target_down_{i}"].float())
    return loss
