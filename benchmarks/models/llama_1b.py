"""A 1.2B-parameter Hugging Face Llama shaped as Llama-3.2-1B (16 layers, hidden 2048, SwiGLU
8192, 32 heads, 8 key/value heads, vocabulary 128,256, tied embeddings), bf16, fused AdamW,
trained on 2 x 2048 tokens: the head-to-head model of issue #28
(benchmarks/cuda_head_to_head.py). Random weights; nothing is downloaded."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB_SIZE, SEQ_LEN, BATCH_SIZE = 128256, 2048, 2


def build_model() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=SEQ_LEN,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).to(torch.bfloat16)


def sample_batch():
    input_ids = torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN))
    return {"input_ids": input_ids, "labels": input_ids}


def build_optimizer(parameters):
    return torch.optim.AdamW(parameters, lr=3e-4, fused=True)
