"""From a profile and a budget to a :class:`Plan` (and baseline plans of the same type)."""

from __future__ import annotations

from planner.memory_model import MemoryModel
from planner.plan import CheckpointMethod, ModuleDecision, Plan
from planner.records import Profile
from planner.solver import Solution, Solver

__all__ = ["baseline_every_block", "build_plan", "plan_for_budget"]


def build_plan(
    profile: Profile,
    module_names: tuple[str, ...] | list[str],
    budget_bytes: int,
    *,
    strategy: str,
    memory: MemoryModel | None = None,
    notes: tuple[str, ...] = (),
) -> Plan:
    """A plan wrapping ``module_names``, with its prediction re-checked by the memory model."""
    memory = memory or MemoryModel(profile.timeline)
    decisions = []
    for name in sorted(module_names):
        record = profile.module(name)
        decisions.append(
            ModuleDecision(
                module_name=name,
                method=CheckpointMethod.CHECKPOINT,
                # Only modules that run random ops need recomputation to replay the RNG.
                preserve_rng_state=record.uses_rng,
                restore_buffers=record.mutated_buffers,
                saving_bytes=record.checkpoint_saving_bytes,
                recompute_ms=record.forward_ms,
            )
        )
    recompute_ms = sum(d.recompute_ms for d in decisions)
    return Plan(
        budget_bytes=budget_bytes,
        predicted_peak_bytes=memory.peak_bytes(module_names),
        baseline_peak_bytes=profile.measured_peak_bytes,
        predicted_overhead=recompute_ms / profile.step_ms if profile.step_ms > 0 else 0.0,
        recompute_ms=recompute_ms,
        step_ms=profile.step_ms,
        static_bytes=profile.static_bytes,
        modules=tuple(decisions),
        fingerprint=profile.fingerprint,
        batch=profile.batch,
        device=profile.device,
        torch_version=profile.torch_version,
        model_name=profile.model_name,
        strategy=strategy,
        notes=notes,
    )


def plan_for_budget(
    profile: Profile,
    budget_bytes: int,
    *,
    solver: Solver | None = None,
    plan_budget_bytes: int | None = None,
) -> tuple[Plan, Solution]:
    """Solve for ``plan_budget_bytes`` (default: the budget) and build the plan.

    ``plan_budget_bytes`` lets a caller aim below the user's budget (a safety margin after a
    measured overshoot) while the plan still records the user's budget.
    """
    solver = solver or Solver(profile)
    solution = solver.solve(plan_budget_bytes if plan_budget_bytes is not None else budget_bytes)
    note = (
        "solver: cheapest plan under the memory model (search finished)"
        if solution.proven_optimal
        else f"solver: best plan found in {solution.evaluations} evaluations (search cut short)"
    )
    plan = build_plan(
        profile,
        solution.module_names,
        budget_bytes,
        strategy="optimal",
        memory=solver.memory,
        notes=(note,),
    )
    return plan, solution


def baseline_every_block(profile: Profile, budget_bytes: int = 0) -> Plan:
    """The usual manual choice: checkpoint every repeated block."""
    blocks = [name for name in profile.block_names if profile.module(name).is_candidate]
    return build_plan(profile, blocks, budget_bytes, strategy="every-block")
