"""ckpt-plan's library: plan activation checkpointing under a memory budget.

The public surface is small: :func:`apply_plan` at training start; :func:`profile_and_plan`
(what ``ckpt-plan profile`` runs); and the stages it composes, each a plain function over
immutable records (:class:`Profile`, :class:`Plan`).
"""

from planner.apply import apply_plan, model_fingerprint, remove_plan, wrapped_modules
from planner.errors import (
    BudgetError,
    InfeasibleBudgetError,
    ModelFileError,
    PlanCheckError,
    PlanFileError,
    PlanMismatchError,
    PlannerError,
    ProfileFileError,
    ProfilingError,
    TargetSpecError,
)
from planner.plan import CheckpointMethod, ModuleDecision, Plan, load_plan, save_plan
from planner.records import Profile

__all__ = [
    "BudgetError",
    "CheckpointMethod",
    "InfeasibleBudgetError",
    "ModelFileError",
    "ModuleDecision",
    "Plan",
    "PlanCheckError",
    "PlanFileError",
    "PlanMismatchError",
    "PlannerError",
    "Profile",
    "ProfileFileError",
    "ProfilingError",
    "TargetSpecError",
    "apply_plan",
    "load_plan",
    "model_fingerprint",
    "profile_and_plan",
    "remove_plan",
    "save_plan",
    "wrapped_modules",
]


def __getattr__(name: str) -> object:
    # The pipeline pulls in the profiler; import it only when asked for.
    if name == "profile_and_plan":
        from planner.pipeline import profile_and_plan

        return profile_and_plan
    raise AttributeError(name)
