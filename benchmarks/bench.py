"""ckpt-plan against the usual checkpointing choices, measured side by side.

    python benchmarks/bench.py              # the default set (make bench), about 10 minutes
    python benchmarks/bench.py --full       # more budgets and timing repeats
    python benchmarks/bench.py --models gpt hf_gpt2
    python benchmarks/bench.py --models cnn resnet --merge   # re-run two models' rows only

For each model file: profile it once (``profile_s``), build the baselines (no
checkpointing, every block, every 2nd block, sqrt(n) ``checkpoint_sequential`` segments where
the blocks are an ``nn.Sequential``) and solve ckpt-plan's plan at several budgets
(``solve_ms``): where checkpointing every block just fits, halfway from there to the
unplanned peak, and (``--full``) more. Then ONE fresh process per model measures every
distinct plan the same way: a workload per plan from the same seed, ``apply_plan``, a warm-up
step, one step under the live-storage tracker (``measured_peak_bytes``), one step under
``torch.utils.flop_counter.FlopCounterMode`` (forward, backward and recomputation FLOPs),
then ``--repeats`` timed steps per plan, interleaved plan by plan so machine drift hits all
alike (``step_ms`` is the median). ``overhead_pct`` and ``extra_flops_pct`` are relative to
no checkpointing in the same process.

Where ``torch.compile`` runs here, an extra row per model runs torch's own memory-budget
activation checkpointing (``torch._functorch.config.activation_memory_budget``) at the
halfway budget's ratio, timed the same way. Its peak cannot be measured by the storage
tracker (compiled kernels allocate outside the dispatcher), so it is left empty.

Writes reports/benchmarks/results.csv, results.md and results.png (atomically). With
``--merge`` the other models' rows are kept from the existing results.csv, and results.md
says which models this run re-measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from benchmarks.common import markdown_table, run_child  # noqa: E402
from planner.core.fileio import atomic_path, atomic_write_text  # noqa: E402
from planner.plan.plan_file import Plan, load_plan, save_plan  # noqa: E402

DEFAULT_MODELS = ["gpt", "mlp", "cnn", "resnet", "hf_gpt2", "hf_llama", "hf_vit", "hf_t5"]
COLUMNS = [
    "model",
    "strategy",
    "budget_bytes",
    "measured_peak_bytes",
    "predicted_peak_bytes",
    "fits",
    "step_ms",
    "overhead_pct",
    "extra_flops_pct",
    "profile_s",
    "solve_ms",
]


# -- parent: profile, solve, then hand every plan to one measuring process per model -------
def plan_model(path: Path, full: bool) -> tuple[list[dict[str, Any]], dict[str, Plan]]:
    from planner.measure.workload import load_model_file
    from planner.pipeline import plan_checked, profile_model_file
    from planner.solve import Solver
    from planner.solve.planning import baseline_plans

    started = time.perf_counter()
    profile = profile_model_file(load_model_file(path))
    profile_s = time.perf_counter() - started
    solver = Solver(profile)
    baselines = baseline_plans(profile)
    every = baselines["every-block"].predicted_peak_bytes
    unplanned = profile.measured_peak_bytes
    fractions = (0.0, 0.25, 0.5, 0.75) if full else (0.0, 0.5)
    budgets = {f"{int(f * 100)}%": int(every + f * (unplanned - every)) for f in fractions}
    plans: dict[str, Plan] = dict(baselines)
    rows = []
    for label, budget in budgets.items():
        # The plan the tool would write: solved, its modules' recomputation tried, and run
        # once in a separate process (plan_checked, as `ckpt-plan profile` does).
        result = plan_checked(profile, budget, model_path=path)
        profile = result.profile  # keeps modules excluded on the way
        started = time.perf_counter()
        Solver(profile, solver.memory).solve(budget)  # the solver's own time, fresh cache
        solve_ms = (time.perf_counter() - started) * 1000
        plan = result.plan
        plans[f"ckpt-plan@{label}"] = plan
        for strategy in [f"ckpt-plan@{label}", *baselines]:
            rows.append(
                {
                    "model": profile.model_name,
                    "strategy": strategy,
                    "budget_label": label,
                    "budget_bytes": budget,
                    "profile_s": round(profile_s, 2),
                    "solve_ms": round(solve_ms, 2) if strategy.startswith("ckpt-plan") else None,
                    "predicted_peak_bytes": plans[strategy].predicted_peak_bytes,
                    "plan": _describe(plans[strategy]),
                }
            )
    half = budgets["50%"]
    rows.append(
        {
            "model": profile.model_name,
            "strategy": "torch.compile memory budget",
            "budget_label": "50%",
            "budget_bytes": half,
            "profile_s": None,
            "solve_ms": None,
            "predicted_peak_bytes": None,
            # torch's knob is a fraction of the activation memory it may keep.
            "compile_budget": round(
                (half - profile.static_bytes) / max(1, unplanned - profile.static_bytes), 3
            ),
        }
    )
    return rows, plans


def _describe(plan: Plan) -> str:
    """What a plan wraps, short: ``blocks.0 blocks.2 blocks#3``."""
    names = [f"{d.module_name}#{d.segments}" if d.segments else d.module_name for d in plan.modules]
    text = " ".join(names) or "(nothing)"
    return text if len(text) <= 60 else f"{len(names)} modules: {text[:50]}..."


