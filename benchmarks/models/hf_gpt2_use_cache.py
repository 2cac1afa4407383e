"""Issue 17's GPT-2 config as a new user writes it: ``use_cache`` left at its default (True),
so in training every layer fills the DynamicCache it is passed. ckpt-plan excludes those
layers (their recomputation would fill it again) and plans around them; hf_gpt2_no_cache.py
builds it with use_cache=False, and the layers are candidates again."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

BATCH_SIZE, SEQ_LEN, VOCAB_SIZE = 4, 256, 8000


def build_model(use_cache: bool = True) -> torch.nn.Module:
    config = GPT2Config(
        n_layer=6,
        n_embd=256,
        n_head=4,
        n_positions=256,
        vocab_size=VOCAB_SIZE,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=use_cache,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def sample_batch():
    input_ids = torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN))
    return {"input_ids": input_ids, "labels": input_ids}
