"""Device specs and roofline cost estimates, for planning a device that is not here.

Pure Python (no torch). A :class:`DeviceSpec` holds what a roofline needs: peak dense
FLOP/s per dtype, memory bandwidth, and the device's memory, and what a step on it costs
beyond the roofline: the fraction of peak its kernels reach, the host's time per op, and
checkpointing's own cost. :func:`roofline_costs` turns a profile's recorded ops (FLOPs and
bytes of each, :class:`~planner.core.records.OpCost`) into module forward times and a step
time for that device (see "The time model" below), and a module's recomputation is the sum
over the ops of its forward.

The time model
--------------
Eager PyTorch runs a step on two resources at once: the host dispatches each op (Python,
the dispatcher, autograd, the launch) and queues its kernel, and the device runs the queue.
Each op therefore has two times:

* its **device time**, ``max(flops / peak_flops[dtype], bytes_moved / bandwidth) /
  efficiency``: the roofline, over the fraction of it that kind of kernel reaches
  (``matmul_efficiency`` for ops with FLOPs: matmuls, convolutions, attention;
  ``memory_efficiency`` for the rest, priced by bytes); views and metadata take none;
* its **host time**, ``kernel_launch_s``: what the host spends per op it dispatches (views
  included; the fake-tensor ``prim``/``profiler`` queries excluded).

The queue lets one hide the other, so a step takes about the longer of its two sums. Where
the device's sum is the longer (**device-bound**: large shapes) an op costs its device time
and the host's work, checkpointing's own included, hides behind the queue. Where the host's
is (**host-bound**: small kernels, which finish before the next is launched) an op costs the
longer of its two times, and every checkpointed call adds ``checkpoint_call_s`` (entering
``torch.utils.checkpoint``, the RNG state, the early stop, the pack and unpack hooks). The
regime is the step's, decided once, so that every cost stays a sum over ops (the solver
adds module costs) and a step of ops costs what its modules' forwards do. Adding the launch
to each op instead (``roofline / efficiency + launch``) cannot match a device-bound step:
on the recorded H100 rows the host's 15.5 us per op alone is 32 ms of llama_medium's 40 ms
step, which leaves its 23.7 ms of roofline 8 ms, a kernel efficiency above 1.
:data:`BUILT_IN_SPECS`' ``h100-80gb`` carries values fitted to measured H100 steps (where
each comes from is written beside it); the other built-in specs carry none (pure roofline,
efficiency 1, no host time), so their times are a lower bound and their predicted overhead
(a ratio) is what to read, not the milliseconds.

Design notes
------------
* **Which peak.** Matrix ops in fp16/bf16 run on tensor cores; fp32 matrix ops in PyTorch
  do not use TF32 unless ``torch.backends.cuda.matmul.allow_tf32`` is set (off by
  default), so fp32 uses the plain FP32 peak. Ops the FLOP counter does not count
  (elementwise, reductions, copies) are priced by bytes alone.
* **Memory** is the total the CUDA driver reports for the card (``nvidia-smi``'s total,
  ``torch.cuda.get_device_properties().total_memory``): the budget can never exceed it.
* **Workspace.** cuBLAS keeps a workspace per (thread, stream) in PyTorch's caching
  allocator for the whole run, and ``torch.cuda.max_memory_allocated()`` counts it: one for
  the forward thread and one for autograd's backward thread. ``workspace_bytes`` is their
  sum, added to every predicted peak (as a storage alive for the whole step).
* **The host link.** ``host_link_bytes_per_s`` is what a copy between device memory and
  pinned host memory reaches, each way (PCIe Gen4 x16 about 25 GB/s, Gen5 about 50 GB/s;
  NVLink-C2C on a GH200 about 450 GB/s); 0 where unknown, and then no module is offered
  the ``offload`` option. ``host_memory_bytes``: the host memory a plan may fill with
  offloaded tensors by default (0: unknown; the planning machine's free memory is used).
* **What offloading costs** (:func:`offload_cost_ms`). Nothing is recomputed; the copies
  cost what the compute does not hide, at ``bytes / host_link_bytes_per_s`` each way. A
  call's copy to the host starts when its forward ends and is hidden by the compute up to
  the end of the next candidate's forward (any module a plan may choose, at any depth, that
  ends after it: the next block, or a layer inside it): windows so cut never overlap for
  the modules of one plan, so copies never share the link inside them, and what does not
  fit a window is paid (it delays at most the later copies, whose waits it bounds). A
  call that no candidate follows has the rest of the step up to the copy back. The copy
  back starts at the backward of the module before it in backward order (the memory
  model's point 8: the next block's backward) and is hidden by the compute from there to
  the first unpack of its own backward, which waits for what is left of it; under the
  ``offload-at-use`` option (or where no module runs between) it starts at that unpack and
  is paid in full. Copies back have windows of their own too: each ends where the next
  one starts. Under :mod:`planner.apply.offload`'s copies (one side stream, in order) that is an
  upper bound, at roofline op times, of the time the copies add to a step.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from planner.core.devices import device_type
from planner.core.errors import BudgetError, PlannerError, TargetSpecError
from planner.core.records import (
    CostSource,
    ModuleProfile,
    Note,
    NoteTopic,
    OpCost,
    OptionCost,
    Profile,
    Unit,
    forward_totals_by_call,
)
from planner.plan.memory_model import NESTED, OFFLOAD, OFFLOAD_AT_USE, OFFLOAD_OPTIONS, MemoryModel
from planner.plan.policies import nested_recompute_ms

__all__ = [
    "BUILT_IN_SPECS",
    "RANKS_PER_HOST",
    "DeviceSpec",
    "StepTimeModel",
    "TargetSpecError",
    "check_spec_file",
    "check_spec_output",
    "default_host_budget",
    "load_spec",
    "offload_cost_ms",
    "op_time_ms",
    "provisional_costs",
    "ranks_per_host",
    "roofline_costs",
    "with_offload_options",
    "write_host_link",
    "write_spec",
]

TERA = 10**12
GIGA = 10**9
MIB = 2**20


@dataclass(frozen=True)
class DeviceSpec:
    """What a roofline estimate needs to know about a device (see the module notes)."""

    name: str
    device_type: str
    memory_bytes: int
    peak_flops_per_s: dict[str, float]
    memory_bandwidth_bytes_per_s: float
    workspace_bytes: int = 0
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    host_link_bytes_per_s: float = 0.0
    host_memory_bytes: int = 0
    # The time model beyond the roofline (module notes): host time per dispatched op, the
    # fraction of the roofline that matmul-like and memory-bound kernels reach, and
    # checkpointing's own host time per checkpointed call (paid where the step is
    # host-bound). The defaults make a pure roofline.
    kernel_launch_s: float = 0.0
    matmul_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    checkpoint_call_s: float = 0.0

    def peak_for(self, dtype: str) -> float:
        """Peak FLOP/s for ops computing in ``dtype`` (fp32's for dtypes not listed)."""
        return self.peak_flops_per_s.get(dtype, self.peak_flops_per_s["float32"])


_TIME_MODEL_DEFAULTS = {
    "kernel_launch_s": 0.0,
    "matmul_efficiency": 1.0,
    "memory_efficiency": 1.0,
    "checkpoint_call_s": 0.0,
}


_NVIDIA = "NVIDIA data sheets (dense, no sparsity)"
# cuBLAS's default workspace, per handle: 32 MiB on Hopper, one for the forward thread and one
# for autograd's backward thread, plus 1 MiB that cuBLASLt keeps (read on this project's lent
# H100 with torch 2.11: 65 MiB after a linear layer's forward and backward in fp32 and bf16);
# 4 MiB x 2 + 16 KiB x 8 per handle on older GPUs (CUBLAS_WORKSPACE_CONFIG's documented
# default), with the same 1 MiB.
_HOPPER_WORKSPACE = 2 * 32 * MIB + MIB
_AMPERE_WORKSPACE = 2 * (2 * 4096 + 8 * 16) * 1024 + MIB
# Pinned host <-> device copies, each way: PCIe Gen4 x16 (A100, L4, RTX 4090) and Gen5 x16
# (H100, H200) reach about 25 and 50 GB/s of their 32 and 64 GB/s.
_PCIE_GEN4 = 25.0
_PCIE_GEN5 = 50.0


def _spec(
    name: str,
    memory_mib: int,
    bf16_tflops: float,
    fp32_tflops: float,
    bandwidth_gb_s: float,
    workspace: int,
    host_link_gb_s: float,
    source: str = _NVIDIA,
    time_model: dict[str, Any] | None = None,
) -> DeviceSpec:
    spec = DeviceSpec(
        name=name,
        device_type="cuda",
        memory_bytes=memory_mib * MIB,
        peak_flops_per_s={
            "bfloat16": bf16_tflops * TERA,
            "float16": bf16_tflops * TERA,
            "float32": fp32_tflops * TERA,
        },
        memory_bandwidth_bytes_per_s=bandwidth_gb_s * GIGA,
        workspace_bytes=workspace,
        source=source,
        host_link_bytes_per_s=host_link_gb_s * GIGA,
    )
    # The time model's values, where the spec has them (the defaults: a pure roofline).
    return replace(spec, **(time_model or {}))


# The H100's time model beyond the roofline (module notes, "The time model"), fitted to the
# steps measured on this project's lent H100 80GB HBM3 (torch 2.11, its host CPU) in
# reports/benchmarks/cuda_plans.md, re-derived by ``benchmarks/gpu_time_model.py`` from those
# rows and the ops of each model's emulated profile:
# * host time per op: the three host-bound unplanned steps (gpt 17.98 ms for 1197 dispatched
#   ops, hf_gpt2 14.69 ms for 883, hf_llama 20.51 ms for 1341; their roofline is 0.2-0.3 ms),
#   53.18 ms over 3421 ops = 15.5 us (each model alone: 15.0, 16.6, 15.3 us).
# * checkpointing's own cost per call: the same three models' emulated plans (6, 3 and 3
#   checkpointed calls; measured +48.9%, +38.4%, +30.0%) less their recomputed ops' host time,
#   16.4 ms over 12 calls = 1.36 ms (each: 1.19, 1.65, 1.42 ms).
# * kernel efficiencies: llama_medium (bf16, 2 x 2048 tokens), device-bound: its unplanned
#   step (40.13 ms; roofline 12.53 ms of matmuls, 11.13 ms of memory-bound ops) and its
#   emulated plan's recomputation (+13.1% = 5.26 ms; roofline 2.29 ms of matmuls, 0.55 ms of
#   memory-bound ops), two equations in the two efficiencies: 0.51 and 0.71.
_H100_TIME_MODEL = {
    "kernel_launch_s": 15.5e-6,
    "checkpoint_call_s": 1.36e-3,
    "matmul_efficiency": 0.51,
    "memory_efficiency": 0.71,
}


BUILT_IN_SPECS: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        # name, memory (MiB, as nvidia-smi reports), bf16 dense, fp32, bandwidth (GB/s),
        # workspaces, host link (GB/s each way: PCIe Gen4 x16 ~25, Gen5 x16 ~50)
        _spec("a100-40gb", 40_960, 312, 19.5, 1_555, _AMPERE_WORKSPACE, _PCIE_GEN4),
        _spec("a100-80gb", 81_920, 312, 19.5, 2_039, _AMPERE_WORKSPACE, _PCIE_GEN4),
        _spec(
            "h100-80gb",
            81_559,
            989.4,
            66.9,
            3_350,
            _HOPPER_WORKSPACE,
            _PCIE_GEN5,
            source=f"{_NVIDIA}; launch, efficiencies and checkpoint cost fitted to measured steps",
            time_model=_H100_TIME_MODEL,
        ),
        _spec("h200", 143_771, 989.4, 66.9, 4_800, _HOPPER_WORKSPACE, _PCIE_GEN5),
        _spec("l4", 23_034, 121, 30.3, 300, _AMPERE_WORKSPACE, _PCIE_GEN4),
        _spec("rtx-4090", 24_564, 165.2, 82.6, 1_008, _AMPERE_WORKSPACE, _PCIE_GEN4),
    )
}


