"""The smallest Hugging Face Llama the rank check is run on (issue #32): examples/hf_llama.py
at hidden 64, 2 layers, 4 heads, 2 key/value heads, SwiGLU width 172, vocabulary 1000;
use_cache=False and eager attention, as training builds it. The batch is hf_llama.py's
``{"input_ids", "labels"}`` (8 x 128). Random weights from torch's global RNG; nothing is
downloaded.

    ckpt-plan profile benchmarks/models/tiny_llama.py --budget 26MiB --world-size 2 --parallel fsdp2
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB_SIZE = 1000
MAX_POSITION_EMBEDDINGS = 256
HIDDEN_SIZE = 64
INTERMEDIATE_SIZE = 172  # SwiGLU width, about 8/3 * HIDDEN_SIZE as in Llama
NUM_HIDDEN_LAYERS = 2
NUM_ATTENTION_HEADS = 4
NUM_KEY_VALUE_HEADS = 2
BATCH_SIZE = 8
SEQ_LEN = 128


def build_model() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_HIDDEN_LAYERS,
        num_attention_heads=NUM_ATTENTION_HEADS,
        num_key_value_heads=NUM_KEY_VALUE_HEADS,
        use_cache=False,  # training: no past key/values kept alive through backward
        attn_implementation="eager",  # explicit softmax attention, not the fused SDPA kernel
    )
    return LlamaForCausalLM(config)


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH_SIZE
    input_ids = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN))  # (B, T)
    return {"input_ids": input_ids, "labels": input_ids}  # the model shifts the labels itself
