"""FlexAttention (``torch.nn.attention.flex_attention``) planned and checked.

    python benchmarks/flex_attention.py

1. **On this CPU, for real.** torch 2.13 refuses FlexAttention's backward on CPU tensors (a
   check of the device, before its operator runs; CUDA trains it). This script lifts that
   refusal in its own process, as ``tests/test_flex_attention.py`` does, so the step runs
   here: ``tests/data/flex_blocks.py`` (a causal document mask over packed sequences) is
   profiled on fake tensors and planned at budgets from its lowest feasible peak to its
   unplanned one, with every option the solver has (whole modules, selective policies,
   nesting), and each plan is run against the unplanned step (:func:`run_check`, in this
   process): its prediction against the measured peak, bit-identical or not.
   The same model with Gemma 2's soft cap added to its ``score_mod`` (a ``tanh``, which
   saves tensors for its own backward): its unplanned peak and lowest feasible budget
   (see docs/how-it-works.md, "FlexAttention": no plan checkpoints a module holding it).
2. **Llama-3-8B for an H100, simulated.** ``--hf examples/configs/llama-3-8b.json`` at one
   sequence of 8192 tokens, bf16, ``--target h100-80gb``, with its default attention
   (SDPA: the emulation runs CUDA's flash kernel) and with ``attn_implementation:
   flex_attention`` (Hugging Face's FlexAttention path, its causal block mask): unplanned
   peak, lowest feasible budget, and the plan at 70 GB, each with offloading allowed (the
   default, within 256 GB of host memory) and recomputation only.

3. **Hugging Face types with FlexAttention.** The causal-LM types of :data:`TYPES`, each
   at the Hugging Face sweep's small sizes (``benchmarks/hf_sweep_models.py``) with
   ``attn_implementation: flex_attention``, bf16, recorded as on CUDA on fake tensors: the
   step's peak, and its FlexAttention forward and backward operators, or the error.

Writes reports/benchmarks/flex_attention.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import markdown_table  # noqa: E402
from benchmarks.selective import memory_profile  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.measure.workload import load_model_file  # noqa: E402
from planner.solve import Solver  # noqa: E402
from planner.solve.planning import plan_for_budget  # noqa: E402

MODEL = ROOT / "tests" / "data" / "flex_blocks.py"
LLAMA = ROOT / "examples" / "configs" / "llama-3-8b.json"
FRACTIONS = (0.0, 0.25, 0.5, 0.75)
HOST_BUDGET = 256 * 10**9  # a DGX H100's 2 TB over 8 GPUs, as benchmarks/offload.py


def _lift_cpu_refusal() -> None:
    import torch.nn.attention.flex_attention as flex

    setattr(flex, "_validate_device", lambda query, key, value: None)  # noqa: B010


SCORE = "return score - slopes[h] * (q_index - kv_index)"
SOFT_CAPPED = "return 30.0 * torch.tanh(score / 30.0) - slopes[h] * (q_index - kv_index)"


def soft_capped(folder: Path) -> dict[str, object]:
    """Step 1's soft-capped variant: unplanned and lowest feasible peaks, beside the
    model's own."""
    source = MODEL.read_text()
    assert SCORE in source
    path = folder / "flex_blocks_soft_capped.py"
    path.write_text(source.replace(SCORE, SOFT_CAPPED))
    row: dict[str, object] = {}
    for name, model in (("as in the tests", MODEL), ("soft cap added", path)):
        profile = memory_profile(str(model))
        row[f"{name}: unplanned (B)"] = f"{profile.measured_peak_bytes:,}"
        row[f"{name}: lowest feasible (B)"] = f"{Solver(profile).lowest_peak()[1]:,}"
    print(row, flush=True)
    return row


def on_this_cpu() -> list[dict[str, object]]:
    """Step 1 of the module docstring: one row per budget."""
    from planner.check.compare import run_check

    _lift_cpu_refusal()
    profile = memory_profile(str(MODEL))
    solver = Solver(profile)
    _, lowest = solver.lowest_peak()
    rows: list[dict[str, object]] = []
    for fraction in FRACTIONS:
        budget = int(lowest + fraction * (profile.measured_peak_bytes - lowest))
        plan, _ = plan_for_budget(profile, budget, solver=solver)
        check = run_check(MODEL, plan)
        rows.append(
            {
                "budget (B)": f"{budget:,}",
                "units": ", ".join(str(unit) for unit in plan.units) or "none",
                "predicted (B)": f"{plan.predicted_peak_bytes:,}",
                "measured (B)": f"{check.measured_peak_bytes:,}",
                "error (B)": f"{check.measured_peak_bytes - plan.predicted_peak_bytes:+,}",
                "within budget": check.measured_peak_bytes <= budget,
                "bit-identical": check.loss_equal and check.gradients_equal and check.buffers_equal,
            }
        )
        print(rows[-1], flush=True)
    return [
        {
            "budget (B)": f"unplanned {profile.measured_peak_bytes:,}",
            "units": f"lowest feasible {lowest:,}",
        },
        *rows,
    ]


