"""A GPU's calibration: what was measured on it, and the device spec made from that.

Pure Python (no torch). :mod:`planner.measure.gpu_calibration` measures a CUDA device that
is here into a :class:`GpuMeasurements` record; :func:`spec_from_measurements` turns the
record into the :class:`~planner.plan.targets.DeviceSpec` that ``--target`` takes (written
by :func:`~planner.plan.targets.write_spec`), so a plan made on another machine is costed
with this GPU's figures. ``ckpt-plan calibrate --device cuda -o SPEC.json`` runs both.

Design notes
------------
* **Peaks are what this GPU reaches, not its data sheet's.** The spec's
  ``peak_flops_per_s`` are large square matmuls' rates, its bandwidth a large copy's: the
  best its kernels do. The built-in specs carry data-sheet peaks instead, with efficiencies
  fitted against them; both are read the same way (``roofline / efficiency``), so a
  calibrated spec's efficiencies are higher for the same device.
* **Efficiency is the typical kernel over the best one.** The time model divides an op's
  roofline by an efficiency (:mod:`planner.plan.targets`, "The time model"), so
  ``peak * efficiency`` is the rate a typical op runs at. ``matmul_efficiency`` is the
  median, over the dtypes measured, of a dtype's median rate on transformer layers' matmul
  shapes over its peak; ``memory_efficiency`` is the median bytes-per-second of
  activation-sized elementwise ops and normalizations over the copy's. A ratio above 1 (a
  small op can beat the large copy from L2) is recorded as 1, the most the spec allows,
  and a note says so.
* **Where each value came from** is written in the spec's ``notes``, one line a value, and
  when, on which GPU and with which torch in its ``source``.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from planner.plan.targets import DeviceSpec

__all__ = ["GpuMeasurements", "default_spec_name", "spec_from_measurements"]


@dataclass(frozen=True)
class GpuMeasurements:
    """What :func:`planner.measure.gpu_calibration.calibrate_device` measured on one CUDA
    device, in the units its field names say.

    ``peak_matmul_flops_per_s`` and ``layer_matmul_flops_per_s`` are keyed by dtype name
    (``bfloat16``, ``float16``, ``float32``; ``float32`` always): a large square matmul's
    rate, and the median rate over transformer layers' matmul shapes.
    ``copy_bandwidth_bytes_per_s`` is a large device-to-device copy's bytes read and written
    per second; ``elementwise_bandwidth_bytes_per_s`` the median over activation-sized
    elementwise ops and normalizations. ``kernel_launch_s`` is the host's time per
    dispatched op in a host-bound training step, ``bare_launch_s`` a tiny kernel's launch in
    a loop (a lower bound, for the notes); ``checkpoint_call_s`` what one checkpointed call
    adds to such a step beyond its recomputed ops. ``workspace_bytes`` is what cuBLAS keeps
    for a forward and its backward on a fresh stream. ``host_link_bytes_per_s`` is the
    slower way of pinned host copies (0: not measured). ``measured_at`` is an ISO 8601 time.
    """

    device_name: str
    torch_version: str
    measured_at: str
    memory_bytes: int
    workspace_bytes: int
    copy_bandwidth_bytes_per_s: float
    elementwise_bandwidth_bytes_per_s: float
    peak_matmul_flops_per_s: dict[str, float]
    layer_matmul_flops_per_s: dict[str, float]
    kernel_launch_s: float
    bare_launch_s: float
    checkpoint_call_s: float
    host_link_bytes_per_s: float = 0.0


def default_spec_name(device_name: str) -> str:
    """A spec name from a CUDA device's name: ``NVIDIA H100 80GB HBM3`` is
    ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "gpu"


def _fraction(ratio: float) -> float:
    """An efficiency from a measured ratio: at most 1 (the spec's bound)."""
    if not ratio > 0:
        raise ValueError(f"a measured efficiency must be positive, not {ratio}")
    return min(ratio, 1.0)