def load_spec(name_or_path: str) -> DeviceSpec:
    """A built-in spec by name (``h100-80gb``) or a spec from a JSON file with the fields of
    :class:`DeviceSpec` (``peak_flops_per_s`` keyed by dtype name, ``float32`` required)."""
    if name_or_path in BUILT_IN_SPECS:
        return BUILT_IN_SPECS[name_or_path]
    path = Path(name_or_path)
    if not path.suffix == ".json" and not path.exists():
        raise TargetSpecError(
            f"--target {name_or_path!r} is not a built-in device "
            f"({', '.join(BUILT_IN_SPECS)}) or a spec .json file"
        )
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TargetSpecError(f"cannot read the device spec {path}: {error}") from error
    required = {"name", "memory_bytes", "peak_flops_per_s", "memory_bandwidth_bytes_per_s"}
    if not isinstance(data, dict) or not required <= data.keys():
        raise TargetSpecError(
            f"device spec {path} must be a JSON object with {', '.join(sorted(required))}"
        )
    known = {f.name for f in fields(DeviceSpec)}
    try:
        values = {key: value for key, value in data.items() if key in known}
        values.setdefault("device_type", "cuda")
        values["memory_bytes"] = int(values["memory_bytes"])
        values["workspace_bytes"] = int(values.get("workspace_bytes", 0))
        values["host_link_bytes_per_s"] = float(values.get("host_link_bytes_per_s", 0.0))
        values["host_memory_bytes"] = int(values.get("host_memory_bytes", 0))
        for name, default in _TIME_MODEL_DEFAULTS.items():
            values[name] = float(values.get(name, default))
        values["memory_bandwidth_bytes_per_s"] = float(values["memory_bandwidth_bytes_per_s"])
        values["peak_flops_per_s"] = {
            str(k): float(v) for k, v in dict(values["peak_flops_per_s"]).items()
        }
        values["notes"] = tuple(values.get("notes", ()))
        spec = DeviceSpec(**values)
    except (TypeError, ValueError) as error:
        raise TargetSpecError(f"device spec {path} is malformed: {error}") from error
    _check_values(spec, path)
    return spec


