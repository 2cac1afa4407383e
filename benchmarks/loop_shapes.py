"""A plan holds for the training loop it was made for: each plan measured in every loop shape.

    python benchmarks/loop_shapes.py                 # gpt, mlp, hf_gpt2
    python benchmarks/loop_shapes.py --models gpt

Per model, the budget is halfway between the peak with every block checkpointed and the
unplanned peak, on the plain loop's fake-tensor profile (``halfway_budget``). For each loop
shape (the plain loop, ``zero_grad`` after the forward as Lightning runs it, gradient
accumulation over 4 micro-batches) the step is recorded on fake tensors in that shape and a
plan solved for the budget (with provisional roofline costs: the modules it picks, not how
fast they are). Every plan is then run, for real, in every loop shape (``measure_step``:
warm-up, then one tracked steady-state step of that shape) and its peak set against the
budget and, in the loop it was made for, against its prediction. Writes
reports/benchmarks/loop_shapes.csv and .md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import halfway_budget, markdown_table  # noqa: E402
from planner.apply import apply_plan  # noqa: E402
from planner.core.fileio import atomic_path, atomic_write_text  # noqa: E402
from planner.core.loop import PLAIN_LOOP, LoopShape, ZeroGrad  # noqa: E402
from planner.measure.fake import build_fake_workload  # noqa: E402
from planner.measure.profiler import record_memory  # noqa: E402
from planner.measure.step import measure_step  # noqa: E402
from planner.measure.workload import build_workload, load_model_file  # noqa: E402
from planner.plan.targets import provisional_costs  # noqa: E402
from planner.solve.planning import plan_for_budget  # noqa: E402

DEFAULT_MODELS = ["gpt", "mlp", "hf_gpt2"]
LOOPS = {
    "plain": PLAIN_LOOP,
    "after-forward": LoopShape(zero_grad=ZeroGrad.AFTER_FORWARD),
    "grad-accum 4": LoopShape(grad_accum=4),
}
MIB = 2**20


def run_model(name: str) -> list[dict[str, object]]:
    model_file = load_model_file(ROOT / "examples" / f"{name}.py")
    profiles = {}
    for label, loop in LOOPS.items():
        workload, session = build_fake_workload(model_file, loop=loop)
        profiles[label] = record_memory(workload, session=session)
    budget = halfway_budget(profiles["plain"])
    plans = {
        label: plan_for_budget(provisional_costs(profile, "cpu"), budget)[0]
        for label, profile in profiles.items()
    }
    rows = []
    for made_for, plan in plans.items():
        for measured_in, loop in LOOPS.items():
            workload = build_workload(model_file, seed=0, loop=loop)
            apply_plan(workload.model, plan, guard=False)
            peak = measure_step(workload, seed=0, copy_state=False).peak_bytes
            own = made_for == measured_in
            rows.append(
                {
                    "model": name,
                    "budget_mib": round(budget / MIB, 2),
                    "plan_made_for": made_for,
                    "modules": len(plan.modules),
                    "measured_in": measured_in,
                    "predicted_mib": round(plan.predicted_peak_bytes / MIB, 3) if own else None,
                    "measured_mib": round(peak / MIB, 3),
                    "over_budget_mib": round(max(0, peak - budget) / MIB, 3),
                    "fits": peak <= budget,
                }
            )
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args(argv)
    rows = [row for name in arguments.models for row in run_model(name)]
    frame = pd.DataFrame(rows)
    arguments.out.mkdir(parents=True, exist_ok=True)
    with atomic_path(arguments.out / "loop_shapes.csv") as temp_path:
        frame.to_csv(temp_path, index=False)
    atomic_write_text(arguments.out / "loop_shapes.md", markdown_table(frame) + "\n")
    print(markdown_table(frame))
    return 0


if __name__ == "__main__":
    sys.exit(main())
