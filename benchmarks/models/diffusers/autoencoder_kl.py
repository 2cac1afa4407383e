"""AutoencoderKL (SD-style VAE) trained to reconstruct its input. Batch: 3x64x64 images; target
is the input."""

import torch
from diffusers import AutoencoderKL


def build_model() -> torch.nn.Module:
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 64),
        layers_per_block=2,
        latent_channels=4,
        norm_num_groups=32,
        sample_size=64,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    x = torch.randn(b, 3, 64, 64)
    return {"pixel_values": x, "target": x.clone()}


def training_step(model, batch):
    # sample_posterior=False -> uses the posterior mode, no randomness in the step
    pred = model(batch["pixel_values"]).sample
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
