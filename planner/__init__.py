"""ckpt-plan's library: plan activation checkpointing under a memory budget.

The public surface is small: :func:`apply_plan` at training start; :func:`profile_and_plan`
(what ``ckpt-plan profile`` runs); and the stages it composes, each a plain function over
immutable records (:class:`Profile`, :class:`Plan`).
"""

from typing import TYPE_CHECKING

from planner.core.errors import (
    BudgetError,
    InfeasibleBudgetError,
    LoopShapeError,
    ModelFileError,
    PlanCheckError,
    PlanFileError,
    PlanMismatchError,
    PlannerError,
    ProfileFileError,
    ProfilingError,
    TargetSpecError,
)
from planner.core.loop import LoopShape, ZeroGrad
from planner.core.records import Profile
from planner.plan.plan_file import CheckpointMethod, ModuleDecision, Plan, load_plan, save_plan

__all__ = [
    "BudgetError",
    "CheckpointMethod",
    "InfeasibleBudgetError",
    "LoopShape",
    "LoopShapeError",
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
    "ZeroGrad",
    "apply_plan",
    "load_plan",
    "model_fingerprint",
    "profile_and_plan",
    "remove_plan",
    "save_plan",
    "wrapped_modules",
]


if TYPE_CHECKING:
    from planner.apply import apply_plan, model_fingerprint, remove_plan, wrapped_modules
    from planner.pipeline import profile_and_plan

# Names whose modules import torch, imported when first asked for: planning from a saved
# profile (the solver, the memory model, plan files, reports' data) imports no torch.
_LAZY = {
    "apply_plan": "planner.apply",
    "model_fingerprint": "planner.apply",
    "remove_plan": "planner.apply",
    "wrapped_modules": "planner.apply",
    "profile_and_plan": "planner.pipeline",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
