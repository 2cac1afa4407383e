"""Plans for pipeline stages (issue #30), measured on real ranks, and a Llama-3-70B pipeline
of 64 ranks planned on paper.

    python benchmarks/pipeline.py                 # both parts
    python benchmarks/pipeline.py --skip-70b      # the real-rank part only

1. **Simulated vs real ranks.** tests/data/tp_gpt.py (a small Llama) as 2 stages of 4
   micro-batches, 1F1B and GPipe, and as PP 2 x FSDP 2 on 4 ranks; tests/data/tp_gpt4.py
   (the same with 4 blocks) as 2 ranks x 2 virtual stages, interleaved 1F1B; examples/configs/
   tiny-llama.json (``--hf``, batch 4 x 64 tokens) as 2 stages, 1F1B. Each stage is planned on
   its simulated rank (``profile_and_plan`` without its check), then the plan is run on real
   gloo ranks (:func:`planner.check.ranks.check_plan_on_ranks`): each rank's measured peak,
   unplanned and planned, against its stage's prediction, within the budget, and its loss,
   gradients and buffers against the unplanned pipeline's, bit for bit.
2. **Llama-3-70B as PP 4 x FSDP 16** (64 ranks; ``--hf`` examples/configs/llama-3-70b.json:
   80 layers, hidden 8192, bf16, AdamW), 1F1B over 4 micro-batches of 1 x 8192 tokens (a
   data-parallel rank's batch: 4 x 8192; 1F1B needs at least as many micro-batches as
   stages): the whole ``ckpt-plan profile`` job in a fresh process (wall and CPU seconds,
   largest resident set) for ``--target h100-80gb`` and ``--target h200``, and each stage's
   budget, peaks and plan; and the same 64 ranks as **PP 8 x FSDP 8** (8 micro-batches of
   1 x 8192) for ``h100-80gb``. Beside them, the closed form of what torch's pipelining keeps
   on stage 0 under FSDP2 whatever is checkpointed: its weights gathered and its gradients
   unsharded (the embedding and 80 / S decoder layers, bf16, each), against the one-line
   error's figure where no plan fits.

Writes reports/benchmarks/pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import markdown_table, plan_text, process_cost  # noqa: E402
from planner.check.ranks import check_plan_on_ranks  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.core.parallel import ParallelLayout, ParallelStrategy, PipelineLayout  # noqa: E402
from planner.measure.hf import hf_workload  # noqa: E402
from planner.pipeline import profile_and_plan  # noqa: E402

GIB = 2**30
TP_GPT = ROOT / "tests" / "data" / "tp_gpt.py"
TP_GPT4 = ROOT / "tests" / "data" / "tp_gpt4.py"
TINY_LLAMA = hf_workload(ROOT / "examples" / "configs" / "tiny-llama.json", 4, 64)
CASES = (
    (
        "tp_gpt",
        TP_GPT,
        ParallelLayout(2, ParallelStrategy.PP, pipeline=PipelineLayout(2, 4)),
        330_000,
    ),
    (
        "tp_gpt",
        TP_GPT,
        ParallelLayout(2, ParallelStrategy.PP, pipeline=PipelineLayout(2, 4, "gpipe")),
        430_000,
    ),
    (
        "tp_gpt",
        TP_GPT,
        ParallelLayout(4, ParallelStrategy.FSDP2, pipeline=PipelineLayout(2, 4)),
        300_000,
    ),
    (
        "tp_gpt4",
        TP_GPT4,
        ParallelLayout(2, ParallelStrategy.PP, pipeline=PipelineLayout(2, 4, "interleaved-1f1b")),
        560_000,
    ),
    (
        "tiny-llama (--hf)",
        TINY_LLAMA,
        ParallelLayout(2, ParallelStrategy.PP, pipeline=PipelineLayout(2, 4)),
        2_900_000,
    ),
)


def _percent(error: int, predicted: int) -> str:
    return f"{100 * error / predicted:.3f}%"


def compare_on_ranks(name: str, source: object, layout: ParallelLayout, budget: int) -> list[dict]:
    """One row per real rank: its stage's predicted peaks against its measured ones."""
    begin = time.perf_counter()
    plan = profile_and_plan(source, budget, parallel=layout, check=False).plan  # type: ignore[arg-type]
    planned_s = time.perf_counter() - begin
    begin = time.perf_counter()
    check = check_plan_on_ranks(source, plan)  # type: ignore[arg-type]
    ranks_s = time.perf_counter() - begin
    rows = []
    for rank in check.ranks:
        stage = plan.stage_plan(layout.stage_of_rank(rank.rank))
        rows.append(
            {
                "model": name,
                "layout": layout.command_options(),
                "rank": rank.rank,
                "stage": layout.stage_of_rank(rank.rank),
                "budget (bytes)": budget,
                "unplanned: predicted / measured (bytes)": (
                    f"{stage.baseline_peak_bytes} / {rank.unplanned_peak_bytes}"
                ),
                "planned: predicted / measured (bytes)": (
                    f"{stage.predicted_peak_bytes} / {rank.measured_peak_bytes}"
                ),
                "error": _percent(
                    rank.measured_peak_bytes - stage.predicted_peak_bytes,
                    stage.predicted_peak_bytes,
                ),
                "checkpointed": ", ".join(
                    d.module_name for d in stage.modules if d.nested_in is None
                ),
                "within budget": "yes" if rank.within_budget else "NO",
                "bit-identical": "yes" if rank.training_unchanged else "NO",
                "plan (s)": f"{planned_s:.1f}",
                "real ranks (s)": f"{ranks_s:.1f}",
            }
        )
        print(rows[-1], flush=True)
    return rows


