"""Why times are taken on a host allocator that keeps freed memory: step times and page
faults of unplanned training steps, glibc's defaults against ``steady_host_allocator``.

    python benchmarks/host_allocator.py                    # ViT and MLP examples
    python benchmarks/host_allocator.py --models gpt --steps 20

Per model and allocator, a fresh process (glibc's settings are per process, and its own
adjustment cannot be undone) builds the model and runs ``--steps`` training steps, each
timed and its minor page faults counted (``getrusage``). Reported: the first steps one by
one, and over the steps from the third on (the timing of ``ckpt-plan profile`` starts
after two warm-up steps) the median, the spread (max - min) and the faults.
Writes reports/benchmarks/host_allocator.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import markdown_table  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402

_STEPS = """
import contextlib, json, resource, sys, time
from planner.measure.host_allocator import steady_host_allocator
from planner.measure.workload import build_workload, load_model_file, run_training_step
path, steps, steady = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "steady"
workload = build_workload(load_model_file(path), seed=0)
rows = []
with steady_host_allocator() if steady else contextlib.nullcontext():
    for step in range(steps):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        run_training_step(workload, seed=step)
        ms = (time.perf_counter() - started) * 1000
        rows.append((ms, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))
print(json.dumps(rows))
"""


def run(model: str, steps: int, allocator: str) -> list[tuple[float, int]]:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _STEPS,
            str(ROOT / "examples" / f"{model}.py"),
            str(steps),
            allocator,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [tuple(row) for row in json.loads(result.stdout.splitlines()[-1])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["hf_vit", "mlp"])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args(argv)
    rows = []
    for model in arguments.models:
        for allocator in ("glibc defaults", "steady"):
            steps = run(model, arguments.steps, allocator.split()[0])
            later = steps[2:]
            times = [ms for ms, _ in later]
            row = {
                "model": model,
                "allocator": allocator,
                "first_steps_ms": " ".join(f"{ms:.0f}" for ms, _ in steps[:4]),
                "median_ms_from_step_3": round(statistics.median(times), 1),
                "spread_ms_from_step_3": round(max(times) - min(times), 1),
                "spread_pct": round(100 * (max(times) - min(times)) / statistics.median(times), 1),
                "median_faults_from_step_3": int(statistics.median(f for _, f in later)),
                "max_faults_from_step_3": max(f for _, f in later),
            }
            print(row, flush=True)
            rows.append(row)
    table = markdown_table(pd.DataFrame(rows))
    text = (
        "# Host allocator: glibc's defaults against the steady allocator of the timing\n\n"
        f"Written by `benchmarks/host_allocator.py` ({arguments.steps} unplanned steps per "
        "process, one process per row).\n\n" + table + "\n"
    )
    atomic_write_text(arguments.out / "host_allocator.md", text)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
