"""Selective checkpointing options (policies and nesting) against whole-module plans.

    python benchmarks/selective.py                  # GPT, HF GPT-2, HF Llama; about 10 min
    python benchmarks/selective.py --models gpt --repeats 5

Per model file, on a fake-tensor profile with times measured here (as ``ckpt-plan profile``
makes it), and the same profile with roofline times for an H100 (``--target h100-80gb``,
less its host link: offloading is weighed by benchmarks/offload.py):

1. **Accuracy.** Plans with options at 5 budgets (10, 30, 50, 70 and 90% of the way from
   the smallest feasible peak to the unplanned peak), solved with either cost (the H100
   ones use more policies; their memory is this CPU's either way): the predicted peak
   against the peak measured in a separate process after ``apply_plan``, and loss,
   gradients and buffers against the unplanned step, bit for bit.
2. **Cost.** At the halfway budget (halfway from every block checkpointed to the unplanned
   peak) and at the tightest (the smallest budget a whole-module plan fits): (a) the
   module-only plan, (b) the plan with options, (c) torchtitan's rule on every block; each
   with its recomputed FLOPs (% of the unplanned step's forward and backward) and its
   measured step time (median of ``--repeats``, interleaved). With H100 roofline costs,
   the plans the solver makes for that device (memory is the same).
3. **A real size.** The Llama-3-8B config planned for an H100 (not run): recomputed FLOPs
   of the module-only plan and the plan with options at the halfway and tightest budgets.
4. **Floor.** The smallest feasible budget with options (nesting) against every block's
   peak, for every bundled example, and for the Llama-3-8B config.

Writes reports/benchmarks/selective.md (atomically) and prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import halfway_budget, markdown_table  # noqa: E402
from planner.apply import apply_plan  # noqa: E402
from planner.check.compare import check_plan  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.core.loop import PLAIN_LOOP  # noqa: E402
from planner.core.records import MemorySource, Profile, Unit  # noqa: E402
from planner.measure.workload import build_workload, load_model_file, run_training_step  # noqa: E402
from planner.pipeline import measure_profile_costs, record_step_memory  # noqa: E402
from planner.plan.memory_model import MemoryModel  # noqa: E402
from planner.plan.plan_file import Plan  # noqa: E402
from planner.plan.targets import DeviceSpec, load_spec, roofline_costs  # noqa: E402
from planner.solve import Solver  # noqa: E402
from planner.solve.planning import baseline_every_block, build_plan, plan_for_budget  # noqa: E402

MIB = 2**20
MODELS = ["gpt", "hf_gpt2", "hf_llama"]
FLOOR_MODELS = ["gpt", "mlp", "cnn", "resnet", "hf_gpt2", "hf_llama", "hf_vit", "hf_t5"]
FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)


def memory_profile(source: str, target: object = None) -> Profile:
    return record_step_memory(
        load_model_file(source),
        device="cpu",
        seed=0,
        memory=MemorySource.FAKE,
        budget_bytes=None,
        target=target,  # type: ignore[arg-type]
        loop=PLAIN_LOOP,
        progress=None,
    )


def recompute_flops(profile: Profile, units: tuple[Unit, ...]) -> int:
    total = 0
    for unit in units:
        record = profile.module(unit.module)
        option = unit.option
        total += record.option_cost(option).recompute_flops if option else record.forward_flops
    return total


def step_flops(profile: Profile) -> int:
    """Forward and backward FLOPs of the unplanned step, as recorded."""
    return sum(op.flops for op in profile.timeline.op_costs)


def label(units: tuple[Unit, ...]) -> str:
    options: dict[str, int] = {}
    for unit in units:
        key = unit.option or "whole"
        options[key] = options.get(key, 0) + 1
    return ", ".join(f"{count} {key}" for key, count in sorted(options.items())) or "none"


def timed_steps(source: str, plans: dict[str, Plan], repeats: int) -> dict[str, float]:
    """Median step ms per plan, the plans' steps interleaved round by round."""
    model_file = load_model_file(source)
    workloads = {}
    for name, plan in plans.items():
        workload = build_workload(model_file, device="cpu", seed=0)
        apply_plan(workload.model, plan, guard=False)
        run_training_step(workload, seed=1)  # warm-up: optimizer state
        workloads[name] = workload
    samples: dict[str, list[float]] = {name: [] for name in plans}
    for round_ in range(repeats):
        for name, workload in workloads.items():
            begin = time.perf_counter()
            run_training_step(workload, seed=2 + round_)
            samples[name].append((time.perf_counter() - begin) * 1000)
    return {name: statistics.median(values) for name, values in samples.items()}


