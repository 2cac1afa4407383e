"""UVit2DModel (aMUSEd masked-token generator). Batch: 16x16 VQ token ids (some masked), text
states, pooled text, micro-conds, target token labels; cross-entropy loss."""

import torch
from diffusers import UVit2DModel

VOCAB = 264  # codebook 256 + mask token etc.
CODEBOOK = 256


def build_model() -> torch.nn.Module:
    return UVit2DModel(
        hidden_size=64,
        cond_embed_dim=32,
        micro_cond_encode_dim=4,
        micro_cond_embed_dim=20,  # 5 micro-conds * 4
        encoder_hidden_size=32,
        vocab_size=VOCAB,
        codebook_size=CODEBOOK,
        in_channels=32,
        block_out_channels=64,
        num_res_blocks=2,
        downsample=True,
        upsample=True,
        block_num_heads=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        sample_size=16,
    )


def sample_batch(batch_size=None):
    b = batch_size or 2
    return {
        "input_ids": torch.randint(0, VOCAB, (b, 16, 16)),
        "encoder_hidden_states": torch.randn(b, 32, 32),
        "pooled_text_emb": torch.randn(b, 32),
        "micro_conds": torch.randint(0, 512, (b, 5)).float(),
        "labels": torch.randint(0, CODEBOOK, (b, 16, 16)),
    }


def training_step(model, batch):
    logits = model(
        batch["input_ids"],
        encoder_hidden_states=batch["encoder_hidden_states"],
        pooled_text_emb=batch["pooled_text_emb"],
        micro_conds=batch["micro_conds"],
    )  # (B, codebook, H, W)
    return torch.nn.functional.cross_entropy(logits.float(), batch["labels"])
