"""Measure on a CUDA device what its :class:`~planner.plan.targets.DeviceSpec` time model needs.

Each function times one thing on the GPU that is here, with CUDA events or a synchronized
host clock, and returns it in the spec's units (the module notes of
:mod:`planner.plan.targets`, "The time model", say what each value means);
:func:`calibrate_device` runs them all (sized to take under a minute on an H100) into a
:class:`~planner.plan.calibration.GpuMeasurements` record, which
:func:`~planner.plan.calibration.spec_from_measurements` turns into a spec
(``ckpt-plan calibrate --device cuda -o SPEC.json``):

* :func:`measure_memory_bytes`: the card's memory as the driver reports it;
* :func:`measure_workspace_bytes`: what cuBLAS keeps in the caching allocator for a linear
  layer's forward and its backward (autograd's thread), on a stream of their own so that
  nothing earlier in the process has made it already;
* :func:`measure_bandwidth_bytes_per_s`: a large device-to-device copy (it reads and writes
  every byte: ``2 * size`` bytes moved);
* :func:`measure_elementwise_bytes_per_s`: the median bytes per second of elementwise ops
  and normalizations on activation-sized tensors (bytes moved as the profiler counts
  them: every input and output once);
* :func:`measure_matmul_flops_per_s`: a large square matmul in a dtype (``2 * n**3``
  FLOPs): the spec's peak; :func:`measure_layer_matmul_flops_per_s`: the median over a
  transformer layer's matmul shapes, for the spec's ``matmul_efficiency``;
* :func:`measure_kernel_launch_s`: the host's time per dispatched op in a host-bound training
  step (a small MLP's forward and backward, so Python, the dispatcher and autograd are in it,
  as in the steps the spec's value was fitted to), and the bare launch of a tiny kernel in a
  loop (a lower bound, for comparison);
* :func:`measure_checkpoint_call_s`: what one checkpointed call adds to that step, with
  each block checkpointed as :func:`~planner.apply.apply_plan` wraps it, beyond the host
  time of the ops its recomputation dispatches.

Each raises :class:`~planner.core.errors.ProfilingError` where the device is not a CUDA
device that is here.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import torch

from planner.dispatch import DispatchWatcher
from planner.measure.host_link import DEFAULT_COPY_BYTES, cuda_device_here, measure_host_link
from planner.plan.calibration import GpuMeasurements
from planner.plan.targets import BUILT_IN_SPECS

__all__ = [
    "CALIBRATION_STEPS",
    "LaunchTimes",
    "calibrate_device",
    "measure_bandwidth_bytes_per_s",
    "measure_checkpoint_call_s",
    "measure_elementwise_bytes_per_s",
    "measure_kernel_launch_s",
    "measure_layer_matmul_flops_per_s",
    "measure_matmul_flops_per_s",
    "measure_memory_bytes",
    "measure_workspace_bytes",
]

MIB = 2**20

# Transformer layers' shapes: 4096 tokens of hidden size 1024 and 4096.
_TOKENS = 4096
_HIDDEN_SIZES = (1024, 4096)


def _cuda(device: str | torch.device) -> torch.device:
    return cuda_device_here(
        device,
        "calibration",
        elsewhere="run `ckpt-plan calibrate --device cuda -o SPEC.json` on the machine with "
        "the GPU, then plan anywhere with --target SPEC.json (or a built-in one: "
        f"{', '.join(BUILT_IN_SPECS)})",
    )


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


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes a spec lists: float32, float16, and bfloat16 where the GPU has it."""
    halves = (torch.bfloat16,) if torch.cuda.is_bf16_supported() else ()
    return (*halves, torch.float16, torch.float32)


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


class _CountOps(DispatchWatcher):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def _small_mlp(device: torch.device, width: int, depth: int) -> torch.nn.Sequential:
    """``depth`` blocks (linear, GELU, layer norm) of ``width``: kernels far shorter than
    their launch, so a step of it is host-bound. Blocks ``0`` ... ``depth - 1`` are what
    :func:`measure_checkpoint_call_s` checkpoints."""
    blocks = [
        torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.LayerNorm(width)
        )
        for _ in range(depth)
    ]
    return torch.nn.Sequential(*blocks).to(device)


def _host_step_s(model: torch.nn.Module, batch: torch.Tensor, repeats: int) -> tuple[float, int]:
    """The median host time of a synchronized forward and backward of ``model`` on
    ``batch`` (after three warm-up steps), and the ops one step dispatches (counted once by
    a dispatch mode)."""

    def step() -> None:
        model(batch).sum().backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    with _CountOps() as counter:
        step()
    torch.cuda.synchronize(batch.device)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        torch.cuda.synchronize(batch.device)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), counter.count


