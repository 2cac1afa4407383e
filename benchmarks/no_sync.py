"""Gradient accumulation without syncing before the last micro-batch (``--no-sync``),
measured on real ranks.

    python benchmarks/no_sync.py                       # every case below
    python benchmarks/no_sync.py --models gpt          # some of the models

Hugging Face's Trainer, accelerate and Lightning accumulate gradients with the micro-batches
before the last under DDP's ``no_sync()`` or FSDP2's ``set_requires_gradient_sync(False)``.
For each model and layout (FSDP2 on 2 and 4 ranks, DDP on 2 with its default buckets, and
the GPT under a DDP of its own with ``gradient_as_bucket_view=True``), accumulating
``GRAD_ACCUM`` micro-batches:

1. One rank is recorded on simulated ranks for the loop that syncs every micro-batch and for
   the one that does not (:func:`planner.measure.distributed.record_rank_memory`), unplanned.
2. The unsynced loop's plan at the budget half way from its lowest peak to its unplanned one
   is checked on real gloo ranks (:func:`planner.check.ranks.check_plan_on_ranks`: each rank
   runs two warm-up cycles and measures the third, unplanned and planned, under
   ``no_sync``): its prediction against each rank, within the budget, bit-identical.
3. The plan made at the same budget for the loop that syncs every micro-batch (the plan
   ckpt-plan made for ``--grad-accum`` before ``--no-sync``) is run by the same ranks in
   the unsynced loop: where its prediction falls short, it goes over.

Writes reports/benchmarks/no_sync.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import markdown_table  # noqa: E402
from planner.check.ranks import check_plan_on_ranks  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.core.loop import LoopShape  # noqa: E402
from planner.core.parallel import ParallelLayout  # noqa: E402
from planner.measure.distributed import record_rank_memory  # noqa: E402
from planner.measure.workload import load_model_file  # noqa: E402
from planner.pipeline import estimated_costs  # noqa: E402
from planner.plan.memory_model import MemoryModel  # noqa: E402
from planner.solve import Solver  # noqa: E402
from planner.solve.planning import plan_for_budget  # noqa: E402

GRAD_ACCUM = 4
SYNCED = LoopShape(grad_accum=GRAD_ACCUM)
UNSYNCED = LoopShape(grad_accum=GRAD_ACCUM, no_sync=True)
# name: (model file, strategy, world size)
CASES = {
    "gpt fsdp2 x2": (ROOT / "examples" / "gpt.py", "fsdp2", 2),
    "gpt fsdp2 x4": (ROOT / "examples" / "gpt.py", "fsdp2", 4),
    "gpt ddp x2": (ROOT / "examples" / "gpt.py", "ddp", 2),
    "gpt ddp (gradient views) x2": (ROOT / "tests" / "data" / "ddp_gpt.py", "ddp", 2),
    "hf_llama fsdp2 x2": (ROOT / "examples" / "hf_llama.py", "fsdp2", 2),
    "hf_llama fsdp2 x4": (ROOT / "examples" / "hf_llama.py", "fsdp2", 4),
    "hf_llama ddp x2": (ROOT / "examples" / "hf_llama.py", "ddp", 2),
}


def mib(size_bytes: int) -> str:
    return f"{size_bytes / 2**20:.3f}"


def measure(name: str) -> dict[str, object]:
    path, strategy, world_size = CASES[name]
    layout = ParallelLayout(world_size, strategy)  # type: ignore[arg-type]
    model_file = load_model_file(path)
    begin = time.perf_counter()
    synced = estimated_costs(record_rank_memory(model_file, layout, loop=SYNCED), "cpu")
    unsynced = estimated_costs(record_rank_memory(model_file, layout, loop=UNSYNCED), "cpu")
    simulated_s = time.perf_counter() - begin
    solver = Solver(unsynced, MemoryModel(unsynced.timeline))
    _, lowest = solver.lowest_peak()
    budget = (lowest + unsynced.measured_peak_bytes) // 2
    plan, _ = plan_for_budget(unsynced, budget, solver=solver)
    begin = time.perf_counter()
    check = check_plan_on_ranks(str(path), plan)
    ranks_s = time.perf_counter() - begin
    measured = [rank.measured_peak_bytes for rank in check.ranks]
    unplanned = [rank.unplanned_peak_bytes for rank in check.ranks]
    synced_plan, _ = plan_for_budget(synced, budget)
    # The synced loop's plan, run by the ranks in the unsynced loop.
    in_unsynced = check_plan_on_ranks(str(path), dataclasses.replace(synced_plan, loop=UNSYNCED))
    old = [rank.measured_peak_bytes for rank in in_unsynced.ranks]
    row: dict[str, object] = {
        "case": name,
        "unplanned, synced (MiB)": mib(synced.measured_peak_bytes),
        "unplanned, unsynced: predicted (MiB)": mib(unsynced.measured_peak_bytes),
        "unplanned, unsynced: ranks' worst error (B, absolute)": max(
            abs(u - unsynced.measured_peak_bytes) for u in unplanned
        ),
        "budget (MiB)": mib(budget),
        "plan: modules": len(plan.modules),
        "plan: predicted (MiB)": mib(plan.predicted_peak_bytes),
        "plan: highest rank (MiB)": mib(max(measured)),
        "plan: worst error (B, absolute)": max(
            abs(m - plan.predicted_peak_bytes) for m in measured
        ),
        "plan: within budget": "yes" if all(r.within_budget for r in check.ranks) else "NO",
        "plan: bit-identical": ("yes" if all(r.training_unchanged for r in check.ranks) else "NO"),
        "synced loop's plan: predicted (MiB)": mib(synced_plan.predicted_peak_bytes),
        "synced loop's plan, run unsynced: highest rank (MiB)": mib(max(old)),
        "synced loop's plan, run unsynced: within budget": (
            "yes" if max(old) <= budget else f"NO (+{(max(old) - budget) / budget:.1%})"
        ),
        "simulate both (s)": f"{simulated_s:.1f}",
        "real ranks (s)": f"{ranks_s:.1f}",
    }
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args()
    rows = [measure(name) for name in arguments.models]
    import torch

    frame = pd.DataFrame(rows).set_index("case").T.reset_index(names="")
    text = "\n\n".join(
        [
            "# Gradient accumulation without syncing (--no-sync) on real ranks",
            f"torch {torch.__version__}, CPU, gloo; generated by benchmarks/no_sync.py (see "
            f"its docstring for the method). {GRAD_ACCUM} micro-batches per optimizer step; "
            "peaks per rank in MiB (2^20 bytes), errors in bytes over every rank; the budget "
            "is half way from the unsynced loop's lowest peak to its unplanned one.",
            markdown_table(frame),
        ]
    )
    arguments.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(arguments.out / "no_sync.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
