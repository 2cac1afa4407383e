"""check_plan runs a plan in a separate process and catches plans that change training."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from planner.check.compare import CheckReference, check_plan, run_check
from planner.core.records import Profile, Unit
from planner.measure.workload import load_model_file
from planner.pipeline import plan_checked, profile_model_file
from planner.solve.planning import baseline_every_block, build_plan

DATA = Path(__file__).resolve().parent / "data"

MODEL = Path(__file__).resolve().parent / "data" / "small_cnn.py"
GPT = Path(__file__).resolve().parent.parent / "examples" / "gpt.py"


@pytest.fixture(scope="module")
def cnn_profile() -> Profile:
    return profile_model_file(load_model_file(MODEL))


@pytest.mark.child_process
@pytest.mark.slow
def test_a_plan_restoring_batchnorm_buffers_passes_and_one_that_does_not_is_caught(
    cnn_profile: Profile,
) -> None:
    profile = cnn_profile
    assert "1.running_mean" in profile.module("0").mutated_buffers
    plan = build_plan(profile, [Unit("0"), Unit("1")], profile.measured_peak_bytes, strategy="test")
    assert all(decision.restore_buffers for decision in plan.modules)

    good = check_plan(MODEL, plan)
    assert good.passed, good.differences
    assert good.measured_peak_bytes == plan.predicted_peak_bytes
    assert good.unplanned_peak_bytes == profile.measured_peak_bytes

    # Without restoring, recomputation updates the running statistics a second time.
    careless = dataclasses.replace(
        plan,
        modules=tuple(dataclasses.replace(d, restore_buffers=()) for d in plan.modules),
    )
    bad = check_plan(MODEL, careless)
    assert bad.loss_equal and bad.gradients_equal
    assert not bad.buffers_equal and not bad.passed
    assert any("running_mean" in str(difference) for difference in bad.differences)


def test_the_recomputation_reference_passes_a_good_plan_without_running_the_unplanned_step(
    cnn_profile: Profile,
) -> None:
    profile = cnn_profile
    plan = build_plan(profile, [Unit("0"), Unit("1")], profile.measured_peak_bytes, strategy="test")
    check = check_plan(MODEL, plan, reference=CheckReference.RECOMPUTATION)
    assert check.passed and check.training_unchanged, check.differences
    assert check.reference == "recomputation" and check.unplanned_peak_bytes is None
    assert check.recomputation_equal and check.buffers_equal and check.recomputed_ops > 0
    assert check.measured_peak_bytes == plan.predicted_peak_bytes


def test_the_recomputation_reference_catches_batchnorm_statistics_updated_twice(
    cnn_profile: Profile,
) -> None:
    profile = cnn_profile
    plan = build_plan(profile, [Unit("0"), Unit("1")], profile.measured_peak_bytes, strategy="test")
    careless = dataclasses.replace(
        plan, modules=tuple(dataclasses.replace(d, restore_buffers=()) for d in plan.modules)
    )
    bad = run_check(MODEL, careless, reference=CheckReference.RECOMPUTATION)
    assert not bad.buffers_equal and not bad.passed
    assert any("running_mean" in str(difference) for difference in bad.differences)


@pytest.mark.slow
def test_the_recomputation_reference_catches_dropout_recomputed_without_its_rng_state() -> None:
    profile = profile_model_file(load_model_file(GPT), timing_steps=1)  # times do not matter
    plan = build_plan(
        profile, [Unit("blocks.1"), Unit("blocks.3")], profile.measured_peak_bytes, strategy="t"
    )
    assert all(decision.preserve_rng_state for decision in plan.modules)
    assert run_check(GPT, plan, reference=CheckReference.RECOMPUTATION).passed
    careless = dataclasses.replace(
        plan,
        modules=tuple(dataclasses.replace(d, preserve_rng_state=False) for d in plan.modules),
    )
    bad = run_check(GPT, careless, reference=CheckReference.RECOMPUTATION)
    assert not bad.recomputation_equal and not bad.passed
    assert bad.recompute_mismatches == ("blocks.1", "blocks.3")
    assert "recomputation of blocks.1 differs from its forward" in str(bad.differences[0])
    # The unplanned step agrees: that plan changes the gradients (and so, after the
    # warm-up step, the weights and the loss too).
    unplanned = run_check(GPT, careless, reference=CheckReference.UNPLANNED)
    assert not unplanned.gradients_equal and not unplanned.passed


def test_the_rng_state_a_models_own_backward_moves_is_no_plan_difference() -> None:
    path = DATA / "reseeding_backward.py"
    profile = profile_model_file(load_model_file(path), timing_steps=1)
    plan = build_plan(
        profile, [Unit("blocks.0"), Unit("blocks.1")], profile.measured_peak_bytes, strategy="t"
    )
    assert not any(decision.preserve_rng_state for decision in plan.modules)  # draws nothing
    check = run_check(path, plan, reference=CheckReference.RECOMPUTATION)
    assert check.passed and check.recomputation_equal and check.buffers_equal
    # (A recomputation that draws without the forward's RNG state is still named: the
    # dropout test above.)


def test_a_check_stops_a_step_that_passes_its_memory_limit(cnn_profile: Profile) -> None:
    profile = cnn_profile
    limit = profile.measured_peak_bytes - 1
    plan = build_plan(profile, [], limit, strategy="test")  # the unplanned step: over by 1 byte
    check = run_check(MODEL, plan, reference=CheckReference.RECOMPUTATION, limit_bytes=limit)
    assert not check.within_budget and not check.passed
    assert check.measured_peak_bytes > limit
    assert str(check.differences[0]).startswith("stopped: live tensor memory reached")


def test_an_unplanned_step_that_does_not_reproduce_itself_is_no_bit_exact_reference() -> None:
    path = DATA / "unreproducible.py"
    profile = profile_model_file(load_model_file(path))
    plan = baseline_every_block(profile, budget_bytes=profile.measured_peak_bytes)
    check = run_check(path, plan, reference=CheckReference.UNPLANNED)
    assert check.loss_equal is None and check.gradients_equal is None
    assert check.buffers_equal is None  # they differ between two unplanned steps too
    assert str(check.differences[0]).startswith("not compared bit for bit: two unplanned steps")
    assert check.passed and check.training_unchanged
    # The tool's own loop then compares each recomputation with its forward instead.
    result = plan_checked(
        profile, plan.predicted_peak_bytes, model_path=path, reference=CheckReference.UNPLANNED
    )
    assert result.check is not None and result.check.loss_equal is None
    assert result.check.recomputation_equal and result.check.recomputed_ops > 0