def measure_kernel_launch_s(
    device: str | torch.device = "cuda", *, repeats: int = 50, width: int = 64, depth: int = 8
) -> LaunchTimes:
    """The host's time per dispatched op: a ``depth``-block MLP of ``width`` (kernels far
    shorter than their launch, so the step is host-bound), forward and backward, timed with
    the host clock around synchronized steps, over the ops its step dispatches; and a loop
    of tiny in-place adds."""
    device = _cuda(device)
    model = _small_mlp(device, width, depth)
    step_s, step_ops = _host_step_s(model, torch.randn(8, width, device=device), repeats)

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
    return LaunchTimes(step_s / step_ops, statistics.median(bare), step_ops)


def measure_checkpoint_call_s(
    device: str | torch.device = "cuda", *, repeats: int = 50, width: int = 64, depth: int = 8
) -> float:
    """Checkpointing's own host time per checkpointed call (the spec's
    ``checkpoint_call_s``): :func:`measure_kernel_launch_s`'s host-bound step, plain and
    with each of its ``depth`` blocks checkpointed as :func:`~planner.apply.apply_plan`
    wraps a plan's module (non-reentrant, the RNG state stashed); the difference, less the
    ops the recomputation adds at the plain step's time per op, per call. Never below 0."""
    from planner.apply import apply_plan, model_fingerprint, remove_plan
    from planner.plan.plan_file import ModuleDecision, Plan

    device = _cuda(device)
    model = _small_mlp(device, width, depth)
    batch = torch.randn(8, width, device=device)
    plain_s, plain_ops = _host_step_s(model, batch, repeats)
    plan = Plan(
        budget_bytes=0,
        predicted_peak_bytes=0,
        baseline_peak_bytes=0,
        predicted_overhead=0.0,
        recompute_ms=0.0,
        step_ms=0.0,
        static_bytes=0,
        modules=tuple(ModuleDecision(str(block)) for block in range(depth)),
        fingerprint=model_fingerprint(model),
        batch={},
        device=str(device),
        torch_version=torch.__version__,
        model_name="calibration",
    )
    apply_plan(model, plan, guard=False)
    try:
        planned_s, planned_ops = _host_step_s(model, batch, repeats)
    finally:
        remove_plan(model)
    recomputed_s = (planned_ops - plain_ops) * plain_s / plain_ops
    return max(0.0, (planned_s - plain_s - recomputed_s) / depth)


def measure_memory_bytes(device: str | torch.device = "cuda") -> int:
    """The card's memory as the driver reports it (``nvidia-smi``'s total): the spec's
    ``memory_bytes``."""
    return int(torch.cuda.get_device_properties(_cuda(device)).total_memory)


def measure_workspace_bytes(device: str | torch.device = "cuda", *, width: int = 256) -> int:
    """What cuBLAS keeps in the caching allocator for a step (the spec's
    ``workspace_bytes``): ``torch.cuda.memory_allocated`` after a linear layer's forward and
    backward in each dtype a spec lists (a linear layer with a bias runs cuBLASLt too), every
    tensor of theirs freed, less before. They run on a new stream: torch keeps cuBLAS's and
    cuBLASLt's workspaces per (thread's handle, stream), so none of the forward thread's or
    autograd's backward thread's can have been made already, whatever ran before."""
    device = _cuda(device)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        for dtype in _dtypes():
            layer = torch.nn.Linear(width, width, device=device, dtype=dtype)
            inputs = torch.randn(64, width, device=device, dtype=dtype, requires_grad=True)
            layer(inputs).sum().backward()
            del layer, inputs
    stream.synchronize()
    return torch.cuda.memory_allocated(device) - before


def _tensor_bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def measure_elementwise_bytes_per_s(
    device: str | torch.device = "cuda", *, repeats: int = 10
) -> float:
    """The median bytes per second of an add, a GELU, a layer norm and a softmax on
    transformer activations (4096 tokens of hidden size 1024 and 4096, in bfloat16 and
    float32), each op's bytes its inputs' and outputs' (as the profiler counts
    ``bytes_moved``)."""
    device = _cuda(device)
    functional = torch.nn.functional
    rates = []
    for dtype in (torch.bfloat16, torch.float32):
        for hidden in _HIDDEN_SIZES:
            x, y = (torch.randn(_TOKENS, hidden, device=device, dtype=dtype) for _ in range(2))
            weight = torch.ones(hidden, device=device, dtype=dtype)
            bias = torch.zeros(hidden, device=device, dtype=dtype)
            # Each op, and its inputs; its output is x's size.
            ops = (
                (functools.partial(torch.add, x, y), [x, y]),
                (functools.partial(functional.gelu, x), [x]),
                (
                    functools.partial(functional.layer_norm, x, (hidden,), weight, bias),
                    [x, weight, bias],
                ),
                (functools.partial(torch.softmax, x, dim=-1), [x]),
            )
            for run, inputs in ops:
                moved = _tensor_bytes([*inputs, x])
                rates.append(moved / (_event_ms(run, repeats) / 1000.0))
    return statistics.median(rates)


