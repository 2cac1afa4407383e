"""Typed, actionable errors raised by the planner library.

Every user-facing failure is a :class:`PlannerError` subclass whose message says what went
wrong and what to do next. Internal invariants use ``assert``; they are bugs, not user errors.
The CLI maps each class to an exit code (see ``planner.cli.main.EXIT_CODES``).
"""

from __future__ import annotations

__all__ = [
    "BudgetError",
    "InfeasibleBudgetError",
    "LoopShapeError",
    "ModelFileError",
    "ParallelLayoutError",
    "PlanCheckError",
    "PlanFileError",
    "PlanMismatchError",
    "PlannerError",
    "ProfileFileError",
    "ProfilingError",
    "TargetSpecError",
]


class PlannerError(Exception):
    """Base class of every error the planner reports to a user.

    ``str(error)`` is the message, one line where it can be. ``trace`` is what a person may
    want beside it but not in it (``torch.utils.checkpoint``'s log of both runs of a
    recomputation that differs, under ``--debug``); empty where there is none."""

    def __init__(self, *args: object, trace: str = "") -> None:
        super().__init__(*args)
        self.trace = trace


class ModelFileError(PlannerError):
    """The model file is missing, does not import, or breaks the model-file contract."""


class ProfilingError(PlannerError):
    """The training step could not be run or measured."""


class BudgetError(PlannerError):
    """A memory budget that does not parse or is not positive."""


class InfeasibleBudgetError(PlannerError):
    """No plan fits the budget. ``min_budget_bytes`` is the smallest budget that would.

    ``profile``: where the step was profiled before the budget was found infeasible, that
    profile (a :class:`planner.core.records.Profile`), so a caller can save it and re-solve at a
    budget that fits without profiling again; otherwise None."""

    def __init__(self, message: str, *, budget_bytes: int, min_budget_bytes: int) -> None:
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.min_budget_bytes = min_budget_bytes
        self.profile: object | None = None


class LoopShapeError(PlannerError):
    """A training loop's shape that is not one ckpt-plan can run (``zero_grad`` neither
    before nor after the forward, ``grad_accum`` below 1)."""


class PlanFileError(PlannerError):
    """A plan file that is missing, empty, corrupt, or from a newer schema."""


class ProfileFileError(PlannerError):
    """A saved profile that is missing, corrupt, or from a newer schema."""


class PlanMismatchError(PlannerError):
    """A plan that was made for another model (its fingerprint or module names differ)."""


class PlanCheckError(PlannerError):
    """A plan failed its measured check (over budget or a changed loss/gradient)."""


class TargetSpecError(PlannerError):
    """A ``--target`` that is neither a built-in device nor a readable spec file."""


class ParallelLayoutError(PlannerError):
    """A parallel layout that cannot be planned (a world size below 1, an unknown strategy,
    a mesh that does not multiply to the world size), or a plan applied under another."""
