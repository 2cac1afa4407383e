"""A tiny nanoGPT-style model file: ``build_optimizer(model)`` with weight-decay groups by
module type (nanoGPT's ``configure_optimizers``), tied embeddings, and a model that prints
its parameter count when built, as nanoGPT's does."""

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS, BATCH = 128, 32, 32, 2, 2, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        print(f"number of parameters: {sum(p.numel() for p in self.parameters()) / 1e6:.2f}M")

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        # nanoGPT (2022): decay the weights of Linear layers, not biases, norms, embeddings.
        decay, no_decay = set(), set()
        for module_name, module in self.named_modules():
            for parameter_name, _ in module.named_parameters(recurse=False):
                full_name = f"{module_name}.{parameter_name}" if module_name else parameter_name
                if parameter_name.endswith("bias"):
                    no_decay.add(full_name)
                elif parameter_name.endswith("weight") and isinstance(module, nn.Linear):
                    decay.add(full_name)
                elif parameter_name.endswith("weight"):
                    no_decay.add(full_name)
                else:  # in_proj_weight of attention: a matmul weight
                    decay.add(full_name)
        decay.discard("lm_head.weight")  # tied to wte.weight, which is not decayed
        parameters = dict(self.named_parameters())
        groups = [
            {"params": [parameters[n] for n in sorted(decay)], "weight_decay": weight_decay},
            {"params": [parameters[n] for n in sorted(no_decay)], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def build_model():
    return GPT()


def build_optimizer(model):
    return model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4, betas=(0.9, 0.95))


def sample_batch():
    tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1))
    return {"idx": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}
