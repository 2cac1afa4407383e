"""Time each selective checkpointing option of a module: how much its recomputation costs
against the module's forward, measured on the module alone, on the inputs of its first call,
once per group of identical modules (:func:`_option_ratios`). Part of measuring costs
(:func:`planner.measure.timing.measure_costs`), within the same budget.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch.utils._pytree import tree_flatten, tree_map_only

from planner.apply import selective_contexts
from planner.apply.autocast import AutocastState
from planner.core.records import ModuleProfile, Profile, StorageKind
from planner.measure.clock import Clock
from planner.measure.rng import RngState
from planner.measure.tracking import MemoryLimitExceeded, PeakMemoryTracker, workload_tensors
from planner.measure.workload import Workload, compute_loss, user_code_errors
from planner.plan.memory_model import MemoryModel
from planner.plan.plan_file import ModuleDecision

logger = logging.getLogger(__name__)


class CapturedCall(NamedTuple):
    """A module's call, to make again on its own: its arguments (detached), and the
    autocast regions it ran in."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    autocast: AutocastState


@contextlib.contextmanager
def _capturing_inputs(workload: Workload, names: list[str]) -> Iterator[dict[str, CapturedCall]]:
    """While open, the arguments of each named module's first forward call (not a
    recomputation during backward), detached, to call the module again on its own."""
    modules = dict(workload.model.named_modules())
    captured: dict[str, CapturedCall] = {}

    def capture(name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if name not in captured and torch._C._current_graph_task_id() == -1:
                detached_args, detached_kwargs = tree_map_only(
                    torch.Tensor, torch.Tensor.detach, (tuple(args), dict(kwargs))
                )
                captured[name] = CapturedCall(detached_args, detached_kwargs, AutocastState.now())

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
) -> dict[str, CapturedCall]:
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
    inputs: dict[str, CapturedCall],
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
    inputs: dict[str, CapturedCall],
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
        call = inputs[name]
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
                            times = _policy_round(clock, decision, forward, call, workload.device)
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
    call: CapturedCall,
    device: torch.device,
) -> dict[str, float]:
    """One round of :func:`_option_ratios`: ms of the forward plain, under the policy's
    caching context and under its cached one, each in the call's autocast regions. Its own
    function so that the contexts (and the outputs the caching one saved) are gone when it
    returns, before the next round.

    Each run starts from the same RNG state, as a recomputation replays the forward's
    (``preserve_rng_state``): a forward that draws to choose its path (LayerDrop skips
    layers at random) must take the same path, or the cached run is handed the outputs of
    other ops and fails. The step's RNG state is left as it was."""
    caching, cached = selective_contexts(decision)
    times = {}
    with RngState.forked(device):
        start = RngState.now(device)
        for label, context in (
            ("plain", contextlib.nullcontext()),
            ("caching", caching),
            ("cached", cached),
        ):
            start.restore()
            begin = clock.mark()
            with call.autocast.entered(), context:
                forward(*call.args, **call.kwargs)
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
