"""The checked planning loop: re-plan on a measured overshoot, refuse a changed step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from planner import pipeline
from planner.check.result import Difference, DifferenceKind, PlanCheck
from planner.core.errors import InfeasibleBudgetError, PlanCheckError
from planner.core.records import Profile, Unit
from planner.plan.memory_model import MemoryModel
from planner.plan.plan_file import CheckpointMethod, ModuleDecision

_PROBE_NAMES = pipeline._probe_names  # before the fixture below replaces it


@pytest.fixture(autouse=True)
def _no_recompute_probe(monkeypatch):  # type: ignore[no-untyped-def]
    # These tests fake the measured check; the model path is not a real file to probe.
    monkeypatch.setattr(pipeline, "_probe_names", lambda profile, plan: [])


@pytest.fixture(scope="module")
def profile(stack_profile: Profile) -> Profile:
    return stack_profile


def _check(measured: int, budget: int, **overrides: object) -> PlanCheck:
    values = dict(
        budget_bytes=budget,
        measured_peak_bytes=measured,
        unplanned_peak_bytes=0,
        loss_equal=True,
        gradients_equal=True,
        buffers_equal=True,
        max_gradient_difference=0.0,
        differences=(),
        state_dict_keys_equal=True,
    )
    values.update(overrides)
    return PlanCheck(**values)  # type: ignore[arg-type]


def test_an_overshoot_makes_the_solver_aim_lower(profile, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    memory = MemoryModel(profile.timeline)
    every = [Unit(n) for n in profile.block_names]
    budget = (memory.peak_bytes(every) + profile.measured_peak_bytes) // 2
    seen = []

    def fake_check(model_path, plan, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(plan.predicted_peak_bytes)
        # The first plan "measures" 1% over the budget; the next one fits as predicted.
        measured = budget + budget // 100 if len(seen) == 1 else plan.predicted_peak_bytes
        return _check(measured, plan.budget_bytes)

    monkeypatch.setattr(pipeline, "check_plan", fake_check)
    result = pipeline.plan_checked(profile, budget, model_path=Path("unused.py"))
    assert result.attempts == 2
    assert seen[1] <= seen[0] - budget // 100  # aimed below the overshoot
    assert result.plan.budget_bytes == budget  # the plan still records the user's budget
    assert result.plan.measured_peak_bytes == seen[1] <= budget


def test_a_plan_that_changes_training_is_refused(profile, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    budget = profile.measured_peak_bytes - 1
    monkeypatch.setattr(
        pipeline,
        "check_plan",
        lambda model_path, plan, **kw: _check(
            0,
            budget,
            gradients_equal=False,
            differences=(Difference(DifferenceKind.GRADIENT, "w"),),
        ),
    )
    with pytest.raises(PlanCheckError, match="gradient of w"):
        pipeline.plan_checked(profile, budget, model_path=Path("unused.py"))


def test_without_a_model_path_nothing_is_run_and_infeasible_budgets_raise(profile) -> None:  # type: ignore[no-untyped-def]
    result = pipeline.plan_checked(profile, profile.measured_peak_bytes, model_path=None)
    assert result.check is None and result.plan.modules == ()
    with pytest.raises(InfeasibleBudgetError) as raised:
        pipeline.plan_checked(profile, profile.static_bytes, model_path=None)
    assert raised.value.min_budget_bytes > profile.static_bytes
    assert dataclasses.is_dataclass(result.plan)


def test_with_times_estimates_where_the_model_file_is_gone(profile) -> None:  # type: ignore[no-untyped-def]
    from planner.core.records import CostSource

    untimed = dataclasses.replace(
        profile, cost_source=CostSource.NONE, model_file="/nonexistent/model.py"
    )
    estimated = pipeline.with_times(untimed)
    assert estimated.cost_source is CostSource.ROOFLINE
    assert any("/nonexistent/model.py is not here" in note.text for note in estimated.assumptions)
    assert pipeline.with_times(profile) is profile  # already timed: as it is


def test_the_recomputation_probe_names_nested_modules_and_not_offloaded_ones(profile) -> None:  # type: ignore[no-untyped-def]
    """A nested decision has no unit of its own, but its module is recomputed too: it is
    probed (this crashed with a real-memory profile whose plan nested); an offloaded module
    is never recomputed, so it is not."""
    from types import SimpleNamespace

    plan = SimpleNamespace(
        modules=[
            ModuleDecision("blocks.0"),
            ModuleDecision("blocks.0.mlp", nested_in="blocks.0"),
            ModuleDecision("blocks.1.mlp", method=CheckpointMethod.OFFLOAD),
            ModuleDecision("blocks.2"),
        ]
    )
    assert _PROBE_NAMES(profile, plan) == ["blocks.0", "blocks.0.mlp", "blocks.2"]  # type: ignore[arg-type]
