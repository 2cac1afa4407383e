"""The child processes a check runs in: one protocol for the plan check (``python -m
planner.check.compare``) and the rank check (``torchrun ... -m planner.check.ranks``, one
child per rank).

* **Started** by :func:`run_child`, with this checkout first on ``PYTHONPATH`` (so the child
  imports the planner its parent runs) and, where children share the machine's cores, a
  number of threads each (:func:`child_environment`). A child that does not finish in time
  is a :class:`ProfilingError`; its output is logged at INFO (``--verbose``).
* **Answers** in a JSON file its parent names (:func:`answer`): the result record, or the
  error it raised as a :class:`ChildFailure` (its class's name, its message, its ``trace``,
  Python's traceback, when it failed). The model file's own prints go to stderr: nothing
  the child prints is read as its answer.
* **Errors are rebuilt** by :meth:`ChildFailure.rebuilt`: the same class where it is one of
  :data:`REBUILT_ERRORS`, else a :class:`ProfilingError`, with the same message and trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.core import errors
from planner.core.errors import PlannerError, ProfilingError
from planner.core.fileio import atomic_write_text

__all__ = [
    "REBUILT_ERRORS",
    "ChildFailure",
    "answer",
    "child_environment",
    "log_output",
    "read_reply",
    "run_child",
]

logger = logging.getLogger(__name__)

# The planner errors a child's failure is raised again as, by class name: every
# PlannerError made from a message alone (InfeasibleBudgetError needs its budgets).
REBUILT_ERRORS: dict[str, type[PlannerError]] = {
    kind.__name__: kind
    for kind in (
        errors.BudgetError,
        errors.LoopShapeError,
        errors.ModelFileError,
        errors.ParallelLayoutError,
        errors.PlanCheckError,
        errors.PlanFileError,
        errors.PlanMismatchError,
        errors.ProfileFileError,
        errors.ProfilingError,
        errors.TargetSpecError,
    )
}

# The folder that holds the ``planner`` package.
_CHECKOUT = Path(__file__).resolve().parent.parent.parent


def _one_line(error: BaseException) -> str:
    """``KeyError: 12``: an exception's type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300]}" if lines else type(error).__name__


@dataclass(frozen=True)
class ChildFailure:
    """An error a child raised, as it travels to its parent. ``message``: a
    :class:`PlannerError`'s own, or any other exception's type and first line; ``trace``: a
    PlannerError's ``trace``; ``traceback``: Python's; ``failed_at``: ``time.time()``."""

    error_type: str
    message: str
    trace: str = ""
    traceback: str = ""
    failed_at: float = 0.0

    @classmethod
    def of(cls, error: BaseException) -> ChildFailure:
        planner_error = error if isinstance(error, PlannerError) else None
        return cls(
            error_type=type(error).__name__,
            message=str(error) if planner_error is not None else _one_line(error),
            trace=planner_error.trace if planner_error is not None else "",
            traceback="".join(traceback.format_exception(error)),
            failed_at=time.time(),
        )

    @property
    def error_class(self) -> type[PlannerError] | None:
        """The class it is raised again as (:data:`REBUILT_ERRORS`); None for an exception
        that is no planner error (a bug, or torch's own)."""
        return REBUILT_ERRORS.get(self.error_type)

    def rebuilt(self, context: str = "") -> PlannerError:
        """The error to raise in the parent: its class (a :class:`ProfilingError` where it
        has none), ``context`` then its message, its trace."""
        return (self.error_class or ProfilingError)(context + self.message, trace=self.trace)


def child_environment(threads: int | None = None) -> dict[str, str]:
    """This process's environment for a child: this checkout first on ``PYTHONPATH`` and,
    unless set already, ``threads`` threads for torch's CPU ops (``OMP_NUM_THREADS``)."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(_CHECKOUT), environment.get("PYTHONPATH")])
    )
    if threads is not None:
        environment.setdefault("OMP_NUM_THREADS", str(threads))
    return environment


def run_child(
    command: Sequence[str],
    *,
    what: str,
    output_of: str,
    timeout_s: float,
    threads: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (``python -m ...``) in :func:`child_environment` and wait for it.
    ``what`` names the job in the log and in the :class:`ProfilingError` of a child still
    running after ``timeout_s``; ``output_of`` names whose output --verbose then shows."""
    logger.info("%s: %s", what, " ".join(command))
    try:
        return subprocess.run(
            list(command),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=child_environment(threads),
            check=False,
        )
    except subprocess.TimeoutExpired as timeout:
        log_output(output_of, timeout.stderr)
        raise ProfilingError(
            f"{what} did not finish in {timeout_s:.0f} s "
            f"(re-run with --verbose for {output_of}'s output)"
        ) from None


def log_output(what: str, output: str | bytes | None) -> None:
    """Log a child's whole stderr at INFO (``--verbose``): the error is one line."""
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    if output and output.strip():
        logger.info("%s's output:\n%s", what, output.rstrip())


def answer(reply_path: Path, work: Callable[[], Any]) -> int:
    """The child's side: run ``work`` (its prints on stderr) and write what it returned (a
    dataclass) or raised to ``reply_path``. Returns the child's exit code: 0, or 1 where
    ``work`` raised (so that ``torchrun`` stops the other ranks)."""
    reply: dict[str, Any]
    try:
        with contextlib.redirect_stdout(sys.stderr):
            reply = {"result": dataclasses.asdict(work())}
    except Exception as error:  # any: the parent says what it was
        reply = {"failure": dataclasses.asdict(ChildFailure.of(error))}
    atomic_write_text(reply_path, json.dumps(reply, default=_enum_value))
    return 1 if "failure" in reply else 0


def read_reply(reply_path: Path) -> dict[str, Any] | ChildFailure | None:
    """The parent's side: the answer at ``reply_path``: the child's result as
    :func:`dataclasses.asdict` and JSON left it (its record's ``from_json`` reads it back),
    the error it raised, or None where it wrote none."""
    if not reply_path.is_file():
        return None
    data = json.loads(reply_path.read_text(encoding="utf-8"))
    if "failure" in data:
        return ChildFailure(**data["failure"])
    result: dict[str, Any] = data["result"]
    return result


def _enum_value(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
