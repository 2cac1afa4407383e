"""Gradient accumulation without syncing before the last micro-batch (``--no-sync``),
measured on real ranks.

    python benchmarks/no_sync.py                       # every case below
    python benchmarks/no_sync.py --models gpt          # some of the models

Hugging Face's Trainer, accelerate and Lightning accumulate gradients with the micro-batches
before the last under DDP's ``no_sync()`` or FSDP2's ``set_requires_gradient_sync(False)``.
For each model and layout (FSDP2 on 2 and 4 ranks, HSDP as 2 x 2, FSDP2 with tensor
parallelism as 2 x 2, DDP on 2 with its default buckets, and the GPT under a DDP of its own
with ``gradient_as_bucket_view=True``), accumulating
``GRAD_ACCUM`` micro-batches:

1. One rank is recorded on simulated ranks for the loop that syncs every micro-batch and for
   the one that does not (:func:`planner.measure.distributed.record_rank_memory`), unplanned.
2. The unsynced loop's plan at the budget half way from its lowest peak to its unplanned one
   is checked on real gloo ranks (:func:`planner.check.ranks.check_plan_on_ranks`: each rank
   runs two warm-up cycles and measures the third, unplanned and planned, each the whole
   cycle of ``GRAD_ACCUM`` micro-batches, where the recording ran 3): its prediction
   against each rank, within the budget, bit-identical; and each rank's planned cycle
   measured again by the CPU allocator's own accounting (``cross_check``: it sees what the
   dispatcher does not, and FSDP2's resizes as frees).
3. The plan made at the same budget for the loop that syncs every micro-batch (the plan
   ckpt-plan made for ``--grad-accum`` before ``--no-sync``) is run by the same ranks in
   the unsynced loop: where its prediction falls short, it goes over.

4. **Full size, simulated.** The Llama-3-8B-shaped example as one FSDP2 rank of 8 on H100s
   (``--target h100-80gb``, one sequence of 4096 tokens, bf16), in both loops: unplanned
   peak and lowest feasible peak, the plan of each loop at 40 and 30 GiB, and the synced
   loop's plan evaluated on the unsynced cycle's timeline (the memory model's prediction;
   nothing runs for real at that size).

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
# name: (model file, one rank's layout)
CASES = {
    "gpt fsdp2 x2": (ROOT / "examples" / "gpt.py", ParallelLayout(2, "fsdp2")),
    "gpt fsdp2 x4": (ROOT / "examples" / "gpt.py", ParallelLayout(4, "fsdp2")),
    "gpt ddp x2": (ROOT / "examples" / "gpt.py", ParallelLayout(2, "ddp")),
    "gpt ddp (gradient views) x2": (
        ROOT / "tests" / "data" / "ddp_gpt.py",
        ParallelLayout(2, "ddp"),
    ),
    "hf_llama fsdp2 x2": (ROOT / "examples" / "hf_llama.py", ParallelLayout(2, "fsdp2")),
    "hf_llama fsdp2 x4": (ROOT / "examples" / "hf_llama.py", ParallelLayout(4, "fsdp2")),
    "hf_llama hsdp 2x2": (
        ROOT / "examples" / "hf_llama.py",
        ParallelLayout(4, "fsdp2", mesh_shape=(2, 2)),
    ),
    "hf_llama ddp x2": (ROOT / "examples" / "hf_llama.py", ParallelLayout(2, "ddp")),
    "tp_gpt fsdp2 x2, tp 2": (
        ROOT / "tests" / "data" / "tp_gpt.py",
        ParallelLayout(4, "fsdp2", tp=2),
    ),
}


def mib(size_bytes: int) -> str:
    return f"{size_bytes / 2**20:.3f}"


def measure(name: str) -> dict[str, object]:
    path, layout = CASES[name]
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
    check = check_plan_on_ranks(str(path), plan, cross_check=True)
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
        "plan: by the CPU allocator, each rank (MiB)": " / ".join(
            mib(r.allocator_peak_bytes) if r.allocator_peak_bytes is not None else "-"
            for r in check.ranks
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


def full_size() -> list[dict[str, object]]:
    """Step 4 of the module docstring: one row per loop and budget."""
    from planner.pipeline import profile_model_file
    from planner.plan.targets import load_spec

    model_file = load_model_file(ROOT / "examples" / "llama3_8b.py")
    layout = ParallelLayout(8, "fsdp2")  # type: ignore[arg-type]
    solvers = {}
    rows: list[dict[str, object]] = []
    for key, loop in (("synced", SYNCED), ("unsynced", UNSYNCED)):
        begin = time.perf_counter()
        profile = profile_model_file(
            model_file, device="cuda", target=load_spec("h100-80gb"), loop=loop, parallel=layout
        )
        solvers[key] = solver = Solver(profile)
        _, lowest = solver.lowest_peak()
        rows.append(
            {
                "loop": key,
                "budget (GiB)": "none (unplanned)",
                "units": 0,
                "predicted (GiB)": gib(profile.measured_peak_bytes),
                "lowest feasible (GiB)": gib(lowest),
                "recompute (roofline)": "",
                "synced plan in the unsynced cycle (GiB)": "",
                "profile (s)": f"{time.perf_counter() - begin:.0f}",
            }
        )
    for budget in (40 * 2**30, 30 * 2**30):
        for key, solver in solvers.items():
            solution = solver.solve(budget)
            elsewhere = solvers["unsynced"].peak(solution.units) if key == "synced" else None
            rows.append(
                {
                    "loop": key,
                    "budget (GiB)": gib(budget),
                    "units": len(solution.units),
                    "predicted (GiB)": gib(solution.predicted_peak_bytes),
                    "lowest feasible (GiB)": "",
                    "recompute (roofline)": (
                        f"{solution.recompute_ms:.0f} ms, "
                        f"{solution.recompute_ms / solver.profile.step_ms:+.1%}"
                    ),
                    "synced plan in the unsynced cycle (GiB)": (
                        f"{gib(elsewhere)} ({(elsewhere - budget) / 2**30:+.2f})"
                        if elsewhere is not None
                        else ""
                    ),
                    "profile (s)": "",
                }
            )
    print(rows, flush=True)
    return rows


def gib(size_bytes: int) -> str:
    return f"{size_bytes / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args()
    rows = [measure(name) for name in arguments.models]
    large = full_size()
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
            "## Llama-3-8B, one FSDP2 rank of 8 on H100s (simulated)",
            "examples/llama3_8b.py with --target h100-80gb --world-size 8 --parallel fsdp2 "
            f"--grad-accum {GRAD_ACCUM}, with and without --no-sync. Units are modules with "
            "how each is planned (recomputed whole, a selective policy, or offloaded to host "
            "memory: the target has a host link, and offloading is on by default, as in "
            "`profile`). Recompute is the "
            "roofline's, as a share of the recorded step: one micro-batch and the optimizer "
            "step in the synced loop, the shortened cycle (3 micro-batches) in the unsynced "
            "one. The last column: the synced loop's plan on the unsynced cycle's timeline, "
            "and how far that is from the budget.",
            markdown_table(pd.DataFrame(large)),
        ]
    )
    arguments.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(arguments.out / "no_sync.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
