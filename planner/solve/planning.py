"""From a profile and a budget to a :class:`Plan` (and baseline plans of the same type)."""

from __future__ import annotations

from planner.core.allocator import PINNED_HOST_ASSUMPTION
from planner.core.records import Note, NoteTopic, Profile, Unit, general_notes
from planner.plan.memory_model import MemoryModel, sequential_segments
from planner.plan.plan_file import CheckpointMethod, ModuleDecision, Plan
from planner.plan.policies import NESTED, OFFLOAD_OPTIONS, SelectivePolicy
from planner.solve import Solution, Solver
from planner.solve.tree import segments_cost_ms

__all__ = [
    "baseline_every_block",
    "baseline_plans",
    "build_plan",
    "frontier",
    "plan_for_budget",
    "recomputed_modules",
    "unit_children",
    "unit_cost_ms",
]


def unit_children(profile: Profile, name: str) -> list[str]:
    """The direct children of module ``name``, in registration (= Sequential call) order."""
    prefix = f"{name}." if name else ""
    return [
        record.module_name
        for record in profile.modules
        if record.module_name.startswith(prefix)
        and record.module_name != name
        and "." not in record.module_name[len(prefix) :]
    ]


def recomputed_modules(profile: Profile, unit: Unit) -> list[str]:
    """The modules whose whole forward a plan unit recomputes: the module itself, or for
    ``checkpoint_sequential`` in k segments the children in the checkpointed segments (the
    last segment runs without checkpointing)."""
    if unit.segments is None:
        return [unit.module]
    children = unit_children(profile, unit.module)
    return [
        child
        for first, last in sequential_segments(len(children), unit.segments)
        for child in children[first : last + 1]
    ]


def unit_cost_ms(profile: Profile, unit: Unit) -> float:
    """Recompute time of a plan unit: the forward times of the modules it recomputes, or
    for an option (a selective policy, nesting) the option's measured or estimated cost."""
    name = unit.module
    if unit.option is not None:
        return profile.module(name).option_cost(unit.option).recompute_ms
    if unit.segments:
        spans = tuple(sequential_segments(len(unit_children(profile, name)), unit.segments))
        return segments_cost_ms(profile, name, recomputed_modules(profile, unit), spans)
    return sum(profile.module(name).forward_ms for name in recomputed_modules(profile, unit))


def _decisions(profile: Profile, unit: Unit, memory: MemoryModel) -> list[ModuleDecision]:
    """A unit's decisions: one, or for nesting the outer module's and its inner ones'."""
    if unit.option != NESTED:
        return [_decision(profile, unit, memory)]
    name = unit.module
    record = profile.module(name)
    option = record.option_cost(NESTED)
    outer = ModuleDecision(
        module_name=name,
        method=CheckpointMethod.CHECKPOINT,
        preserve_rng_state=record.uses_rng,
        restore_buffers=record.mutated_buffers,
        saving_bytes=memory.freed_bytes(unit),
        recompute_ms=option.recompute_ms,
    )
    inner = [
        ModuleDecision(
            module_name=child,
            method=CheckpointMethod.CHECKPOINT,
            preserve_rng_state=profile.module(child).uses_rng,
            restore_buffers=profile.module(child).mutated_buffers,
            nested_in=name,
        )
        for child in option.inner_modules
    ]
    return [outer, *inner]


