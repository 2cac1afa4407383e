"""Random small Hugging Face configs as ckpt-plan model files, for property tests of the
memory model (tests/test_hf.py, a few seeded configs) and benchmarks/check_plans.py
(``--hf-configs N``: many).

Three families with different block structures: GPT-2 (fused QKV projection, learned
positions, tied embeddings), Llama (rotary tables shared by every layer, grouped KV heads)
and GPT-NeoX (parallel residual, partial rotary). Each draw varies the layer count (2-8),
width, heads and KV heads, sequence length, batch size, tied or untied embeddings, dropout
on or off, and whether the model builds a key/value cache in training (``use_cache``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

FAMILIES = ("gpt2", "llama", "gpt_neox")

_TEMPLATE = '''"""{description}"""
import torch
from transformers import {config_class}, {model_class}

BATCH_SIZE, SEQ_LEN, VOCAB_SIZE = {batch_size}, {seq_len}, {vocab_size}


def build_model():
    config = {config_class}({arguments})
    model = {model_class}(config)
    model.loss_type = "ForCausalLM"
    return model


def sample_batch():
    input_ids = torch.randint(0, VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN))
    return {{"input_ids": input_ids, "labels": input_ids}}
'''


@dataclass(frozen=True)
class HFConfig:
    """One drawn config: its family, a short description and the model file's source."""

    family: str
    description: str
    source: str

    def write(self, folder: Path, index: int) -> Path:
        path = folder / f"hf_{self.family}_{index}.py"
        path.write_text(self.source, encoding="utf-8")
        return path


def draw_config(rng: random.Random, family: str) -> HFConfig:
    layers = rng.randint(2, 8)
    heads = rng.choice([2, 4])
    head_dim = rng.choice([8, 16])
    hidden = heads * head_dim
    kv_heads = rng.choice([h for h in (1, 2, heads) if heads % h == 0])
    seq_len = rng.choice([16, 32, 64])
    batch_size = rng.randint(1, 4)
    vocab_size = rng.choice([256, 512, 1000])
    tied = rng.random() < 0.5
    dropout = rng.choice([0.0, 0.1])
    use_cache = rng.random() < 0.3
    common = {
        "vocab_size": vocab_size,
        "tie_word_embeddings": tied,
        "use_cache": use_cache,
        "attn_implementation": rng.choice(["eager", "sdpa"]),
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
    }
    if family == "gpt2":
        config_class, model_class = "GPT2Config", "GPT2LMHeadModel"
        specific = {
            "n_layer": layers,
            "n_embd": hidden,
            "n_head": heads,
            "n_positions": 64,
            "resid_pdrop": dropout,
            "embd_pdrop": dropout,
            "attn_pdrop": dropout,
        }
        kv_heads = heads
    elif family == "llama":
        config_class, model_class = "LlamaConfig", "LlamaForCausalLM"
        specific = {
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "intermediate_size": rng.choice([2, 3]) * hidden + rng.choice([0, 8]),
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "max_position_embeddings": 64,
            "attention_dropout": dropout,
        }
    elif family == "gpt_neox":
        config_class, model_class = "GPTNeoXConfig", "GPTNeoXForCausalLM"
        specific = {
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "intermediate_size": 4 * hidden,
            "num_attention_heads": heads,
            "max_position_embeddings": 64,
            "rotary_pct": rng.choice([0.25, 1.0]),
            "use_parallel_residual": rng.random() < 0.5,
            "attention_dropout": dropout,
            "hidden_dropout": dropout,
        }
        kv_heads = heads
    else:
        raise ValueError(f"unknown family {family!r}; one of {FAMILIES}")
    arguments = {**specific, **common}
    description = (
        f"{family}: {layers} layers, width {hidden}, {heads} heads / {kv_heads} KV heads, "
        f"batch {batch_size}x{seq_len}, vocab {vocab_size}, "
        f"{'tied' if tied else 'untied'} embeddings, dropout {dropout}, "
        f"use_cache={use_cache}, {arguments['attn_implementation']} attention"
    )
    source = _TEMPLATE.format(
        description=description,
        config_class=config_class,
        model_class=model_class,
        arguments=", ".join(f"{key}={value!r}" for key, value in arguments.items()),
        batch_size=batch_size,
        seq_len=seq_len,
        vocab_size=vocab_size,
    )
    return HFConfig(family=family, description=description, source=source)


def draw_configs(count: int, seed: int = 0) -> list[HFConfig]:
    """``count`` configs, the families taken in turn, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [draw_config(rng, FAMILIES[index % len(FAMILIES)]) for index in range(count)]


def predicted_and_measured(path: Path, fractions: tuple[float, ...]) -> list[dict[str, object]]:
    """Profile ``path`` on fake tensors (as ``ckpt-plan profile`` does), solve at budgets
    ``lowest + fraction * (unplanned - lowest)``, and measure each plan's real step after
    ``apply_plan`` with an independent live-storage tracker. One row per budget."""
    from planner.apply import apply_plan
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from planner.measure.step import measure_step
    from planner.measure.workload import build_workload, load_model_file
    from planner.plan.targets import provisional_costs
    from planner.solve import Solver
    from planner.solve.planning import build_plan

    model_file = load_model_file(path)
    workload, session = build_fake_workload(model_file, "cpu", seed=0)
    # Rough costs to solve with (any will do: the prediction is what is tested).
    profile = provisional_costs(record_memory(workload, session=session), "cpu")
    solver = Solver(profile)
    _, lowest = solver.lowest_peak()
    unplanned = profile.measured_peak_bytes
    rows = []
    for fraction in fractions:
        budget = lowest + int(fraction * (unplanned - lowest))
        solution = solver.solve(budget)
        plan = build_plan(profile, solution.units, budget, strategy="optimal")
        real = build_workload(model_file, seed=0)
        apply_plan(real.model, plan)
        measured = measure_step(real, seed=0, copy_state=False).peak_bytes
        rows.append(
            {
                "fraction": fraction,
                "budget_bytes": budget,
                "modules": len(solution.units),
                "predicted_bytes": plan.predicted_peak_bytes,
                "measured_bytes": measured,
                "error_pct": 100 * (plan.predicted_peak_bytes - measured) / measured,
            }
        )
    return rows


# A tiny Mixtral as a config.json (what `--hf` reads), its experts run eagerly: memory
# depends on routing, so plans assume one (--expert-load).
TINY_EAGER_MIXTRAL = {
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 128,
    "experts_implementation": "eager",  # each expert on the tokens routed to it
    "bos_token_id": 0,
    "eos_token_id": 0,
}