def _check_values(spec: DeviceSpec, path: Path) -> None:
    """:class:`TargetSpecError` where a value of ``spec`` (read from, or to be written to,
    ``path``) is one no device has."""
    if "float32" not in spec.peak_flops_per_s or spec.memory_bandwidth_bytes_per_s <= 0:
        raise TargetSpecError(
            f"device spec {path} needs a positive bandwidth and a float32 entry in peak_flops_per_s"
        )
    if spec.host_link_bytes_per_s < 0 or spec.host_memory_bytes < 0:
        raise TargetSpecError(
            f"device spec {path}: host_link_bytes_per_s and host_memory_bytes cannot be negative"
        )
    if spec.kernel_launch_s < 0 or spec.checkpoint_call_s < 0:
        raise TargetSpecError(
            f"device spec {path}: kernel_launch_s and checkpoint_call_s cannot be negative"
        )
    if not (0 < spec.matmul_efficiency <= 1 and 0 < spec.memory_efficiency <= 1):
        raise TargetSpecError(
            f"device spec {path}: matmul_efficiency and memory_efficiency are fractions of the "
            "roofline, above 0 and at most 1"
        )


def check_spec_output(path: str | Path) -> Path:
    """``path`` if a device spec may be written there (a ``.json`` path, what ``--target``
    takes for a file), else :class:`TargetSpecError`."""
    target = Path(path)
    if target.suffix != ".json" or target.is_dir():
        raise TargetSpecError(
            f"{target}: write a device spec to a path ending in .json (what --target takes)"
        )
    return target


