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
   forward call (``perf_counter`` on CPU, CUDA events on CUDA). Hooks that fire during
   backward are the timing plan's recomputations and are not counted as forwards.

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
import contextlib
import dataclasses
import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils._pytree import tree_flatten, tree_map_only
from torch.utils.checkpoint import checkpoint

from planner.apply import Region, apply_plan, observing_recomputation, selective_contexts
from planner.core.records import CostSource, ModuleProfile, OptionCost, Profile, StorageKind
from planner.measure.host_allocator import steady_host_allocator
from planner.measure.model_file import ModelFile
from planner.measure.tracking import MemoryLimitExceeded, PeakMemoryTracker, workload_tensors
from planner.measure.workload import (
    Workload,
    build_workload,
    compute_loss,
    run_training_step,
    user_code_errors,
)
from planner.plan.memory_model import NESTED, MemoryModel
from planner.plan.plan_file import ModuleDecision, Plan
from planner.plan.policies import nested_recompute_ms

__all__ = [
    "Clock",
    "MeasuredCosts",
    "measure_costs",
    "summed_ms",
    "timed_module_calls",
    "with_measured_costs",
]

ProgressCallback = Callable[[str, int, int], None]

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
    # time (see _option_ratios); a module's option costs its forward_ms times that.
    option_ratios: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # What checkpointing itself costs beyond the recomputation (see _checkpoint_overhead):
    # ms per checkpointed call, and ms per tensor the region saves.
    call_ms: float = 0.0
    saved_tensor_ms: float = 0.0
    # Whether the host allocator kept freed memory while timing (planner.measure.host_allocator).
    steady_host_allocator: bool = False


