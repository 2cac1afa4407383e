"""GPU calibration measurements (planner.measure.gpu_calibration): need a CUDA device."""

from __future__ import annotations

import pytest
import torch

from planner.measure.gpu_calibration import (
    measure_bandwidth_bytes_per_s,
    measure_kernel_launch_s,
    measure_matmul_flops_per_s,
)
from planner.plan.targets import load_spec


def test_calibration_refuses_a_device_that_is_not_cuda() -> None:
    with pytest.raises(ValueError, match="needs a CUDA device"):
        measure_bandwidth_bytes_per_s("cpu")


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
