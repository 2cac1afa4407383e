"""Check plans on real models: fake against real memory, predicted against measured peaks,
and an unchanged training step.

For each model file: profile it twice, on fake tensors (what `ckpt-plan profile` does) and by
running the unplanned step for real; take the budgets at 10%, 30%, 50%, 70% and 90% of the
way from the peak with every block checkpointed to the unplanned peak, and near the floor
(the smallest feasible budget, and 2%, 5% and 10% of the way from it to the unplanned peak,
where recomputation spikes decide the peak); plan each from the
fake profile as the tool does (solved, its modules' recomputation tried on fake tensors,
checked within the budget against the recomputation). Then, per plan:

* its predicted peak on the fake timeline against the same plan on the real timeline;
* a run in a separate process after ``apply_plan`` against the *unplanned* step (the
  strongest reference: loss, every gradient and every buffer compared bit for bit), with
  the measured peak against the budget and the prediction.

    python benchmarks/check_plans.py                       # the bundled examples
    python benchmarks/check_plans.py examples/gpt.py       # some model files
    python benchmarks/check_plans.py --hf-configs 60       # random small HF configs

Writes reports/benchmarks/plan_checks.csv and .md (atomically) and prints the table. With
``--hf-configs N`` it instead draws N random small Hugging Face configs (tests/hf_configs.py:
GPT-2, Llama, GPT-NeoX; layers, widths, heads, sequence, batch, tied embeddings, dropout,
use_cache), plans each at budgets from the smallest feasible to the unplanned peak and
measures each plan's real step: reports/benchmarks/hf_configs.csv and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import markdown_table  # noqa: E402
from planner.check.compare import CheckReference, check_plan  # noqa: E402
from planner.core.errors import InfeasibleBudgetError, PlanCheckError  # noqa: E402
from planner.core.fileio import atomic_path, atomic_write_text  # noqa: E402
from planner.core.records import Unit  # noqa: E402
from planner.measure.profiler import profile_workload  # noqa: E402
from planner.measure.workload import build_workload, load_model_file  # noqa: E402
from planner.pipeline import plan_checked, profile_model_file  # noqa: E402
from planner.plan.memory_model import MemoryModel  # noqa: E402
from planner.plan.plan_file import Plan  # noqa: E402
from planner.solve import Solver  # noqa: E402
from planner.solve.planning import baseline_every_block  # noqa: E402

DEFAULT_MODELS = ["gpt", "mlp", "cnn", "hf_gpt2", "hf_llama", "hf_vit", "hf_t5"]
FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)
FLOOR_FRACTIONS = (0.0, 0.02, 0.05, 0.1)  # of the way from the smallest feasible budget
HF_CONFIG_FRACTIONS = (0.0, 0.02, 0.05, 0.1, 0.4, 0.8)
SWEEP_BUDGETS = 40
MIB = 2**20


def _percent(value: int, reference: int) -> float:
    return round(100 * (value - reference) / reference, 4) if reference else 0.0


def check_model(
    path: Path,
    fractions: tuple[float, ...] = FRACTIONS,
    floor_fractions: tuple[float, ...] = FLOOR_FRACTIONS,
) -> list[dict[str, object]]:
    model_file = load_model_file(path)
    started = time.perf_counter()
    profile = profile_model_file(model_file)  # fake memory, measured times
    profile_s = time.perf_counter() - started
    real = profile_workload(build_workload(model_file, seed=0))
    real_memory = MemoryModel(real.timeline).include_nesting(profile)
    memory = MemoryModel.for_profile(profile)
    solver = Solver(profile, memory)
    every_block = baseline_every_block(profile)
    # The way starts at every block checkpointed, as predicted, even where some blocks
    # cannot be (a model that fills a cache in its layers): the budgets a user would try.
    low, high = (
        memory.peak_bytes(Unit(block) for block in profile.block_names),
        profile.measured_peak_bytes,
    )
    monotone = predicted_peak_is_monotone(solver, high)
    plans: list[tuple[str, Plan, dict[str, object]]] = []
    _, lowest = solver.lowest_peak()
    budgets = [
        (f"ckpt-plan@{fraction:.2f}", int(low + fraction * (high - low))) for fraction in fractions
    ]
    budgets += [
        (f"ckpt-plan@floor+{100 * fraction:g}%", int(lowest + fraction * (high - lowest)))
        for fraction in floor_fractions
    ]
    for strategy, budget in budgets:
        try:
            result = plan_checked(profile, budget, model_path=path)
        except InfeasibleBudgetError as error:
            print(f"{strategy}: {error}", flush=True)
            continue
        profile = result.profile  # keeps modules excluded on the way
        started = time.perf_counter()
        solution = Solver(profile, memory).solve(budget)
        solve_ms = (time.perf_counter() - started) * 1000
        facts: dict[str, object] = {
            "solve_ms": round(solve_ms, 2),
            "proven_optimal": solution.proven_optimal,
            "tool_check": "passed" if result.check and result.check.passed else "failed",
        }
        plans.append((strategy, result.plan, facts))
    # The usual choice, judged against its own prediction (it may not train at all).
    every_block = dataclasses.replace(every_block, budget_bytes=every_block.predicted_peak_bytes)
    plans.insert(0, ("every-block", every_block, {}))
    rows = []
    for strategy, plan, facts in plans:
        on_real = real_memory.peak_bytes(plan.units)
        row: dict[str, object] = {
            "model": profile.model_name,
            "strategy": strategy,
            "modules": len(plan.modules),
            "budget_mib": round(plan.budget_bytes / MIB, 2),
            "unplanned_fake_mib": round(profile.measured_peak_bytes / MIB, 2),
            "unplanned_real_mib": round(real.measured_peak_bytes / MIB, 2),
            "unplanned_fake_vs_real_pct": _percent(
                profile.measured_peak_bytes, real.measured_peak_bytes
            ),
            "predicted_fake_mib": round(plan.predicted_peak_bytes / MIB, 2),
            "predicted_real_mib": round(on_real / MIB, 2),
            "plan_fake_vs_real_pct": _percent(plan.predicted_peak_bytes, on_real),
            "predicted_overhead_pct": round(100 * plan.predicted_overhead, 1),
            "profile_s": round(profile_s, 2),
            "monotone": monotone,
            **facts,
        }
        try:
            check = check_plan(path, plan, reference=CheckReference.UNPLANNED)
        except PlanCheckError as error:
            row.update(fits=False, note=f"fails: {error}"[:140])
            rows.append(row)
            print(row, flush=True)
            continue
        row.update(
            measured_unplanned_mib=round((check.unplanned_peak_bytes or 0) / MIB, 2),
            measured_peak_mib=round(check.measured_peak_bytes / MIB, 2),
            prediction_error_pct=_percent(plan.predicted_peak_bytes, check.measured_peak_bytes),
            fits=check.within_budget,
            loss_equal=check.loss_equal,
            gradients_equal=check.gradients_equal,
            buffers_equal=check.buffers_equal,
            state_dict_keys_equal=check.state_dict_keys_equal,
        )
        rows.append(row)
        print(row, flush=True)
    return rows


def predicted_peak_is_monotone(solver: Solver, unplanned_peak: int) -> bool:
    """Solve at SWEEP_BUDGETS budgets from the lowest feasible to the unplanned peak: as the
    budget shrinks, the predicted peak of the chosen plan must never rise."""
    _, lowest = solver.lowest_peak()
    step = max(1, (unplanned_peak - lowest) // (SWEEP_BUDGETS - 1))
    budgets = range(unplanned_peak, lowest - 1, -step)
    peaks = [solver.solve(budget).predicted_peak_bytes for budget in budgets]
    return all(later <= earlier for earlier, later in itertools.pairwise(peaks))


def check_hf_configs(count: int, seed: int, out: Path) -> int:
    """The memory model's property test at scale: predicted against measured peaks."""
    from tests.hf_configs import draw_configs, predicted_and_measured

    rows = []
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-hf-") as folder:
        for index, config in enumerate(draw_configs(count, seed)):
            for row in predicted_and_measured(
                config.write(Path(folder), index), HF_CONFIG_FRACTIONS
            ):
                rows.append({"config": index, "description": config.description, **row})
                print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    frame["error_pct"] = frame["error_pct"].round(5)
    with atomic_path(out / "hf_configs.csv") as temp_path:
        frame.to_csv(temp_path, index=False)
    atomic_write_text(out / "hf_configs.md", markdown_table(frame) + "\n")
    worst = frame["error_pct"].abs().max()
    over = int((frame["measured_bytes"] > frame["budget_bytes"]).sum())
    print(
        f"{count} configs x {len(HF_CONFIG_FRACTIONS)} budgets = {len(frame)} plans; "
        f"exact: {int((frame['predicted_bytes'] == frame['measured_bytes']).sum())}; "
        f"worst error {worst:.5f}%; measured over budget: {over}"
    )
    return 1 if worst > 0.1 or over else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    parser.add_argument(
        "--hf-configs", type=int, default=0, metavar="N", help="check N random small HF configs"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the random HF configs")
    parser.add_argument(
        "--fractions",
        type=lambda text: tuple(float(part) for part in text.split(",")),
        default=FRACTIONS,
        help="budgets, as fractions of the way from every block to the unplanned peak",
    )
    parser.add_argument(
        "--no-floor", action="store_true", help="skip the budgets near the smallest feasible"
    )
    arguments = parser.parse_args(argv)
    if arguments.hf_configs:
        return check_hf_configs(arguments.hf_configs, arguments.seed, arguments.out)
    paths = arguments.models or [ROOT / "examples" / f"{name}.py" for name in DEFAULT_MODELS]
    floor = () if arguments.no_floor else FLOOR_FRACTIONS
    rows = [row for path in paths for row in check_model(path, arguments.fractions, floor)]
    frame = pd.DataFrame(rows)
    with atomic_path(arguments.out / "plan_checks.csv") as temp_path:
        frame.to_csv(temp_path, index=False)
    atomic_write_text(arguments.out / "plan_checks.md", markdown_table(frame) + "\n")
    print(markdown_table(frame))
    ours = frame[frame.strategy.str.startswith("ckpt-plan")]
    bad = ours[
        ~(ours.fits & ours.loss_equal & ours.gradients_equal & ours.buffers_equal)
        | (ours.plan_fake_vs_real_pct.abs() > 0.1)
        | (ours.unplanned_fake_vs_real_pct.abs() > 0.1)
    ]
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