LLAMA_70B = ROOT / "examples" / "configs" / "llama-3-70b.json"


def stage0_unsharded_bytes(stages: int) -> int:
    """Stage 0's weights gathered plus its gradients unsharded, bf16, from the 70B config:
    the token embedding and 80 / ``stages`` decoder layers (q and o projections hidden^2
    each, k and v hidden x kv_heads x head_dim each, the MLP's three hidden x intermediate,
    two RMSNorm weights)."""
    config = json.loads(LLAMA_70B.read_text())
    hidden, intermediate = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]
    layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate + 2 * hidden
    parameters = config["vocab_size"] * hidden + config["num_hidden_layers"] // stages * layer
    return 2 * 2 * parameters  # bf16 weights and bf16 gradients


def llama_70b(
    target: str, budget: str, stages: int = 4
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The whole profile job for Llama-3-70B as PP ``stages`` x FSDP 64 / ``stages`` (see
    the module docstring), and each stage's figures; where a stage fits no plan, the job's
    one-line error."""
    config = LLAMA_70B
    cli = str(Path(sys.executable).parent / "ckpt-plan")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-70b-pp-") as folder:
        plan_path = Path(folder) / "plan.json"
        command = [
            cli, "profile", "--hf", str(config), "--batch-size", str(stages), "--seq-len",
            "8192", "--pp", str(stages), "--microbatches", str(stages), "--schedule", "1f1b",
            "--world-size", "64", "--parallel", "fsdp2",
            "--target", target, "--budget", budget,
            "--out", str(plan_path), "--report-dir", str(Path(folder) / "report"),
        ]  # fmt: skip
        cost = process_cost(command, Path(folder))
        plan = json.loads(plan_path.read_text()) if plan_path.is_file() else None
    job = {
        "layout": f"PP {stages} x FSDP {64 // stages}",
        "target": target,
        "budget": budget,
        "load_before": round(load, 2),
        "wall_s": round(cost.wall_s, 1),
        "cpu_s": round(cost.cpu_s, 1),
        "max_rss_mib": round(cost.max_rss_kib / 1024),
        "stage 0 gathered + unsharded, closed form (GiB)": (
            f"{stage0_unsharded_bytes(stages) / GIB:.2f}"
        ),
        "result": "a plan per stage"
        if plan is not None
        else (cost.stderr.strip().splitlines() or ["no output"])[-1],
    }
    rows = []
    for stage in plan["stages"] if plan is not None else []:
        chosen = [d for d in stage["modules"] if d.get("nested_in") is None]
        rows.append(
            {
                "layout": job["layout"],
                "target": target,
                "stage": stage["parallel"]["pipeline"]["stage"],
                "budget (GiB)": f"{stage['budget_bytes'] / GIB:.2f}",
                "static (GiB)": f"{stage['static_bytes'] / GIB:.2f}",
                "unplanned (GiB)": f"{stage['baseline_peak_bytes'] / GIB:.2f}",
                "planned (GiB)": f"{stage['predicted_peak_bytes'] / GIB:.2f}",
                "modules": len(chosen),
                "recompute (ms)": f"{stage['recompute_ms']:.0f}",
                "overhead": f"+{stage['predicted_overhead']:.1%}",
                "plan": plan_text(chosen),
            }
        )
    print(job, rows, flush=True)
    return job, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-70b", action="store_true")
    parser.add_argument("--skip-ranks", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args()
    import torch

    parts = [
        "# Pipeline stages: simulated vs real ranks, and Llama-3-70B on 64 ranks",
        f"torch {torch.__version__}, CPU, gloo, {os.cpu_count()} cores; generated by "
        "benchmarks/pipeline.py (see its docstring for the method).",
    ]
    if not arguments.skip_ranks:
        rows = [row for case in CASES for row in compare_on_ranks(*case)]
        parts += [
            "## Each stage's prediction (its simulated rank) vs every real rank",
            markdown_table(pd.DataFrame(rows)),
        ]
    if not arguments.skip_70b:
        jobs, stages = [], []
        runs = (("h100-80gb", "79GiB", 4), ("h100-80gb", "79GiB", 8), ("h200", "120GiB", 4))
        for target, budget, stages_count in runs:
            job, rows = llama_70b(target, budget, stages_count)
            jobs.append(job)
            stages += rows
        parts += [
            "## Llama-3-70B on 64 ranks, PP 4 x FSDP 16 and PP 8 x FSDP 8: the whole `profile` job",
            markdown_table(pd.DataFrame(jobs)),
            "## Each stage's budget, peaks and plan",
            markdown_table(pd.DataFrame(stages)) if stages else "(no stage planned)",
        ]
    text = "\n\n".join(parts)
    arguments.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(arguments.out / "pipeline.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
