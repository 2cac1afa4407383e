"""How often the plan check on real ranks passes (issue #32): consecutive runs of

    ckpt-plan profile benchmarks/models/tiny_llama.py --budget 26MiB --world-size 2 --parallel fsdp2

each a fresh process, as a user runs it: the rank-memory simulation, the plan, then the check
on 2 gloo ranks under torchrun (planner.check.ranks). Recorded per run: the exit code, the
wall time, and the measured peak (highest of the 2 ranks) or the one-line error. Runs with
--verbose, so a failed run's log has its ranks' tracebacks and torchrun's output: its last
lines are kept in the report.

The cause of the intermittent failure (planner/check/ranks.py, design note "a rank's exit")
is measured beside it: a 15-line FSDP2 script on 2 gloo ranks under torchrun, launched
``--teardown-launches`` times ending as a script does (``destroy_process_group()``, then
return) and as many times ending with ``os._exit`` as each rank of the check now does;
counted, the launches that failed, and of them those where a rank aborted after printing its
last line (its work done, only the interpreter's exit left).

    python benchmarks/rank_check_reliability.py                  # 30 runs, 40 + 40 launches
    python benchmarks/rank_check_reliability.py --runs 5 --teardown-launches 0

Writes reports/benchmarks/rank_check_reliability.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import markdown_table  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402

MODEL = ROOT / "benchmarks" / "models" / "tiny_llama.py"
_MEASURED = re.compile(r"measured peak with plan \(highest of (\d+) ranks\)\s+(\S+ \S+)")
_KEPT_LINES = 30  # of a failed run's log


def profile_once(model: Path, budget: str, folder: Path) -> dict[str, object]:
    """One ``ckpt-plan profile`` run in a fresh process; what it printed, summarized."""
    command = [
        sys.executable,
        "-m",
        "planner.cli.main",
        "profile",
        str(model),
        "--budget",
        budget,
        "--world-size",
        "2",
        "--parallel",
        "fsdp2",
        "--out",
        str(folder / "plan.json"),
        "--report-dir",
        str(folder / "report"),
        "--verbose",
    ]
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    begin = time.perf_counter()
    result = subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, check=False
    )
    wall_s = time.perf_counter() - begin
    measured = _MEASURED.search(result.stdout)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    return {
        "exit code": result.returncode,
        "wall (s)": round(wall_s, 1),
        "result": (
            f"measured {measured[2]} (highest of {measured[1]} ranks)"
            if result.returncode == 0 and measured
            else (errors[-1] if errors else f"exit {result.returncode}")
        ),
        "log": result.stderr,
    }


# One rank of the teardown probe: FSDP2 over gloo, a few steps, destroy_process_group(), a
# last line on stderr; then it returns (``exit``) or ends with os._exit (``os._exit``).
_TEARDOWN = """
import os, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2,))
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
for _ in range(3):
    model(torch.randn(64, 256)).sum().backward()
del model, mesh
dist.destroy_process_group()
print("done", file=sys.stderr, flush=True)
if sys.argv[1] == "os._exit":
    os._exit(0)
"""


def _aborted_after_last_line(stderr: str) -> bool:
    """Whether a rank printed "terminate called ..." after its own "done" (its work over)."""
    lines = stderr.splitlines()
    for rank in (0, 1):
        prefix = f"[default{rank}]:"
        own = [line.removeprefix(prefix) for line in lines if line.startswith(prefix)]
        if "done" in own and any(
            line.startswith("terminate called") for line in own[own.index("done") :]
        ):
            return True
    return False


def teardown_launches(ending: str, launches: int) -> dict[str, object]:
    """``launches`` torchrun launches of the teardown probe ending as ``ending`` says: how
    many failed, and how (torchrun's one line for each)."""
    from planner.check.ranks import torchrun_failure

    failures = []
    aborts = after_work = 0
    begin = time.perf_counter()
    for _ in range(launches):
        with tempfile.TemporaryDirectory(prefix="ckpt-plan-teardown-") as folder:
            script = Path(folder) / "teardown.py"
            script.write_text(_TEARDOWN)
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node=2",
                    "--tee=3",  # each rank's lines prefixed "[default<rank>]:"
                    f"--log-dir={Path(folder) / 'logs'}",
                    str(script),
                    ending,
                ],
                env=dict(os.environ, OMP_NUM_THREADS="1"),
                capture_output=True,
                text=True,
                check=False,
            )
        if result.returncode != 0:
            failures.append(torchrun_failure(result.stderr))
            aborts += "terminate called without an active exception" in result.stderr
            after_work += _aborted_after_last_line(result.stderr)
    return {
        "ending": f"`{ending}`",
        "launches": launches,
        "failed": len(failures),
        "of them a rank's abort after its last line": after_work,
        "'terminate called without an active exception'": aborts,
        "how (torchrun)": "; ".join(sorted(set(failures))),
        "wall (s)": round(time.perf_counter() - begin),
    }


