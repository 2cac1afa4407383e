"""Plans for one rank of a job with tensor parallelism (issue #30), measured on real ranks,
and a Llama-3-70B rank of 64 simulated.

    python benchmarks/tensor_parallel.py                 # both parts
    python benchmarks/tensor_parallel.py --skip-70b      # the real-rank part only

1. **Simulated vs real ranks.** For tests/data/tp_gpt.py (its own ``parallelize``:
   torchtitan's Llama layout) and examples/configs/tiny-llama.json (``--hf``, batch 2 x 64
   tokens: the built-in plan), TP 2 on 2 ranks and FSDP 2 x TP 2 on 4: one rank recorded in
   this process on a fake process group, its predicted peak, unplanned and for plans at the
   lowest feasible peak and a quarter, half and three quarters of the way to the unplanned
   one, set against each real rank's measured peak (gloo under ``torchrun``:
   :func:`planner.check.ranks.check_plan_on_ranks`), with loss, gradient shards and buffers
   compared bit for bit with the unplanned distributed step's, and each planned step
   measured again by the CPU allocator (``AllocatorPeakTracker``), which also sees gloo's own
   staging buffers (see docs/results.md, "Tensor parallelism").
2. **Llama-3-70B, one rank of 64 as FSDP 8 x TP 8** on an H100 (``--target h100-80gb``,
   1 x 8192 tokens, bf16, AdamW): the whole ``ckpt-plan profile`` job in a fresh process
   (wall and CPU seconds, largest resident set), and the rank's static memory against the
   closed form (every weight matrix split 64 ways, the RMSNorm weights 8 ways; gradients as
   large; AdamW's two moments in bf16; a 4-byte step counter per parameter tensor in a
   512-byte CUDA block).

Writes reports/benchmarks/tensor_parallel.md.
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
from planner.core.parallel import ParallelLayout, ParallelStrategy  # noqa: E402
from planner.measure.distributed import record_rank_memory  # noqa: E402
from planner.measure.hf import hf_workload  # noqa: E402
from planner.measure.source import WorkloadSource  # noqa: E402
from planner.measure.workload import load_model_file  # noqa: E402
from planner.pipeline import estimated_costs  # noqa: E402
from planner.plan.memory_model import MemoryModel  # noqa: E402
from planner.solve import Solver  # noqa: E402
from planner.solve.planning import plan_for_budget  # noqa: E402

GIB = 2**30
MODELS: dict[str, WorkloadSource | Path] = {
    "tp_gpt": ROOT / "tests" / "data" / "tp_gpt.py",
    "tiny-llama (--hf)": hf_workload(ROOT / "examples" / "configs" / "tiny-llama.json", 2, 64),
}
LAYOUTS = (
    ParallelLayout(2, ParallelStrategy.TP),
    ParallelLayout(4, ParallelStrategy.FSDP2, tp=2),
)
FRACTIONS = (0.0, 0.25, 0.5, 0.75)


def compare_on_ranks(name: str, layout: ParallelLayout) -> list[dict[str, object]]:
    source = MODELS[name]
    begin = time.perf_counter()
    profile = estimated_costs(record_rank_memory(load_model_file(source), layout), "cpu")
    simulated_s = time.perf_counter() - begin
    solver = Solver(profile, MemoryModel(profile.timeline))
    _, lowest = solver.lowest_peak()
    peak = profile.measured_peak_bytes
    rows: list[dict[str, object]] = []
    for fraction in FRACTIONS:
        budget = lowest + int((peak - lowest) * fraction)
        plan, _ = plan_for_budget(profile, budget, solver=solver)
        begin = time.perf_counter()
        check = check_plan_on_ranks(source, plan, cross_check=True)
        ranks_s = time.perf_counter() - begin
        if not rows:
            unplanned = sorted({rank.unplanned_peak_bytes for rank in check.ranks})
            rows.append(
                {
                    "model": name,
                    "layout": layout.command_options(),
                    "budget (bytes)": "none (unplanned)",
                    "modules": 0,
                    "predicted (bytes)": peak,
                    "measured, every rank (bytes)": " / ".join(map(str, unplanned)),
                    "worst error (bytes)": max(
                        abs(r.unplanned_peak_bytes - peak) for r in check.ranks
                    ),
                    "allocator, each rank (bytes)": "",
                    "within budget": "",
                    "bit-identical": "",
                    "simulate (s)": f"{simulated_s:.1f}",
                    "real ranks (s)": "",
                }
            )
        measured = sorted({rank.measured_peak_bytes for rank in check.ranks})
        rows.append(
            {
                "model": name,
                "layout": layout.command_options(),
                "budget (bytes)": budget,
                "modules": len(plan.modules),
                "predicted (bytes)": plan.predicted_peak_bytes,
                "measured, every rank (bytes)": " / ".join(map(str, measured)),
                "worst error (bytes)": max(
                    abs(r.measured_peak_bytes - plan.predicted_peak_bytes) for r in check.ranks
                ),
                "allocator, each rank (bytes)": " / ".join(
                    str(r.allocator_peak_bytes) for r in check.ranks
                ),
                "within budget": "yes" if all(r.within_budget for r in check.ranks) else "NO",
                "bit-identical": (
                    "yes" if all(r.training_unchanged for r in check.ranks) else "NO"
                ),
                "simulate (s)": "",
                "real ranks (s)": f"{ranks_s:.1f}",
            }
        )
        print(rows[-1], flush=True)
    return rows


def llama_70b() -> tuple[dict[str, object], list[dict[str, object]]]:
    """The whole profile job for a Llama-3-70B rank of 64 (FSDP 8 x TP 8), and its static
    memory against the closed form (see the module docstring)."""
    config = ROOT / "examples" / "configs" / "llama-3-70b.json"
    cli = str(Path(sys.executable).parent / "ckpt-plan")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-70b-") as folder:
        plan_path = Path(folder) / "plan.json"
        command = [
            cli,
            "profile",
            "--hf",
            str(config),
            "--batch-size",
            "1",
            "--seq-len",
            "8192",
            "--world-size",
            "64",
            "--parallel",
            "fsdp2",
            "--tp",
            "8",
            "--target",
            "h100-80gb",
            "--budget",
            "60GB",
            "--out",
            str(plan_path),
            "--report-dir",
            str(Path(folder) / "report"),
        ]
        cost = process_cost(command, Path(folder))
        if cost.code != 0:
            raise SystemExit(f"the 70B profile failed ({cost.code}): {cost.stderr[-2000:]}")
        plan = json.loads(plan_path.read_text())
        profile = json.loads((Path(folder) / "profile.json").read_text())
    data = json.loads(config.read_text())
    layers, hidden = data["num_hidden_layers"], data["hidden_size"]
    heads, kv_heads = data["num_attention_heads"], data["num_key_value_heads"]
    kv = hidden // heads * kv_heads
    matrices = 2 * data["vocab_size"] * hidden + layers * (
        2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * data["intermediate_size"]
    )
    norms = (2 * layers + 1) * hidden
    dp, tp = 8, 8
    shard_bytes = 2 * (matrices // (dp * tp) + norms // dp)  # bf16
    counters = (9 * layers + 3) * 512  # one fp32 step per parameter tensor, a CUDA block each
    closed = {
        "parameter_bytes": shard_bytes,
        "gradient_bytes": shard_bytes,
        "optimizer_state_bytes": 2 * shard_bytes + counters,
    }
    static = [
        {
            "per rank": key.removesuffix("_bytes"),
            "simulated (bytes)": profile[key],
            "closed form (bytes)": value,
            "difference (bytes)": profile[key] - value,
        }
        for key, value in closed.items()
    ]
    job = {
        "job": "Llama-3-70B, one rank of 64 (FSDP 8 x TP 8), h100-80gb, 1 x 8192 tokens",
        "load_before": round(load, 2),
        "wall_s": round(cost.wall_s, 1),
        "cpu_s": round(cost.cpu_s, 1),
        "max_rss_mib": round(cost.max_rss_kib / 1024),
        "unplanned (GiB)": f"{plan['baseline_peak_bytes'] / GIB:.2f}",
        "planned (GiB)": f"{plan['predicted_peak_bytes'] / GIB:.2f}",
        "budget (GiB)": f"{plan['budget_bytes'] / GIB:.2f}",
        "static (GiB)": f"{plan['static_bytes'] / GIB:.2f}",
        "modules": len(plan["modules"]),
        "overhead": f"+{plan['predicted_overhead']:.1%}",
    }
    print(job, static, flush=True)
    return job, static


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-70b", action="store_true")
    parser.add_argument("--skip-ranks", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args()
    import torch

    parts = [
        "# Tensor parallelism: simulated vs real ranks, and a Llama-3-70B rank",
        f"torch {torch.__version__}, CPU, gloo, {os.cpu_count()} cores; generated by "
        "benchmarks/tensor_parallel.py (see its docstring for the method). 'worst error' is "
        "the largest |measured - predicted| over the ranks; equal ranks are shown once.",
    ]
    if not arguments.skip_ranks:
        rows = [
            row for name in MODELS for layout in LAYOUTS for row in compare_on_ranks(name, layout)
        ]
        parts += [
            "## Predicted (one simulated rank) vs measured (every real rank)",
            markdown_table(pd.DataFrame(rows)),
        ]
    if not arguments.skip_70b:
        job, static = llama_70b()
        parts += [
            "## Llama-3-70B, one rank of 64: the whole `profile` job",
            markdown_table(pd.DataFrame([job])),
            "## Its static memory per rank against the closed form",
            markdown_table(pd.DataFrame(static)),
        ]
    text = "\n\n".join(parts)
    arguments.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(arguments.out / "tensor_parallel.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
