"""A small GPT language model in plain torch (nanoGPT style), as a ckpt-plan model file.

    ckpt-plan profile examples/gpt.py --budget 64MiB

The model is called as ``model(**sample_batch())`` and returns the scalar cross-entropy
loss. Attention is computed explicitly (no scaled_dot_product_attention) so the
(B, n_head, T, T) score and probability tensors are real saved activations: with these
sizes they dominate memory, which is what makes checkpointing the `blocks` worthwhile.
Weights and batch come from torch's global RNG; the caller seeds it.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB_SIZE = 512
SEQ_LEN = 128  # also the size of the position embedding table
N_EMBD = 128
N_HEAD = 4
N_LAYER = 6
DROPOUT = 0.1
BATCH_SIZE = 8


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_head = N_HEAD
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)  # q, k, v in one matmul
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)
        self.attn_dropout = nn.Dropout(DROPOUT)
        self.resid_dropout = nn.Dropout(DROPOUT)
        # lower-triangular mask; a buffer, so it is not a parameter and moves with .to()
        mask = torch.tril(torch.ones(SEQ_LEN, SEQ_LEN, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, SEQ_LEN, SEQ_LEN), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # each (B, T, C)
        # (B, T, C) -> (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads: (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(N_EMBD, 4 * N_EMBD)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * N_EMBD, N_EMBD)
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, x):
        return self.dropout(self.proj(self.gelu(self.fc(x))))  # (B, T, 4C) inside


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(N_EMBD)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(N_EMBD)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB_SIZE, N_EMBD)
        self.wpe = nn.Embedding(SEQ_LEN, N_EMBD)
        self.drop = nn.Dropout(DROPOUT)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, VOCAB_SIZE, bias=False)
        # weight tying: the head and the token embedding share one Parameter, so the
        # planner sees a weight used twice in one step (docs/architecture.md, "The memory
        # model")
        self.lm_head.weight = self.wte.weight
        # GPT-2 init: nn.Embedding's default N(0, 1) through the tied head would give
        # huge logits (initial loss ~80 instead of ~ln(VOCAB_SIZE) = 6.2)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, input_ids, labels):
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        return F.cross_entropy(logits.view(B * T, -1), labels.view(B * T))


def build_model() -> nn.Module:
    return GPT()


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH_SIZE  # read at call time: a file importing this one may set it
    # random tokens; labels are the inputs shifted by one, as in next-token prediction
    tokens = torch.randint(0, VOCAB_SIZE, (batch_size, SEQ_LEN + 1))
    # .contiguous(): two separate (B, T) tensors, not views of one shared storage
    return {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}