def accuracy_rows(source: str, profile: Profile, costs: str) -> list[dict[str, object]]:
    solver = Solver(profile)
    _, lowest = solver.lowest_peak()
    rows = []
    for fraction in FRACTIONS:
        budget = int(lowest + (profile.measured_peak_bytes - lowest) * fraction)
        plan, _ = plan_for_budget(profile, budget, solver=solver)
        check = check_plan(ROOT / "examples" / f"{source}.py", plan)
        error = (check.measured_peak_bytes - plan.predicted_peak_bytes) / plan.predicted_peak_bytes
        rows.append(
            {
                "model": source,
                "costs": costs,
                "budget_MiB": round(budget / MIB, 2),
                "plan": label(plan.units),
                "predicted_MiB": round(plan.predicted_peak_bytes / MIB, 3),
                "measured_MiB": round(check.measured_peak_bytes / MIB, 3),
                "error_pct": round(100 * error, 4),
                "fits": check.measured_peak_bytes <= budget,
                "identical": check.loss_equal and check.gradients_equal and check.buffers_equal,
            }
        )
    return rows


def uniform(profile: Profile, option: str) -> tuple[Unit, ...]:
    return tuple(
        Unit(block, option=option)
        for block in profile.block_names
        if any(o.option == option for o in profile.module(block).options)
    )


def cost_rows(
    source: str, measured: Profile, roofline: Profile, repeats: int
) -> list[dict[str, object]]:
    memory = MemoryModel.for_profile(measured)
    every_block = baseline_every_block(measured).predicted_peak_bytes
    _, tightest = Solver(measured, options=False).lowest_peak()
    budgets = {"halfway": halfway_budget(measured), "tightest": max(tightest, every_block)}
    total = step_flops(measured)
    plans: dict[str, Plan] = {}
    rows = []
    for costs_name, profile in (("measured here", measured), ("h100 roofline", roofline)):
        module_only, with_options = Solver(profile, options=False), Solver(profile)
        for budget_name, budget in budgets.items():
            titan = uniform(profile, "torchtitan")
            candidates = {
                "(a) module-only": module_only.solve(budget).units,
                "(b) with options": with_options.solve(budget).units,
                "(c) torchtitan, every block": titan,
            }
            for name, units in candidates.items():
                key = f"{costs_name}|{budget_name}|{name}"
                plan = build_plan(measured, units, budget, strategy=name, memory=memory)
                plans[key] = plan
                rows.append(
                    {
                        "model": source,
                        "costs": costs_name,
                        "budget": f"{budget_name} {budget / MIB:.2f} MiB",
                        "plan": name,
                        "units": label(units),
                        "predicted_MiB": round(plan.predicted_peak_bytes / MIB, 2),
                        "fits": plan.predicted_peak_bytes <= budget,
                        "extra_flops_pct": round(100 * recompute_flops(profile, units) / total, 1),
                        "predicted_extra_ms": round(
                            Solver(profile).cost(units), 3 if costs_name == "h100 roofline" else 1
                        ),
                        "_key": key,
                    }
                )
    times = timed_steps(str(ROOT / "examples" / f"{source}.py"), plans, repeats)
    base = timed_steps(str(ROOT / "examples" / f"{source}.py"), {"none": _empty(measured)}, repeats)
    for row in rows:
        row["step_ms_here"] = round(times[str(row.pop("_key"))], 1)
        row["unplanned_step_ms"] = round(base["none"], 1)
    return rows


def _empty(profile: Profile) -> Plan:
    return build_plan(profile, [], 0, strategy="none")


