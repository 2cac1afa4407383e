"""check_plan runs a plan in a separate process and catches plans that change training."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from planner.check import check_plan
from planner.planning import build_plan
from planner.profiler import profile_model_file
from planner.workload import load_model_file

MODEL = Path(__file__).resolve().parent / "data" / "small_cnn.py"


def test_a_plan_restoring_batchnorm_buffers_passes_and_one_that_does_not_is_caught() -> None:
    profile = profile_model_file(load_model_file(MODEL))
    assert "1.running_mean" in profile.module("0").mutated_buffers
    plan = build_plan(profile, ["0", "1"], profile.measured_peak_bytes, strategy="test")
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
    assert any("running_mean" in difference for difference in bad.differences)