def write_spec(path: str | Path, spec: DeviceSpec) -> Path:
    """Write ``spec`` to ``path`` as the JSON file :func:`load_spec` reads (every field of
    :class:`DeviceSpec`), atomically; :class:`TargetSpecError`, and nothing written, where
    a value is one :func:`load_spec` would refuse. Returns the path."""
    from planner.core.fileio import atomic_write_text

    target = check_spec_output(path)
    _check_values(spec, target)
    data = {item.name: getattr(spec, item.name) for item in fields(DeviceSpec)}
    data["notes"] = list(spec.notes)
    atomic_write_text(target, json.dumps(data, indent=2) + "\n")
    return target


def check_spec_file(path: str | Path) -> Path:
    """``path`` if it is a valid device spec .json file (not a built-in name), else
    :class:`TargetSpecError`."""
    source = Path(path)
    if source.suffix != ".json" or not source.is_file():
        raise TargetSpecError(f"--spec {source}: give an existing device spec .json file")
    load_spec(str(source))
    return source


def write_host_link(path: str | Path, host_link_bytes_per_s: float) -> DeviceSpec:
    """Set ``host_link_bytes_per_s`` in the device spec file at ``path`` (a measured link,
    `ckpt-plan calibrate --spec`), keeping its other fields as written; atomically. Raises
    :class:`TargetSpecError` where ``path`` is not a valid spec file. Returns the spec."""
    from planner.core.fileio import atomic_write_text

    source = check_spec_file(path)
    data = json.loads(source.read_text(encoding="utf-8"))
    data["host_link_bytes_per_s"] = float(host_link_bytes_per_s)
    atomic_write_text(source, json.dumps(data, indent=2) + "\n")
    return load_spec(str(source))


