"""Plan every stage of a pipeline (docs/distributed.md, "Pipeline stages"):
:func:`plan_pipeline` profiles each stage on its own simulated rank
(:func:`planner.measure.distributed.record_rank_memory`, which runs the stage's schedule),
solves each for the same per-rank budget, and puts the stages' plans in one plan
(:func:`combined_plan`), which is checked on that many real ranks where they run here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging

from planner.check.ranks import check_plan_on_ranks
from planner.checked_plan import CheckedPlan
from planner.core.errors import InfeasibleBudgetError, PlanCheckError
from planner.core.loop import PLAIN_LOOP
from planner.core.parallel import ParallelLayout
from planner.core.units import format_bytes
from planner.measure.model_file import ModelFile
from planner.measure.profiler import ProgressCallback
from planner.pipeline import (
    marked_unchecked,
    marked_unchecked_ranks,
    plan_checked,
    profile_model_file,
    ranks_run_here,
)
from planner.plan.plan_file import Plan
from planner.plan.targets import DeviceSpec

__all__ = ["combined_plan", "plan_pipeline"]

logger = logging.getLogger(__name__)


def combined_plan(stage_plans: tuple[Plan, ...], layout: ParallelLayout) -> Plan:
    """One plan holding every stage's (``stages``), for the whole pipeline ``layout``: its
    own ``modules`` empty (each stage applies its own), its peaks the highest stage's, its
    overhead (and times) the slowest stage's (the pipeline runs at its pace), its
    fingerprint one digest of the stages'."""
    worst = max(stage_plans, key=lambda plan: plan.predicted_peak_bytes)
    slowest = max(stage_plans, key=lambda plan: plan.predicted_overhead)
    digests = [plan.fingerprint.get("digest", "") for plan in stage_plans]
    fingerprint = {
        "digest": hashlib.sha256(":".join(digests).encode()).hexdigest(),
        "stage_digests": digests,
    }
    return dataclasses.replace(
        worst,
        predicted_peak_bytes=max(plan.predicted_peak_bytes for plan in stage_plans),
        baseline_peak_bytes=max(plan.baseline_peak_bytes for plan in stage_plans),
        static_bytes=max(plan.static_bytes for plan in stage_plans),
        predicted_overhead=slowest.predicted_overhead,
        recompute_ms=slowest.recompute_ms,
        step_ms=slowest.step_ms,
        modules=(),
        fingerprint=fingerprint,
        parallel=layout,
        stages=stage_plans,
        measured_peak_bytes=None,
        checked=False,
    )


def plan_pipeline(
    model_file: ModelFile,
    budget_bytes: int,
    layout: ParallelLayout,
    *,
    device: str = "cpu",
    seed: int = 0,
    check: bool = True,
    target: DeviceSpec | None = None,
    progress: ProgressCallback | None = None,
    offload: bool = True,
    host_budget_bytes: int | None = None,
) -> CheckedPlan:
    """Profile and solve each stage of ``layout.pipeline`` for ``budget_bytes`` (each rank's
    peak), put their plans in one (:func:`combined_plan`), and check it on real ranks where
    ``check`` and they run here (every rank within the budget, its loss, gradients and
    buffers bit-identical to the unplanned pipeline's); else it is marked unchecked. The
    result's ``stages`` are each stage's :class:`CheckedPlan`."""
    pipeline = layout.pipeline
    assert pipeline is not None
    results = []
    for stage in range(pipeline.stages):
        stage_layout = dataclasses.replace(
            layout, pipeline=dataclasses.replace(pipeline, stage=stage)
        )
        profile = profile_model_file(
            model_file,
            device=device,
            seed=seed,
            budget_bytes=budget_bytes,
            target=target,
            loop=PLAIN_LOOP,
            parallel=stage_layout,
            progress=progress,
        )
        # Solved alone: a stage's recomputation is tried on the real ranks, in its schedule.
        try:
            result = plan_checked(
                profile,
                budget_bytes,
                model_path=None,
                device=device,
                seed=seed,
                progress=progress,
                offload=offload,
                host_budget_bytes=host_budget_bytes,
            )
        except InfeasibleBudgetError as error:
            staged = InfeasibleBudgetError(
                f"pipeline stage {stage} of {pipeline.stages}: {error}",
                budget_bytes=error.budget_bytes,
                min_budget_bytes=error.min_budget_bytes,
            )
            staged.profile = error.profile
            raise staged from None
        results.append(result)
    plan = combined_plan(tuple(result.plan for result in results), layout)
    worst = max(range(len(results)), key=lambda index: results[index].plan.predicted_peak_bytes)
    combined = CheckedPlan(
        results[worst].profile, plan, results[worst].solution, None, 1, stages=tuple(results)
    )
    if target is not None:
        return marked_unchecked(combined, target, model_file.source)
    if not check:
        return combined
    if not ranks_run_here(layout, device):
        return marked_unchecked_ranks(combined, layout, model_file.source)
    if progress:
        progress(f"checking the plan on {layout.world_size} ranks", 0, 1)
    ranks = check_plan_on_ranks(model_file.source, plan, device=device, seed=seed)
    for rank in ranks.ranks:
        if not rank.training_unchanged:
            raise PlanCheckError(
                f"the plan changes rank {rank.rank}'s training step ("
                + "; ".join(map(str, rank.differences[:3]))
                + "); please report this with your model file"
            )
        if not rank.within_budget:
            raise PlanCheckError(
                f"rank {rank.rank}'s stage plan measured "
                f"{format_bytes(rank.measured_peak_bytes)}, "
                f"over the budget {format_bytes(budget_bytes)} (predicted "
                f"{format_bytes(rank.predicted_peak_bytes)}); try a larger budget"
            )
    measured: dict[int, int] = {}  # each stage's highest rank
    for rank in ranks.ranks:
        stage = layout.stage_of_rank(rank.rank)
        measured[stage] = max(measured.get(stage, 0), rank.measured_peak_bytes)
    stage_plans = tuple(
        dataclasses.replace(stage, measured_peak_bytes=measured[index], checked=True)
        for index, stage in enumerate(plan.stages)
    )
    plan = dataclasses.replace(
        plan,
        stages=stage_plans,
        measured_peak_bytes=max(measured.values()),
        checked=True,
    )
    stages = tuple(
        dataclasses.replace(result, plan=stage_plan)
        for result, stage_plan in zip(results, stage_plans, strict=True)
    )
    return dataclasses.replace(combined, plan=plan, check=ranks.combined(), stages=stages)
