"""Plans for one rank of a torchrun job (issue #12), measured on real ranks.

    python benchmarks/distributed.py                     # every example, DDP and FSDP2
    python benchmarks/distributed.py --models gpt        # some of them

1. **Simulated vs real ranks.** For each example and each strategy (DDP with default
   buckets; FSDP2 with ``fully_shard`` on each block and the root), one rank of a 2-rank job
   is recorded in this process on a fake process group
   (:func:`planner.measure.distributed.record_rank_memory`); its predicted peak, unplanned
   and for plans at three budgets (a quarter, half and three quarters of the way from the
   lowest feasible peak to the unplanned one), is set against each real rank's measured peak:
   2 processes under ``torchrun`` with gloo on this CPU
   (:func:`planner.check.ranks.check_plan_on_ranks`: each rank builds the model, applies the
   plan, lays the model out, warms up two steps, measures the third; the unplanned step's peak
   is measured by each check too, and shown from the first). Each planned rank's loss,
   gradient shards and buffers are compared with the unplanned distributed step's, bit for bit.
   Each rank's planned step is also measured from the other side, by the CPU allocator's own
   accounting (``AllocatorPeakTracker``, a separate run of the same step): it does not rely on
   the dispatcher or on the tracker's handling of FSDP2's storage resizes. The same for a tiny
   Mixtral through ``--hf`` (its config.json; batch 2 x 32): eager experts (each expert on
   the tokens routed to it), planned and checked under balanced routing and under a busiest
   expert at twice its share (``--expert-load 2``), and the default ``grouped_mm`` experts,
   whose shapes no routing changes.
2. **Simulated world sizes.** FSDP2 on the Llama example at 2, 8 and 64 simulated ranks, and
   HSDP on 64 as an 8x8 mesh (replicate x shard): static memory per rank (parameters,
   gradients, optimizer state and buffers), the unplanned peak, and the plan for one
   per-rank budget.

Writes reports/benchmarks/distributed.md.
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
from planner.check.ranks import check_plan_on_ranks  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.core.parallel import ParallelLayout, ParallelStrategy  # noqa: E402
from planner.core.units import format_bytes  # noqa: E402
from planner.measure.distributed import record_rank_memory  # noqa: E402
from planner.measure.hf import hf_workload  # noqa: E402
from planner.measure.source import WorkloadSource  # noqa: E402
from planner.measure.workload import load_model_file  # noqa: E402
from planner.pipeline import estimated_costs  # noqa: E402
from planner.plan.memory_model import MemoryModel  # noqa: E402
from planner.solve import Solver  # noqa: E402
from planner.solve.planning import plan_for_budget  # noqa: E402

MODELS = {
    "gpt": ROOT / "examples" / "gpt.py",
    "hf_gpt2": ROOT / "examples" / "hf_gpt2.py",
    "hf_llama": ROOT / "examples" / "hf_llama.py",
}
# A tiny Mixtral as a config.json (what `profile --hf` reads): each entry its experts'
# implementation and the routing planned for (--expert-load).
MIXTRAL = {
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
    "bos_token_id": 0,
    "eos_token_id": 0,
}
MOE_MODELS = {
    "mixtral_eager": ("eager", 1.0),
    "mixtral_eager_load2": ("eager", 2.0),
    "mixtral_grouped_mm": ("grouped_mm", 1.0),
}
MOE_BATCH = (2, 32)
FRACTIONS = (0.75, 0.5, 0.25)


def mib(size_bytes: int) -> str:
    return f"{size_bytes / 2**20:.2f}"


def rank_profile(  # type: ignore[no-untyped-def]
    source: Path | WorkloadSource, layout: ParallelLayout, expert_load: float = 1.0
):
    model_file = load_model_file(source)
    return estimated_costs(record_rank_memory(model_file, layout, expert_load=expert_load), "cpu")


def moe_source(name: str, folder: Path) -> WorkloadSource:
    """The tiny Mixtral of ``MOE_MODELS[name]`` as an ``--hf`` workload, its config written
    into ``folder``."""
    experts, _ = MOE_MODELS[name]
    config = folder / f"{name}.json"
    config.write_text(json.dumps({**MIXTRAL, "experts_implementation": experts}))
    return hf_workload(config, *MOE_BATCH, None)


def compare_on_ranks(
    name: str, source: Path | WorkloadSource, strategy: ParallelStrategy, expert_load: float = 1.0
) -> list[dict[str, object]]:
    layout = ParallelLayout(2, strategy)
    begin = time.perf_counter()
    profile = rank_profile(source, layout, expert_load)
    load = profile.switches.expert_load
    routing = "-" if load is None else f"{load:g}"
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
            unplanned = [rank.unplanned_peak_bytes for rank in check.ranks]
            rows.append(
                {
                    "model": name,
                    "strategy": strategy.value,
                    "expert load": routing,
                    "budget (MiB)": "none (unplanned)",
                    "modules": 0,
                    "predicted (MiB)": mib(peak),
                    "rank 0 (MiB)": mib(unplanned[0]),
                    "rank 1 (MiB)": mib(unplanned[1]),
                    "worst error": f"{max(abs(u - peak) / u for u in unplanned):.3%}",
                    "worst error (bytes)": max(abs(u - peak) for u in unplanned),
                    "allocator, rank 0 / 1 (MiB)": "",
                    "within budget": "",
                    "bit-identical": "",
                    "simulate (s)": f"{simulated_s:.1f}",
                    "2 real ranks (s)": "",
                }
            )
        measured = [rank.measured_peak_bytes for rank in check.ranks]
        rows.append(
            {
                "model": name,
                "strategy": strategy.value,
                "expert load": routing,
                "budget (MiB)": mib(budget),
                "modules": len(plan.modules),
                "predicted (MiB)": mib(plan.predicted_peak_bytes),
                "rank 0 (MiB)": mib(measured[0]),
                "rank 1 (MiB)": mib(measured[1]),
                "worst error": (
                    f"{max(abs(m - plan.predicted_peak_bytes) / m for m in measured):.3%}"
                ),
                "worst error (bytes)": max(abs(m - plan.predicted_peak_bytes) for m in measured),
                "allocator, rank 0 / 1 (MiB)": " / ".join(
                    mib(r.allocator_peak_bytes) if r.allocator_peak_bytes is not None else "-"
                    for r in check.ranks
                ),
                "within budget": "yes" if all(r.within_budget for r in check.ranks) else "NO",
                "bit-identical": (
                    "yes" if all(r.training_unchanged for r in check.ranks) else "NO"
                ),
                "simulate (s)": "",
                "2 real ranks (s)": f"{ranks_s:.1f}",
            }
        )
        print(rows[-1], flush=True)
    return rows


def world_sizes(sizes: tuple[int, ...]) -> tuple[list[dict[str, object]], int]:
    """FSDP2 on the Llama example at each simulated world size, and HSDP on the largest as an
    N/8 x 8 mesh (replicated over N/8 groups, sharded over 8 ranks); plans at one per-rank
    budget (halfway between the lowest feasible peak and the unplanned peak at the smallest
    size)."""
    layouts = [ParallelLayout(size, "fsdp2") for size in sizes]  # type: ignore[arg-type]
    largest = max(sizes)
    if largest > 8 and largest % 8 == 0:
        layouts.append(ParallelLayout(largest, "fsdp2", (largest // 8, 8)))  # type: ignore[arg-type]
    profiles = {layout: rank_profile(MODELS["hf_llama"], layout) for layout in layouts}
    first = profiles[layouts[0]]
    _, lowest = Solver(first, MemoryModel(first.timeline)).lowest_peak()
    budget = (lowest + first.measured_peak_bytes) // 2
    rows = []
    for layout, profile in profiles.items():
        size = layout.world_size
        plan, _ = plan_for_budget(profile, budget)
        rows.append(
            {
                "world size": size,
                "mesh": "x".join(str(dim) for dim in layout.mesh_shape),
                "static per rank (MiB)": mib(profile.static_bytes),
                "static x world size (MiB)": mib(profile.static_bytes * size),
                "parameters per rank (KiB)": f"{profile.parameter_bytes / 1024:.1f}",
                "optimizer state per rank (KiB)": f"{profile.optimizer_state_bytes / 1024:.1f}",
                "unplanned peak (MiB)": mib(profile.measured_peak_bytes),
                f"plan at {format_bytes(budget)}: modules": ", ".join(plan.module_names) or "none",
                "predicted (MiB)": mib(plan.predicted_peak_bytes),
                "recompute (ms)": f"{plan.recompute_ms:.1f}",
            }
        )
        print(rows[-1], flush=True)
    return rows, budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [*MODELS, *MOE_MODELS]
    parser.add_argument("--models", nargs="*", default=names, choices=names)
    parser.add_argument("--sizes", nargs="*", type=int, default=[2, 8, 64])
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="moe-configs-") as folder:
        rows = [
            row
            for name in arguments.models
            for strategy in (ParallelStrategy.DDP, ParallelStrategy.FSDP2)
            for row in (
                compare_on_ranks(name, MODELS[name], strategy)
                if name in MODELS
                else compare_on_ranks(
                    name, moe_source(name, Path(folder)), strategy, MOE_MODELS[name][1]
                )
            )
        ]
    sizes, budget = world_sizes(tuple(arguments.sizes))
    import torch

    text = "\n\n".join(
        [
            "# Plans for one rank of a torchrun job: simulated vs real ranks",
            f"torch {torch.__version__}, CPU, gloo; generated by benchmarks/distributed.py "
            "(see its docstring for the method). Peaks are per rank, in MiB (2^20 bytes); "
            "'worst error' is the largest |measured - predicted| / measured over the two "
            "ranks. The Mixtrals are a tiny config through --hf (batch "
            f"{MOE_BATCH[0]} x {MOE_BATCH[1]}; eager or grouped_mm experts); 'expert load': "
            "the routing planned and checked for (--expert-load; '-' where no shape depends "
            "on routing).",
            "## 2 ranks: predicted (simulated rank) vs measured (each real rank)",
            markdown_table(pd.DataFrame(rows)),
            f"## FSDP2 on examples/hf_llama.py at simulated world sizes (budget "
            f"{format_bytes(budget)} per rank)",
            markdown_table(pd.DataFrame(sizes)),
        ]
    )
    arguments.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(arguments.out / "distributed.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