# Ranks that share one host's memory in a torchrun job, where the plan cannot know: the
# GPUs of one HGX/DGX node (`torchrun --nproc-per-node 8`).
RANKS_PER_HOST = 8


def ranks_per_host(world_size: int) -> int:
    """How many ranks of a job of ``world_size`` share one host's memory, as the default host
    budget assumes: all of them up to :data:`RANKS_PER_HOST` (a job run here, on at most 4
    ranks, has them all on this machine), then a host of that many."""
    return max(1, min(world_size, RANKS_PER_HOST))


def default_host_budget(spec: DeviceSpec | None, world_size: int = 1) -> tuple[int, str]:
    """The host memory one process's offloaded tensors may fill when not told, and where it
    came from: the spec's host memory where it gives one, else what this machine has free
    now; for one rank of a job of ``world_size`` ranks, its share of that among the ranks
    on one host (:func:`ranks_per_host`: each rank pins its own copies)."""
    if spec is not None and spec.host_memory_bytes > 0:
        total, source = spec.host_memory_bytes, f"{spec.name}'s host memory"
    else:
        from planner.core.devices import available_host_memory_bytes

        total, source = available_host_memory_bytes(), "this machine's free memory"
    ranks = ranks_per_host(world_size)
    if ranks == 1:
        return total, source
    return total // ranks, f"{source} shared by {ranks} ranks"


def check_budget_fits(spec: DeviceSpec, budget_bytes: int) -> None:
    """A budget above the device's memory can never be what a step on it peaks at."""
    if budget_bytes > spec.memory_bytes:
        from planner.core.units import format_bytes

        raise BudgetError(
            f"the budget {format_bytes(budget_bytes)} is more than {spec.name}'s memory "
            f"({format_bytes(spec.memory_bytes)}); give a budget it can hold"
        )


def op_time_ms(flops: int, bytes_moved: int, dtype: str, spec: DeviceSpec) -> float:
    """One op's device time on ``spec``, in milliseconds: its roofline over the efficiency
    of its kind of kernel (``matmul_efficiency`` where it has FLOPs, else
    ``memory_efficiency``)."""
    compute_s = flops / spec.peak_for(dtype) if flops else 0.0
    memory_s = bytes_moved / spec.memory_bandwidth_bytes_per_s
    efficiency = spec.matmul_efficiency if flops else spec.memory_efficiency
    return max(compute_s, memory_s) / efficiency * 1000.0


def dispatches(op: OpCost) -> bool:
    """Whether the host dispatches ``op`` in a real step (every aten op, views included;
    not the ``prim``/``profiler`` queries that only fake tensors record)."""
    return not op.op.startswith(("prim.", "profiler."))


