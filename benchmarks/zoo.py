"""The zoo (issue 27): plan every Hugging Face architecture of benchmarks/zoo_models.py at two
budgets and check each plan on a real step.

Per architecture, as ``ckpt-plan profile`` does it: the step is profiled on fake tensors
(times measured on the unplanned step), then planned at two budgets with the tool's own
loop (:func:`planner.pipeline.plan_checked`: solved, every candidate's recomputation tried on
fake tensors, the plan run in a separate process after ``apply_plan``, re-planned if it
measures over the budget):

* ``mid``: halfway between the floor (the smallest feasible budget) and the unplanned peak
  (where the tool then excludes modules whose recomputation differs, so the floor rises
  past it: halfway from the floor without them);
* ``every-block``: the predicted peak with every repeated block checkpointed (the usual
  manual choice, counted even for blocks the tool cannot checkpoint: the budget a user who
  checkpoints every block expects to reach).

Each plan's run is compared with the unplanned step (loss, every gradient and every buffer,
bit for bit), and its measured peak with the prediction. An architecture or budget that
cannot be planned gets the tool's one-line error; an exception that is not the tool's own
(not a ``PlannerError``) is recorded as ``raw TYPE: message``, a finding to report.

The profile is taken once, without a budget (the budgets come from it). Where fake tensors
cannot run the step the tool records a real step instead, and ``ckpt-plan profile --budget``
does so only where that step fits the budget: for those architectures ``profile_error`` is
what the CLI says at each budget (the plan beside it is then what ``--memory real`` gives).

    python benchmarks/zoo.py                    # every architecture
    python benchmarks/zoo.py --fast             # a quick subset
    python benchmarks/zoo.py --only llama,vit   # some

Writes reports/benchmarks/zoo.csv and zoo.md (atomically) and prints the table. Exits 1 if
any plan failed (or the CLI's profile would refuse its budget), measured more than 0.1% from
its prediction or changed the training step.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import markdown_table  # noqa: E402
from benchmarks.zoo_models import ZOO, write_model_file  # noqa: E402
from planner.check.compare import CheckReference, check_plan  # noqa: E402
from planner.core.errors import InfeasibleBudgetError, PlannerError  # noqa: E402
from planner.core.fileio import atomic_path, atomic_write_text  # noqa: E402
from planner.core.loop import PLAIN_LOOP  # noqa: E402
from planner.core.records import MemorySource, Profile, Unit  # noqa: E402
from planner.measure.model_file import ModelFile  # noqa: E402
from planner.measure.workload import load_model_file  # noqa: E402
from planner.pipeline import plan_checked, profile_model_file, record_step_memory  # noqa: E402
from planner.plan.memory_model import MemoryModel  # noqa: E402
from planner.solve import Solver  # noqa: E402

FAST = ("gpt2", "bert", "vit", "convnext")
"""The quick subset (``--fast``): a decoder, an encoder and two vision models."""
MAX_ERROR_PCT = 0.1
MIB = 2**20


def _mib(size_bytes: int | None) -> float | None:
    return None if size_bytes is None else round(size_bytes / MIB, 3)


def _percent(value: int, reference: int) -> float:
    return round(100 * (value - reference) / reference, 4) if reference else 0.0


def one_line(error: BaseException) -> str:
    """The tool's own error as the CLI prints it (one line); any other exception as ``raw
    TYPE: message``, a finding (the CLI would show a traceback)."""
    text = " ".join(str(error).split())
    if isinstance(error, PlannerError):
        return text
    return f"raw {type(error).__name__}: {text}"


@contextmanager
def planner_warnings() -> Iterator[list[str]]:
    """The warnings the library logs meanwhile (exclusions, fallbacks, re-planning)."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(" ".join(record.getMessage().split()))

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("planner")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def budget_profile_error(model_file: ModelFile, budget_bytes: int) -> str | None:
    """Where fake tensors cannot run the step, ``ckpt-plan profile --budget`` records a real
    step instead only if it fits the budget: its one-line error at ``budget_bytes``, or None
    where the real step fits (the memory half of the profile, as the CLI records it)."""
    try:
        record_step_memory(
            model_file,
            device="cpu",
            seed=0,
            memory=MemorySource.FAKE,
            budget_bytes=budget_bytes,
            target=None,
            loop=PLAIN_LOOP,
            progress=None,
        )
    except Exception as error:
        return one_line(error)
    return None


