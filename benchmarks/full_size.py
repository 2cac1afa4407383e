"""The whole `profile --hf` job on full-size Hugging Face configs, as a user runs it: wall and
CPU seconds, the largest resident set, the exit code and the answer (issue #27, point 4:
at most 60 s wall and 1 GB resident each on this 2-core machine).

    python benchmarks/full_size.py                    # every config below
    python benchmarks/full_size.py --only mixtral-8x7b

Each config in examples/configs/ runs in a fresh process as
``ckpt-plan profile --hf CONFIG --target h100-80gb --batch-size 1 --seq-len 4096 --budget B``
(Mixtral-8x7B as one rank of 8 under FSDP2), with its config's defaults (``use_cache`` on,
the default experts implementation). The plan's figures are read back from the plan JSON
the run wrote; a run that ends in exit 3 (no plan fits) reports the one line it printed.
Wall times are only as quiet as the machine: the load average before each run is printed
with it. Writes reports/benchmarks/full_size.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import markdown_table, process_cost  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402

GIB = 2**30
WALL_LIMIT_S = 60.0
RSS_LIMIT_KIB = 10**9 // 1024

# name: (budget, extra arguments); one H100 each, Mixtral as one rank of 8 under FSDP2.
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "llama-3-8b": ("70GB", []),
    "qwen2.5-7b": ("70GB", []),
    "gemma-2-9b": ("70GB", []),
    "phi-3-mini": ("70GB", []),
    "qwen3-30b-a3b": ("70GB", []),
    "mixtral-8x7b": ("60GB", ["--world-size", "8", "--parallel", "fsdp2"]),
}


def run(name: str) -> dict[str, object]:
    budget, extra = CONFIGS[name]
    cli = str(Path(sys.executable).parent / "ckpt-plan")
    config = ROOT / "examples" / "configs" / f"{name}.json"
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-full-size-") as folder:
        plan_path = Path(folder) / "plan.json"
        command = [
            cli,
            "profile",
            "--hf",
            str(config),
            "--target",
            "h100-80gb",
            "--batch-size",
            "1",
            "--seq-len",
            "4096",
            "--budget",
            budget,
            "--out",
            str(plan_path),
            "--report-dir",
            str(Path(folder) / "report"),
            *extra,
        ]
        cost = process_cost(command, Path(folder))
        plan = json.loads(plan_path.read_text()) if plan_path.is_file() else None
    row: dict[str, object] = {
        "config": name,
        "budget": budget + (" per rank" if extra else ""),
        "exit": cost.code,
        "load_before": round(load, 2),
        "wall_s": round(cost.wall_s, 1),
        "cpu_s": round(cost.cpu_s, 1),
        "max_rss_mib": round(cost.max_rss_kib / 1024),
        "within_60s_1GB": cost.wall_s <= WALL_LIMIT_S and cost.max_rss_kib <= RSS_LIMIT_KIB,
    }
    if plan is not None:
        units = plan["modules"]
        row["answer"] = (
            f"{plan['predicted_peak_bytes'] / GIB:.2f} GiB planned of "
            f"{plan['baseline_peak_bytes'] / GIB:.2f} GiB unplanned "
            f"({plan['static_bytes'] / GIB:.2f} GiB static), {len(units)} modules, "
            f"+{plan['predicted_overhead']:.1%}"
        )
    else:
        lines = [line.strip() for line in cost.stderr.splitlines() if line.strip()]
        row["answer"] = lines[-1] if lines else "(no output)"
    print(row, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CONFIGS), default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args(argv)
    names = arguments.only or list(CONFIGS)
    rows = [run(name) for name in names]
    text = (
        "# Full-size configs: the whole `profile --hf` job\n\n"
        f"`python benchmarks/full_size.py` on {os.cpu_count()} CPU cores; "
        "`--target h100-80gb --batch-size 1 --seq-len 4096`, each config's defaults. "
        "Wall and CPU seconds and the largest resident set are of the whole process tree "
        "(the plan's check does not run: a target's plan is checked where it runs). "
        "`load_before` is the 1-minute load average when the run started.\n\n"
        + markdown_table(pd.DataFrame(rows))
        + "\n"
    )
    arguments.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(arguments.out / "full_size.md", text)
    print(f"wrote {arguments.out / 'full_size.md'}")
    return 0 if all(row["exit"] in (0, 3) for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
