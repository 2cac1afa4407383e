"""The whole ``profile`` job as one library call: measure, solve, check by running, re-plan.

Rule: a plan is returned only after it has been run in a separate process with its peak
within the budget and its loss, gradients and buffers equal to the unplanned step's. If the
measured peak overshoots, the solver aims lower by the overshoot and tries again.

Before that run, the modules a plan chose are tried once for recomputation mismatches
(:func:`planner.safety.find_recompute_mismatches`: a module that fills a cache in forward and
reads it back when recomputed, say). Any found are excluded from the profile, with the
reason, and the plan is solved again. Only chosen modules are tried, so profiling itself
stays a constant number of steps.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from planner.check import PlanCheck, check_plan
from planner.errors import InfeasibleBudgetError, PlanCheckError
from planner.plan import CheckpointMethod, Plan
from planner.planning import plan_for_budget, unit_children
from planner.profiler import ProgressCallback, profile_model_file
from planner.records import Profile
from planner.safety import exclude_modules, find_recompute_mismatches
from planner.solver import Solution, Solver
from planner.units import format_bytes
from planner.workload import build_workload, load_model_file

__all__ = ["PlanningResult", "plan_checked", "profile_and_plan"]

logger = logging.getLogger(__name__)


def _probe_names(profile: Profile, plan: Plan) -> list[str]:
    """The modules to try for recomputation: each wrapped module, and for
    ``checkpoint_sequential`` the children it runs in checkpointed segments."""
    names: list[str] = []
    for decision in plan.modules:
        if decision.method is CheckpointMethod.CHECKPOINT_SEQUENTIAL:
            names.extend(
                child
                for child in unit_children(profile, decision.module_name)
                if any(True for m in profile.modules if m.module_name.startswith(child + "."))
                or profile.module(child).is_candidate
            )
        else:
            names.append(decision.module_name)
    return names


@dataclass(frozen=True)
class PlanningResult:
    profile: Profile
    plan: Plan
    solution: Solution
    check: PlanCheck | None
    attempts: int


def plan_checked(
    profile: Profile,
    budget_bytes: int,
    *,
    model_path: str | Path | None,
    device: str = "cpu",
    seed: int = 0,
    max_attempts: int = 3,
    progress: ProgressCallback | None = None,
) -> PlanningResult:
    """Solve for ``budget_bytes`` and, if ``model_path`` is given, check the plan by running it."""
    solver = Solver(profile)
    target = budget_bytes
    probed: set[str] = set()
    workload = None
    attempt = 0
    while attempt < max_attempts:
        attempt += 1
        try:
            plan, solution = plan_for_budget(
                profile, budget_bytes, solver=solver, plan_budget_bytes=target
            )
        except InfeasibleBudgetError:
            if attempt == 1:
                raise
            raise PlanCheckError(
                f"plans predicted to fit {format_bytes(budget_bytes)} measured over it, and no "
                f"plan fits the corrected target {format_bytes(target)}; try a larger budget"
            ) from None
        if model_path is None:
            return PlanningResult(profile, plan, solution, None, attempt)
        untried = [name for name in _probe_names(profile, plan) if name not in probed]
        if untried:
            if progress:
                progress(f"trying recomputation of {len(untried)} chosen modules", 0, 1)
            if workload is None:
                workload = build_workload(load_model_file(model_path), device=device, seed=seed)
            mismatches = find_recompute_mismatches(workload, untried, seed=seed)
            probed.update(untried)
            if mismatches:
                logger.warning(
                    "excluding %d modules whose recomputation differs from their forward: %s",
                    len(mismatches),
                    ", ".join(sorted(mismatches)),
                )
                profile = exclude_modules(profile, mismatches)
                solver = Solver(profile, solver.memory)
                attempt -= 1  # not a measured attempt
                continue
        if progress:
            progress(f"checking the plan by running it (attempt {attempt})", 0, 1)
        check = check_plan(model_path, plan, device=device, seed=seed)
        if not check.training_unchanged:
            raise PlanCheckError(
                "the plan changes the training step ("
                + "; ".join(check.differences[:3])
                + "); please report this with your model file"
            )
        if not check.state_dict_keys_equal:
            raise PlanCheckError("internal error: applying the plan changed state_dict keys")
        if check.within_budget:
            plan = dataclasses.replace(plan, measured_peak_bytes=check.measured_peak_bytes)
            return PlanningResult(profile, plan, solution, check, attempt)
        overshoot = check.measured_peak_bytes - budget_bytes
        logger.warning(
            "plan measured %d bytes over the budget (predicted %d, measured %d); re-planning",
            overshoot,
            plan.predicted_peak_bytes,
            check.measured_peak_bytes,
        )
        target = min(target, plan.predicted_peak_bytes) - overshoot - max(1, budget_bytes // 200)
    raise PlanCheckError(
        f"after {max_attempts} attempts no plan measured within {format_bytes(budget_bytes)}; "
        "try a larger budget"
    )


def profile_and_plan(
    model_path: str | Path,
    budget_bytes: int,
    *,
    device: str = "cpu",
    seed: int = 0,
    check: bool = True,
    progress: ProgressCallback | None = None,
) -> PlanningResult:
    """Load the model file, profile one step, solve for the budget, check the plan."""
    model_file = load_model_file(model_path)
    profile = profile_model_file(model_file, device=device, seed=seed, progress=progress)
    return plan_checked(
        profile,
        budget_bytes,
        model_path=model_file.path if check else None,
        device=device,
        seed=seed,
        progress=progress,
    )
