"""The CUDA path (skipped without a GPU): the tracker reports the allocator's peak; fake CUDA
profiles, native and emulated on CPU fakes, predict the real CUDA step to the byte."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.measure.tracking import PeakMemoryTracker


@pytest.mark.cuda
def test_cuda_tracker_reports_max_memory_allocated() -> None:
    device = torch.device("cuda")
    with PeakMemoryTracker(device) as tracker:
        x = torch.empty(1024, 1024, device=device)
        y = x * 2
        del x, y
    assert tracker.peak_bytes >= 2 * 1024 * 1024 * 4
    assert tracker.peak_bytes == torch.cuda.max_memory_allocated(device)


DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.cuda
def test_a_fake_cuda_profile_records_the_real_cuda_step() -> None:
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from planner.measure.workload import build_workload, load_model_file

    model_file = load_model_file(DATA / "small_gpt.py")
    workload, session = build_fake_workload(model_file, "cuda")
    assert not session.emulated and workload.device.type == "cuda"
    fake = record_memory(workload, session=session)
    real = record_memory(build_workload(model_file, device="cuda", seed=0))
    assert fake.measured_peak_bytes == real.measured_peak_bytes
    assert fake.timeline.storages == real.timeline.storages


@pytest.mark.cuda
def test_the_emulated_cuda_step_predicts_the_real_one() -> None:
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from planner.measure.workload import load_model_file

    model_file = load_model_file(DATA / "small_gpt.py")
    workload, session = build_fake_workload(model_file, "cuda")
    native = record_memory(workload, session=session)
    workload, session = build_fake_workload(model_file, "cuda", emulate=True)
    emulated = record_memory(workload, session=session)
    assert emulated.measured_peak_bytes == native.measured_peak_bytes
    assert emulated.static_bytes == native.static_bytes


@pytest.mark.cuda
def test_a_cuda_plan_is_measured_at_its_predicted_peak() -> None:
    from planner.check.compare import CheckReference, check_plan
    from planner.measure.workload import load_model_file
    from planner.pipeline import profile_model_file
    from planner.solve.planning import baseline_every_block

    path = DATA / "small_gpt.py"
    profile = profile_model_file(load_model_file(path), device="cuda")
    assert profile.workspace_bytes > 0  # cuBLAS's, counted by max_memory_allocated
    plan = baseline_every_block(profile, budget_bytes=2 * profile.measured_peak_bytes)
    check = check_plan(path, plan, device="cuda", reference=CheckReference.UNPLANNED)
    assert check.training_unchanged
    # Tensors and cuBLAS's workspaces are predicted to the byte; CUDA kernels' own
    # temporaries (not tensors) come on top, a small share of the peak.
    for measured, predicted in (
        (check.unplanned_peak_bytes, profile.measured_peak_bytes),
        (check.measured_peak_bytes, plan.predicted_peak_bytes),
    ):
        assert measured is not None and predicted <= measured <= 1.02 * predicted
    recomputation = check_plan(path, plan, device="cuda", reference=CheckReference.RECOMPUTATION)
    assert recomputation.passed and recomputation.recomputation_equal
    assert recomputation.measured_peak_bytes == check.measured_peak_bytes


@pytest.mark.cuda
def test_a_measured_cuda_step_does_not_count_last_steps_gradients() -> None:
    from planner.measure.step import measure_step
    from planner.measure.workload import build_workload, load_model_file, run_training_step

    workload = build_workload(load_model_file(DATA / "small_gpt.py"), device="cuda", seed=0)
    measured = measure_step(workload, seed=0)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    run_training_step(workload, seed=0)
    torch.cuda.synchronize()
    assert measured.peak_bytes == torch.cuda.max_memory_allocated()


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for 2 NCCL ranks")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_rank_plan_is_checked_on_two_nccl_ranks(strategy: str, tmp_path: Path) -> None:
    """The torchrun check on GPUs: one rank per GPU, NCCL; each rank's allocator peak within
    2% of the simulated rank's prediction and within the budget, training bit-identical."""
    from typer.testing import CliRunner

    from planner.cli.main import app
    from planner.plan.plan_file import load_plan

    model = Path(__file__).parent / "data" / "small_gpt.py"
    plan_path = tmp_path / "plan.json"
    result = CliRunner().invoke(
        app,
        [
            "profile",
            str(model),
            "--budget",
            "40MiB",
            "--device",
            "cuda",
            "--world-size",
            "2",
            "--parallel",
            strategy,
            "-o",
            str(plan_path),
            "--report-dir",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 0, result.output
    plan = load_plan(plan_path)
    assert plan.checked and plan.measured_peak_bytes is not None
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert plan.measured_peak_bytes == pytest.approx(plan.predicted_peak_bytes, rel=0.02)
