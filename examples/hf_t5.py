"""A tiny Hugging Face T5 encoder-decoder (random weights, nothing downloaded), as a ckpt-plan
model file.

    ckpt-plan profile examples/hf_t5.py --budget 40MiB

The batch is a dict ``{"input_ids", "labels"}``; the model is called as ``model(**batch)``,
builds the decoder inputs by shifting ``labels`` right, and returns ``output.loss``, so no
loss_fn is needed. Eager attention keeps the (B, n_heads, T, T) attention weights as real
saved activations; dropout is on (T5's default 0.1), so recomputation must replay the RNG.

The config keeps T5's default ``use_cache=True``, as a model built from a downloaded config
would. With the cache on, the decoder makes a key/value cache in its forward that every
decoder layer writes to and cross-attention reads back, so a recomputed decoder module would
find it filled (a ``CheckpointError``). ckpt-plan plans and trains it with the cache off, as
Hugging Face's own checkpointing does (``apply_plan`` turns ``config.use_cache`` off);
tests/data/t5_cache_in_call.py asks for the cache in the call and keeps the hazard.
The encoder blocks are ``encoder.block.0`` ...
``encoder.block.{NUM_LAYERS-1}``, the decoder blocks ``decoder.block.0`` ... Weights and
batch come from torch's global RNG; the caller seeds it.
"""

import torch
from transformers import T5Config, T5ForConditionalGeneration

VOCAB_SIZE = 1000
D_MODEL = 128
D_KV = 32  # per-head width: N_HEADS * D_KV == D_MODEL
D_FF = 256
NUM_LAYERS = 3  # encoder blocks; the decoder has as many
NUM_HEADS = 4
BATCH_SIZE = 4
SOURCE_LEN = 128
TARGET_LEN = 64


def build_model() -> torch.nn.Module:
    config = T5Config(
        vocab_size=VOCAB_SIZE,
        d_model=D_MODEL,
        d_kv=D_KV,
        d_ff=D_FF,
        num_layers=NUM_LAYERS,
        num_heads=NUM_HEADS,
        decoder_start_token_id=0,  # T5 starts decoding from the pad token
        pad_token_id=0,
        eos_token_id=1,
        attn_implementation="eager",  # explicit softmax attention, not the fused SDPA kernel
    )
    # constructing from a config gives random weights from torch's global RNG (no download)
    return T5ForConditionalGeneration(config)


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH_SIZE  # read at call time: a file importing this one may set it
    # token ids from 2: 0 is padding (and the decoder's start token), 1 is end-of-sequence
    input_ids = torch.randint(2, VOCAB_SIZE, (batch_size, SOURCE_LEN))  # (B, S)
    labels = torch.randint(2, VOCAB_SIZE, (batch_size, TARGET_LEN))  # (B, T)
    return {"input_ids": input_ids, "labels": labels}