def targets(frame: pd.DataFrame) -> pd.DataFrame:
    """Issue 4's targets per model, from one run: at the every-block budget (0%) ckpt-plan's
    overhead is no higher than every-block's; at the halfway budget (50%) it is at most 0.6x
    every-block's. Both as step time and as extra FLOPs."""
    rows = []
    for model, group in frame.groupby("model", sort=False):
        every = group[(group.strategy == "every-block") & (group.budget_label == "0%")]
        if every.empty or pd.isna(every.iloc[0]["step_ms"]):
            continue
        every_time, every_flops = every.iloc[0]["overhead_pct"], every.iloc[0]["extra_flops_pct"]
        row: dict[str, Any] = {
            "model": model,
            "every_block_time_pct": every_time,
            "every_block_flops_pct": every_flops,
        }
        for label in ("0%", "50%"):
            ours = group[group.strategy == f"ckpt-plan@{label}"]
            if ours.empty:
                continue
            time_pct, flops_pct = ours.iloc[0]["overhead_pct"], ours.iloc[0]["extra_flops_pct"]
            row[f"ours@{label}_time_pct"] = time_pct
            row[f"ours@{label}_flops_pct"] = flops_pct
            if label == "50%":
                row["time_ratio@50%"] = round(time_pct / every_time, 2)
                row["flops_ratio@50%"] = round(flops_pct / every_flops, 2)
        row["meets@0%"] = bool(
            row.get("ours@0%_time_pct", 1e9) <= every_time
            and row.get("ours@0%_flops_pct", 1e9) <= every_flops
        )
        row["meets@50%"] = bool(
            row.get("time_ratio@50%", 1e9) <= 0.6 and row.get("flops_ratio@50%", 1e9) <= 0.6
        )
        rows.append(row)
    return pd.DataFrame(rows)


def measure_in_subprocess(
    path: Path, plans: dict[str, Plan], repeats: int, compile_budget: float, folder: Path
) -> dict[str, dict[str, Any]]:
    plan_paths = {}
    for name, plan in plans.items():
        plan_paths[name] = str(save_plan(plan, folder / f"{name.replace('/', '_')}.json"))
    spec = {
        "model": str(path),
        "plans": plan_paths,
        "repeats": repeats,
        "compile_budget": compile_budget,
    }
    measured, stderr = run_child(__file__, "--measure", spec, folder)
    if measured is None:
        raise RuntimeError(f"measuring {path.name} failed: {stderr.strip()[-2000:]}")
    return measured


# -- child: measure every plan of one model the same way, interleaved -------------------
def measure(spec_path: Path) -> None:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from planner.apply import apply_plan
    from planner.measure.step import measure_step
    from planner.measure.workload import build_workload, load_model_file, run_training_step

    spec = json.loads(spec_path.read_text())
    model_file = load_model_file(spec["model"])
    workloads = {}
    results: dict[str, dict[str, Any]] = {}
    for name, plan_path in spec["plans"].items():
        try:
            workload = build_workload(model_file, seed=0)
            apply_plan(workload.model, load_plan(plan_path))
            measured = measure_step(workload, seed=0)  # warm-up + one tracked step
            flops = FlopCounterMode(display=False)
            with flops:
                run_training_step(workload, seed=1)
        except Exception as error:
            results[name] = {"error": f"fails: {type(error).__name__}: {error}"[:160]}
            continue
        results[name] = {
            "measured_peak_bytes": measured.peak_bytes,
            "flops": flops.get_total_flops(),
            "times": [],
        }
        workloads[name] = workload
    compiled = None
    try:  # torch's own alternative, where torch.compile works on this machine
        import torch._functorch.config as functorch_config

        functorch_config.activation_memory_budget = float(spec["compile_budget"])
        workload = build_workload(model_file, seed=0)
        workload.model = torch.compile(workload.model)
        run_training_step(workload, seed=0)  # compiles
        run_training_step(workload, seed=1)
        compiled = workload
        results["torch.compile memory budget"] = {
            "measured_peak_bytes": None,
            "flops": None,
            "times": [],
        }
    except Exception as error:
        results["torch.compile memory budget"] = {"error": f"{type(error).__name__}: {error}"[:200]}
    for repeat in range(spec["repeats"]):
        order = list(workloads) + (["torch.compile memory budget"] if compiled else [])
        for name in order[repeat % len(order) :] + order[: repeat % len(order)]:
            workload = compiled if name == "torch.compile memory budget" else workloads[name]
            assert workload is not None
            started = time.perf_counter()
            run_training_step(workload, seed=100 + repeat)
            results[name]["times"].append((time.perf_counter() - started) * 1000)
    for entry in results.values():
        if "times" in entry:
            entry["step_ms"] = statistics.median(entry.pop("times")) if entry["times"] else None
    print(json.dumps(results))


