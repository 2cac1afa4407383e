"""ckpt-plan's library: plan activation checkpointing under a memory budget.

What a training script needs: :func:`apply_plan` (and :func:`remove_plan`) at training
start, :func:`load_plan` and :class:`Plan` to read a plan file, and the errors they raise.
What ``ckpt-plan profile`` runs: :func:`profile_and_plan`, with every type its signature
names and :class:`CheckedPlan`, its result. Everything else lives in the subpackages (see
docs/architecture.md).

``import planner`` loads no torch: the names whose modules import it are imported when
first asked for.
"""

from typing import TYPE_CHECKING

from planner.checked_plan import CheckedPlan
from planner.core.errors import (
    BudgetError,
    InfeasibleBudgetError,
    LoopShapeError,
    ModelFileError,
    ParallelLayoutError,
    PlanCheckError,
    PlanFileError,
    PlanMismatchError,
    PlannerError,
    ProfileFileError,
    ProfilingError,
    TargetSpecError,
)
from planner.core.loop import LoopShape
from planner.core.parallel import ParallelLayout
from planner.core.records import MemorySource
from planner.plan.plan_file import Plan, load_plan
from planner.plan.targets import DeviceSpec

__all__ = [
    "BudgetError",
    "CheckedPlan",
    "DeviceSpec",
    "InfeasibleBudgetError",
    "LoopShape",
    "LoopShapeError",
    "MemorySource",
    "ModelFileError",
    "ParallelLayout",
    "ParallelLayoutError",
    "Plan",
    "PlanCheckError",
    "PlanFileError",
    "PlanMismatchError",
    "PlannerError",
    "ProfileFileError",
    "ProfilingError",
    "ProgressCallback",
    "TargetSpecError",
    "WorkloadSource",
    "apply_plan",
    "load_plan",
    "profile_and_plan",
    "remove_plan",
]


if TYPE_CHECKING:
    from planner.apply import apply_plan, remove_plan
    from planner.measure.profiler import ProgressCallback
    from planner.measure.source import WorkloadSource
    from planner.pipeline import profile_and_plan

# Names whose modules import torch, imported when first asked for: planning from a saved
# profile (the solver, the memory model, plan files, reports' data) imports no torch.
_LAZY = {
    "apply_plan": "planner.apply",
    "remove_plan": "planner.apply",
    "profile_and_plan": "planner.pipeline",
    "ProgressCallback": "planner.measure.profiler",
    "WorkloadSource": "planner.measure.source",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