@dataclass(frozen=True)
class StepTimeModel:
    """A step's ops priced on a spec (module notes, "The time model"): the sums of their
    device and host times, and from them the regime and each op's cost."""

    spec: DeviceSpec
    device_ms: float
    host_ms: float

    @classmethod
    def of(cls, ops: Sequence[OpCost], spec: DeviceSpec) -> StepTimeModel:
        device_ms = sum(op_time_ms(op.flops, op.bytes_moved, op.dtype, spec) for op in ops)
        host_ms = spec.kernel_launch_s * 1000.0 * sum(1 for op in ops if dispatches(op))
        return cls(spec, device_ms, host_ms)

    @property
    def host_bound(self) -> bool:
        """Whether the host's work is the longer: then it is paid, not hidden."""
        return self.host_ms > self.device_ms

    @property
    def checkpoint_call_ms(self) -> float:
        """Checkpointing's own cost per checkpointed call: the spec's where the step is
        host-bound, hidden behind the device's queue where it is not."""
        return self.spec.checkpoint_call_s * 1000.0 if self.host_bound else 0.0

    def op_ms(self, op: OpCost) -> float:
        """One op's cost in this step: its device time, or where the step is host-bound
        the longer of its device and host times."""
        device = op_time_ms(op.flops, op.bytes_moved, op.dtype, self.spec)
        if not self.host_bound or not dispatches(op):
            return device
        return max(device, self.spec.kernel_launch_s * 1000.0)


def offload_cost_ms(
    memory: MemoryModel,
    module_name: str,
    spec: DeviceSpec,
    op_ms: Callable[[OpCost], float],
    boundaries: Sequence[int],
    option: str = OFFLOAD,
) -> float:
    """What offloading a module costs on ``spec`` (all its calls) under ``option``
    (``offload``, prefetched, or ``offload-at-use``): the transfer time the compute does
    not hide, with ``op_ms`` the time of one recorded op and ``boundaries`` the sorted
    forward-end events of every candidate's calls (see the module notes, "What offloading
    costs")."""
    if spec.host_link_bytes_per_s <= 0:
        raise ValueError(f"{spec.name} has no host link bandwidth: nothing can be offloaded")
    timeline = memory.timeline
    events = [op.event for op in timeline.op_costs]

    def compute_ms(after: int, until: int) -> float:
        """The time of the ops that run after event ``after``, up to event ``until``."""
        low = bisect.bisect_right(events, after)
        high = bisect.bisect_right(events, until)
        return sum(op_ms(op) for op in timeline.op_costs[low:high])

    total = 0.0
    for effect in memory.unit_effects(Unit(module_name, option=option)):
        if not effect.host:
            continue
        transfer_ms = effect.host_bytes / spec.host_link_bytes_per_s * 1000.0
        end = timeline.calls[effect.call_index].forward_end_event
        later = bisect.bisect_right(boundaries, end)
        until = boundaries[later] if later < len(boundaries) else effect.recompute_event
        copy_out_ms = max(0.0, transfer_ms - compute_ms(end, until))
        copy_back_ms = transfer_ms
        if effect.prefetch_event >= 0:
            # Hidden by the backward from the prefetch to the first unpack of this call's.
            window_ms = compute_ms(effect.prefetch_event - 1, effect.release_event - 1)
            copy_back_ms = max(0.0, transfer_ms - window_ms)
        total += copy_out_ms + copy_back_ms
    return total


def _offload_options(
    memory: MemoryModel,
    module_name: str,
    spec: DeviceSpec,
    op_ms: Callable[[OpCost], float],
    boundaries: Sequence[int],
) -> tuple[OptionCost, ...]:
    """A candidate's offload options on ``spec``: none where it moves nothing; prefetched,
    and where that differs, at its own backward (less device memory during the backward
    before it, more time)."""
    unit = Unit(module_name, option=OFFLOAD)
    if memory.host_bytes(unit) <= 0:
        return ()
    offloads = [OFFLOAD]
    if memory.prefetch_module(unit) is not None:
        offloads.append(OFFLOAD_AT_USE)
    return tuple(
        OptionCost(
            option,
            offload_cost_ms(memory, module_name, spec, op_ms, boundaries, option),
            0,
            freed_bytes=memory.freed_bytes(Unit(module_name, option=option)),
        )
        for option in offloads
    )


