"""Measure recomputation costs on this device without running the unplanned step.

A module's recomputation is one more forward of it, with grad enabled, during backward; so
its cost is its forward time. :func:`measure_costs` takes those times from real training
steps of a *timing plan*: a plan that fits the budget (the pipeline solves one from the
memory profile with provisional roofline costs), so no pass of profiling needs more
memory than the budget. With the plan applied, it runs

1. ``warmup_steps`` untimed steps (two by default: the first creates the optimizer
   state, the second is the steady state); on CPU they run under a storage watcher that
   stops them if live memory passes ``limit_bytes`` (it cannot, if the memory profile is
   right; the watcher makes sure), and their measured peak is returned;
2. ``timing_steps`` steps with a forward hook pair on every module, timing each module's
   forward call (``perf_counter`` on CPU, CUDA events on CUDA: :mod:`planner.measure.clock`).
   Hooks that fire during backward are the timing plan's recomputations and are not counted
   as forwards;
3. each selective checkpointing option, timed on its module alone
   (:mod:`planner.measure.option_timing`).

The timing plan is whole modules where that fits the budget, and its recomputations are
timed too: each checkpointed function's recomputation during backward against its own
forward run in the same step (through :func:`planner.apply.observing_recomputation`, at
the granularity the solver costs: the early stop and the checkpoint's hooks are in both).
That ratio is how much a recomputation costs against a forward on this device and model
(caches are warm or cold, allocations cheaper or dearer), and every module's forward time
is scaled by it. Checkpointing also costs something of its own beyond the recomputation
(entering the checkpoint, the RNG state, a pack and an unpack hook per saved tensor):
:func:`_checkpoint_overhead` measures it per call and per saved tensor on two chains of
tiny ops, and every module's and option's cost gets it for its calls and the tensors its
forward saves. The unplanned step's time is then the planned step's time less what the
timing plan's checkpoints cost.

Design notes
------------
* **Identical modules cost the same.** Blocks of one class with the same parameter,
  input, output and saved bytes (``blocks.0`` ... ``blocks.47``) do the same work; their
  times differ only by noise. Each module's time is the median over its group (and over
  the timed steps), which keeps the plan, and its predicted overhead, the same from one run
  to the next (``benchmarks/plan_stability.py``).
* **Steady steps.** All of it runs with the host allocator keeping freed memory
  (:mod:`planner.measure.host_allocator`): with glibc's defaults a CPU step takes
  thousands of page faults, as many as where the heap happened to end up, and the same
  plan's overhead measured several points apart from one process to the next.
* **Hook overhead** (a few microseconds per module call) is counted in the step time
  and in each module's forward alike; it is small against any module worth wrapping.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.checkpoint import checkpoint

from planner.apply import Region, apply_plan, observing_recomputation
from planner.core.records import (
    CostSource,
    ModuleProfile,
    Note,
    NoteTopic,
    OptionCost,
    Profile,
    Unit,
)
from planner.measure.clock import Clock, summed_ms, timed_module_calls
from planner.measure.host_allocator import steady_host_allocator
from planner.measure.model_file import ModelFile
from planner.measure.option_timing import (
    _captured_inputs,
    _group_key,
    _option_groups,
    _option_ratios,
)
from planner.measure.tracking import PeakMemoryTracker, workload_tensors
from planner.measure.workload import (
    Workload,
    build_workload,
    run_training_step,
)
from planner.model_switches import TopkRoutedAsPlanned
from planner.plan.memory_model import NESTED
from planner.plan.plan_file import Plan
from planner.plan.policies import nested_recompute_ms

if TYPE_CHECKING:
    from planner.measure.profiler import ProgressCallback

__all__ = [
    "MeasuredCosts",
    "measure_costs",
    "with_measured_costs",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeasuredCosts:
    """Times measured with a timing plan applied, by module qualified name.
    ``planned_step_ms`` is the step with the timing plan's recomputation in it."""

    forward_ms: dict[str, float]
    planned_step_ms: float
    warmup_peak_bytes: int
    # Recomputation over forward time, measured (see _recompute_ratio); times are scaled by it.
    recompute_ratio: float | None
    timing_modules: tuple[str, ...]
    timing_steps: int
    # Per module, per selective option: its recomputation's cost over the module's forward
    # time (see option_timing._option_ratios); a module's option costs its forward_ms times that.
    option_ratios: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # What checkpointing itself costs beyond the recomputation (see _checkpoint_overhead):
    # ms per checkpointed call, and ms per tensor the region saves.
    call_ms: float = 0.0
    saved_tensor_ms: float = 0.0
    # Whether the host allocator kept freed memory while timing (planner.measure.host_allocator).
    steady_host_allocator: bool = False


