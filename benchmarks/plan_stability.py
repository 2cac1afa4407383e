"""Plan stability and overhead accuracy: three `profile` runs per model choose the same modules,
and the overhead they print is the overhead measured.

    python benchmarks/plan_stability.py                  # the bundled examples
    python benchmarks/plan_stability.py --models gpt     # some of them

Per model, the budget is halfway between the peak with every block checkpointed (or the
smallest feasible peak, where some blocks cannot be checkpointed) and the unplanned peak
(from a fake-tensor profile). ``profile_and_plan`` (what `ckpt-plan profile`
runs: fake memory, times measured within the budget, the plan checked) runs ``--runs``
times; then each distinct plan and the unplanned step are timed on one model instance,
interleaved, ``--repeats`` rounds of one step each, and the measured overhead (per round,
the planned step over the unplanned one, minus one; the median over rounds, with its
interquartile range) is set against the printed one (``predicted_overhead``). The steps are
timed as the tool times its own (on the steady host allocator of
:mod:`planner.measure.host_allocator`), and again in a fresh process on glibc's own
allocator settings (``measured_glibc_defaults_pct``: what a training script that changes
nothing sees on this CPU, page faults included).
Writes reports/benchmarks/plan_stability.csv and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import halfway_budget, markdown_table  # noqa: E402
from planner.apply import apply_plan, remove_plan  # noqa: E402
from planner.core.fileio import atomic_path, atomic_write_text  # noqa: E402
from planner.measure.fake import build_fake_workload  # noqa: E402
from planner.measure.host_allocator import steady_host_allocator  # noqa: E402
from planner.measure.profiler import record_memory  # noqa: E402
from planner.measure.workload import build_workload, load_model_file, run_training_step  # noqa: E402
from planner.pipeline import profile_and_plan  # noqa: E402
from planner.plan.plan_file import load_plan, save_plan  # noqa: E402

DEFAULT_MODELS = ["gpt", "mlp", "cnn", "hf_gpt2", "hf_llama", "hf_vit", "hf_t5"]


def measured_step_ms(path: Path, plans: dict[str, object], repeats: int) -> dict[str, list[float]]:
    """Step times of each plan (None: unplanned), one per round of ``repeats`` rounds that
    run every plan once, in rotating order, after two warm-ups each.

    One model instance takes every plan in turn (applied before its step, removed after):
    two instances of one model can differ in step time by a few percent (where their
    memory landed), as much as a small plan's whole overhead."""
    model_file = load_model_file(path)
    workload = build_workload(model_file, seed=0)

    def step(plan: object, seed: int) -> float:
        if plan is not None:
            # No first-step guard: it would run inside this timed step, every step.
            apply_plan(workload.model, plan, guard=False)  # type: ignore[arg-type]
        started = time.perf_counter()
        run_training_step(workload, seed=seed)
        elapsed = (time.perf_counter() - started) * 1000
        remove_plan(workload.model)
        return elapsed

    for warmup in range(2):
        for plan in plans.values():
            step(plan, seed=warmup)
    times: dict[str, list[float]] = {name: [] for name in plans}
    for repeat in range(repeats):
        order = list(plans)
        for name in order[repeat % len(order) :] + order[: repeat % len(order)]:
            times[name].append(step(plans[name], seed=10 + repeat))
    return times


