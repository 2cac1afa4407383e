"""The training loop's shape (planner.core.loop): a plan made for a Lightning-style or a
gradient-accumulation loop predicts the peak that loop measures, written out by hand here as
those loops run; a plan made for the plain loop goes over its budget in them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from planner.apply import apply_plan
from planner.check.compare import CheckReference, check_plan
from planner.core.errors import LoopShapeError
from planner.core.loop import PLAIN_LOOP, LoopShape, ZeroGrad, loop_from_dict, loop_to_dict
from planner.core.records import Profile, Unit
from planner.measure.fake import build_fake_workload
from planner.measure.profiler import record_memory
from planner.measure.tracking import PeakMemoryTracker, workload_tensors
from planner.measure.workload import Workload, build_workload, load_model_file
from planner.plan.plan_file import Plan
from planner.solve.planning import build_plan

GPT = Path(__file__).resolve().parent / "data" / "small_gpt.py"  # dropout, tied embeddings
LIGHTNING = LoopShape(zero_grad=ZeroGrad.AFTER_FORWARD)
ACCUMULATION = LoopShape(grad_accum=2)


def test_a_loop_shape_is_validated_and_round_trips_through_its_json_object() -> None:
    for loop in (PLAIN_LOOP, LIGHTNING, ACCUMULATION, LoopShape("after-forward", 2)):  # type: ignore[arg-type]
        assert loop_from_dict(loop_to_dict(loop)) == loop
    assert LoopShape("after-forward").zero_grad is ZeroGrad.AFTER_FORWARD  # type: ignore[arg-type]
    assert loop_to_dict(ACCUMULATION) == {"zero_grad": "before-forward", "grad_accum": 2}
    assert loop_from_dict(None) == PLAIN_LOOP  # a file written before loops were recorded
    assert loop_from_dict({"grad_accum": 2}) == LoopShape(grad_accum=2)
    for zero_grad, grad_accum in (("sideways", 1), ("before-forward", 0), ("after-forward", 1.5)):
        with pytest.raises(LoopShapeError):
            LoopShape(zero_grad, grad_accum)  # type: ignore[arg-type]
    with pytest.raises(LoopShapeError, match="grad_accum"):
        LoopShape(grad_accum=True)
    for data in ("plain", [1], {"zero_grad": "before-forward", "accumulate": 2}):
        with pytest.raises(LoopShapeError):
            loop_from_dict(data)
    # Accumulating without syncing: written only where set, so other loops' files read as
    # before; it needs accumulation; the cycle recorded is at most 3 micro-batches long.
    unsynced = LoopShape(grad_accum=8, no_sync=True)
    assert loop_to_dict(unsynced) == {
        "zero_grad": "before-forward",
        "grad_accum": 8,
        "no_sync": True,
    }
    assert loop_from_dict(loop_to_dict(unsynced)) == unsynced
    runs = [LoopShape(grad_accum=n, no_sync=True).micro_batches_run for n in (2, 3, 8)]
    assert runs == [2, 3, 3]
    assert ACCUMULATION.micro_batches_run == 1 and "no_sync" in unsynced.describe()
    assert (ACCUMULATION.step_words(), unsynced.step_words()) == (
        "step",
        "cycle of 3 micro-batches",
    )
    assert (ACCUMULATION.step_name, unsynced.step_name) == ("step", "cycle")
    # The step zeroes the gradients where it is a cycle's first micro-batch.
    starts = [loop.starts_a_cycle for loop in (PLAIN_LOOP, LIGHTNING, ACCUMULATION, unsynced)]
    assert starts == [True, True, False, True]
    with pytest.raises(LoopShapeError, match="no_sync needs gradient accumulation"):
        LoopShape(no_sync=True)
    with pytest.raises(LoopShapeError, match="true or false"):
        loop_from_dict({"grad_accum": 2, "no_sync": "yes"})
    assert not PLAIN_LOOP.gradients_in_forward
    assert LIGHTNING.gradients_in_forward and ACCUMULATION.gradients_in_forward
    assert "Lightning" in LIGHTNING.describe() and "2 micro-batches" in ACCUMULATION.describe()


# -- the loops, written out as they run --------------------------------------------------
def _loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch)  # the GPT computes its loss from the labels


def _plain_step(workload: Workload) -> None:
    model, optimizer, batch = workload.model, workload.optimizer, workload.batch
    optimizer.zero_grad(set_to_none=True)
    loss = _loss(model, batch)
    loss.backward()
    optimizer.step()


def _lightning_step(workload: Workload) -> None:
    """Lightning's automatic optimization: ``optimizer.step(closure)``, whose closure runs
    ``training_step``, then ``zero_grad``, then backward."""
    model, optimizer, batch = workload.model, workload.optimizer, workload.batch

    def closure() -> torch.Tensor:
        loss = _loss(model, batch)
        optimizer.zero_grad()  # set_to_none=True, torch's default
        loss.backward()
        return loss

    optimizer.step(closure)


def _accumulation_cycle(workload: Workload, micro_batches: int) -> None:
    """Gradient accumulation: backward on each micro-batch's loss / N, then one optimizer
    step and ``zero_grad``."""
    model, optimizer, batch = workload.model, workload.optimizer, workload.batch

    def micro_step() -> None:
        loss = _loss(model, batch) / micro_batches
        loss.backward()

    for _ in range(micro_batches):
        micro_step()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _hand_written(loop: LoopShape) -> Callable[[Workload], None]:
    if loop.accumulates:
        return lambda workload: _accumulation_cycle(workload, loop.grad_accum)
    return _lightning_step if loop.zero_grad is ZeroGrad.AFTER_FORWARD else _plain_step


def _measured_peak(plan: Plan, loop: LoopShape) -> int:
    """The peak of one steady-state step (a whole accumulation cycle) of the hand-written
    loop, with ``plan`` applied, by the tracker's count of live storages."""
    workload = build_workload(load_model_file(GPT), seed=0)  # its own loop is not used
    apply_plan(workload.model, plan, guard=False)
    step = _hand_written(loop)
    torch.manual_seed(1)
    step(workload)  # warm-up: optimizer state, and the gradients a Lightning step starts with
    tracker = PeakMemoryTracker(
        "cpu", workload_tensors(workload.model, workload.optimizer, workload.batch)
    )
    with tracker:
        step(workload)
    return tracker.peak_bytes


