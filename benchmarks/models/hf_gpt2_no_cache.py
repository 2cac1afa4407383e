"""Issue 17's config with use_cache=False, as training should build it: every layer is a
candidate again (compare hf_gpt2_use_cache.py)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

USE_CACHE = False
BATCH_SIZE, SEQ_LEN, VOCAB_SIZE = 4, 256, 8000


def build_model() -> torch.nn.Module:
    config = GPT2Config(
        n_layer=6,
        n_embd=256,
        n_head=4,
        n_positions=256,
        vocab_size=VOCAB_SIZE,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=USE_CACHE,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def sample_batch():
    input_ids = torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN))
    return {"input_ids": input_ids, "labels": input_ids}
