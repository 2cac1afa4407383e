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
   budget, peaks and plan.

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

from benchmarks.common import markdown_table, process_cost  # noqa: E402
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


def llama_70b(target: str, budget: str) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The whole profile job for Llama-3-70B as PP 4 x FSDP 16 (see the module docstring),
    and each stage's figures; where a stage fits no plan, the job's one-line error."""
    config = ROOT / "examples" / "configs" / "llama-3-70b.json"
    cli = str(Path(sys.executable).parent / "ckpt-plan")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-70b-pp-") as folder:
        plan_path = Path(folder) / "plan.json"
        command = [
            cli, "profile", "--hf", str(config), "--batch-size", "4", "--seq-len", "8192",
            "--pp", "4", "--microbatches", "4", "--schedule", "1f1b",
            "--world-size", "64", "--parallel", "fsdp2",
            "--target", target, "--budget", budget,
            "--out", str(plan_path), "--report-dir", str(Path(folder) / "report"),
        ]  # fmt: skip
        cost = process_cost(command, Path(folder))
        plan = json.loads(plan_path.read_text()) if plan_path.is_file() else None
    job = {
        "target": target,
        "budget": budget,
        "load_before": round(load, 2),
        "wall_s": round(cost.wall_s, 1),
        "cpu_s": round(cost.cpu_s, 1),
        "max_rss_mib": round(cost.max_rss_kib / 1024),
        "result": "a plan per stage"
        if plan is not None
        else (cost.stderr.strip().splitlines() or ["no output"])[-1][:300],
    }
    stages = []
    for stage in plan["stages"] if plan is not None else []:
        chosen = [d for d in stage["modules"] if d.get("nested_in") is None]
        stages.append(
            {
                "target": target,
                "stage": stage["parallel"]["pipeline"]["stage"],
                "budget (GiB)": f"{stage['budget_bytes'] / GIB:.2f}",
                "static (GiB)": f"{stage['static_bytes'] / GIB:.2f}",
                "unplanned (GiB)": f"{stage['baseline_peak_bytes'] / GIB:.2f}",
                "planned (GiB)": f"{stage['predicted_peak_bytes'] / GIB:.2f}",
                "modules": len(chosen),
                "recompute (ms)": f"{stage['recompute_ms']:.0f}",
                "overhead": f"+{stage['predicted_overhead']:.1%}",
                "plan": _plan_text(chosen),
            }
        )
    print(job, stages, flush=True)
    return job, stages


def _plan_text(decisions: list[dict]) -> str:
    """The decisions, blocks grouped by how (``36 x model.layers.N (whole)``)."""
    import re

    groups: dict[str, int] = {}
    for decision in decisions:
        name = re.sub(r"\.\d+(\.|$)", r".N\1", decision["module_name"])
        how = decision.get("policy") or decision.get("method", "checkpoint")
        key = f"{name} ({how})"
        groups[key] = groups.get(key, 0) + 1
    return "; ".join(f"{count} x {key}" for key, count in groups.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-70b", action="store_true")
    parser.add_argument("--skip-ranks", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args()
    import torch

    parts = [
        "# Pipeline stages: simulated vs real ranks, and Llama-3-70B as PP 4 x FSDP 16",
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
        for target, budget in (("h100-80gb", "79GiB"), ("h200", "120GiB")):
            job, rows = llama_70b(target, budget)
            jobs.append(job)
            stages += rows
        parts += [
            "## Llama-3-70B, PP 4 x FSDP 16: the whole `profile` job",
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