def report(
    rows: list[dict[str, object]],
    teardown: list[dict[str, object]],
    command: str,
    started: str,
    total_s: float,
) -> str:
    frame = pd.DataFrame(rows)
    passed = int((frame["exit code"] == 0).sum())
    walls = [float(wall) for wall in frame["wall (s)"]]
    lines = [
        "# The plan check on real ranks, run after run",
        "",
        "Written by `benchmarks/rank_check_reliability.py` (issue #32).",
        "",
        f"    {command}",
        "",
        f"- **{passed} of {len(rows)} runs passed** (exit code 0: the plan made and checked "
        "on 2 gloo ranks under torchrun).",
        f"- Wall time: {total_s:.0f} s for the {len(rows)} runs; per run median "
        f"{statistics.median(walls):.1f} s (min {min(walls):.1f}, max {max(walls):.1f}).",
        f"- Started {started} on {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}.",
        "",
        markdown_table(
            frame.drop(columns=["log"])
            .rename_axis("run")
            .reset_index()
            .assign(run=lambda table: table["run"] + 1)
        ),
    ]
    if teardown:
        lines += [
            "",
            "## The cause: gloo's threads at a rank's exit",
            "",
            "Once FSDP2 has run, the gloo group's threads outlive `destroy_process_group()` and "
            "a rank can abort as the interpreter finalizes, after its work (planner/check/"
            'ranks.py, design note "a rank\'s exit"). A 15-line FSDP2 script on 2 gloo ranks, '
            "ending as a script does and as each rank of the check now does (`os._exit` once "
            "its result is written):",
            "",
            markdown_table(pd.DataFrame(teardown)),
        ]
    for index, row in enumerate(rows, start=1):
        if row["exit code"] != 0:
            log = str(row["log"]).rstrip().splitlines()[-_KEPT_LINES:]
            lines += ["", f"## Run {index}: the last {len(log)} lines of its log", "", "```"]
            lines += [*log, "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--budget", default="26MiB")
    parser.add_argument("--teardown-launches", type=int, default=40)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args(argv)
    model = arguments.model.resolve()
    shown = model.relative_to(ROOT) if model.is_relative_to(ROOT) else model
    command = (
        f"ckpt-plan profile {shown} --budget {arguments.budget} --world-size 2 "
        "--parallel fsdp2 --verbose"
    )
    started = time.strftime("%Y-%m-%d %H:%M")
    begin = time.perf_counter()
    rows = []
    for run in range(1, arguments.runs + 1):
        with tempfile.TemporaryDirectory(prefix="ckpt-plan-reliability-") as folder:
            row = profile_once(model, arguments.budget, Path(folder))
        rows.append(row)
        print(
            f"run {run}: exit {row['exit code']}, {row['wall (s)']} s, {row['result']}", flush=True
        )
    total_s = time.perf_counter() - begin
    teardown = []
    for ending in ("exit", "os._exit") if arguments.teardown_launches else ():
        teardown.append(teardown_launches(ending, arguments.teardown_launches))
        print(
            f"teardown ending with {ending}: {teardown[-1]['failed']} of "
            f"{arguments.teardown_launches} launches failed",
            flush=True,
        )
    text = report(rows, teardown, command, started, total_s)
    atomic_write_text(arguments.out / "rank_check_reliability.md", text)
    passed = sum(1 for row in rows if row["exit code"] == 0)
    print(f"{passed} of {len(rows)} runs passed")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
