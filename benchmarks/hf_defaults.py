"""Hugging Face models with their config's defaults (issue 27): GPT-2 and Llama built as
users ship them (``use_cache`` on), 6 layers, a batch of 4 x 256 tokens, plain loop.

Each is profiled on fake tensors as ``ckpt-plan profile`` does, then planned with the tool's
own loop (:func:`planner.pipeline.plan_checked`: solved, recomputation tried on fake tensors,
run in a separate process after ``apply_plan`` against the unplanned step) at every block's
peak (what ``gradient_checkpointing_enable()`` reaches) and at 5, 10, 25, 50 and 80% of the
way from it to the unplanned peak. Before the cache was planned off, every one of these
exited 3 ("6 of 6 blocks cannot be checkpointed ... DynamicCache").

    python benchmarks/hf_defaults.py

Writes reports/benchmarks/hf_defaults.csv and .md (atomically) and prints the table. Exits 1
if a plan failed, measured more than 0.1% from its prediction, changed the training step,
or the smallest feasible budget is above every block's peak.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import markdown_table  # noqa: E402
from benchmarks.zoo import one_line  # noqa: E402
from planner.check.compare import CheckReference  # noqa: E402
from planner.core.fileio import atomic_path, atomic_write_text  # noqa: E402
from planner.core.records import Unit  # noqa: E402
from planner.measure.workload import load_model_file  # noqa: E402
from planner.pipeline import plan_checked, profile_model_file  # noqa: E402
from planner.plan.memory_model import MemoryModel  # noqa: E402
from planner.solve import Solver  # noqa: E402

MIB = 2**20
FRACTIONS = (0.0, 0.05, 0.10, 0.25, 0.50, 0.80)
MODELS = {
    "gpt2": (
        "GPT2Config, GPT2LMHeadModel",
        "GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=256, n_embd=128, n_layer=6, "
        "n_head=4))",
    ),
    "llama": (
        "LlamaConfig, LlamaForCausalLM",
        "LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=344, "
        "num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, "
        "max_position_embeddings=256))",
    ),
}


def write_model_file(name: str, folder: Path) -> Path:
    classes, construction = MODELS[name]
    path = folder / f"{name}_defaults.py"
    path.write_text(
        f'"""{name} with its config\'s defaults (use_cache on), 4 x 256 tokens."""\n'
        f"import torch\nfrom transformers import {classes}\n\n\n"
        f"def build_model():\n    return {construction}\n\n\n"
        "def sample_batch():\n    ids = torch.randint(0, 1000, (4, 256))\n"
        '    return {"input_ids": ids, "labels": ids}\n'
    )
    return path


def sweep(name: str, folder: Path) -> list[dict[str, object]]:
    path = write_model_file(name, folder)
    started = time.perf_counter()
    profile = profile_model_file(load_model_file(path))
    profile_s = time.perf_counter() - started
    memory = MemoryModel.for_profile(profile)
    _, floor = Solver(profile, memory).lowest_peak()
    unplanned = profile.measured_peak_bytes
    every_block = memory.peak_bytes(Unit(block) for block in profile.block_names)
    rows = []
    for fraction in FRACTIONS:
        budget = int(every_block + fraction * (unplanned - every_block))
        row: dict[str, object] = {
            "model": name,
            "way_pct": round(100 * fraction),
            "unplanned_mib": round(unplanned / MIB, 3),
            "every_block_mib": round(every_block / MIB, 3),
            "floor_mib": round(floor / MIB, 3),
            "floor_over_every_block": round(floor / every_block, 4),
            "caches_off": ",".join(name or "(root)" for name in profile.switches.caches_off),
            "budget_mib": round(budget / MIB, 3),
            "profile_s": round(profile_s, 1),
        }
        started = time.perf_counter()
        try:
            result = plan_checked(
                profile, budget, model_path=path, reference=CheckReference.UNPLANNED
            )
        except Exception as error:
            row["error"] = one_line(error)
        else:
            plan, check = result.plan, result.check
            assert check is not None
            row.update(
                modules=len(plan.modules),
                plan_mib=round(plan.predicted_peak_bytes / MIB, 3),
                measured_mib=round(check.measured_peak_bytes / MIB, 3),
                error_pct=round(
                    100
                    * (plan.predicted_peak_bytes - check.measured_peak_bytes)
                    / check.measured_peak_bytes,
                    4,
                ),
                within_budget=check.measured_peak_bytes <= budget,
                bit_identical=bool(
                    check.loss_equal and check.gradients_equal and check.buffers_equal
                ),
            )
        row["seconds"] = round(time.perf_counter() - started, 1)
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        rows = [row for name in MODELS for row in sweep(name, Path(folder))]
    frame = pd.DataFrame(rows)
    bad = (
        frame.get("error", pd.Series([None] * len(frame))).notna()
        | (frame["error_pct"].abs() > 0.1)
        | (frame["bit_identical"] != True)  # noqa: E712
        | (frame["within_budget"] != True)  # noqa: E712
        | (frame["floor_over_every_block"] > 1)
    )
    out = ROOT / "reports" / "benchmarks"
    with atomic_path(out / "hf_defaults.csv") as temporary:
        frame.to_csv(temporary, index=False)
    text = (
        "# Hugging Face defaults (use_cache on): GPT-2 and Llama, 6 layers, 4 x 256\n\n"
        "Made by `python benchmarks/hf_defaults.py`. Budgets at every block's peak and "
        "`way_pct`% of the way from it to the unplanned peak; each plan run after "
        "`apply_plan` in a separate process against the unplanned step.\n\n"
        + markdown_table(frame)
        + f"\n\n{int((~bad).sum())} of {len(frame)} rows pass.\n"
    )
    atomic_write_text(out / "hf_defaults.md", text)
    print(text)
    return 1 if bad.any() else 0


if __name__ == "__main__":
    raise SystemExit(main())
