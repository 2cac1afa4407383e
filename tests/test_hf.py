"""Hugging Face transformers models (small configs, random weights): a plan made by
ckpt-plan, run in a separate process after apply_plan, fits and leaves training unchanged.
The full three-budget sweep over all models is benchmarks/check_plans.py."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from planner.check import check_plan
from planner.planning import baseline_every_block, plan_for_budget
from planner.profiler import profile_model_file
from planner.workload import load_model_file

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.hf
@pytest.mark.parametrize("name", ["hf_gpt2", "hf_llama"])
def test_a_mid_budget_plan_fits_and_trains_identically(name: str) -> None:
    path = EXAMPLES / f"{name}.py"
    profile = profile_model_file(load_model_file(path))
    low = baseline_every_block(profile).predicted_peak_bytes
    assert low < profile.measured_peak_bytes
    budget = (low + profile.measured_peak_bytes) // 2
    plan, _ = plan_for_budget(profile, budget)
    assert plan.modules
    check = check_plan(path, plan)
    assert check.passed, check.differences
    assert check.measured_peak_bytes <= budget
    assert (
        abs(check.measured_peak_bytes - plan.predicted_peak_bytes)
        <= 0.02 * check.measured_peak_bytes
    )
