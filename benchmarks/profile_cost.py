"""What profiling costs: time against a plain step, and memory against the budget.

    python benchmarks/profile_cost.py                 # both parts
    python benchmarks/profile_cost.py --part time     # the 48-block GPT only
    python benchmarks/profile_cost.py --part memory   # the bundled examples only

**time** (the 48-block GPT, as issue 3 measured it): the median plain training step against
the profiling stages after warm-up, all in one process, interleaved ``--repeats`` times:
the fake-tensor instrumented step (with the module table and the memory model), the same
step on fake tensors with nothing recorded (the floor of fake-tensor recording: fake
tensors' own dispatch, in Python, per op), and the
timing step (a real step with module hooks), against the all-real profile the tool used
before (a real instrumented step and a timed forward).

**memory** (every bundled example, at the budget halfway between the every-block peak and
the unplanned peak): the whole `profile` job (fake profile, timing, recomputation probe,
the plan's check in its own process), with

* the peak of live tensor storages in the job's process over the whole run (a storage
  watcher around all of it; fake tensors hold none) and in the check's process (its steps
  run under the budget as a limit);
* the largest resident set of any process of a `ckpt-plan profile` run (``ru_maxrss`` of
  its process tree), against the budget plus 1 GiB (the interpreter, torch and the
  libraries a run imports), and against a process that only imports torch and ckpt-plan.
Writes reports/benchmarks/profile_cost.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import halfway_budget, markdown_table, process_cost  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.measure import clock, profiler, recorder  # noqa: E402
from planner.measure.fake import build_fake_workload  # noqa: E402
from planner.measure.timing import measure_costs  # noqa: E402
from planner.measure.tracking import StorageWatcher  # noqa: E402
from planner.measure.workload import build_workload, load_model_file, run_training_step  # noqa: E402
from planner.pipeline import profile_and_plan  # noqa: E402
from planner.plan.memory_model import MemoryModel  # noqa: E402
from planner.solve.planning import build_plan  # noqa: E402

MIB = 2**20
EXAMPLES = ["gpt", "mlp", "cnn", "hf_gpt2", "hf_llama", "hf_vit", "hf_t5"]


def time_part(model: Path, repeats: int) -> str:
    model_file = load_model_file(model)
    plain_s: list[float] = []
    fake_s: list[float] = []
    bare_s: list[float] = []
    timing_s: list[float] = []
    real_s: list[float] = []
    for repeat in range(repeats):
        workload = build_workload(model_file, seed=0)
        for step in range(2):
            run_training_step(workload, seed=step)
        for step in range(3):
            started = time.perf_counter()
            run_training_step(workload, seed=10 + step)
            plain_s.append(time.perf_counter() - started)
        # The fake profile: warm-up (optimizer state) outside the clock, as before.
        fake_workload, session = build_fake_workload(model_file)
        with session.running():
            run_training_step(fake_workload, seed=0)
        # The floor of any fake-tensor recording: the same step on fake tensors, unrecorded.
        started = time.perf_counter()
        with session.running():
            run_training_step(fake_workload, seed=0)
        bare_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        with session.running():
            timeline, _ = recorder._record_step(fake_workload, seed=0)
        profiler._module_profiles(fake_workload.model, timeline, {}, MemoryModel(timeline))
        fake_s.append(time.perf_counter() - started)
        # The timing step (unplanned here: no budget), after its warm-up.
        memory_profile = profiler.record_memory(fake_workload, session=session, warmup_steps=0)
        started = time.perf_counter()
        measure_costs(
            model_file,
            memory_profile,
            build_plan(memory_profile, [], 0, strategy="t"),
            timing_steps=5,  # as the pipeline times
        )
        timing_s.append(time.perf_counter() - started)
        # The all-real profile it replaces.
        started = time.perf_counter()
        forward_ms = clock._time_forward(workload, 1, 0, None)
        real_timeline, _ = recorder._record_step(workload, seed=0)
        profiler._module_profiles(workload.model, real_timeline, forward_ms)
        real_s.append(time.perf_counter() - started)
        print(
            f"repeat {repeat}: plain {statistics.median(plain_s[-3:]):.3f} s, "
            f"fake unrecorded {bare_s[-1]:.3f} s, fake step "
            f"{fake_s[-1]:.3f} s, timing (build, 2 warm-up and 5 timed steps) "
            f"{timing_s[-1]:.3f} s, "
            f"all-real {real_s[-1]:.3f} s",
            flush=True,
        )
    plain = statistics.median(plain_s)
    rows = [
        ("plain training step (median)", plain, 1.0),
        ("fake instrumented step + module table", statistics.median(fake_s), None),
        ("the same step on fake tensors, nothing recorded", statistics.median(bare_s), None),
        ("timing: build + two warm-up and five timed steps", statistics.median(timing_s), None),
        (
            "all-real profile before (timed forward + real instrumented step)",
            statistics.median(real_s),
            None,
        ),
    ]
    frame = pd.DataFrame(
        [
            {
                "stage": stage,
                "median_s": round(seconds, 3),
                "x_plain_step": round(seconds / plain, 2),
            }
            for stage, seconds, _ in rows
        ]
    )
    events = len(timeline.calls)
    return (
        f"{model_file.name}: {events} module calls, {len(timeline.op_costs)} ops\n\n"
        + markdown_table(frame)
    )


def _max_rss_kib(command: list[str], cwd: Path) -> tuple[int, int, float]:
    """The largest resident set (KiB) of any process of ``command``'s tree, its exit code,
    and its wall time."""
    cost = process_cost(command, cwd)
    return cost.max_rss_kib, cost.code, cost.wall_s


def memory_part(names: list[str]) -> str:
    baseline_rss, _, _ = _max_rss_kib(
        [sys.executable, "-c", "import torch, planner.pipeline, planner.report, planner.cli.main"],
        ROOT,
    )
    cli = str(Path(sys.executable).parent / "ckpt-plan")
    rows = []
    for name in names:
        path = ROOT / "examples" / f"{name}.py"
        workload, session = build_fake_workload(load_model_file(path))
        memory = profiler.record_memory(workload, session=session)
        budget = halfway_budget(memory)
        watcher = StorageWatcher("cpu", real_only=True)
        with watcher:
            result = profile_and_plan(path, budget)
        check = result.check
        with tempfile.TemporaryDirectory() as folder:
            rss, code, seconds = _max_rss_kib(
                [cli, "profile", str(path), "--budget", str(budget)], Path(folder)
            )
        row = {
            "model": name,
            "budget_mib": round(budget / MIB, 2),
            "unplanned_mib": round(memory.measured_peak_bytes / MIB, 2),
            "job_process_peak_mib": round(watcher.peak_bytes / MIB, 2),
            "check_process_peak_mib": round(check.measured_peak_bytes / MIB, 2) if check else None,
            "within_budget": watcher.peak_bytes <= budget
            and (check is None or check.measured_peak_bytes <= budget),
            "cli_exit": code,
            "cli_s": round(seconds, 1),
            "max_rss_mib": round(rss / 1024, 1),
            "rss_over_import_mib": round((rss - baseline_rss) / 1024, 1),
            # The allowance: the budget plus the interpreter and torch (about 1 GiB).
            "rss_within_budget_plus_1GiB": rss * 1024 <= budget + 2**30,
        }
        print(row, flush=True)
        rows.append(row)
    header = (
        f"Baseline: a process importing torch and ckpt-plan has a resident set of "
        f"{baseline_rss / 1024:.0f} MiB.\n\n"
    )
    return header + markdown_table(pd.DataFrame(rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("time", "memory", "both"), default="both")
    parser.add_argument("--model", type=Path, default=ROOT / "benchmarks/models/gpt48.py")
    parser.add_argument("--models", nargs="*", default=EXAMPLES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args(argv)
    sections = []
    if arguments.part in ("time", "both"):
        sections.append("## Time\n\n" + time_part(arguments.model, arguments.repeats))
        print(sections[-1], flush=True)
    if arguments.part in ("memory", "both"):
        sections.append("## Memory\n\n" + memory_part(arguments.models))
        print(sections[-1], flush=True)
    text = "# Profiling cost\n\n" + "\n\n".join(sections) + "\n"
    if arguments.part == "both":
        atomic_write_text(arguments.out / "profile_cost.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