BUDGETS = ("mid", "every-block")
"""The budgets each architecture is planned at (module docstring)."""


def plan_architecture(name: str, folder: Path) -> list[dict[str, object]]:
    """Profile ``name`` on fake tensors, plan it at the two budgets (module docstring) and
    check each plan against the unplanned step: one row per budget, or one row with the
    error where it cannot be profiled."""
    zoo_model = ZOO[name]
    path = write_model_file(zoo_model, folder)
    return plan_model_file(path, {"architecture": name, "family": zoo_model.family})


def plan_model_file(
    path: Path | str, base: dict[str, object], budgets: tuple[str, ...] = BUDGETS
) -> list[dict[str, object]]:
    """:func:`plan_architecture` for any model file, at some of :data:`BUDGETS`: rows
    holding ``base`` and what was measured."""
    base = dict(base)
    started = time.perf_counter()
    with planner_warnings() as warnings:
        try:
            model_file = load_model_file(path)
            profile = profile_model_file(model_file)
        except Exception as error:
            base.update(
                budget="profile",
                seconds=round(time.perf_counter() - started, 1),
                error=one_line(error),
                notes="; ".join(warnings),
            )
            return [base]
    profile_s = time.perf_counter() - started
    memory = MemoryModel.for_profile(profile)
    _, floor = Solver(profile, memory).lowest_peak()
    unplanned = profile.measured_peak_bytes
    every_block = memory.peak_bytes(Unit(block) for block in profile.block_names)
    excluded = [block for block in profile.block_names if not profile.module(block).is_candidate]
    base.update(
        memory_source=profile.memory_source.value,
        blocks=len(profile.block_names),
        block_names=profile.block_names,  # for callers; not a column of the report
        blocks_excluded=len(excluded),
        unplanned_mib=_mib(unplanned),
        floor_mib=_mib(floor),
        every_block_mib=_mib(every_block),
        profile_s=round(profile_s, 1),
    )
    profile_notes = list(warnings)
    rows = []
    budget_bytes = {"mid": (floor + unplanned) // 2, "every-block": every_block}
    for budget_name in budgets:
        budget = budget_bytes[budget_name]
        row = {**base, "budget": budget_name, "budget_mib": _mib(budget)}
        started = time.perf_counter()
        with planner_warnings() as warnings:
            if profile.memory_source is MemorySource.REAL:
                # Profiled without a budget (to find the budgets): the CLI's profile at this
                # one may refuse. The plan below is then what --memory real would give.
                row["profile_error"] = budget_profile_error(model_file, budget)
            try:
                try:
                    result = plan_checked(
                        profile, budget, model_path=path, reference=CheckReference.UNPLANNED
                    )
                except InfeasibleBudgetError as error:
                    if budget_name != "mid" or not isinstance(error.profile, Profile):
                        raise
                    # The probe excluded modules the floor counted on (their recomputation
                    # differs): halfway again, from the floor without them.
                    profile = error.profile
                    budget = (error.min_budget_bytes + unplanned) // 2
                    row.update(floor_mib=_mib(error.min_budget_bytes), budget_mib=_mib(budget))
                    if profile.memory_source is MemorySource.REAL:
                        row["profile_error"] = budget_profile_error(model_file, budget)
                    result = plan_checked(
                        profile, budget, model_path=path, reference=CheckReference.UNPLANNED
                    )
            except Exception as error:
                row["error"] = one_line(error)
            else:
                profile = result.profile  # keeps the modules excluded on the way
                plan, check = result.plan, result.check
                assert check is not None  # a model path was given: the plan was run
                reference = CheckReference.UNPLANNED.value
                identical = bool(check.loss_equal and check.gradients_equal and check.buffers_equal)
                if check.loss_equal is None:
                    # Two unplanned steps differ on this device (threaded accumulation in a
                    # kernel): the tool's advice, compare every recomputation with its forward.
                    again = check_plan(path, plan, reference=CheckReference.RECOMPUTATION)
                    reference = CheckReference.RECOMPUTATION.value
                    identical = bool(again.recomputation_equal and again.buffers_equal)
                row.update(
                    modules=len(plan.modules),
                    plan_mib=_mib(plan.predicted_peak_bytes),
                    measured_mib=_mib(check.measured_peak_bytes),
                    error_pct=_percent(plan.predicted_peak_bytes, check.measured_peak_bytes),
                    unplanned_measured_mib=_mib(check.unplanned_peak_bytes),
                    unplanned_error_pct=_percent(unplanned, check.unplanned_peak_bytes or 0),
                    bit_identical=identical,
                    compared_with=reference,
                    attempts=result.attempts,
                )
        row["seconds"] = round(time.perf_counter() - started, 1)
        row["notes"] = "; ".join([*profile_notes, *warnings])
        profile_notes = []  # once per architecture
        rows.append(row)
    return rows


COLUMNS = [
    "architecture",
    "family",
    "budget",
    "unplanned_mib",
    "floor_mib",
    "every_block_mib",
    "budget_mib",
    "plan_mib",
    "measured_mib",
    "error_pct",
    "bit_identical",
    "compared_with",
    "modules",
    "blocks",
    "blocks_excluded",
    "unplanned_measured_mib",
    "unplanned_error_pct",
    "memory_source",
    "attempts",
    "profile_s",
    "seconds",
    "error",
    "profile_error",
    "notes",
]


SUMMARY_COLUMNS = [
    "architecture",
    "budget",
    "unplanned_mib",
    "floor_mib",
    "every_block_mib",
    "budget_mib",
    "plan_mib",
    "measured_mib",
    "error_pct",
    "bit_identical",
    "compared_with",
    "blocks_excluded",
    "profile_s",
    "seconds",
    "error",
    "profile_error",
]
"""The columns of zoo.md (zoo.csv has them all, with the warnings the tool logged)."""


def failed(frame: pd.DataFrame) -> pd.Series:
    """Rows whose plan failed, changed training, or measured away from its prediction."""
    planned = frame["plan_mib"].notna()
    return (
        ~planned
        | frame["profile_error"].notna()
        | (frame["bit_identical"] != True)  # noqa: E712 (missing values count as not identical)
        | (frame["error_pct"].abs() > MAX_ERROR_PCT)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", type=lambda text: text.split(","), help="comma-separated architecture names"
    )
    parser.add_argument("--fast", action="store_true", help=f"only {', '.join(FAST)}")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args(argv)
    names = arguments.only or (list(FAST) if arguments.fast else list(ZOO))
    unknown = [name for name in names if name not in ZOO]
    if unknown:
        parser.error(f"unknown architecture {', '.join(unknown)}; one of {', '.join(ZOO)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-zoo-") as folder:
        for name in names:
            for row in plan_architecture(name, Path(folder)):
                rows.append(row)
                print(row, flush=True)
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    return write_report(frame, arguments.out, "zoo", SUMMARY_COLUMNS)


def write_report(frame: pd.DataFrame, out: Path, stem: str, summary: list[str]) -> int:
    """Write ``frame`` to OUT/STEM.csv and its ``summary`` columns to OUT/STEM.md (both
    atomically), print the table and how many rows failed (:func:`failed`): the exit code."""
    for column in ("modules", "blocks", "blocks_excluded", "attempts", "own_blocks"):
        if column in frame:
            frame[column] = frame[column].astype("Int64")
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / f"{stem}.csv") as temp_path:
        frame.to_csv(temp_path, index=False)
    table = markdown_table(frame[summary])
    atomic_write_text(out / f"{stem}.md", table + "\n")
    print(table)
    bad = failed(frame)
    print(f"{len(frame)} rows, {int(bad.sum())} failed", flush=True)
    return 1 if bad.any() else 0


if __name__ == "__main__":
    sys.exit(main())