def spec_from_measurements(measured: GpuMeasurements, name: str | None = None) -> DeviceSpec:
    """The device spec of the calibrated GPU (see the module notes), named ``name`` or
    :func:`default_spec_name` of the device. Raises ``ValueError`` where the record lacks a
    ``float32`` peak, or a rate is not positive."""
    peaks = measured.peak_matmul_flops_per_s
    if "float32" not in peaks:
        raise ValueError("a GPU's measurements need a float32 matmul peak")
    rates = [measured.copy_bandwidth_bytes_per_s, measured.elementwise_bandwidth_bytes_per_s]
    if min(rates + list(peaks.values())) <= 0:
        raise ValueError("measured peaks and bandwidths must be positive")
    layer_ratios = {
        dtype: measured.layer_matmul_flops_per_s[dtype] / peaks[dtype]
        for dtype in peaks
        if dtype in measured.layer_matmul_flops_per_s
    }
    if not layer_ratios:
        raise ValueError("a GPU's measurements need matmul rates on layer shapes")
    matmul_ratio = statistics.median(layer_ratios.values())
    memory_ratio = measured.elementwise_bandwidth_bytes_per_s / measured.copy_bandwidth_bytes_per_s
    capped = " (measured above 1: recorded as 1)"
    notes = (
        "memory_bytes: torch.cuda.get_device_properties().total_memory",
        "workspace_bytes: memory cuBLAS kept after a linear layer's forward and backward "
        "in each dtype on a fresh stream, torch.cuda.memory_allocated()",
        "peak_flops_per_s: a square matmul per dtype, median of CUDA-event timings: "
        + ", ".join(f"{dtype} {rate / 1e12:.1f} TFLOP/s" for dtype, rate in peaks.items()),
        "memory_bandwidth_bytes_per_s: a large device-to-device copy, 2 bytes moved a byte "
        f"copied: {measured.copy_bandwidth_bytes_per_s / 1e9:.0f} GB/s",
        f"matmul_efficiency {matmul_ratio:.3f}{capped if matmul_ratio > 1 else ''}: median "
        "over dtypes of the median rate on transformer layers' matmul shapes over the peak: "
        + ", ".join(f"{dtype} {ratio:.3f}" for dtype, ratio in layer_ratios.items()),
        f"memory_efficiency {memory_ratio:.3f}{capped if memory_ratio > 1 else ''}: median "
        "bytes/s of activation-sized elementwise ops and normalizations "
        f"({measured.elementwise_bandwidth_bytes_per_s / 1e9:.0f} GB/s) over the copy's",
        f"kernel_launch_s: the host's time per dispatched op in a host-bound training step "
        f"(a small MLP's forward and backward): {measured.kernel_launch_s * 1e6:.1f} us; a "
        f"bare launch in a loop: {measured.bare_launch_s * 1e6:.1f} us",
        "checkpoint_call_s: the same step with each block checkpointed as a plan applies it, "
        "less the recomputed ops' host time, per checkpointed call: "
        f"{measured.checkpoint_call_s * 1e6:.0f} us",
        "host_link_bytes_per_s: pinned host copies on a side stream, the slower way"
        if measured.host_link_bytes_per_s > 0
        else "host_link_bytes_per_s: not measured (no module is offered offloading)",
    )
    return DeviceSpec(
        name=name or default_spec_name(measured.device_name),
        device_type="cuda",
        memory_bytes=measured.memory_bytes,
        peak_flops_per_s=dict(peaks),
        memory_bandwidth_bytes_per_s=measured.copy_bandwidth_bytes_per_s,
        workspace_bytes=measured.workspace_bytes,
        source=(
            f"calibrated on {measured.device_name} by `ckpt-plan calibrate` at "
            f"{measured.measured_at}, torch {measured.torch_version}"
        ),
        notes=notes,
        host_link_bytes_per_s=measured.host_link_bytes_per_s,
        kernel_launch_s=measured.kernel_launch_s,
        matmul_efficiency=_fraction(matmul_ratio),
        memory_efficiency=_fraction(memory_ratio),
        checkpoint_call_s=measured.checkpoint_call_s,
    )