def _decision(profile: Profile, unit: Unit, memory: MemoryModel) -> ModuleDecision:
    name, segments, option = unit.module, unit.segments, unit.option
    record = profile.module(name)
    if option in OFFLOAD_OPTIONS:
        return ModuleDecision(
            module_name=name,
            method=CheckpointMethod.OFFLOAD,
            # Nothing runs twice: no RNG state to replay, no buffer to restore.
            preserve_rng_state=False,
            offload_min_bytes=memory.offload_min_bytes,
            saving_bytes=memory.freed_bytes(unit),
            host_bytes=memory.host_bytes(unit),
            prefetch_module=memory.prefetch_module(unit),
            recompute_ms=record.option_cost(option).recompute_ms,
        )
    if option is not None:
        rule = memory.policy_rules(name)[option]
        return ModuleDecision(
            module_name=name,
            method=CheckpointMethod.CHECKPOINT,
            preserve_rng_state=record.uses_rng,
            policy=option,
            saved_ops=rule.saved_ops,
            alternating_ops=rule.alternating_ops,
            restore_buffers=record.mutated_buffers,
            saving_bytes=memory.freed_bytes(unit),
            recompute_ms=record.option_cost(option).recompute_ms,
        )
    if segments is None:
        return ModuleDecision(
            module_name=name,
            method=CheckpointMethod.CHECKPOINT,
            # Only modules that run random ops need recomputation to replay the RNG.
            preserve_rng_state=record.uses_rng,
            restore_buffers=record.mutated_buffers,
            saving_bytes=record.checkpoint_saving_bytes,
            recompute_ms=record.forward_ms,
        )
    return ModuleDecision(
        module_name=name,
        method=CheckpointMethod.CHECKPOINT_SEQUENTIAL,
        segments=segments,
        preserve_rng_state=record.uses_rng,
        saving_bytes=sum(effect.retained_bytes for effect in memory.unit_effects(unit)),
        recompute_ms=unit_cost_ms(profile, unit),
    )


