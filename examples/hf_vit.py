"""A tiny Hugging Face Vision Transformer classifier (random weights, nothing downloaded).

    ckpt-plan profile examples/hf_vit.py --budget 40MiB

The batch is a dict ``{"pixel_values", "labels"}``; the model is called as
``model(**batch)`` and the loss is ``output.loss``. Eager attention keeps the
(B, heads, patches, patches) attention probabilities as saved activations. The encoder
blocks are ``vit.encoder.layer.0`` ... Weights and batch come from torch's global RNG;
the caller seeds it.
"""

import torch
from transformers import ViTConfig, ViTForImageClassification

IMAGE_SIZE = 64
PATCH_SIZE = 4  # (64 / 4)^2 = 256 patches + 1 class token per image
HIDDEN_SIZE = 96
N_LAYER = 4
N_HEAD = 4
N_CLASSES = 10
BATCH_SIZE = 8


def build_model() -> torch.nn.Module:
    config = ViTConfig(
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        hidden_size=HIDDEN_SIZE,
        num_hidden_layers=N_LAYER,
        num_attention_heads=N_HEAD,
        intermediate_size=4 * HIDDEN_SIZE,
        num_labels=N_CLASSES,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        attn_implementation="eager",
    )
    return ViTForImageClassification(config)


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH_SIZE  # read at call time: a file importing this one may set it
    pixel_values = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)  # (B, C, H, W)
    labels = torch.randint(0, N_CLASSES, (batch_size,))
    return {"pixel_values": pixel_values, "labels": labels}
