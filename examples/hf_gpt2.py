"""A tiny Hugging Face GPT-2 (random weights, nothing downloaded), as a ckpt-plan model file.

    ckpt-plan profile examples/hf_gpt2.py --budget 40MiB

The batch is a dict ``{"input_ids", "labels"}``; the model is called as
``model(**batch)`` and the loss is ``output.loss`` (GPT2LMHeadModel shifts the labels
itself), so no loss_fn is needed. Eager attention keeps the (B, n_head, T, T) attention
weights as real saved activations, and ``use_cache=False`` stops the forward from
returning key/value caches. The transformer blocks are ``transformer.h.0`` ...
``transformer.h.{N_LAYER-1}``. Weights and batch come from torch's global RNG; the
caller seeds it.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB_SIZE = 1000
N_POSITIONS = 256
N_EMBD = 128
N_HEAD = 4
N_LAYER = 4
BATCH_SIZE = 4
SEQ_LEN = 128


def build_model() -> torch.nn.Module:
    config = GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=N_POSITIONS,
        n_embd=N_EMBD,
        n_head=N_HEAD,
        n_layer=N_LAYER,
        bos_token_id=0,  # GPT-2's default 50256 is outside this small vocabulary
        eos_token_id=0,
        use_cache=False,  # training: no past key/values kept alive or returned
        attn_implementation="eager",  # explicit softmax attention, not the fused SDPA kernel
    )
    # constructing from a config gives random weights from torch's global RNG (no download)
    model = GPT2LMHeadModel(config)
    # transformers picks the loss from the class name, which "GPT2LMHeadModel" does not
    # match: it falls back to this same loss with a warning. Naming it avoids the warning.
    model.loss_type = "ForCausalLM"
    return model


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH_SIZE  # read at call time: a file importing this one may set it
    input_ids = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN))  # (B, T)
    # labels == input_ids: the model shifts them by one position internally
    return {"input_ids": input_ids, "labels": input_ids}