# -- report ---------------------------------------------------------------------------------
def chart(frame: pd.DataFrame, path: Path) -> None:
    from matplotlib.figure import Figure

    models = list(dict.fromkeys(frame["model"]))
    figure = Figure(figsize=(11, 3.2 * ((len(models) + 2) // 3)), layout="constrained")
    for index, model in enumerate(models):
        axes = figure.add_subplot((len(models) + 2) // 3, 3, index + 1)
        rows = frame[(frame.model == model) & frame.measured_peak_bytes.notna()]
        rows = rows.drop_duplicates("strategy")
        for row in rows.itertuples():
            marker = "o" if str(row.strategy).startswith("ckpt-plan") else "s"
            axes.scatter(row.measured_peak_bytes / 2**20, row.overhead_pct, marker=marker)
            axes.annotate(
                str(row.strategy).replace("ckpt-plan@", "ours@"),
                (row.measured_peak_bytes / 2**20, row.overhead_pct),
                fontsize=7,
            )
        axes.set_title(model, fontsize=9)
        axes.set_xlabel("measured peak (MiB)")
        axes.set_ylabel("step time overhead (%)")
        axes.grid(alpha=0.3)
    figure.suptitle(
        "ckpt-plan vs the usual choices: measured peak memory vs step-time overhead (CPU)"
    )
    with atomic_path(path) as temp_path:
        figure.savefig(temp_path, format="png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other models' rows of the existing results.csv (re-run some models only)",
    )
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.measure:
        measure(arguments.measure)
        return 0
    import tempfile

    repeats = arguments.repeats or (31 if arguments.full else 25)
    names = arguments.models or DEFAULT_MODELS
    all_rows = []
    for name in names:
        path = ROOT / "examples" / f"{name}.py"
        print(f"[{name}] profiling and solving", flush=True)
        rows, plans = plan_model(path, arguments.full)
        compile_budget = next(r["compile_budget"] for r in rows if "compile_budget" in r)
        print(f"[{name}] measuring {len(plans)} plans in a separate process", flush=True)
        with tempfile.TemporaryDirectory() as folder:
            measured = measure_in_subprocess(path, plans, repeats, compile_budget, Path(folder))
        base = measured["none"]
        for row in rows:
            result = measured.get(row["strategy"], {})
            row["measured_peak_bytes"] = result.get("measured_peak_bytes")
            row["step_ms"] = round(result["step_ms"], 1) if result.get("step_ms") else None
            row["overhead_pct"] = (
                round(100 * (result["step_ms"] / base["step_ms"] - 1), 1)
                if result.get("step_ms")
                else None
            )
            row["extra_flops_pct"] = (
                round(100 * (result["flops"] / base["flops"] - 1), 1)
                if result.get("flops")
                else None
            )
            row["fits"] = (
                None
                if row["measured_peak_bytes"] is None
                else bool(row["measured_peak_bytes"] <= row["budget_bytes"])
            )
            if "error" in result:
                row["note"] = result["error"]
            all_rows.append(row)
    frame = pd.DataFrame(all_rows)
    preface = ""
    previous_path = arguments.out / "results.csv"
    if arguments.merge and previous_path.exists():
        previous = pd.read_csv(previous_path)
        kept = previous[~previous.model.isin(names)]
        frame = pd.concat([kept, frame], ignore_index=True)
        order = {model: index for index, model in enumerate([*DEFAULT_MODELS, *names])}
        frame = frame.sort_values("model", key=lambda m: m.map(order), kind="stable")
        preface = (
            f"Rows of {', '.join(names)} re-measured in this run (`bench.py --models "
            f"{' '.join(names)} --merge`); the other models' rows are from the previous run, "
            "kept as they were.\n\n"
        )
    ordered = frame[[*COLUMNS, *[c for c in frame.columns if c not in COLUMNS]]]
    arguments.out.mkdir(parents=True, exist_ok=True)
    with atomic_path(arguments.out / "results.csv") as temp_path:
        ordered.to_csv(temp_path, index=False)
    shown = ordered.drop(columns=[c for c in ("compile_budget",) if c in ordered.columns]).copy()
    for column in ("budget_bytes", "measured_peak_bytes", "predicted_peak_bytes"):
        shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else f"{v / 2**20:.2f} MiB")
    verdicts = targets(ordered)
    atomic_write_text(
        arguments.out / "results.md",
        preface
        + markdown_table(shown)
        + "\n\n## Targets (issue 4)\n\n"
        + markdown_table(verdicts)
        + "\n",
    )
    chart(ordered, arguments.out / "results.png")
    print(markdown_table(shown))
    print()
    print(markdown_table(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
