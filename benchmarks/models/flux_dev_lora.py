"""Flux-dev (12B) LoRA at 1024 x 1024 (4096 image tokens, 512 text tokens), batch 1."""

import torch
from diffusers import FluxTransformer2DModel
from peft import LoraConfig

H = W = 64
TXT = 512


def build_model():
    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=19,
        num_single_layers=38,
        attention_head_dim=128,
        num_attention_heads=24,
        joint_attention_dim=4096,
        pooled_projection_dim=768,
        guidance_embeds=True,
        axes_dims_rope=(16, 56, 56),
    ).to(torch.bfloat16)
    model.requires_grad_(False)
    model.add_adapter(
        LoraConfig(
            r=16,
            lora_alpha=16,
            init_lora_weights="gaussian",
            target_modules=["to_k", "to_q", "to_v", "to_out.0"],
        )
    )
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    return model


def sample_batch(batch_size=None):
    b = batch_size or 1
    return {
        "latents": torch.randn(b, H * W, 64, dtype=torch.bfloat16),
        "text": torch.randn(b, TXT, 4096, dtype=torch.bfloat16),
        "pooled": torch.randn(b, 768, dtype=torch.bfloat16),
        "t": torch.rand(b, dtype=torch.bfloat16),
        "guidance": torch.full((b,), 3.5, dtype=torch.bfloat16),
        "target": torch.randn(b, H * W, 64, dtype=torch.bfloat16),
    }


def _ids(h, w):
    ids = torch.zeros(h, w, 3)
    ids[..., 1] = ids[..., 1] + torch.arange(h)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(w)[None, :]
    return ids.reshape(h * w, 3)


def training_step(model, batch):
    with torch.autocast(batch["latents"].device.type, dtype=torch.bfloat16):
        pred = model(
            hidden_states=batch["latents"],
            timestep=batch["t"],
            guidance=batch["guidance"],
            pooled_projections=batch["pooled"],
            encoder_hidden_states=batch["text"],
            txt_ids=torch.zeros(TXT, 3, device=batch["latents"].device),
            img_ids=_ids(H, W).to(batch["latents"].device),
            return_dict=False,
        )[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
