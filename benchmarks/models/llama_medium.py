"""A 0.5B-parameter Hugging Face Llama in bf16 (8 layers, hidden 2048, 2 x 2048 tokens), big
enough that a GPU step is compute-bound rather than launch-bound: the model the CUDA
benchmark (benchmarks/cuda_plans.py) compares roofline estimates with on."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB_SIZE, SEQ_LEN, BATCH_SIZE = 32000, 2048, 2


def build_model() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=SEQ_LEN,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).to(torch.bfloat16)


def sample_batch():
    input_ids = torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN))
    return {"input_ids": input_ids, "labels": input_ids}


def build_optimizer(parameters):
    return torch.optim.AdamW(parameters, lr=3e-4, fused=True)