def measured_in_fresh_process(
    path: Path, plans: dict[str, object], repeats: int
) -> dict[str, list[float]]:
    """:func:`measured_step_ms` in a new Python process, on glibc's own allocator settings
    (this process's were changed by the tool's timing, for good)."""
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        for index, (name, plan) in enumerate(plans.items()):
            if plan is not None:
                paths[name] = str(save_plan(plan, Path(folder) / f"plan{index}.json"))  # type: ignore[arg-type]
        result = subprocess.run(
            [sys.executable, __file__, "--measure", str(path), str(repeats), json.dumps(paths)],
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(result.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def _measure_main(path: str, repeats: str, plan_paths: str) -> int:
    plans: dict[str, object] = {"none": None}
    plans.update({name: load_plan(file) for name, file in json.loads(plan_paths).items()})
    print(json.dumps(measured_step_ms(Path(path), plans, int(repeats))))
    return 0


def paired_overhead(planned: list[float], unplanned: list[float]) -> tuple[float, float]:
    """The overhead of a plan from rounds of interleaved steps: per round, its step over the
    unplanned step of the same round, less one (steps seconds apart: the machine's drift,
    which moves a median of either by several percent over a minute, cancels); the median
    over rounds, and the interquartile range (how much one round's figure varies)."""
    ratios = [p / u - 1 for p, u in zip(planned, unplanned, strict=True)]
    quartiles = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), quartiles[2] - quartiles[0]


def run_model(name: str, runs: int, repeats: int) -> dict[str, object]:
    path = ROOT / "examples" / f"{name}.py"
    workload, session = build_fake_workload(load_model_file(path))
    memory = record_memory(workload, session=session)
    budget = halfway_budget(memory)
    results = [profile_and_plan(path, budget) for _ in range(runs)]
    choices = [result.plan.module_names for result in results]
    distinct = {modules: result.plan for modules, result in zip(choices, results, strict=True)}
    plans: dict[str, object] = {"none": None}
    plans.update({" ".join(modules): plan for modules, plan in distinct.items()})
    # Measured as the tool times (planner.measure.host_allocator), and in a fresh process
    # on glibc's own settings, as a training script that changes nothing runs.
    with steady_host_allocator():
        times = measured_step_ms(path, plans, repeats)
    default_times = measured_in_fresh_process(path, plans, repeats)
    printed = [round(100 * result.plan.predicted_overhead, 1) for result in results]
    paired = {name: paired_overhead(times[name], times["none"]) for name in plans if name != "none"}
    measured = [round(100 * paired[" ".join(modules)][0], 1) for modules in choices]
    spread = [round(100 * paired[" ".join(modules)][1], 1) for modules in choices]
    ratios = [p / m if m else float("inf") for p, m in zip(printed, measured, strict=True)]
    default_paired = {
        name: paired_overhead(default_times[name], default_times["none"])
        for name in plans
        if name != "none"
    }
    measured_default = [round(100 * default_paired[" ".join(m)][0], 1) for m in choices]
    default_spread = [round(100 * default_paired[" ".join(m)][1], 1) for m in choices]
    row: dict[str, object] = {
        "model": name,
        "budget_mib": round(budget / 2**20, 2),
        "same_modules": len(distinct) == 1,
        "modules": " ".join(choices[0])
        if len(distinct) == 1
        else " | ".join(map(" ".join, distinct)),
        "printed_overhead_pct": " / ".join(map(str, printed)),
        "measured_overhead_pct": " / ".join(map(str, measured)),
        "measured_iqr_pct": " / ".join(map(str, spread)),
        "printed_over_measured": " / ".join(f"{r:.2f}" for r in ratios),
        "within_25pct": all(0.75 <= r <= 1.25 for r in ratios),
        "measured_glibc_defaults_pct": " / ".join(map(str, measured_default)),
        "glibc_defaults_iqr_pct": " / ".join(map(str, default_spread)),
        "unplanned_step_ms": round(statistics.median(times["none"]), 1),
        "checked": all(result.plan.checked for result in results),
    }
    print(row, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--measure"]:
        return _measure_main(*argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args(argv)
    frame = pd.DataFrame(
        [run_model(name, arguments.runs, arguments.repeats) for name in arguments.models]
    )
    arguments.out.mkdir(parents=True, exist_ok=True)
    with atomic_path(arguments.out / "plan_stability.csv") as temp_path:
        frame.to_csv(temp_path, index=False)
    atomic_write_text(arguments.out / "plan_stability.md", markdown_table(frame) + "\n")
    print(markdown_table(frame))
    return 0 if bool(frame.same_modules.all() and frame.within_25pct.all()) else 1


if __name__ == "__main__":
    sys.exit(main())