def _fake_profile(loop: LoopShape) -> Profile:
    workload, session = build_fake_workload(load_model_file(GPT), loop=loop)
    return record_memory(workload, session=session)


@pytest.mark.parametrize("loop", [LIGHTNING, ACCUMULATION], ids=["lightning", "accumulation"])
@pytest.mark.slow
def test_the_predicted_peak_is_what_the_hand_written_loop_measures(loop: LoopShape) -> None:
    profile = _fake_profile(loop)
    assert profile.loop == loop
    for units in ([], [Unit("blocks.0")]):
        plan = build_plan(profile, units, profile.measured_peak_bytes, strategy="test")
        assert plan.loop == loop
        assert _measured_peak(plan, loop) == plan.predicted_peak_bytes, units
    # Inside a checkpointed module's forward the memory model keeps what checkpointing
    # drops until that module returns (it cannot see the model's code let go earlier), and
    # wrapping the last block it is 128 bytes high in every loop, the plain one included:
    # where the peak is in the forward, as it can be with gradients alive there, the
    # prediction may be above the measurement, never below it.
    for units in ([Unit("blocks.1")], [Unit("blocks.1.mlp")]):
        plan = build_plan(profile, units, profile.measured_peak_bytes, strategy="test")
        assert _measured_peak(plan, loop) <= plan.predicted_peak_bytes, units


@pytest.mark.parametrize("loop", [LIGHTNING, ACCUMULATION], ids=["lightning", "accumulation"])
@pytest.mark.slow
def test_a_plan_for_the_plain_loop_goes_over_its_budget_in_another_loop(loop: LoopShape) -> None:
    # blocks.0 wrapped: the peak is in the forward, where the other loops keep gradients.
    plain = _fake_profile(PLAIN_LOOP)
    made_for_plain = build_plan(plain, [Unit("blocks.0")], 0, strategy="test")
    budget = made_for_plain.predicted_peak_bytes
    made_for_plain = dataclasses.replace(made_for_plain, budget_bytes=budget)
    assert made_for_plain.loop == PLAIN_LOOP
    assert _measured_peak(made_for_plain, PLAIN_LOOP) <= budget  # fits the loop it was made for
    over = _measured_peak(made_for_plain, loop)
    assert over > budget
    # Planned with the loop's shape, the same modules predict that peak.
    made_for_loop = build_plan(_fake_profile(loop), [Unit("blocks.0")], over, strategy="test")
    assert made_for_loop.predicted_peak_bytes == over


@pytest.mark.slow
def test_the_check_runs_the_loop_the_plan_records() -> None:
    # In its own process, from the plan file alone: the unplanned and the planned step of
    # the accumulation loop (the plain loop's peaks are lower: see the test above).
    profile = _fake_profile(ACCUMULATION)
    plan = build_plan(profile, [Unit("blocks.0")], profile.measured_peak_bytes, strategy="test")
    checked = check_plan(GPT, plan, reference=CheckReference.UNPLANNED)
    assert checked.passed and checked.gradients_equal, checked.differences
    assert checked.measured_peak_bytes == plan.predicted_peak_bytes
    assert checked.unplanned_peak_bytes == profile.measured_peak_bytes
