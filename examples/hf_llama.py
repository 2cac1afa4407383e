"""A tiny Hugging Face Llama (random weights, nothing downloaded), as a ckpt-plan model file.

    ckpt-plan profile examples/hf_llama.py --budget 32MiB

The batch is a dict ``{"input_ids", "labels"}``; the model is called as
``model(**batch)`` and the loss is ``output.loss`` (LlamaForCausalLM shifts the labels
itself), so no loss_fn is needed. Eager attention keeps the (B, n_heads, T, T) attention
weights as real saved activations; grouped-query attention (2 key/value heads for 4
query heads) and RoPE make it a different shape of model from hf_gpt2.py. The decoder
layers are ``model.layers.0`` ... ``model.layers.{NUM_HIDDEN_LAYERS-1}``. Weights and
batch come from torch's global RNG; the caller seeds it.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB_SIZE = 1000
MAX_POSITION_EMBEDDINGS = 256
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 344  # SwiGLU width, about 8/3 * HIDDEN_SIZE as in Llama
NUM_HIDDEN_LAYERS = 4
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
        use_cache=False,  # training: no past key/values kept alive or returned
        attn_implementation="eager",  # explicit softmax attention, not the fused SDPA kernel
    )
    # constructing from a config gives random weights from torch's global RNG (no download)
    return LlamaForCausalLM(config)


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH_SIZE  # read at call time: a file importing this one may set it
    input_ids = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN))  # (B, T)
    # labels == input_ids: the model shifts them by one position internally
    return {"input_ids": input_ids, "labels": input_ids}