def h100_without_host_link() -> DeviceSpec:
    """The built-in H100 spec less its host link: this benchmark weighs recomputation
    options against whole modules, so no module is offered offloading (benchmarks/offload.py
    weighs that)."""
    return dataclasses.replace(load_spec("h100-80gb"), host_link_bytes_per_s=0.0)


def large_model_rows() -> list[dict[str, object]]:
    """The Llama-3-8B config planned for an H100 (not run: FLOPs and roofline time only)."""
    h100 = h100_without_host_link()
    source = "hf:examples/configs/llama-3-8b.json?batch_size=1&seq_len=4096&dtype=bfloat16"
    profile = roofline_costs(memory_profile(source, h100), h100)
    total = step_flops(profile)
    _, tightest = Solver(profile, options=False).lowest_peak()
    budgets = {"halfway": halfway_budget(profile), "tightest": tightest}
    rows = []
    for budget_name, budget in budgets.items():
        for name, solver in (
            ("(a) module-only", Solver(profile, options=False)),
            ("(b) with options", Solver(profile)),
        ):
            solution = solver.solve(budget)
            rows.append(
                {
                    "budget": f"{budget_name} {budget / 2**30:.2f} GiB",
                    "plan": name,
                    "units": label(solution.units),
                    "predicted_GiB": round(solution.predicted_peak_bytes / 2**30, 2),
                    "extra_flops_pct": round(
                        100 * recompute_flops(profile, solution.units) / total, 1
                    ),
                    "predicted_extra_ms": round(solution.recompute_ms, 1),
                }
            )
    return rows


def floor_rows() -> list[dict[str, object]]:
    rows = []
    sources = [str(ROOT / "examples" / f"{name}.py") for name in FLOOR_MODELS]
    sources.append("hf:examples/configs/llama-3-8b.json?batch_size=1&seq_len=4096&dtype=bfloat16")
    for source in sources:
        target = h100_without_host_link() if source.startswith("hf:") else None
        profile = memory_profile(source, target)
        every_block = MemoryModel(profile.timeline).peak_bytes(
            [Unit(b) for b in profile.block_names if profile.module(b).is_candidate]
        )
        _, module_floor = Solver(profile, options=False).lowest_peak()
        units, floor = Solver(profile).lowest_peak()
        rows.append(
            {
                "model": Path(source).stem if not source.startswith("hf:") else "llama-3-8b (h100)",
                "every_block_MiB": round(every_block / MIB, 2),
                "module_only_floor_MiB": round(module_floor / MIB, 2),
                "floor_with_options_MiB": round(floor / MIB, 2),
                "lower_than_every_block_pct": round(100 * (1 - floor / every_block), 1),
                "floor_plan": label(units),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--repeats", type=int, default=7)
    arguments = parser.parse_args()
    h100 = h100_without_host_link()
    accuracy, costs = [], []
    for name in arguments.models:
        source = str(ROOT / "examples" / f"{name}.py")
        memory = memory_profile(source)
        measured = measure_profile_costs(load_model_file(source), memory)
        roofline = roofline_costs(memory, h100)
        accuracy += accuracy_rows(name, measured, "measured here")
        # Plans made with H100 roofline costs use more policies; their memory is the same
        # on this CPU, so they are measured here too.
        accuracy += accuracy_rows(name, roofline, "h100 roofline")
        costs += cost_rows(name, measured, roofline, arguments.repeats)
        print(f"{name}: done", flush=True)
    floors = floor_rows()
    large = large_model_rows()
    text = "\n\n".join(
        [
            "# Selective checkpointing options\n\nWritten by `benchmarks/selective.py`.",
            "## Predicted against measured peak, plans with options\n\n"
            + markdown_table(pd.DataFrame(accuracy)),
            "## Module-only, with options, torchtitan on every block\n\n"
            + markdown_table(pd.DataFrame(costs)),
            "## Llama-3-8B config for an H100 (planned here, not run; roofline costs)\n\n"
            + markdown_table(pd.DataFrame(large)),
            "## Smallest feasible budget: with options (nesting) against every block\n\n"
            + markdown_table(pd.DataFrame(floors)),
        ]
    )
    path = ROOT / "reports" / "benchmarks" / "selective.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text + "\n")
    print(text)


if __name__ == "__main__":
    main()