def measure_layer_matmul_flops_per_s(
    dtype: torch.dtype, device: str | torch.device = "cuda", *, repeats: int = 5
) -> float:
    """The median FLOP/s, in ``dtype``, of a transformer layer's matmuls as ``nn.Linear``
    runs them (the input times the transposed weight): query/key/value (h to 3h), output
    (h to h), MLP up (h to 4h) and down (4h to h), for 4096 tokens of hidden size h 1024 and
    4096."""
    device = _cuda(device)
    generator = torch.Generator(device=device).manual_seed(0)
    rates = []
    for hidden in _HIDDEN_SIZES:
        for inner, outer in (
            (hidden, 3 * hidden),
            (hidden, hidden),
            (hidden, 4 * hidden),
            (4 * hidden, hidden),
        ):
            inputs = torch.randn(_TOKENS, inner, device=device, dtype=dtype, generator=generator)
            weight = torch.randn(outer, inner, device=device, dtype=dtype, generator=generator)
            ms = _event_ms(functools.partial(torch.nn.functional.linear, inputs, weight), repeats)
            rates.append(2 * _TOKENS * inner * outer / (ms / 1000.0))
    return statistics.median(rates)


CALIBRATION_STEPS = 8
"""How many times :func:`calibrate_device` calls its ``progress``: once a measurement."""


def calibrate_device(
    device: str | torch.device = "cuda",
    *,
    host_link_bytes: int = DEFAULT_COPY_BYTES,
    host_link_copies: int = 5,
    progress: Callable[[str, int, int], None] | None = None,
) -> GpuMeasurements:
    """Measure everything a device spec holds on ``device`` (see the module docstring),
    the host link with ``host_link_copies`` copies of ``host_link_bytes`` each way
    (:func:`~planner.measure.host_link.measure_host_link`). ``progress(what, done, total)``
    is called before each of the :data:`CALIBRATION_STEPS` measurements. Raises
    :class:`ProfilingError` where ``device`` is not a CUDA device that is here."""
    device = _cuda(device)

    def step(done: int, what: str) -> None:
        if progress is not None:
            progress(what, done, CALIBRATION_STEPS)

    dtypes = _dtypes()
    with torch.cuda.device(device):
        step(0, "memory and cuBLAS workspace")
        workspace_bytes = measure_workspace_bytes(device)
        memory_bytes = measure_memory_bytes(device)
        step(1, "copy bandwidth")
        copy = measure_bandwidth_bytes_per_s(device)
        step(2, "elementwise ops' bandwidth")
        elementwise = measure_elementwise_bytes_per_s(device)
        step(3, f"matmul peaks ({', '.join(_dtype_name(dtype) for dtype in dtypes)})")
        peaks = {_dtype_name(dtype): measure_matmul_flops_per_s(dtype, device) for dtype in dtypes}
        step(4, "matmuls of transformer layers' shapes")
        layers = {
            _dtype_name(dtype): measure_layer_matmul_flops_per_s(dtype, device) for dtype in dtypes
        }
        step(5, "host time per op in a host-bound step")
        launch = measure_kernel_launch_s(device)
        step(6, "checkpointed calls in that step")
        checkpoint_call_s = measure_checkpoint_call_s(device)
        step(7, "host link (pinned copies each way)")
        link = measure_host_link(str(device), size_bytes=host_link_bytes, copies=host_link_copies)
        device_name = torch.cuda.get_device_name(device)
    return GpuMeasurements(
        device_name=device_name,
        torch_version=torch.__version__,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        memory_bytes=memory_bytes,
        workspace_bytes=workspace_bytes,
        copy_bandwidth_bytes_per_s=copy,
        elementwise_bandwidth_bytes_per_s=elementwise,
        peak_matmul_flops_per_s=peaks,
        layer_matmul_flops_per_s=layers,
        kernel_launch_s=launch.step_s_per_op,
        bare_launch_s=launch.bare_s_per_op,
        checkpoint_call_s=checkpoint_call_s,
        host_link_bytes_per_s=link.bytes_per_s,
    )
