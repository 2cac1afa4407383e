"""CUDA kernels' scratch in the emulated CUDA step, against the H100 figures on record (CPU).

Reads the measurements of ``reports/benchmarks/cuda_gaps.md`` (unplanned steps) and
``cuda_plans.csv`` (plans made on the emulated step, run on the H100), both from torch 2.11 on
an H100 80GB without ``expandable_segments``, and predicts the same steps here on the
emulated CUDA step (``--target h100-80gb``), without and with the kernels' scratch
(:mod:`planner.measure.kernel_scratch`):

* per model, the unplanned step: predicted before and after, the measured allocated and
  requested peaks, and what the allocator charged beyond the rounded sizes (unsplit cached
  blocks, which ``expandable_segments:True``, the plans' assumption, removes);
* per model, the whole-module plan the emulated path chose at the recorded budget before the
  scratch was charged (the recorded run's: same module count and prediction), its prediction
  with the scratch, and the plan chosen now.

    python benchmarks/cuda_scratch.py

Writes reports/benchmarks/cuda_scratch.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import planner.measure.profiler as profiler  # noqa: E402
from benchmarks.common import markdown_table  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.core.records import Profile  # noqa: E402
from planner.measure.fake import build_fake_workload  # noqa: E402
from planner.measure.kernel_scratch import KernelScratch  # noqa: E402
from planner.measure.workload import load_model_file  # noqa: E402
from planner.plan.memory_model import MemoryModel  # noqa: E402
from planner.plan.targets import load_spec, roofline_costs  # noqa: E402
from planner.solve.planning import plan_for_budget  # noqa: E402

MODELS = {name: ROOT / "examples" / f"{name}.py" for name in ("gpt", "hf_gpt2", "hf_llama")}
REPORTS = ROOT / "reports" / "benchmarks"
MIB = 2**20


class _NoScratch(KernelScratch):
    """The step as recorded before the scratch was charged."""

    def charge(self, *args: object) -> int:
        return 0


def recorded_unplanned(name: str) -> dict[str, int]:
    """The unplanned step's figures of cuda_gaps.md's section for ``name``."""
    text = (REPORTS / "cuda_gaps.md").read_text(encoding="utf-8")
    section = text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]

    def figure(label: str) -> int:
        match = re.search(rf"- {label}[^:]*: (\d+) B", section)
        assert match, (name, label)
        return int(match.group(1))

    unsplit = sum(
        int(match.group(1))
        for match in re.finditer(r"^\| \w+ \| \d+ \| \d+ \| (\d+) \|$", section, re.MULTILINE)
    )
    return {
        "allocated": figure("measured max_memory_allocated"),
        "requested": figure("measured peak of requested bytes"),
        "reserved": figure("reserved peak"),
        "unsplit": unsplit,
    }


def emulated(path: Path, *, scratch: bool) -> Profile:
    """The emulated CUDA profile for the H100, whole modules only (the recorded plans'
    options), with or without the kernels' scratch."""
    spec = load_spec("h100-80gb")
    original = profiler.KernelScratch
    profiler.KernelScratch = KernelScratch if scratch else _NoScratch  # type: ignore[misc]
    try:
        workload, session = build_fake_workload(load_model_file(path), "cuda", emulate=True)
        profile = profiler.record_memory(
            workload, session=session, workspace_bytes=spec.workspace_bytes
        )
    finally:
        profiler.KernelScratch = original  # type: ignore[misc]
    profile = roofline_costs(profile, spec)
    whole = tuple(dataclasses.replace(record, options=()) for record in profile.modules)
    return dataclasses.replace(profile, modules=whole)


def run(name: str) -> tuple[dict[str, object], dict[str, object]]:
    before = emulated(MODELS[name], scratch=False)
    after = emulated(MODELS[name], scratch=True)
    step = recorded_unplanned(name)
    unplanned = {
        "model": name,
        "measured_allocated_B": step["allocated"],
        "measured_requested_B": step["requested"],
        "unsplit_blocks_B": step["unsplit"],
        "predicted_before_B": before.measured_peak_bytes,
        "predicted_after_B": after.measured_peak_bytes,
        "after_minus_measured_B": after.measured_peak_bytes - step["allocated"],
        "measured_reserved_B": step["reserved"],
    }
    plans = pd.read_csv(REPORTS / "cuda_plans.csv")
    row = plans[(plans.model == name) & (plans.made == "emulated")].iloc[0]
    budget = round(float(row.budget_mib) * MIB)
    old, _ = plan_for_budget(before, budget)
    old_after = MemoryModel(after.timeline).peak_bytes(old.units)
    new, _ = plan_for_budget(after, budget)
    plan = {
        "model": name,
        "budget_mib": row.budget_mib,
        "recorded_modules": int(row.modules),
        "recorded_predicted_mib": row.plan_predicted_mib,
        "recorded_measured_mib": row.plan_measured_mib,
        "old_plan_modules": len(old.modules),
        "old_predicted_before_mib": round(old.predicted_peak_bytes / MIB, 3),
        "old_predicted_after_mib": round(old_after / MIB, 3),
        "after_minus_measured_mib": round(old_after / MIB - float(row.plan_measured_mib), 3),
        "new_plan_modules": len(new.modules),
        "new_predicted_mib": round(new.predicted_peak_bytes / MIB, 3),
        "new_fits": new.predicted_peak_bytes <= budget,
    }
    print(unplanned, plan, sep="\n", flush=True)
    return unplanned, plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--out", type=Path, default=REPORTS)
    arguments = parser.parse_args(argv)
    results = [run(name) for name in arguments.models]
    unplanned = pd.DataFrame([u for u, _ in results])
    plans = pd.DataFrame([p for _, p in results])
    text = "\n".join(
        [
            "Predicted here on the emulated CUDA step (--target h100-80gb), against the H100",
            "figures on record (cuda_gaps.md, cuda_plans.csv: torch 2.11, no expandable",
            "segments). `python benchmarks/cuda_scratch.py`.",
            "",
            "## Unplanned steps",
            "",
            markdown_table(unplanned),
            "",
            "`unsplit_blocks_B`: the allocator's charges beyond the rounded sizes over the",
            "whole step (cuda_gaps.md's second table; at the peak at most that), which",
            "`expandable_segments:True` (the plans' assumption) removes; the predictions",
            "cannot include it.",
            "",
            "## The emulated whole-module plans at the recorded budgets",
            "",
            markdown_table(plans),
            "",
            "`old_*`: the plan the emulated step gave before its kernels' scratch was charged",
            "(for gpt and hf_gpt2 the recorded one: same module count and prediction);",
            "`after_minus_measured_mib`: its prediction with the scratch less the recorded",
            "measurement; `new_*`: the plan chosen now.",
            "",
        ]
    )
    arguments.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(arguments.out / "cuda_scratch.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