def _candidate_boundaries(profile: Profile) -> list[int]:
    """The sorted forward-end events of every candidate's calls (where copy windows end)."""
    candidates = {record.module_name for record in profile.candidates}
    return sorted(
        call.forward_end_event for call in profile.timeline.calls if call.module_name in candidates
    )


def with_offload_options(profile: Profile, host_link_bytes_per_s: float) -> Profile:
    """A profile whose times were measured on a CUDA device here, with each candidate's
    offload options costed for a host link of ``host_link_bytes_per_s`` (measured here:
    :func:`planner.measure.host_link.measure_host_link`). The compute that hides a copy is
    the measured step's time shared among its recorded ops by their roofline times on a
    GPU's balance of FLOP/s to bandwidth (ops are not timed one by one)."""
    from dataclasses import replace

    if host_link_bytes_per_s <= 0:
        raise ValueError(f"host_link_bytes_per_s must be positive, not {host_link_bytes_per_s}")
    if profile.cost_source is not CostSource.MEASURED or device_type(profile.device) != "cuda":
        raise PlannerError(
            "a measured host link costs offloading only for times measured on a CUDA device "
            f"(this profile: {profile.cost_source.value} times on {profile.device})"
        )
    ops = profile.timeline.op_costs
    if not ops:
        raise PlannerError("this profile has no recorded ops; re-profile to offload")
    spec = replace(_PROVISIONAL_SPECS["cuda"], host_link_bytes_per_s=host_link_bytes_per_s)
    total_ms = sum(op_time_ms(op.flops, op.bytes_moved, op.dtype, spec) for op in ops)
    scale = profile.step_ms / total_ms if total_ms > 0 else 0.0

    def ms(op: OpCost) -> float:
        return op_time_ms(op.flops, op.bytes_moved, op.dtype, spec) * scale

    memory = MemoryModel(profile.timeline)
    boundaries = _candidate_boundaries(profile)
    modules = tuple(
        replace(
            record,
            options=(
                *(cost for cost in record.options if cost.option not in OFFLOAD_OPTIONS),
                *(
                    _offload_options(memory, record.module_name, spec, ms, boundaries)
                    if record.is_candidate
                    else ()
                ),
            ),
        )
        for record in profile.modules
    )
    note = Note(
        NoteTopic.TIMES,
        f"offload copies at the host link measured here, {host_link_bytes_per_s / GIGA:.1f} "
        "GB/s each way; the compute that hides them is the measured step shared among its "
        "ops by their roofline times",
    )
    return replace(profile, modules=modules, assumptions=(*profile.assumptions, note))


