"""A saved profile and plan read back for a report, and the plan solved where none is given."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from planner.core.errors import BudgetError, PlanFileError, PlanMismatchError
from planner.core.records import Profile
from planner.core.units import format_bytes
from planner.plan.plan_file import Plan, plan_from_dict
from planner.plan.profile_file import load_profile
from planner.solve import Solver
from planner.solve.planning import (
    build_plan,
    plan_for_budget,
)

# -- files -------------------------------------------------------------------------------


def load_report_inputs(
    path: str | Path,
    *,
    profile_path: str | Path | None = None,
    budget_bytes: int | None = None,
    offload: bool = True,
    host_budget_bytes: int | Callable[[Profile], int | None] | None = None,
) -> tuple[Profile, Plan]:
    """The profile and plan to report on, from a plan file or a profile file at ``path``.

    A plan: its profile is ``profile_path`` or ``profile.json`` beside it, and must be of
    the same model (same fingerprint). A profile: with ``budget_bytes``, the cheapest plan
    for that budget (solved now, not run; offloading where ``offload`` and the profile offer
    it, within ``host_budget_bytes``, None: no bound, or a function of the profile giving
    it: a rank's share depends on the job's ranks); without, an empty plan whose budget is the
    unplanned peak. Raises :class:`PlanFileError` (or ``ProfileFileError``) for a missing or
    corrupt file, :class:`PlanMismatchError` for a profile of another model,
    ``InfeasibleBudgetError`` for a budget no plan fits, and :class:`BudgetError` for a
    budget given with a plan (which has its own).
    """
    source = Path(path)
    if not source.is_file():
        raise PlanFileError(
            f"{source} does not exist; give a plan.json or profile.json written by "
            "`ckpt-plan profile`"
        )
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PlanFileError(
            f"{source} is not valid JSON ({error}); re-create it with `ckpt-plan profile`"
        ) from error
    if isinstance(data, dict) and "timeline" in data:
        profile = load_profile(source)
        if budget_bytes is None:
            budget = profile.measured_peak_bytes
            return profile, build_plan(profile, [], budget, strategy="none")
        if callable(host_budget_bytes):
            host_budget_bytes = host_budget_bytes(profile)
        solver = Solver(profile, offload=offload, host_budget_bytes=host_budget_bytes)
        plan, _ = plan_for_budget(profile, budget_bytes, solver=solver)
        return profile, plan

    plan = plan_from_dict(data, source=f"plan file {source}")
    if budget_bytes is not None:
        raise BudgetError(
            f"{source} is a plan, made for a budget of {format_bytes(plan.budget_bytes)}; "
            "to plan for another budget, report on its profile.json with that budget"
        )
    profile = load_profile(profile_path or source.parent / "profile.json")
    if profile.fingerprint.get("digest") != plan.fingerprint.get("digest"):
        raise PlanMismatchError(
            f"plan file {source} was made for another model than the profile "
            f"{profile_path or source.parent / 'profile.json'} (fingerprints differ); "
            "give the profile the plan was made from"
        )
    return profile, plan
