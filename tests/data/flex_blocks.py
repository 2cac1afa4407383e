"""A small transformer whose attention is FlexAttention under a causal document mask, as
torchtitan writes it: a ``BlockMask`` made once per batch from the batch's document ids
(``create_block_mask``), passed to every block, and ``flex_attention`` called eagerly (a
training script compiles it; on fake tensors and under a plan's check it runs uncompiled).
Its ``score_mod`` adds ALiBi's fixed per-head slopes, a buffer it captures.
torch 2.13 refuses FlexAttention's backward on CPU tensors: the tests lift that refusal to
run this step for real here."""

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

WIDTH, HEADS, TOKENS, BATCH, VOCAB, DOCUMENTS = 32, 4, 256, 2, 64, 3


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("slopes", 2.0 ** -torch.arange(1.0, HEADS + 1))

    def forward(self, x: torch.Tensor, block_mask) -> torch.Tensor:  # type: ignore[no-untyped-def]
        batch, tokens, width = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, HEADS, width // HEADS).unbind(2)
        slopes = self.slopes

        def alibi(score, b, h, q_index, kv_index):  # type: ignore[no-untyped-def]
            return score - slopes[h] * (q_index - kv_index)

        out = flex_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            score_mod=alibi,
            block_mask=block_mask,
        )
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, width))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor, block_mask) -> torch.Tensor:  # type: ignore[no-untyped-def]
        x = x + self.attn(self.norm1(x), block_mask)
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor, documents: torch.Tensor, labels: torch.Tensor):  # type: ignore[no-untyped-def]
        def same_document_causal(b, h, q, kv):  # type: ignore[no-untyped-def]
            return (documents[b, q] == documents[b, kv]) & (q >= kv)

        block_mask = create_block_mask(
            same_document_causal, tokens.shape[0], None, TOKENS, TOKENS, device=tokens.device
        )
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, block_mask)
        return F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


def build_model() -> nn.Module:
    return Model()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=generator)
    # Documents of random lengths packed into each sequence, as a data loader packs them.
    cuts = torch.sort(torch.randint(1, TOKENS, (BATCH, DOCUMENTS - 1), generator=generator))
    documents = (torch.arange(TOKENS)[None, :, None] >= cuts.values[:, None, :]).sum(-1)
    labels = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=generator)
    return tokens, documents, labels
