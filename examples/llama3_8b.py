"""A Llama-3-8B-shaped Hugging Face model in bf16 with AdamW, as a ckpt-plan model file.

    ckpt-plan profile examples/llama3_8b.py --budget 80GB --target h100-80gb

Far too big to train on the planning machine: 8.0 billion parameters, 16 GB of bf16 weights
before gradients and optimizer state (64 GB of static memory in all). ckpt-plan plans it on
fake tensors (nothing is allocated) and estimates times for the target GPU; the plan is
checked there with `ckpt-plan verify`. The shape is LlamaConfig's for Llama 3 8B: 32
layers, hidden 4096, intermediate 14336, 32 heads with 8 key/value heads, vocabulary
128256; one sequence of 4096 tokens. Attention is SDPA (the transformers default), which
on an H100 in bf16 runs the flash kernel. Random weights from the config; no download.

The optimizer is AdamW with ``fused=True``, as torchtitan configures it. torch's default
AdamW on CUDA (``foreach``) allocates a bf16 copy of the squared-gradient state in its step,
15 GiB here: with it the optimizer step alone peaks at 74.85 GiB, above an 80 GB budget
whatever is checkpointed, and ckpt-plan says so.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SEQ_LEN = 4096
BATCH_SIZE = 1
VOCAB_SIZE = 128256


def build_model() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        use_cache=False,  # training: no key/value cache
        attn_implementation="sdpa",
    )
    # Built in fp32 from the config, then cast, as training scripts commonly do.
    return LlamaForCausalLM(config).to(torch.bfloat16)


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH_SIZE  # read at call time: a file importing this one may set it
    input_ids = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN))  # (B, T)
    return {"input_ids": input_ids, "labels": input_ids}


def build_optimizer(parameters):
    return torch.optim.AdamW(parameters, lr=3e-4, fused=True)
