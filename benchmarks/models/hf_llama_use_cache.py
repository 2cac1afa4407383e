"""Issue 17's Llama config as a new user writes it: ``use_cache`` left at its default (True),
so in training every decoder layer fills the DynamicCache it is passed. ckpt-plan excludes
those layers (their recomputation would fill it again) and plans around them; hf_llama_no_cache.py
builds it with use_cache=False, and the layers are candidates again."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCH_SIZE, SEQ_LEN, VOCAB_SIZE = 4, 256, 8000


def build_model(use_cache: bool = True) -> torch.nn.Module:
    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=512,
        attention_dropout=0.0,
        use_cache=use_cache,
    )
    return LlamaForCausalLM(config)


def sample_batch():
    input_ids = torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN))
    return {"input_ids": input_ids, "labels": input_ids}
