"""A GPU's calibration (planner.plan.calibration): measurements to a device spec, and
``ckpt-plan calibrate --out`` writing one that ``--target`` takes, with the measurement
replaced by a fixed record (no GPU here)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from planner.cli.main import app
from planner.plan.calibration import GpuMeasurements, default_spec_name, spec_from_measurements
from planner.plan.targets import load_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Made-up figures of the shape a calibration on an H100 gives (not measurements).
MEASURED = GpuMeasurements(
    device_name="NVIDIA H100 80GB HBM3",
    torch_version="2.13.0+cu128",
    measured_at="2026-01-02T03:04:05+00:00",
    memory_bytes=85_520_809_984,
    workspace_bytes=65 * 2**20,
    copy_bandwidth_bytes_per_s=3.0e12,
    elementwise_bandwidth_bytes_per_s=2.4e12,
    peak_matmul_flops_per_s={"bfloat16": 700e12, "float16": 720e12, "float32": 50e12},
    layer_matmul_flops_per_s={"bfloat16": 490e12, "float16": 540e12, "float32": 45e12},
    kernel_launch_s=15e-6,
    bare_launch_s=5e-6,
    checkpoint_call_s=200e-6,
    host_link_bytes_per_s=50e9,
)


def test_a_spec_holds_the_measured_peaks_and_the_typical_kernels_share_of_them() -> None:
    spec = spec_from_measurements(MEASURED)
    assert spec.name == "nvidia-h100-80gb-hbm3" and spec.device_type == "cuda"
    assert spec.peak_flops_per_s == MEASURED.peak_matmul_flops_per_s
    assert spec.memory_bandwidth_bytes_per_s == 3.0e12
    assert (spec.memory_bytes, spec.workspace_bytes) == (85_520_809_984, 65 * 2**20)
    assert spec.host_link_bytes_per_s == 50e9
    assert (spec.kernel_launch_s, spec.checkpoint_call_s) == (15e-6, 200e-6)
    # The median over dtypes of layer rate / peak: 0.7, 0.75, 0.9.
    assert spec.matmul_efficiency == pytest.approx(0.75)
    assert spec.memory_efficiency == pytest.approx(0.8)
    # Where it came from: when, on which GPU, with which torch; a note per value.
    for fragment in ("NVIDIA H100 80GB HBM3", "2026-01-02T03:04:05+00:00", "torch 2.13.0+cu128"):
        assert fragment in spec.source
    noted = {note.split(" ")[0].rstrip(":") for note in spec.notes}
    time_model = {"kernel_launch_s", "matmul_efficiency", "memory_efficiency", "checkpoint_call_s"}
    assert time_model | {"memory_bytes", "workspace_bytes", "peak_flops_per_s"} <= noted
    assert spec_from_measurements(MEASURED, "my-gpu").name == "my-gpu"


def test_an_efficiency_measured_above_one_is_recorded_as_one_and_said() -> None:
    fast = dataclasses.replace(MEASURED, elementwise_bandwidth_bytes_per_s=3.3e12)
    spec = spec_from_measurements(fast)
    assert spec.memory_efficiency == 1.0
    (note,) = [note for note in spec.notes if note.startswith("memory_efficiency")]
    assert "1.100" in note and "recorded as 1" in note
    unlinked = spec_from_measurements(dataclasses.replace(MEASURED, host_link_bytes_per_s=0.0))
    assert any("not measured" in note for note in unlinked.notes)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"peak_matmul_flops_per_s": {"bfloat16": 7e14}}, "float32 matmul peak"),
        ({"copy_bandwidth_bytes_per_s": 0.0}, "must be positive"),
        ({"layer_matmul_flops_per_s": {}}, "layer shapes"),
    ],
)
def test_measurements_no_spec_can_hold_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec_from_measurements(dataclasses.replace(MEASURED, **change))


def test_a_default_name_is_the_gpus_in_lower_case() -> None:
    assert default_spec_name("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"
    assert default_spec_name("  ") == "gpu"


def test_calibrate_out_writes_a_spec_that_profile_takes_as_its_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import planner.measure.gpu_calibration as gpu_calibration

    asked: list[tuple[Any, ...]] = []

    def measured(device: str, **options: Any) -> GpuMeasurements:
        for done, what in enumerate(("memory", "bandwidth")):
            options["progress"](what, done, 2)
        asked.append((device, options["host_link_bytes"], options["host_link_copies"]))
        return MEASURED

    monkeypatch.setattr(gpu_calibration, "calibrate_device", measured)
    out = tmp_path / "my-gpu.json"
    arguments = ["calibrate", "--device", "cuda:1", "-o", str(out), "--name", "my-gpu"]
    result = CliRunner().invoke(app, [*arguments, "--size", "64MiB", "--copies", "3"])
    assert result.exit_code == 0, result.output
    assert asked == [("cuda:1", 64 * 2**20, 3)]
    # Progress on stderr, a line a measurement; the spec's values on stdout.
    assert result.stderr.splitlines() == [
        "calibrating cuda:1 (1/2): memory",
        "calibrating cuda:1 (2/2): bandwidth",
    ]
    assert "matmul_efficiency" in result.stdout and "0.750" in result.stdout
    assert f"plan for this GPU with --target {out}" in result.stdout
    written = load_spec(str(out))
    assert written == spec_from_measurements(MEASURED, "my-gpu")
    assert json.loads(out.read_text())["source"].startswith("calibrated on NVIDIA H100")

    plan_path = tmp_path / "plan.json"
    profiled = CliRunner().invoke(
        app,
        [
            *("profile", str(EXAMPLES / "mlp.py"), "--budget", "110MiB", "--target", str(out)),
            *("--out", str(plan_path), "--report-dir", str(tmp_path / "report")),
        ],
    )
    assert profiled.exit_code == 0, profiled.output
    plan = json.loads(plan_path.read_text())
    assert plan["target"] == "my-gpu" and plan["device"] == "cuda"
    # The budget holds the spec's 65 MiB of cuBLAS workspace too: only with checkpointing.
    assert plan["predicted_peak_bytes"] <= plan["budget_bytes"] == 110 * 2**20
    assert plan["modules"]