def build_plan(
    profile: Profile,
    units: tuple[Unit, ...] | list[Unit],
    budget_bytes: int,
    *,
    strategy: str,
    memory: MemoryModel | None = None,
    notes: tuple[Note, ...] = (),
    host_budget_bytes: int | None = None,
) -> Plan:
    """A plan checkpointing ``units``, its prediction re-checked by the memory model.
    ``host_budget_bytes``: the host memory its offloaded modules were allowed (recorded
    where one offloads). A CUDA plan that offloads counts its host copies in pinned blocks
    and says so among its assumptions (:data:`~planner.core.allocator.PINNED_HOST_ASSUMPTION`)."""
    memory = (
        memory.include_nesting(profile) if memory is not None else MemoryModel.for_profile(profile)
    )
    offloads = any(unit.option in OFFLOAD_OPTIONS for unit in units)
    decisions = tuple(
        decision for unit in sorted(units) for decision in _decisions(profile, unit, memory)
    )
    recompute_ms = sum(d.recompute_ms for d in decisions)
    return Plan(
        budget_bytes=budget_bytes,
        predicted_peak_bytes=memory.peak_bytes(units),
        baseline_peak_bytes=profile.measured_peak_bytes,
        predicted_overhead=recompute_ms / profile.step_ms if profile.step_ms > 0 else 0.0,
        recompute_ms=recompute_ms,
        step_ms=profile.step_ms,
        static_bytes=profile.static_bytes,
        modules=decisions,
        fingerprint=profile.fingerprint,
        batch=profile.batch,
        device=profile.device,
        torch_version=profile.torch_version,
        model_name=profile.model_name,
        strategy=strategy,
        notes=notes,
        memory_source=profile.memory_source.value,
        cost_source=profile.cost_source.value,
        target=profile.target,
        assumptions=(
            *profile.assumptions,
            *(general_notes((PINNED_HOST_ASSUMPTION,)) if offloads and memory.pinned_host else ()),
        ),
        model_file=profile.model_file,
        loop=profile.loop,
        parallel=profile.parallel,
        switches=profile.switches,
        host_budget_bytes=host_budget_bytes if offloads else None,
        predicted_host_peak_bytes=memory.host_peak_bytes(units),
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
    if solution.proven_optimal:
        text = "cheapest plan under the memory model (search finished)"
    elif solution.lower_bound_ms > 0:
        gap_ms = solution.recompute_ms - solution.lower_bound_ms
        text = (
            f"at most {gap_ms:.2f} ms ({gap_ms / solution.recompute_ms:.1%}) more "
            "recompute than the cheapest plan under the memory model (search cut short)"
        )
    else:
        text = f"best plan found in {solution.evaluations} evaluations (search cut short)"
    note = Note(NoteTopic.SOLVER, text)
    plan = build_plan(
        profile,
        solution.units,
        budget_bytes,
        strategy="optimal",
        memory=solver.memory,
        notes=(note,),
        host_budget_bytes=solver.host_budget_bytes,
    )
    return plan, solution


def baseline_every_block(profile: Profile, budget_bytes: int = 0) -> Plan:
    """The usual manual choice: checkpoint every repeated block."""
    blocks = [Unit(name) for name in profile.block_names if profile.module(name).is_candidate]
    return build_plan(profile, blocks, budget_bytes, strategy="every-block")


def _sequential_blocks_container(profile: Profile) -> str | None:
    """The nn.Sequential that holds the blocks, if the blocks are its children."""
    if not profile.block_names:
        return None
    parent = profile.block_names[0].rpartition(".")[0]
    try:
        record = profile.module(parent)
    except KeyError:
        return None
    children = unit_children(profile, parent)
    if record.module_type != "Sequential" or tuple(children) != profile.block_names:
        return None
    return parent


def _stacks(profile: Profile) -> list[tuple[str, ...]]:
    """The profile's blocks by stack (``Profile.block_stacks``; one stack when it is empty)."""
    sizes = profile.block_stacks or (len(profile.block_names),)
    starts = [sum(sizes[:index]) for index in range(len(sizes))]
    return [
        profile.block_names[start : start + size] for start, size in zip(starts, sizes, strict=True)
    ]


def baseline_plans(profile: Profile, budget_bytes: int = 0, *, every: int = 2) -> dict[str, Plan]:
    """The usual manual choices, as plans of the same type as the solver's:

    ``none``; ``every-block``; ``every-2nd-block`` (blocks 0, 2, 4, ... of each stack: an
    encoder-decoder's encoder and decoder each start at their block 0; ``every`` sets k);
    ``every-block-POLICY``, one selective option (``save-matmuls``, ``torchtitan``, ...,
    ``nested``) on every block, for each option every block has; and ``sqrt-n-segments``,
    ``checkpoint_sequential`` over the blocks in round(sqrt(n)) segments, when the blocks
    are the children of one ``nn.Sequential``.
    """
    memory = MemoryModel.for_profile(profile)
    blocks = [name for name in profile.block_names if profile.module(name).is_candidate]
    whole_blocks = [Unit(block) for block in blocks]
    ordinal = {1: "st", 2: "nd", 3: "rd"}.get(every if every < 20 else every % 10, "th")
    every_kth = f"every-{every}{ordinal}-block"
    plans = {
        "none": build_plan(profile, [], budget_bytes, strategy="none", memory=memory),
        "every-block": build_plan(
            profile, whole_blocks, budget_bytes, strategy="every-block", memory=memory
        ),
        every_kth: build_plan(
            profile,
            [
                Unit(block)
                for stack in _stacks(profile)
                for block in [name for name in stack if name in blocks][::every]
            ],
            budget_bytes,
            strategy=every_kth,
            memory=memory,
        ),
    }
    # The uniform selective baselines: one option on every block (torchtitan's usual
    # choice), where every block has it.
    for option in (*(str(policy) for policy in SelectivePolicy), NESTED):
        if blocks and all(
            any(cost.option == option for cost in profile.module(block).options) for block in blocks
        ):
            name = f"every-block-{option}"
            plans[name] = build_plan(
                profile,
                [Unit(block, option=option) for block in blocks],
                budget_bytes,
                strategy=name,
                memory=memory,
            )
    container = _sequential_blocks_container(profile)
    if container is not None:
        segments = max(2, round(len(profile.block_names) ** 0.5))
        plans["sqrt-n-segments"] = build_plan(
            profile,
            [Unit(container, segments=segments)],
            budget_bytes,
            strategy="sqrt-n-segments",
            memory=memory,
        )
    return plans


def frontier(profile: Profile, points: int = 50, *, solver: Solver | None = None) -> list[Plan]:
    """The memory/time trade-off: the cheapest plan at ``points`` budgets spread evenly from
    the lowest feasible peak to the unplanned peak, highest budget first. Each plan's
    ``budget_bytes`` is the budget it was solved for."""
    solver = solver or Solver(profile)
    _, lowest = solver.lowest_peak()
    highest = profile.measured_peak_bytes
    budgets = sorted(
        {int(lowest + (highest - lowest) * i / max(1, points - 1)) for i in range(points)},
        reverse=True,
    )
    # Solved from the lowest budget up: each answer fits every higher budget, so its cost
    # bounds the next search (the solver keeps the plans it found).
    plans = [plan_for_budget(profile, budget, solver=solver)[0] for budget in reversed(budgets)]
    return plans[::-1]
