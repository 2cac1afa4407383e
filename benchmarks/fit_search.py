"""``ckpt-plan fit``'s search against the doubling and bisection it replaced, on real fits:
the fake steps each records, its wall time, and that both find the same largest size and
the same plan.

Each fit runs twice in this process, once with :func:`planner.fit.largest_fitting` and
once with the old search in its place (kept below as the reference), alternating which
goes first per case:

* tiny-llama (``examples/configs/tiny-llama.json``), batch 2, its sequence length under
  6 MiB on this CPU: timed here and its plan checked by running it (what ``fit`` does on
  a small model: its real steps dominate);
* Llama-3-8B (``examples/configs/llama-3-8b.json``) for an H100, its sequence length at
  batch 1 under 60.1 GiB, and its batch size at 2048 tokens under 70 GB: fake steps and
  roofline times only (what ``fit`` does for a large model: its fake steps dominate).

    python benchmarks/fit_search.py            # about 6 minutes on 2 cores

Writes reports/benchmarks/fit_search.md and prints it.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import planner.fit  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.core.units import parse_bytes  # noqa: E402
from planner.measure.source import WorkloadSource  # noqa: E402
from planner.measure.workload import load_model_file  # noqa: E402
from planner.plan.targets import load_spec  # noqa: E402

OUT = ROOT / "reports" / "benchmarks" / "fit_search.md"
CONFIGS = ROOT / "examples" / "configs"


def doubling_and_bisection(
    smallest: int, max_size: int, lowest: Callable[[int], int], budget_bytes: int
) -> tuple[int, int | None]:
    """fit's search before this one (same contract as ``largest_fitting``)."""
    fitting, failing = smallest, None
    while failing is None and fitting < max_size:
        size = min(2 * fitting, max_size)
        if lowest(size) <= budget_bytes:
            fitting = size
        else:
            failing = size
    while failing is not None and failing - fitting > 1:
        middle = (fitting + failing) // 2
        if lowest(middle) <= budget_bytes:
            fitting = middle
        else:
            failing = middle
    return fitting, failing


@contextlib.contextmanager
def searching_with(search: Callable[..., tuple[int, int | None]]) -> Iterator[None]:
    original = planner.fit.largest_fitting
    planner.fit.largest_fitting = search  # type: ignore[assignment]
    try:
        yield
    finally:
        planner.fit.largest_fitting = original  # type: ignore[assignment]


@dataclass(frozen=True)
class Case:
    name: str
    source: WorkloadSource
    budget: str
    dimension: str
    target: str | None = None
    check: bool = True


CASES = (
    Case(
        "tiny-llama, seq len at batch 2, CPU (timed, checked)",
        WorkloadSource.hugging_face(CONFIGS / "tiny-llama.json", 2, 1, "float32"),
        "6MiB",
        "seq_len",
    ),
    Case(
        "Llama-3-8B, seq len at batch 1, h100-80gb",
        WorkloadSource.hugging_face(CONFIGS / "llama-3-8b.json", 1, 1, "bfloat16"),
        "60.1GiB",
        "seq_len",
        target="h100-80gb",
        check=False,
    ),
    Case(
        "Llama-3-8B, batch size at 2048 tokens, h100-80gb",
        WorkloadSource.hugging_face(CONFIGS / "llama-3-8b.json", 1, 2048, "bfloat16"),
        "70GB",
        "batch_size",
        target="h100-80gb",
        check=False,
    ),
)


def run(case: Case, search: Callable[..., tuple[int, int | None]]) -> tuple[int, int, float, int]:
    """(largest, sizes recorded, seconds, plan modules) of one fit."""
    model_file = load_model_file(case.source)
    target = load_spec(case.target) if case.target else None
    started = time.perf_counter()
    with searching_with(search):
        result = planner.fit.fit_largest(
            model_file,
            parse_bytes(case.budget),
            dimension=case.dimension,
            target=target,
            check=case.check,
            timing_steps=3,
        )
    seconds = time.perf_counter() - started
    return result.largest, len(result.points), seconds, len(result.planned.plan.modules)


def main() -> int:
    rows = []
    for index, case in enumerate(CASES):
        searches = [("curve", planner.fit.largest_fitting), ("old", doubling_and_bisection)]
        if index % 2:
            searches.reverse()
        outcome = {name: run(case, search) for name, search in searches}
        new, old = outcome["curve"], outcome["old"]
        assert new[0] == old[0] and new[3] == old[3], (case.name, new, old)
        rows.append(
            f"| {case.name} | {case.budget} | {new[0]} | {old[1]} | {new[1]} | "
            f"{old[2]:.1f} | {new[2]:.1f} | {old[2] / new[2]:.2f}x |"
        )
        print(rows[-1], flush=True)
    text = "\n".join(
        [
            "# fit's search: curves through the sizes recorded, against doubling and bisection",
            "",
            f"Written by `python benchmarks/fit_search.py` (torch {torch.__version__}). Each fit "
            "ran with both searches in one process; both found the same largest size and "
            "a plan of as many modules. Sizes recorded: fake steps, the sizes timed for "
            "throughput (powers of two from largest / 8) included.",
            "",
            "| fit | budget | largest | sizes recorded (old) | sizes recorded | "
            "seconds (old) | seconds | speed-up |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    atomic_write_text(OUT, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