def roofline_costs(profile: Profile, spec: DeviceSpec, *, estimate_only: bool = False) -> Profile:
    """``profile`` with every module's forward time and the step time estimated for
    ``spec`` from the recorded ops. ``cost_source`` becomes ``roofline`` and ``target`` the
    spec's name, unless ``estimate_only`` (a provisional estimate, replaced by measured
    times before anything is shown)."""
    if not profile.timeline.op_costs:
        raise PlannerError(
            "this profile has no recorded ops (it was saved by an older ckpt-plan); "
            "re-profile to estimate times for a target"
        )

    times = StepTimeModel.of(profile.timeline.op_costs, spec)
    ms = times.op_ms
    call_ms = times.checkpoint_call_ms

    by_call = forward_totals_by_call(profile.timeline, ms)
    step_ms = sum(ms(op) for op in profile.timeline.op_costs)
    # A module's recomputation: its calls' forward ops, and checkpointing's own cost per call.
    by_module: dict[str, float] = {}
    for index, call in enumerate(profile.timeline.calls):
        by_module[call.module_name] = by_module.get(call.module_name, 0.0) + by_call[index]
        by_module[call.module_name] += call_ms
    call_counts = {record.module_name: record.call_count for record in profile.modules}
    offloading = spec.host_link_bytes_per_s > 0
    boundaries = _candidate_boundaries(profile)
    memory = (
        MemoryModel(profile.timeline)
        if offloading or any(r.options for r in profile.modules)
        else None
    )

    def option_ms(record: ModuleProfile, cost: OptionCost) -> float:
        if cost.option in OFFLOAD_OPTIONS:
            assert memory is not None
            return offload_cost_ms(memory, record.module_name, spec, ms, boundaries, cost.option)
        if cost.option == NESTED:
            return nested_recompute_ms(
                record.module_name, cost.inner_modules, lambda name: by_module.get(name, 0.0)
            )
        # A selective option recomputes every op of the forward but the ones it saves.
        assert memory is not None
        unit = Unit(record.module_name, option=cost.option)
        own_ms = call_ms * call_counts.get(record.module_name, 0)
        return sum(ms(op) for op in memory.recomputed_ops(unit)) + own_ms

    def options(record: ModuleProfile) -> tuple[OptionCost, ...]:
        known = tuple(
            replace(cost, recompute_ms=option_ms(record, cost))
            for cost in record.options
            if cost.option not in OFFLOAD_OPTIONS
        )
        if not (offloading and record.is_candidate):
            return known
        assert memory is not None
        # Offloading's own host cost (its hooks on every saved tensor, each call) is not
        # measured: taken as checkpointing's, so a host-bound step does not get it for free.
        own_ms = call_ms * call_counts.get(record.module_name, 0)
        offloads = _offload_options(memory, record.module_name, spec, ms, boundaries)
        return (
            *known,
            *(replace(cost, recompute_ms=cost.recompute_ms + own_ms) for cost in offloads),
        )

    modules = tuple(
        replace(
            record,
            forward_ms=by_module.get(record.module_name, 0.0),
            options=options(record),
        )
        for record in profile.modules
    )
    if estimate_only:
        return replace(profile, modules=modules, step_ms=step_ms, checkpoint_call_ms=call_ms)
    return replace(
        profile,
        modules=modules,
        step_ms=step_ms,
        checkpoint_call_ms=call_ms,
        cost_source=CostSource.ROOFLINE,
        target=spec.name,
        assumptions=(
            *profile.assumptions,
            Note(NoteTopic.TIMES, _time_model_note(spec, times)),
        ),
    )


def _time_model_note(spec: DeviceSpec, times: StepTimeModel) -> str:
    """The assumption a plan records about its times."""
    text = (
        f"roofline on {spec.name} ({spec.source or 'user spec'}): each op "
        "max(FLOPs / peak, bytes / bandwidth)"
    )
    if (spec.matmul_efficiency, spec.memory_efficiency) != (1.0, 1.0):
        text += (
            f" over the efficiency its kernels reach ({spec.matmul_efficiency:g} for matmuls, "
            f"{spec.memory_efficiency:g} for memory-bound ops)"
        )
    if spec.kernel_launch_s > 0:
        regime = (
            f"host-bound ({times.host_ms:.1f} ms of host time at "
            f"{spec.kernel_launch_s * 1e6:.1f} us per op against {times.device_ms:.1f} ms on "
            f"the device): each op the longer of the two, and "
            f"{spec.checkpoint_call_s * 1000:.2f} ms per checkpointed call"
            if times.host_bound
            else f"device-bound ({times.device_ms:.1f} ms on the device against "
            f"{times.host_ms:.1f} ms of host time): the host's work, checkpointing's own "
            "included, hides behind the device's queue"
        )
        text += f"; the step is {regime}"
    return text


# Provisional costs, only to choose a plan before times are measured (never shown): a
# roofline with round numbers for this machine's device. Relative costs are what matter.
_PROVISIONAL_SPECS = {
    "cpu": DeviceSpec("this-cpu", "cpu", 2**62, {"float32": 1e11}, 2e10),
    "cuda": DeviceSpec("this-gpu", "cuda", 2**62, {"float32": 2e13, "bfloat16": 2e14}, 1e12),
}


def provisional_costs(profile: Profile, device: str) -> Profile:
    """``profile`` with rough roofline times for ``device`` (``"cpu"``, ``"cuda:0"``), its
    ``cost_source`` unchanged: enough to solve for a plan that fits before measuring."""
    return roofline_costs(profile, _PROVISIONAL_SPECS[device_type(device)], estimate_only=True)