def llama(folder: Path) -> list[dict[str, object]]:
    """Step 2 of the module docstring: one row per attention and offloading choice."""
    from planner.measure.hf import hf_workload, load_hf_model_file
    from planner.pipeline import profile_model_file
    from planner.plan.targets import load_spec

    config = json.loads(LLAMA.read_text())
    rows: list[dict[str, object]] = []
    for attention in ("sdpa (default)", "flex_attention"):
        if attention == "flex_attention":
            config["attn_implementation"] = "flex_attention"
        path = folder / f"{attention.split()[0]}.json"
        path.write_text(json.dumps(config))
        begin = time.perf_counter()
        profile = profile_model_file(
            load_hf_model_file(hf_workload(path, 1, 8192)),
            device="cuda",
            target=load_spec("h100-80gb"),
        )
        seconds = time.perf_counter() - begin
        attention_saved = profile.module("model.layers.0.self_attn").saved_bytes
        for offload in (True, False):
            solver = Solver(profile, offload=offload, host_budget_bytes=HOST_BUDGET)
            _, lowest = solver.lowest_peak()
            solution = solver.solve(70 * 10**9)
            rows.append(
                {
                    "attention": attention,
                    "offloading": "allowed" if offload else "no",
                    "profile (s)": f"{seconds:.0f}",
                    "unplanned (B)": f"{profile.measured_peak_bytes:,}",
                    "layer 0 attention saves (B)": f"{attention_saved:,}",
                    "lowest feasible (B)": f"{lowest:,}",
                    "70 GB plan (B)": f"{solution.predicted_peak_bytes:,}",
                    "units": len(solution.units),
                    "overhead (roofline)": f"{solution.recompute_ms / profile.step_ms:+.1%}",
                }
            )
            print(rows[-1], flush=True)
    return rows


TYPES = (
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2",
    "granite", "cohere", "mixtral", "qwen3_moe", "gpt_oss",
)  # fmt: skip


def hugging_face_types(folder: Path) -> list[dict[str, object]]:
    """Step 3 of the module docstring: one row per type."""
    from benchmarks.hf_sweep_models import write_hf_config
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from planner.measure.source import WorkloadSource

    rows: list[dict[str, object]] = []
    for model_type in TYPES:
        source = write_hf_config("causal-lm", model_type, folder)
        path = folder / model_type / "config.json"
        config = json.loads(path.read_text())
        config["attn_implementation"] = "flex_attention"
        path.write_text(json.dumps(config))
        parsed = WorkloadSource.parse(source.replace("dtype=float32", "dtype=bfloat16"))
        try:
            workload, session = build_fake_workload(load_model_file(parsed), "cuda")
            profile = record_memory(workload, session=session)
        except Exception as error:  # the row says what stopped it
            message = str(error).replace(f"{folder}/", "")  # no temporary folder in the report
            rows.append({"type": model_type, "recorded": f"no: {message}"})
            continue
        ops = [cost.op for cost in profile.timeline.op_costs]
        rows.append(
            {
                "type": model_type,
                "recorded": "yes",
                "peak (B)": f"{profile.measured_peak_bytes:,}",
                "flex_attention / _backward": (
                    f"{ops.count('flex_attention')} / {ops.count('flex_attention_backward')}"
                ),
            }
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-flex-") as folder:
        large = llama(Path(folder))
        small = on_this_cpu()
        capped = soft_capped(Path(folder))
        types = hugging_face_types(Path(folder) / "types")
    import torch

    text = "\n\n".join(
        [
            "# FlexAttention",
            f"torch {torch.__version__}, CPU; generated by benchmarks/flex_attention.py (see "
            "its docstring for the method).",
            "## tests/data/flex_blocks.py on this CPU (torch's refusal of its CPU backward lifted)",
            "Budgets from the lowest feasible peak to the unplanned one; each plan run "
            "against the unplanned step (peak of live tensor storages, in bytes).",
            markdown_table(pd.DataFrame(small)),
            "With Gemma 2's soft cap added to its score_mod (no plan checkpoints a module "
            'holding it; docs/how-it-works.md, "FlexAttention"):',
            markdown_table(pd.DataFrame([capped])),
            "## Llama-3-8B, one sequence of 8192 tokens, bf16, --target h100-80gb (simulated)",
            "The same config with its default attention and with attn_implementation: "
            "flex_attention; the plan at 70 GB (65.19 GiB); overhead is the roofline's "
            "recompute and copy time over the recorded step's.",
            markdown_table(pd.DataFrame(large)),
            "## Hugging Face causal-LM types with attn_implementation: flex_attention",
            "Each at the Hugging Face sweep's small sizes, bf16, recorded as on CUDA (emulated "
            "on fake CPU tensors); the FlexAttention operators one step runs.",
            markdown_table(pd.DataFrame(types)),
        ]
    )
    arguments.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(arguments.out / "flex_attention.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
