"""Measure a real training step: its peak memory, time, loss, gradients and buffers.

This is the independent check on every prediction: it knows nothing of the profile or the
memory model; it runs the step with :class:`~planner.measure.tracking.PeakMemoryTracker`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from planner.core.records import StorageKind
from planner.measure.tracking import PeakMemoryTracker, workload_tensors
from planner.measure.workload import Workload, run_training_step

__all__ = ["StepMeasurement", "measure_step"]


@dataclass(frozen=True)
class StepMeasurement:
    """One measured step. ``gradients``/``buffers`` are CPU copies keyed by qualified name.
    ``peak_held_by_other_threads`` (CPU): the peak counted a storage that another thread
    freed later (:attr:`~planner.measure.tracking.StorageWatcher.peak_held_by_other_threads`:
    a ``gloo`` worker finishing a collective), so it may be above the step's own peak.
    ``host_peak_bytes``: the most host memory offloaded saved tensors held at once."""

    peak_bytes: int
    start_bytes: int
    step_ms: float
    loss: float
    loss_tensor: torch.Tensor
    gradients: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    peak_held_by_other_threads: bool = False
    host_peak_bytes: int = 0
    # CUDA: the caching allocator's reserved peak (None on other devices).
    reserved_peak_bytes: int | None = None


def measure_step(
    workload: Workload,
    *,
    seed: int = 0,
    warmup_steps: int = 1,
    timed_steps: int = 0,
    limit_bytes: int | None = None,
    copy_state: bool = True,
    resident: Sequence[torch.Tensor] = (),
) -> StepMeasurement:
    """Warm up (optimizer state exists), then measure one steady-state step.

    The measured step reseeds the RNG with ``seed`` so that two workloads built from the same
    seed take identical steps. ``timed_steps`` extra untracked steps give a median time
    (tracking itself slows a step down); with 0 the tracked step's own time is reported.
    ``limit_bytes`` (CPU) stops any step, warm-up included, whose live memory passes it
    (:class:`~planner.measure.tracking.MemoryLimitExceeded`). Without ``copy_state`` the gradients
    and buffers are not copied out (the copies cost memory beside the step). ``resident``:
    tensors the step's objects hold out of sight of the model, optimizer and batch (DDP's
    gradient buckets, held by its Reducer), counted from the start like the gradients. It is
    read after the warm-up steps (they may make them).
    """
    for step in range(warmup_steps):
        warmup_tracker = PeakMemoryTracker(
            workload.device,
            workload_tensors(workload.model, workload.optimizer, workload.batch),
            limit_bytes=limit_bytes,
        )
        with warmup_tracker:
            run_training_step(workload, seed=seed + 1000 + step)
    existing = workload_tensors(workload.model, workload.optimizer, workload.batch)
    existing[StorageKind.GRADIENT] = [*existing[StorageKind.GRADIENT], *resident]
    tracker = PeakMemoryTracker(workload.device, existing, limit_bytes=limit_bytes)
    del existing
    begin = time.perf_counter()
    with tracker:
        loss_value = run_training_step(workload, seed=seed)
    tracked_ms = (time.perf_counter() - begin) * 1000.0
    # The optimizer step reads gradients but does not change them; copy them outside the
    # tracked region so the copies do not count toward the peak.
    gradients = {
        name: p.grad.detach().to("cpu", copy=True)
        for name, p in workload.model.named_parameters()
        if p.grad is not None and copy_state
    }
    buffers = {
        name: buffer.detach().to("cpu", copy=True)
        for name, buffer in workload.model.named_buffers()
        if copy_state
    }
    times = []
    for step in range(timed_steps):
        if workload.device.type == "cuda":
            torch.cuda.synchronize(workload.device)
        start = time.perf_counter()
        run_training_step(workload, seed=seed + 2000 + step)
        if workload.device.type == "cuda":
            torch.cuda.synchronize(workload.device)
        times.append((time.perf_counter() - start) * 1000.0)
    return StepMeasurement(
        peak_bytes=tracker.peak_bytes,
        start_bytes=tracker.start_bytes,
        step_ms=statistics.median(times) if times else tracked_ms,
        loss=float(loss_value),
        loss_tensor=loss_value.to("cpu"),
        gradients=gradients,
        buffers=buffers,
        peak_held_by_other_threads=tracker.peak_held_by_other_threads,
        host_peak_bytes=tracker.host_peak_bytes,
        reserved_peak_bytes=tracker.reserved_peak_bytes,
    )
