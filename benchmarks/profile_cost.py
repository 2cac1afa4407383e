"""Profiling cost against one plain training step, measured side by side in one run.

    python benchmarks/profile_cost.py [MODEL.py]   # default: the 48-block GPT

Target (issue 3): profiling a 48-block model costs at most 3x one plain step's wall time,
after imports and warm-up. Prints the median plain step, the profiling stages after
warm-up, and the ratio. Repeats the whole comparison ``--repeats`` times, interleaved, and
reports medians, so machine drift hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner import profiler  # noqa: E402
from planner.memory_model import MemoryModel  # noqa: E402
from planner.workload import build_workload, load_model_file, run_training_step  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, default=ROOT / "benchmarks/models/gpt48.py")
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args(argv)
    model_file = load_model_file(arguments.model)
    plain_s, profile_s, candidates = [], [], 0
    for repeat in range(arguments.repeats):
        workload = build_workload(model_file, seed=0)
        for step in range(2):  # warm-up, as profile_workload does
            run_training_step(workload, seed=step)
        # Side by side: three plain steps, then the profiling stages after warm-up.
        for step in range(3):
            started = time.perf_counter()
            run_training_step(workload, seed=10 + step)
            plain_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        forward_ms = profiler._time_forward(workload, 1, 0, None)
        timeline, _ = profiler._record_step(workload, seed=0)
        modules = profiler._module_profiles(workload, timeline, forward_ms)
        MemoryModel(timeline)
        profile_s.append(time.perf_counter() - started)
        candidates = sum(module.is_candidate for module in modules)
        print(
            f"repeat {repeat}: plain steps {[round(s, 3) for s in plain_s[-3:]]} s, "
            f"profiling after warm-up {profile_s[-1]:.3f} s",
            flush=True,
        )
    plain, profile = statistics.median(plain_s), statistics.median(profile_s)
    print(
        f"{model_file.name}: {len(timeline.calls)} module calls, {candidates} candidates, "
        f"{timeline.event_count} events"
    )
    print(
        f"median plain step {plain * 1000:.0f} ms; median profiling after warm-up "
        f"{profile * 1000:.0f} ms; ratio {profile / plain:.2f}x (target <= 3x)"
    )
    return 0 if profile <= 3 * plain else 1


if __name__ == "__main__":
    sys.exit(main())
