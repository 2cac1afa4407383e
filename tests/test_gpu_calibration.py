"""GPU calibration measurements (planner.measure.gpu_calibration): need a CUDA device."""

from __future__ import annotations

import pytest
import torch

from planner.core.errors import ProfilingError
from planner.measure.gpu_calibration import (
    CALIBRATION_STEPS,
    calibrate_device,
    measure_bandwidth_bytes_per_s,
    measure_kernel_launch_s,
    measure_matmul_flops_per_s,
)
from planner.plan.calibration import spec_from_measurements
from planner.plan.targets import load_spec


def test_calibration_refuses_a_device_that_is_not_cuda() -> None:
    with pytest.raises(ProfilingError, match="needs a CUDA device, not cpu"):
        measure_bandwidth_bytes_per_s("cpu")
    with pytest.raises(ProfilingError, match="needs a CUDA device"):
        calibrate_device("cpu")


@pytest.mark.cuda
def test_bandwidth_and_matmul_rate_are_below_the_data_sheets_and_not_far_below() -> None:
    name = torch.cuda.get_device_name()
    bandwidth = measure_bandwidth_bytes_per_s("cuda")
    bf16 = measure_matmul_flops_per_s(torch.bfloat16, "cuda")
    fp32 = measure_matmul_flops_per_s(torch.float32, "cuda")
    assert bf16 > 2 * fp32 > 0
    if "H100" in name:  # against the built-in spec's data-sheet figures
        spec = load_spec("h100-80gb")
        assert 0.5 < bandwidth / spec.memory_bandwidth_bytes_per_s < 1.05
        assert 0.3 < bf16 / spec.peak_for("bfloat16") < 1.05
    else:
        assert bandwidth > 1e11


@pytest.mark.cuda
def test_a_host_bound_steps_time_per_op_is_above_a_bare_launch() -> None:
    launch = measure_kernel_launch_s("cuda", repeats=10)
    assert launch.step_ops > 50
    assert 0 < launch.bare_s_per_op < launch.step_s_per_op < 1e-3


@pytest.mark.cuda
def test_a_calibration_measures_plausible_values_in_under_a_minute() -> None:
    import time

    steps: list[tuple[str, int, int]] = []
    started = time.perf_counter()
    measured = calibrate_device("cuda", progress=lambda *step: steps.append(step))
    seconds = time.perf_counter() - started
    assert seconds < 60, seconds
    assert [done for _, done, _ in steps] == list(range(CALIBRATION_STEPS))
    assert measured.memory_bytes == torch.cuda.get_device_properties(0).total_memory
    assert measured.device_name == torch.cuda.get_device_name(0)
    # cuBLAS's workspaces: at least 1 MiB, below 1 GiB.
    assert 2**20 <= measured.workspace_bytes < 2**30
    assert measured.copy_bandwidth_bytes_per_s > 1e11
    assert 0 < measured.elementwise_bandwidth_bytes_per_s < 2 * measured.copy_bandwidth_bytes_per_s
    peaks, layers = measured.peak_matmul_flops_per_s, measured.layer_matmul_flops_per_s
    assert "float32" in peaks and peaks.keys() == layers.keys()
    assert peaks["float16"] > 2 * peaks["float32"] > 0
    assert all(0 < layers[dtype] < 1.5 * peaks[dtype] for dtype in peaks)
    assert 0 < measured.bare_launch_s < measured.kernel_launch_s < 1e-3
    assert 0 <= measured.checkpoint_call_s < 0.1
    assert measured.host_link_bytes_per_s > 1e9
    spec = spec_from_measurements(measured)
    assert 0 < spec.matmul_efficiency <= 1 and 0 < spec.memory_efficiency <= 1
