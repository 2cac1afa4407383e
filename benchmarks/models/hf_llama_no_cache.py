"""Issue 17's config with use_cache=False, as training should build it: every layer is a
candidate again (compare hf_llama_use_cache.py)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

USE_CACHE = False
BATCH_SIZE, SEQ_LEN, VOCAB_SIZE = 4, 256, 8000


def build_model() -> torch.nn.Module:
    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=512,
        attention_dropout=0.0,
        use_cache=USE_CACHE,
    )
    return LlamaForCausalLM(config)


def sample_batch():
    input_ids = torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN))
    return {"input_ids": input_ids, "labels": input_ids}
