"""The framework recipes (examples/recipes/), measured: each recipe's plan, then its training
run with and without the plan, the peak of each run measured by an independent tracker.

    python benchmarks/recipes.py                          # every recipe, 3 steps per run
    python benchmarks/recipes.py --recipes hf_trainer     # some of them

A run is the recipe's whole ``train()``: building the model, the framework's set-up and every
step, inside the tracker, so the peak is of everything the run allocates (the framework's
own tensors, the copies its data loader makes of the batches) and covers the steady-state
steps after the first; the batches themselves are made before it. Two trackers:
``storage`` is the project's definition of the budget on CPU (live tensor storages, seen
through the dispatcher: ``PeakMemoryTracker``); ``allocator`` is the CPU allocator's
accounting (``AllocatorPeakTracker``), which also sees ``torch.compile``'s kernels (under
the storage tracker's dispatch mode dynamo does not run compiled code, so compiled runs have
only this one) and the RNG state that checkpoint stashes. Plans are made as a user makes
them: ``profile_and_plan`` with its check. Writes reports/benchmarks/recipes.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import markdown_table  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.core.units import format_bytes  # noqa: E402
from planner.measure.tracking import AllocatorPeakTracker, PeakMemoryTracker  # noqa: E402

RECIPES = ROOT / "examples" / "recipes"
# (run name, planned, train() options, trackers) per recipe.
RUNS: dict[str, list[tuple[str, bool, dict[str, Any], tuple[str, ...]]]] = {
    "hf_trainer": [
        ("Trainer, planned", True, {}, ("storage", "allocator")),
        ("Trainer, no plan", False, {}, ("storage", "allocator")),
    ],
    "lightning_module": [
        ("Lightning, planned (plain-loop plan)", True, {}, ("storage", "allocator")),
        (
            "Lightning, planned, gradients zeroed before the forward",
            True,
            {"zero_grad_before_forward": True},
            ("storage", "allocator"),
        ),
        ("Lightning, no plan", False, {}, ("storage", "allocator")),
    ],
    "accelerate_loop": [
        ("accelerate, planned", True, {}, ("storage", "allocator")),
        ("accelerate, no plan", False, {}, ("storage", "allocator")),
    ],
    "compiled_loop": [
        ("eager, planned", True, {"compile": False}, ("storage", "allocator")),
        ("eager, no plan", False, {"compile": False}, ("storage", "allocator")),
        ("compiled, planned", True, {}, ("allocator",)),
        ("compiled, no plan", False, {}, ("allocator",)),
    ],
}


def load_recipe(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measured_run(
    recipe: ModuleType, plan: Any, options: dict[str, Any], tracker_name: str, steps: int
) -> tuple[int, list[float]]:
    """The peak of one whole ``train()`` run (its batches made before, not counted) and its
    losses."""
    batches = recipe.make_batches(steps)
    data = [tensor for batch in batches for tensor in batch.values()]
    tracker = (
        PeakMemoryTracker("cpu", ignore=data)
        if tracker_name == "storage"
        else AllocatorPeakTracker()
    )
    with tracker:
        losses = recipe.train(plan, batches, **options)
    return tracker.peak_bytes, losses


def run_recipe(name: str, steps: int) -> list[dict[str, object]]:
    recipe = load_recipe(name)
    plan = recipe.make_plan()
    rows: list[dict[str, object]] = []
    losses_by_run: dict[tuple[bool, str], list[float]] = {}
    for run, planned, options, trackers in RUNS[name]:
        for tracker_name in trackers:
            peak, losses = measured_run(
                recipe, plan if planned else None, options, tracker_name, steps
            )
            print(f"{name}: {run}, {tracker_name}: {format_bytes(peak)}", file=sys.stderr)
            losses_by_run.setdefault((planned, str(options.get("compile", True))), losses)
            rows.append(
                {
                    "recipe": name,
                    "model": Path(recipe.MODEL_FILE).stem,
                    "budget": format_bytes(recipe.BUDGET_BYTES),
                    "planned for": format_bytes(plan.budget_bytes),
                    "predicted (eager)": format_bytes(plan.predicted_peak_bytes),
                    "run": run,
                    "tracker": tracker_name,
                    "measured peak": format_bytes(peak),
                    "vs budget": f"{peak - recipe.BUDGET_BYTES:+,} bytes",
                    "peak_bytes": peak,
                    "budget_bytes": recipe.BUDGET_BYTES,
                    "losses": losses,
                    "mode": str(options.get("compile", True)),
                    "planned": planned,
                    "plan modules": ", ".join(plan.module_names),
                }
            )
    for row in rows:  # each run's losses against the unplanned run's of the same mode
        unplanned = losses_by_run.get((False, str(row["mode"])))
        row["losses equal no plan's"] = row["losses"] == unplanned
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="*", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks" / "recipes.md")
    arguments = parser.parse_args()
    rows = [row for name in arguments.recipes for row in run_recipe(name, arguments.steps)]
    frame = pd.DataFrame(rows)
    shown = frame[
        [
            "recipe",
            "model",
            "budget",
            "planned for",
            "predicted (eager)",
            "run",
            "tracker",
            "measured peak",
            "vs budget",
            "losses equal no plan's",
        ]
    ]
    import torch

    text = "\n\n".join(
        [
            "# Framework recipes, measured",
            f"`python benchmarks/recipes.py --steps {arguments.steps}` (torch {torch.__version__}, "
            "CPU). Each run is the recipe's whole `train()` (model built, framework set up, "
            f"{arguments.steps} steps) inside the tracker; `storage`: live tensor storages (the "
            "budget's definition on CPU), `allocator`: the CPU allocator's accounting "
            "(compiled kernels and checkpoint's RNG stash included). Losses are compared with "
            "the unplanned run of the same recipe and mode (eager or compiled), step for step.",
            markdown_table(shown),
            "Each recipe's plan (one per recipe, made by its `make_plan()`; plans of one model "
            "differ between runs where timing noise changes the cheapest set):",
            "\n".join(
                f"- {name}: {modules}"
                for name, modules in frame.groupby("recipe", sort=False)["plan modules"]
                .first()
                .items()
            ),
        ]
    )
    atomic_write_text(arguments.out, text + "\n")
    print(text)


if __name__ == "__main__":
    main()
