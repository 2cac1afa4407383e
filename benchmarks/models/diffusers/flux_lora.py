"""Flux LoRA fine-tuning as diffusers' train_dreambooth_lora_flux.py runs it: the base
transformer in bf16 and frozen, peft LoRA adapters (rank 4) on the attention projections in
float32, the forward under bf16 autocast. Batch as flux.py's."""

import torch
from diffusers import FluxTransformer2DModel
from peft import LoraConfig

H = W = 16  # packed latent grid
TXT = 64


def build_model() -> torch.nn.Module:
    model = FluxTransformer2DModel(
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
    ).to(torch.bfloat16)
    model.requires_grad_(False)
    model.add_adapter(
        LoraConfig(
            r=4,
            lora_alpha=4,
            init_lora_weights="gaussian",
            target_modules=["to_k", "to_q", "to_v", "to_out.0"],
        )
    )
    for parameter in model.parameters():
        if parameter.requires_grad:  # the adapters train in float32
            parameter.data = parameter.data.float()
    return model


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "packed_noisy_latents": torch.randn(b, H * W, 16),
        "encoder_hidden_states": torch.randn(b, TXT, 32),
        "pooled_projections": torch.randn(b, 32),
        "timesteps": torch.rand(b),
        "guidance": torch.full((b,), 3.5),
        "target": torch.randn(b, H * W, 16),
    }


def _latent_image_ids(h, w):
    ids = torch.zeros(h, w, 3)
    ids[..., 1] = ids[..., 1] + torch.arange(h)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(w)[None, :]
    return ids.reshape(h * w, 3)


def training_step(model, batch):
    img_ids = _latent_image_ids(H, W)
    txt_ids = torch.zeros(batch["encoder_hidden_states"].shape[1], 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred = model(
            hidden_states=batch["packed_noisy_latents"].to(torch.bfloat16),
            timestep=batch["timesteps"].to(torch.bfloat16),
            guidance=batch["guidance"].to(torch.bfloat16),
            pooled_projections=batch["pooled_projections"].to(torch.bfloat16),
            encoder_hidden_states=batch["encoder_hidden_states"].to(torch.bfloat16),
            txt_ids=txt_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
