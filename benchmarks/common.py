"""Shared by the benchmark scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from planner.core.records import Profile


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table; missing values are empty cells. (pandas' own to_markdown
    needs an extra package.)"""
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = [
        "| " + " | ".join("" if pd.isna(v) else str(v) for v in row) + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join([header, rule, *body])


def plan_text(decisions: list[dict]) -> str:
    """A plan JSON's decisions, blocks grouped by how: ``32 x model.layers.N.mlp
    (checkpoint)``."""
    import re

    groups: dict[str, int] = {}
    for decision in decisions:
        name = re.sub(r"\.\d+(\.|$)", r".N\1", decision["module_name"])
        how = decision.get("policy") or decision.get("method", "checkpoint")
        key = f"{name} ({how})"
        groups[key] = groups.get(key, 0) + 1
    return "; ".join(f"{count} x {key}" for key, count in groups.items())


def halfway_budget(profile: Profile) -> int:
    """Halfway from the peak with every block checkpointed (or, where some blocks cannot be,
    the smallest feasible peak: T5's decoder) to the unplanned peak."""
    from planner.core.records import Unit
    from planner.plan.memory_model import MemoryModel
    from planner.solve import Solver

    model = MemoryModel.for_profile(profile)
    _, lowest = Solver(profile, model).lowest_peak()
    low = max(model.peak_bytes(Unit(block) for block in profile.block_names), lowest)
    return (low + profile.measured_peak_bytes) // 2


@dataclass(frozen=True)
class ProcessCost:
    """What a command cost: exit code, wall and CPU seconds (user + system, of its whole
    process tree), and the largest resident set of any process of that tree."""

    code: int
    wall_s: float
    cpu_s: float
    max_rss_kib: int
    stderr: str


def process_cost(command: list[str], cwd: Path) -> ProcessCost:
    """Run ``command`` in a fresh helper process (so that ``RUSAGE_CHILDREN`` holds only
    its tree) and return what it cost."""
    helper = (
        "import json, resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "run = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "wall = time.perf_counter() - t\n"
        "use = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(json.dumps([run.returncode, wall, use.ru_utime + use.ru_stime,"
        " use.ru_maxrss, run.stderr]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", helper, *command],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    code, wall, cpu, rss, stderr = json.loads(result.stdout)
    return ProcessCost(int(code), float(wall), float(cpu), int(rss), str(stderr))


def run_child(script: str, flag: str, spec: dict, folder: Path) -> tuple[dict | None, str]:
    """Run ``script`` in a fresh Python with ``flag SPEC.json`` (``spec`` written to
    ``folder``), the repository on its path; its last stdout line that is a JSON object,
    or None where it failed or printed none, and its stderr."""
    from planner.core.fileio import atomic_write_text

    root = Path(__file__).resolve().parent.parent
    spec_path = folder / "spec.json"
    atomic_write_text(spec_path, json.dumps(spec))
    result = subprocess.run(
        [sys.executable, script, flag, str(spec_path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(root)),
        check=False,
        timeout=3600,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        return None, result.stderr
    return json.loads(lines[-1]), result.stderr
