"""DiTTransformer2DModel (class-conditional DiT). Batch: 4x32x32 latents (256 patches),
timesteps, class labels, noise target."""

import torch
from diffusers import DiTTransformer2DModel
from diffusers.models.embeddings import LabelEmbedding


def build_model() -> torch.nn.Module:
    model = DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        sample_size=32,
        patch_size=2,
        num_embeds_ada_norm=1000,
    )
    # The class embedder drops labels at random in train mode (CFG dropout, torch.rand inside
    # forward). Turn that off so the step is deterministic; the null-class id 1000 can be put
    # in the batch's class_labels instead.
    for m in model.modules():
        if isinstance(m, LabelEmbedding):
            m.dropout_prob = 0.0
    return model


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "noisy_latents": torch.randn(b, 4, 32, 32),
        "timesteps": torch.randint(0, 1000, (b,)),
        "class_labels": torch.randint(0, 1000, (b,)),
        "target": torch.randn(b, 4, 32, 32),
    }


def training_step(model, batch):
    pred = model(
        batch["noisy_latents"], timestep=batch["timesteps"], class_labels=batch["class_labels"]
    ).sample
    return torch.nn.functional.mse_loss(pred.float(), batch["target"].float())
