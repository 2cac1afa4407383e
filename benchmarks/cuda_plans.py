"""Plans on a CUDA GPU: predicted against measured peaks (``torch.cuda.max_memory_allocated``),
for the two ways a CUDA plan is made, and predicted against measured overheads.

Run on a machine with a GPU:

    python benchmarks/cuda_plans.py                     # gpt, hf_gpt2, hf_llama, llama_medium
    python benchmarks/cuda_plans.py --target h100-80gb  # the spec the roofline rows use

Per model, the budget halfway between the every-block peak and the unplanned peak, and:

* ``here``: what `ckpt-plan profile --device cuda` does: fake CUDA tensors, cuBLAS's
  workspace measured on this GPU, times measured on it, the plan checked on it against the
  recomputation. The plan is then run again against the unplanned step (loss, gradients and
  buffers compared bit for bit), which also measures the unplanned peak.
* ``emulated``: what `ckpt-plan profile --target NAME` does on a machine without CUDA: the
  CUDA step emulated on fake CPU tensors, times from the roofline of ``--target``. Its plan is
  run here against the unplanned step (as `ckpt-plan verify` would on the target).

Then every plan's step time, interleaved with the unplanned step's (``--repeats`` each,
medians, CUDA-synchronized), against the overhead each plan predicted.
Writes reports/benchmarks/cuda_plans.csv and .md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The allocator setting CUDA plans assume (planner.core.allocator), before torch starts CUDA;
# run with PYTORCH_CUDA_ALLOC_CONF= (empty) to measure the default allocator instead.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

from benchmarks.common import markdown_table  # noqa: E402
from planner.apply import apply_plan  # noqa: E402
from planner.check.compare import CheckReference, check_plan  # noqa: E402
from planner.core.fileio import atomic_path, atomic_write_text  # noqa: E402
from planner.measure.fake import build_fake_workload  # noqa: E402
from planner.measure.profiler import record_memory  # noqa: E402
from planner.measure.workload import build_workload, load_model_file, run_training_step  # noqa: E402
from planner.pipeline import plan_checked, profile_model_file  # noqa: E402
from planner.plan.targets import load_spec, roofline_costs  # noqa: E402
from planner.solve.planning import baseline_every_block, plan_for_budget  # noqa: E402

MODELS = {
    "gpt": ROOT / "examples" / "gpt.py",
    "hf_gpt2": ROOT / "examples" / "hf_gpt2.py",
    "hf_llama": ROOT / "examples" / "hf_llama.py",
    "llama_medium": ROOT / "benchmarks" / "models" / "llama_medium.py",
}
MIB = 2**20


def _timed(plans: dict, path: Path, device: str, repeats: int) -> dict[str, float]:
    """Median step time (ms) of each plan (None: unplanned), interleaved."""
    import torch

    model_file = load_model_file(path)
    workloads = {}
    for name, plan in plans.items():
        workload = build_workload(model_file, device=device, seed=0)
        if plan is not None:
            apply_plan(workload.model, plan)
        for step in range(2):
            run_training_step(workload, seed=step)
        workloads[name] = workload
    times: dict[str, list[float]] = {name: [] for name in plans}
    for repeat in range(repeats):
        for name, workload in workloads.items():
            torch.cuda.synchronize()
            started = time.perf_counter()
            run_training_step(workload, seed=10 + repeat)
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - started) * 1000)
    del workloads
    torch.cuda.empty_cache()
    return {name: statistics.median(values) for name, values in times.items()}


def run_model(name: str, path: Path, spec_name: str, repeats: int) -> list[dict[str, object]]:
    model_file = load_model_file(path)
    spec = load_spec(spec_name)
    here = profile_model_file(model_file, device="cuda")
    every = baseline_every_block(here).predicted_peak_bytes
    budget = (every + here.measured_peak_bytes) // 2
    checked = plan_checked(here, budget, model_path=path, device="cuda")
    workload, session = build_fake_workload(model_file, "cuda", emulate=True)
    emulated = record_memory(workload, session=session, workspace_bytes=spec.workspace_bytes)
    emulated = roofline_costs(emulated, spec)
    emulated_plan, _ = plan_for_budget(emulated, budget)
    rows = []
    plans = {"none": None, "here": checked.plan, "emulated": emulated_plan}
    medians = _timed(plans, path, "cuda", repeats)
    for label, profile, plan in (
        ("here", checked.profile, checked.plan),
        ("emulated", emulated, emulated_plan),
    ):
        against_unplanned = check_plan(
            path, plan, device="cuda", reference=CheckReference.UNPLANNED
        )
        measured_unplanned = against_unplanned.unplanned_peak_bytes or 0
        rows.append(
            {
                "model": name,
                "made": label,
                "budget_mib": round(budget / MIB, 2),
                "workspace_mib": round(profile.workspace_bytes / MIB, 2),
                "unplanned_predicted_mib": round(profile.measured_peak_bytes / MIB, 2),
                "unplanned_measured_mib": round(measured_unplanned / MIB, 2),
                "unplanned_error_pct": round(
                    100 * (profile.measured_peak_bytes - measured_unplanned) / measured_unplanned, 3
                ),
                "modules": len(plan.modules),
                "plan_predicted_mib": round(plan.predicted_peak_bytes / MIB, 2),
                "plan_measured_mib": round(against_unplanned.measured_peak_bytes / MIB, 2),
                "plan_reserved_mib": round((against_unplanned.reserved_peak_bytes or 0) / MIB, 2),
                "plan_error_pct": round(
                    100
                    * (plan.predicted_peak_bytes - against_unplanned.measured_peak_bytes)
                    / against_unplanned.measured_peak_bytes,
                    3,
                ),
                "fits": against_unplanned.within_budget,
                "training_unchanged": against_unplanned.training_unchanged,
                "tool_check": (
                    "passed" if label == "here" and checked.check and checked.check.passed else "-"
                ),
                "predicted_overhead_pct": round(100 * plan.predicted_overhead, 1),
                "measured_overhead_pct": round(100 * (medians[label] / medians["none"] - 1), 1),
                "step_ms_unplanned": round(medians["none"], 2),
                "cost_source": profile.cost_source.value,
            }
        )
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--target", default="h100-80gb")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args(argv)
    import torch

    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = [
        row
        for name in arguments.models
        for row in run_model(name, MODELS[name], arguments.target, arguments.repeats)
    ]
    frame = pd.DataFrame(rows)
    arguments.out.mkdir(parents=True, exist_ok=True)
    with atomic_path(arguments.out / "cuda_plans.csv") as temp_path:
        frame.to_csv(temp_path, index=False)
    header = (
        f"Measured on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r}.\n\n"
    )
    atomic_write_text(arguments.out / "cuda_plans.md", header + markdown_table(frame) + "\n")
    print(markdown_table(frame))
    return 0


if __name__ == "__main__":
    sys.exit(main())