class _RegionSpans:
    """A recomputation observer (:func:`planner.apply.observing_recomputation`) that times
    each run of every checkpointed function: its forward, and its recomputation during
    backward (cut short where ``torch.utils.checkpoint`` stops early: that is its cost)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.spans: list[tuple[Region, bool, Any, Any]] = []

    def region(self, region: Region, function: Any, cached_ops: frozenset[str]) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            in_backward = torch._C._current_graph_task_id() != -1
            begin = self.clock.mark()
            try:
                return function(*args, **kwargs)
            finally:
                self.spans.append((region, in_backward, begin, self.clock.mark()))

        return run


@dataclass(frozen=True)
class _TimedStep:
    forward_ms: dict[str, float]  # per module, its forward calls
    region_forward_ms: dict[Region, float]  # per checkpointed function, its forward run
    region_recompute_ms: dict[Region, float]  # ... and its recomputation
    step_ms: float


def _timed_step(workload: Workload, seed: int) -> _TimedStep:
    """One step with every module's calls and every checkpointed function's runs timed."""
    clock = Clock(workload.device)
    regions = _RegionSpans(clock)
    with timed_module_calls(workload.model, clock) as spans, observing_recomputation(regions):
        begin = clock.mark()
        run_training_step(workload, seed=seed)
        end = clock.mark()
    forward_ms, _ = summed_ms(spans, clock)
    region_forward_ms, region_recompute_ms = summed_ms(regions.spans, clock)
    return _TimedStep(
        forward_ms, region_forward_ms, region_recompute_ms, clock.elapsed_ms(begin, end)
    )


def _recompute_ratio(plan: Plan, step: _TimedStep) -> float | None:
    """Recomputation time over forward time, measured on the timing plan's whole-module
    checkpoints: each checkpointed function's recomputation during backward against its
    own forward run in the same step, at the granularity the solver costs (a module's
    checkpoint, with the early stop and the checkpoint's own hooks in both). Modules under a
    selective policy or nested are left out: their recomputation is cheaper by what the
    policy saves (their options are timed on their own). None when nothing was recomputed."""
    whole = {
        decision.module_name
        for decision in plan.modules
        if decision.policy is None and decision.nested_in is None
    }
    recomputed = forward = 0.0
    for region, ms in step.region_recompute_ms.items():
        if region.module in whole:  # a module, or one checkpoint_sequential segment
            recomputed += ms
            forward += step.region_forward_ms.get(region, 0.0)
    return recomputed / forward if forward > 0 and recomputed > 0 else None


def _smoothed(profile: Profile, forward_ms: dict[str, float]) -> dict[str, float]:
    """Each module's time as the median of its group of identical modules (see notes)."""
    groups: dict[tuple[object, ...], list[str]] = defaultdict(list)
    for record in profile.modules:
        groups[_group_key(record)].append(record.module_name)
    smoothed = {}
    for names in groups.values():
        median = statistics.median(forward_ms.get(name, 0.0) for name in names)
        for name in names:
            smoothed[name] = median
    return smoothed


def measure_costs(
    model_file: ModelFile,
    profile: Profile,
    timing_plan: Plan,
    *,
    device: str = "cpu",
    seed: int = 0,
    limit_bytes: int | None = None,
    warmup_steps: int = 2,
    timing_steps: int = 1,
    progress: ProgressCallback | None = None,
) -> MeasuredCosts:
    """Time ``profile``'s modules in real steps with ``timing_plan`` applied (see the
    module docstring), in the training loop's shape the profile was recorded in, after
    ``warmup_steps`` untimed steps (at least one: it creates the optimizer state), on a
    host allocator that keeps freed memory (:mod:`planner.measure.host_allocator`). On CPU,
    ``limit_bytes`` stops a step that would pass it."""
    total = timing_steps + 1
    warmup_steps = max(warmup_steps, 1)
    if progress:
        progress("building the model to time it", 0, total)
    workload = build_workload(model_file, device=device, seed=seed, loop=profile.loop)
    apply_plan(workload.model, timing_plan, guard=False)
    if progress:
        progress(
            f"warm-up steps ({len(timing_plan.modules)} modules checkpointed to fit)", 0, total
        )
    tracker = PeakMemoryTracker(
        workload.device,
        workload_tensors(workload.model, workload.optimizer, workload.batch),
        limit_bytes=limit_bytes,
    )
    samples: list[dict[str, float]] = []
    step_samples: list[float] = []
    ratios: list[float] = []
    representatives = [members[0].module_name for members in _option_groups(profile)]
    # Mixture-of-experts steps whose memory depends on routing run as the profile assumed
    # (the timing plan fits the budget under that routing, not the weights' own).
    routing = TopkRoutedAsPlanned(profile.switches.expert_load)
    with steady_host_allocator(workload.device.type) as steady, routing:
        # Untimed, and stopped at the limit: the first step creates the optimizer state, the
        # second is the steady state (with the previous step's gradients, where the loop
        # keeps them during the forward), and the allocator settles.
        with tracker:
            for step in range(warmup_steps):
                run_training_step(workload, seed=seed + step)
        for step in range(timing_steps):
            if progress:
                progress("timing module forwards", step + 1, total)
            timed = _timed_step(workload, seed=seed + warmup_steps + step)
            samples.append(timed.forward_ms)
            step_samples.append(timed.step_ms)
            ratio = _recompute_ratio(timing_plan, timed)
            if ratio is not None:
                ratios.append(ratio)
        if progress:
            progress("timing selective checkpointing options", total, total)
        inputs = _captured_inputs(workload, representatives, seed, limit_bytes)
        option_ratios = _option_ratios(workload, profile, inputs, limit_bytes=limit_bytes)
        inputs.clear()
        call_ms, saved_tensor_ms = _checkpoint_overhead(workload.device)
    if profile.switches.expert_load is not None and not routing.routed:
        logger.warning(
            "the profile assumed a mixture-of-experts routing, but no router called torch.topk "
            "while timing: the timed steps routed as the model's weights do"
        )
    names = [record.module_name for record in profile.modules]
    medians = {name: statistics.median(s.get(name, 0.0) for s in samples) for name in names}
    recompute_ratio = statistics.median(ratios) if ratios else None
    scale = recompute_ratio or 1.0
    smoothed = {name: ms * scale for name, ms in _smoothed(profile, medians).items()}
    return MeasuredCosts(
        forward_ms=smoothed,
        planned_step_ms=statistics.median(step_samples),
        warmup_peak_bytes=tracker.peak_bytes,
        recompute_ratio=recompute_ratio,
        timing_modules=timing_plan.module_names,
        timing_steps=timing_steps,
        option_ratios=option_ratios,
        call_ms=call_ms,
        saved_tensor_ms=saved_tensor_ms,
        steady_host_allocator=steady,
    )


def _checkpoint_overhead(device: torch.device, rounds: int = 30) -> tuple[float, float]:
    """What ``torch.utils.checkpoint`` costs on this device beyond the recomputation it
    runs: entering and leaving the checkpoint, saving and restoring the RNG state, and a
    pack hook in the forward and an unpack in backward per saved tensor (Python, each).
    Measured on two chains of tiny ops (1 and 32 matmul+tanh pairs: their compute is
    negligible, the hooks are not), see :func:`_outside_recomputation_ms`; fitted to
    ``per_call + per_saved_tensor * saved`` (ms each, not negative)."""
    generator = torch.Generator().manual_seed(0)
    weights = [
        torch.randn(8, 8, generator=generator).to(device).requires_grad_() for _ in range(32)
    ]
    value = torch.randn(4, 8, generator=generator).to(device).requires_grad_()
    clock = Clock(device)
    (few, few_ms), (many, many_ms) = (
        _outside_recomputation_ms(clock, weights[:length], value, rounds) for length in (1, 32)
    )
    per_saved = max(0.0, (many_ms - few_ms) / (many - few))
    return max(0.0, few_ms - per_saved * few), per_saved


def _outside_recomputation_ms(
    clock: Clock, weights: list[torch.Tensor], value: torch.Tensor, rounds: int
) -> tuple[int, float]:
    """The tensors a chain of ``tanh(x @ weight)`` saves, and the median over ``rounds``
    (after three to warm up) of a forward and backward through it checkpointed, less the
    same plain, less the recomputation run inside the checkpointed one."""
    recomputed: list[float] = []

    def chain(x: torch.Tensor) -> torch.Tensor:
        in_backward = torch._C._current_graph_task_id() != -1
        begin = clock.mark()
        try:
            for weight in weights:
                x = torch.tanh(x @ weight)
            return x
        finally:  # the recomputation stops early, by an exception, at its last saved tensor
            if in_backward:
                recomputed.append(clock.elapsed_ms(begin, clock.mark()))

    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        chain(value)
    outside: list[float] = []
    for round_ in range(rounds + 3):
        begin = clock.mark()
        chain(value).sum().backward()
        middle = clock.mark()
        checkpoint(chain, value, use_reentrant=False).sum().backward()
        end = clock.mark()
        if round_ >= 3:
            plain, checkpointed = clock.elapsed_ms(begin, middle), clock.elapsed_ms(middle, end)
            outside.append(checkpointed - plain - recomputed[-1])
    return len(saved), statistics.median(outside)


def saved_tensor_counts(profile: Profile) -> dict[str, int]:
    """Per module, the tensors saved for backward during its forward calls (its
    children's included): the pack hooks a checkpoint of it runs."""
    packs = sorted(saved.pack_event for saved in profile.timeline.saved_tensors)
    counts: dict[str, int] = defaultdict(int)
    for call in profile.timeline.calls:
        low = bisect.bisect_right(packs, call.forward_start_event)
        high = bisect.bisect_left(packs, call.forward_end_event)
        counts[call.module_name] += high - low
    return counts


def with_measured_costs(
    profile: Profile,
    costs: MeasuredCosts,
    timing_units: tuple[Unit, ...],
    unit_cost_ms: Callable[[Profile, Unit], float],
) -> Profile:
    """``profile`` with its times replaced by measured ones. The unplanned step's time is
    the measured step's less the recomputation of ``timing_units`` (the timing plan's),
    each costed by ``unit_cost_ms`` on the measured forward times."""

    saved = saved_tensor_counts(profile)

    def own_cost_ms(record: ModuleProfile) -> float:
        """Checkpointing's own cost for this module, beyond its recomputation."""
        return costs.call_ms * record.call_count + costs.saved_tensor_ms * saved[record.module_name]

    records = {record.module_name: record for record in profile.modules}

    def cost_ms(name: str) -> float:
        """A module's recomputation and its checkpoint's own cost."""
        return costs.forward_ms.get(name, 0.0) + own_cost_ms(records[name])

    def options(record: ModuleProfile, forward_ms: float) -> tuple[OptionCost, ...]:
        ratios = costs.option_ratios.get(record.module_name, {})

        def recompute_ms(option: OptionCost) -> float:
            if option.option == NESTED:
                return nested_recompute_ms(record.module_name, option.inner_modules, cost_ms)
            return forward_ms * ratios.get(option.option, 1.0) + own_cost_ms(record)

        return tuple(
            dataclasses.replace(option, recompute_ms=recompute_ms(option))
            for option in record.options
        )

    modules = tuple(
        dataclasses.replace(
            record,
            forward_ms=cost_ms(record.module_name),
            options=options(record, costs.forward_ms.get(record.module_name, 0.0)),
        )
        for record in profile.modules
    )
    timed = dataclasses.replace(profile, modules=modules, checkpoint_call_ms=costs.call_ms)
    recompute_ms = sum(unit_cost_ms(timed, unit) for unit in timing_units)
    # Noise cannot make the recomputation more than the step it is part of.
    step_ms = max(costs.planned_step_ms - recompute_ms, costs.planned_step_ms / 2)
    how = Note(
        NoteTopic.TIMES,
        f"measured here in {costs.timing_steps} step(s) with "
        f"{len(costs.timing_modules)} modules checkpointed (so the step fits the budget); "
        "identical modules share their median"
        + (
            f"; recomputation measured at {costs.recompute_ratio:.2f}x its forward, and "
            "every module's time scaled by that"
            if costs.recompute_ratio is not None
            else ""
        )
        + (
            f"; checkpointing's own cost measured at {costs.call_ms:.3f} ms per checkpointed "
            f"call and {1000 * costs.saved_tensor_ms:.1f} us per saved tensor, added to each"
        )
        + (
            "; the host allocator kept freed memory while timing (no page faults from glibc "
            "giving it back)"
            if costs.steady_host_allocator
            else ""
        ),
    )
    return dataclasses.replace(
        timed,
        step_ms=step_ms,
        cost_source=CostSource.MEASURED,
        target=None,
        assumptions=(*[a for a in profile.assumptions if a.topic is not NoteTopic.TIMES], how),
    )
