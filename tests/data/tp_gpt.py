"""A small Llama-shaped language model (RMSNorm, separate q/k/v projections, a SwiGLU
feed-forward, untied output) with its own parallelize(model, mesh): tensor parallelism with
sequence parallelism as torchtitan lays out Llama, on the mesh's "tp" dimension, and
fully_shard on the blocks and the root over its data-parallel dimension(s) where the mesh
has one."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB_SIZE = 64
SEQ_LEN = 32
DIM = 32
N_HEAD = 4
HIDDEN = 64
N_LAYER = 2
BATCH_SIZE = 4


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = DIM // N_HEAD
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        # -1: the heads this rank holds (all of them without tensor parallelism)
        q = self.wq(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, -1)
        return self.wo(y)


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB_SIZE, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB_SIZE, bias=False)

    def forward(self, input_ids, labels):
        x = self.tok_embeddings(input_ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def build_model():
    return Transformer()


def sample_batch(batch_size=None):
    tokens = torch.randint(0, VOCAB_SIZE, (batch_size or BATCH_SIZE, SEQ_LEN + 1))
    return {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}


def parallelize(model, mesh):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    names = mesh.mesh_dim_names
    if "tp" in names:
        tp = mesh["tp"]
        parallelize_module(
            model,
            tp,
            {
                "tok_embeddings": RowwiseParallel(
                    input_layouts=Replicate(), output_layouts=Shard(1)
                ),
                "norm": SequenceParallel(),
                "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
            },
        )
        for layer in model.layers:
            parallelize_module(
                layer,
                tp,
                {
                    "attention_norm": SequenceParallel(),
                    "attention": PrepareModuleInput(
                        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                    ),
                    "attention.wq": ColwiseParallel(),
                    "attention.wk": ColwiseParallel(),
                    "attention.wv": ColwiseParallel(),
                    "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                    "ffn_norm": SequenceParallel(),
                    "feed_forward": PrepareModuleInput(
                        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                    ),
                    "feed_forward.w1": ColwiseParallel(),
                    "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                    "feed_forward.w3": ColwiseParallel(),
                },
            )
    data = tuple(name for name in names if name != "tp")
    if data:
        dp = mesh[data] if len(data) > 1 else mesh[data[0]]
        for layer in model.layers:
            fully_shard(layer, mesh=dp)
        fully_shard(model, mesh=dp)
    return model
