"""What planning for a budget gives: the plan, the profile it was solved on, and the check
of the plan by running it.

Pure data, no torch: ``ckpt-plan solve`` makes one from a saved profile without running
anything, :func:`planner.pipeline.plan_checked` after running the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.core.records import Profile
from planner.plan.plan_file import Plan
from planner.solve import Solution

if TYPE_CHECKING:
    from planner.check.compare import PlanCheck

__all__ = ["CheckedPlan"]


@dataclass(frozen=True)
class CheckedPlan:
    """A solved plan, the profile it was solved on (with any modules excluded on the way),
    the solver's answer it was built from, and its check (None when it was not run).
    ``attempts``: how many plans were run to find one that fits (1 when none was run).
    ``stages``: a pipeline's plan (whose ``plan.stages`` are its stages' plans) holds each
    stage's own result here, in stage order; ``profile`` and ``solution`` are then the
    stage's with the highest predicted peak."""

    profile: Profile
    plan: Plan
    solution: Solution
    check: PlanCheck | None
    attempts: int
    stages: tuple[CheckedPlan, ...] = ()
