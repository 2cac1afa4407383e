"""Measure on a CUDA device what its :class:`~planner.plan.targets.DeviceSpec` time model needs.

Each function times one thing on the GPU that is here, with CUDA events or a synchronized
host clock, and returns it in the spec's units (the module notes of
:mod:`planner.plan.targets`, "The time model", say what each value means):

* :func:`measure_bandwidth_bytes_per_s`: a large device-to-device copy (it reads and writes
  every byte: ``2 * size`` bytes moved);
* :func:`measure_matmul_flops_per_s`: a large square matmul in a dtype (``2 * n**3`` FLOPs);
  against the data sheet's peak it is the spec's ``matmul_efficiency``;
* :func:`measure_kernel_launch_s`: the host's time per dispatched op in a host-bound training
  step (a small MLP's forward and backward, so Python, the dispatcher and autograd are in it,
  as in the steps the spec's value was fitted to), and the bare launch of a tiny kernel in a
  loop (a lower bound, for comparison).

Not wired into the CLI: a ``calibrate --device cuda`` command writing a spec would call these.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "LaunchTimes",
    "measure_bandwidth_bytes_per_s",
    "measure_kernel_launch_s",
    "measure_matmul_flops_per_s",
]

MIB = 2**20


def _cuda(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"calibration needs a CUDA device; got {device}")
    return device


def _event_ms(run: Any, repeats: int) -> float:
    """Median time in ms of ``run()`` on the current stream, after two warm-up runs."""
    for _ in range(2):
        run()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def measure_bandwidth_bytes_per_s(
    device: str | torch.device = "cuda", *, size_bytes: int = 512 * MIB, repeats: int = 10
) -> float:
    """Device memory bandwidth: bytes read and written per second by a copy of
    ``size_bytes`` (large enough that caches do not hold it)."""
    device = _cuda(device)
    source = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    ms = _event_ms(lambda: target.copy_(source), repeats)
    return 2 * size_bytes / (ms / 1000.0)


def measure_matmul_flops_per_s(
    dtype: torch.dtype,
    device: str | torch.device = "cuda",
    *,
    size: int = 8192,
    repeats: int = 10,
) -> float:
    """FLOP/s of a ``size`` x ``size`` matmul in ``dtype`` (PyTorch's default matmul
    settings: no TF32 for float32 unless the process enabled it)."""
    device = _cuda(device)
    generator = torch.Generator(device=device).manual_seed(0)
    left = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    right = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    ms = _event_ms(lambda: torch.mm(left, right), repeats)
    return 2 * size**3 / (ms / 1000.0)


@dataclass(frozen=True)
class LaunchTimes:
    """Host time per op, in seconds: in a small training step (the spec's
    ``kernel_launch_s``), and of a bare tiny kernel in a loop (a lower bound)."""

    step_s_per_op: float
    bare_s_per_op: float
    step_ops: int


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def measure_kernel_launch_s(
    device: str | torch.device = "cuda", *, repeats: int = 50, width: int = 64, depth: int = 8
) -> LaunchTimes:
    """The host's time per dispatched op: a ``depth``-layer MLP of ``width`` (kernels far
    shorter than their launch, so the step is host-bound), forward and backward, timed with
    the host clock around synchronized steps, over the ops its step dispatches (counted once
    by a dispatch mode); and a loop of tiny in-place adds."""
    device = _cuda(device)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.LayerNorm(width)]
    model = torch.nn.Sequential(*layers).to(device)
    batch = torch.randn(8, width, device=device)

    def step() -> None:
        model(batch).sum().backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    with _CountOps() as counter:
        step()
    torch.cuda.synchronize(device)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        torch.cuda.synchronize(device)
        samples.append(time.perf_counter() - started)
    step_s = statistics.median(samples)

    value = torch.zeros(1, device=device)
    loop = 1000
    bare = []
    for _ in range(5):
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(loop):
            value.add_(1.0)
        torch.cuda.synchronize(device)
        bare.append((time.perf_counter() - started) / loop)
    return LaunchTimes(step_s / counter.count, statistics.median(bare), counter.count)