class Clock:
    """Milliseconds between two marks: ``perf_counter`` on CPU, CUDA events on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        if self.cuda:
            end.synchronize()
            return float(start.elapsed_time(end))
        return (end - start) * 1000.0


@contextlib.contextmanager
def timed_module_calls(
    model: torch.nn.Module, clock: Clock
) -> Iterator[list[tuple[str, bool, Any, Any]]]:
    """Hooks on every module of ``model`` while the context is open: yields the list they
    fill with ``(module name, called during backward, start mark, end mark)`` per call."""
    names = {id(module): name for name, module in model.named_modules()}
    starts: dict[int, list[Any]] = defaultdict(list)
    spans: list[tuple[str, bool, Any, Any]] = []

    def before(module: torch.nn.Module, args: Any) -> None:
        starts[id(module)].append(clock.mark())

    def after(module: torch.nn.Module, args: Any, output: Any) -> None:
        stack = starts[id(module)]
        if stack:
            in_backward = torch._C._current_graph_task_id() != -1
            spans.append((names[id(module)], in_backward, stack.pop(), clock.mark()))

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(before))
        handles.append(module.register_forward_hook(after, always_call=True))
    try:
        yield spans
    finally:
        for handle in handles:
            handle.remove()


_Name = TypeVar("_Name")  # a module's name, or a checkpointed function's Region


def summed_ms(
    spans: list[tuple[_Name, bool, Any, Any]], clock: Clock
) -> tuple[dict[_Name, float], dict[_Name, float]]:
    """Per module, the summed time of its calls in forward, and during backward."""
    forward_ms: dict[_Name, float] = defaultdict(float)
    backward_ms: dict[_Name, float] = defaultdict(float)
    for name, in_backward, start, stop in spans:
        (backward_ms if in_backward else forward_ms)[name] += clock.elapsed_ms(start, stop)
    return dict(forward_ms), dict(backward_ms)


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


@contextlib.contextmanager
def _capturing_inputs(
    workload: Workload, names: list[str]
) -> Iterator[dict[str, tuple[tuple[Any, ...], dict[str, Any]]]]:
    """While open, the arguments of each named module's first forward call (not a
    recomputation during backward), detached, to call the module again on its own."""
    modules = dict(workload.model.named_modules())
    captured: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def capture(name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if name not in captured and torch._C._current_graph_task_id() == -1:
                captured[name] = tree_map_only(
                    torch.Tensor, torch.Tensor.detach, (tuple(args), dict(kwargs))
                )

        return hook

    handles = [
        modules[name].register_forward_pre_hook(capture(name), with_kwargs=True) for name in names
    ]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _captured_inputs(
    workload: Workload, names: list[str], seed: int, limit_bytes: int | None
) -> dict[str, tuple[tuple[Any, ...], dict[str, Any]]]:
    """The first-call inputs of the ``names`` modules, from a forward without grad of its
    own: captured in a training step they would stay alive past where the step frees them
    and add to its peak, which the budget has no room for. Without grad the forward keeps
    only these inputs; on CPU it runs under ``limit_bytes`` too, and where holding them
    would pass it, nothing is captured (the options are then costed as a forward)."""
    if not names or workload.loop.gradients_in_forward:
        # A training_step that calls backward itself cannot run without grad.
        return {}
    with _capturing_inputs(workload, names) as captured:
        try:
            with (
                _held_within(workload, {}, limit_bytes),
                torch.no_grad(),
                user_code_errors(workload),
            ):
                torch.manual_seed(seed)
                compute_loss(
                    workload.model_file, workload.model, workload.batch, require_grad=False
                )
        except MemoryLimitExceeded:
            logger.info("inputs for timing selective options not captured: over the budget")
            captured.clear()
    return dict(captured)


def _held_within(
    workload: Workload,
    inputs: dict[str, tuple[tuple[Any, ...], dict[str, Any]]],
    limit_bytes: int | None,
) -> contextlib.AbstractContextManager[object]:
    """A region stopped if live memory (the step's tensors and the held ``inputs``) would
    pass ``limit_bytes``; no tracking at all without a limit or off CPU."""
    if limit_bytes is None or workload.device.type != "cpu":
        return contextlib.nullcontext()
    existing = workload_tensors(workload.model, workload.optimizer, workload.batch)
    existing[StorageKind.OTHER] = [
        *existing[StorageKind.OTHER],
        *(
            t
            for held in inputs.values()
            for t in tree_flatten(held)[0]
            if isinstance(t, torch.Tensor)
        ),
    ]
    return PeakMemoryTracker(workload.device, existing, limit_bytes=limit_bytes)


def _option_groups(profile: Profile) -> list[list[ModuleProfile]]:
    """Modules with selective options, in groups of identical ones (see _group_key)."""
    groups: dict[tuple[object, ...], list[ModuleProfile]] = defaultdict(list)
    for record in profile.modules:
        if record.options:
            groups[_group_key(record)].append(record)
    return list(groups.values())


def _option_ratios(
    workload: Workload,
    profile: Profile,
    inputs: dict[str, tuple[tuple[Any, ...], dict[str, Any]]],
    repeats: int = 7,
    *,
    limit_bytes: int | None = None,
) -> dict[str, dict[str, float]]:
    """Each selective option's recomputation cost over its module's forward time, measured on
    one module per group of identical ones (the rest share it). Three runs of the module
    on the inputs of its first call (``inputs``), without grad, as the policy's contexts
    run it: plain; under the caching context (the forward of a checkpointed call, which
    keeps what the policy saves); under the cached context (the recomputation, which
    takes those back and computes the rest). The option costs the recomputation plus
    what the caching context adds to the forward: ``(max(0, caching - plain) + cached) /
    plain``, per round of the three (so drift cancels), the median of ``repeats`` rounds
    after one to warm up. That first round runs under ``limit_bytes`` (CPU), counting the
    step's tensors and every held input, less the module's largest single allocation (a
    watcher sees an op's outputs once they exist): an option whose round would pass it
    (the caching context keeps what the option saves) is left unmeasured, and costed as a
    forward."""
    memory = MemoryModel.for_profile(profile)
    modules = dict(workload.model.named_modules())
    clock = Clock(workload.device)
    ratios: dict[str, dict[str, float]] = {}
    for members in _option_groups(profile):
        name = members[0].module_name
        if name not in inputs:
            continue
        args, kwargs = inputs[name]
        module = modules[name]
        forward = type(module).forward.__get__(module)  # not the plan's wrapper
        per_option: dict[str, float] = {}
        # One op's outputs are counted once they exist: stop that much short of the limit.
        limit = None if limit_bytes is None else limit_bytes - memory.largest_allocation(name)
        for option, rule in memory.policy_rules(name).items():
            decision = ModuleDecision(
                name, policy=option, saved_ops=rule.saved_ops, alternating_ops=rule.alternating_ops
            )
            rounds: list[float] = []
            with torch.no_grad():
                for round_ in range(repeats + 1):  # the first round warms caches up
                    try:
                        with _held_within(workload, inputs, limit if not round_ else None):
                            times = _policy_round(clock, decision, forward, args, kwargs)
                    except MemoryLimitExceeded:
                        logger.info("option %s of %s not timed: over the budget", option, name)
                        break
                    if round_ and times["plain"] > 0:
                        # Per round, so that drift on a shared machine cancels out; the
                        # caching context cannot make the forward faster.
                        overhead = max(0.0, times["caching"] - times["plain"])
                        rounds.append((overhead + times["cached"]) / times["plain"])
            if rounds:
                per_option[option] = statistics.median(rounds)
        for record in members:
            ratios[record.module_name] = per_option
    return ratios


def _policy_round(
    clock: Clock,
    decision: ModuleDecision,
    forward: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> dict[str, float]:
    """One round of :func:`_option_ratios`: ms of the forward plain, under the policy's
    caching context and under its cached one. Its own function so that the contexts (and
    the outputs the caching one saved) are gone when it returns, before the next round."""
    caching, cached = selective_contexts(decision)
    times = {}
    for label, context in (
        ("plain", contextlib.nullcontext()),
        ("caching", caching),
        ("cached", cached),
    ):
        begin = clock.mark()
        with context:
            forward(*args, **kwargs)
        times[label] = clock.elapsed_ms(begin, clock.mark())
    return times


def _group_key(record: ModuleProfile) -> tuple[object, ...]:
    return (
        record.module_type,
        record.call_count,
        record.parameter_bytes,
        record.input_bytes,
        record.output_bytes,
        record.saved_bytes,
        record.forward_flops,
    )


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
    with steady_host_allocator(workload.device.type) as steady:
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
    timing_units: tuple[str, ...],
    unit_cost_ms: Callable[[Profile, str], float],
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
    how = (
        f"times: measured here in {costs.timing_steps} step(s) with "
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
        )
    )
    return dataclasses.replace(
        timed,
        step_ms=step_ms,
        cost_source=CostSource.MEASURED,
        target=None,
        assumptions=(*[a for a in profile.assumptions if not a.startswith("times:")], how),
    )
