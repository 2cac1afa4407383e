"""Profile one training step: the memory timeline, per-module saved bytes, op costs.

:func:`record_memory` is the memory half of a profile. It runs ``warmup_steps`` steps (so
the optimizer state exists, and the gradients where the loop keeps them during the forward:
the step is steady-state), then ONE instrumented step, in the workload's loop shape, under
:class:`~planner.measure.recorder.TimelineRecorder`, which records, in order, every storage
made and freed, every module forward entered and left, every tensor saved for backward
(packed) and read back (unpacked), and each op's FLOPs and bytes. With a
:class:`~planner.measure.fake.FakeSession` all of it runs on fake tensors (the default of
``ckpt-plan profile``: no memory is used); without one, for real. Times are not taken here:
:mod:`planner.measure.timing` measures them in steps that fit the budget, and
:mod:`planner.plan.targets` estimates them for a target device.

:func:`profile_workload` is the all-real profile (a real instrumented step, then timed
forward passes of the unplanned model): the cross-check for fake profiles, for models that
fit the machine.

The profile's blocks come from :mod:`planner.measure.candidates`; forward passes are timed
with :mod:`planner.measure.clock`.

Everything the planner needs about checkpointing a module is derived from the timeline by
:mod:`planner.plan.memory_model` (pure Python), so the derivation can be tested on hand-written
timelines and re-run from a saved profile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import statistics
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch

from planner.apply import model_fingerprint
from planner.apply.tensors import describe_batch
from planner.core.allocator import ALLOCATOR_ASSUMPTION
from planner.core.devices import device_type
from planner.core.errors import ProfilingError
from planner.core.records import (
    PROFILE_SCHEMA_VERSION,
    CostSource,
    MemorySource,
    MemoryTimeline,
    ModuleProfile,
    Note,
    NoteTopic,
    OptionCost,
    Phase,
    Profile,
    StorageKind,
    StorageLifetime,
    forward_totals_by_call,
    general_notes,
)
from planner.core.switches import StepSwitches
from planner.core.text import and_more
from planner.measure.candidates import _is_torch_layer, find_block_stacks
from planner.measure.clock import Clock, _time_forward
from planner.measure.kernel_scratch import KernelScratch
from planner.measure.recorder import _record_step
from planner.measure.tracking import (
    PeakMemoryTracker,
    workload_tensors,
)
from planner.measure.workload import Workload, check_modules_unchanged, run_training_step
from planner.plan.memory_model import NESTED, MemoryModel
from planner.plan.policies import nested_recompute_ms

if TYPE_CHECKING:
    from planner.measure.fake import FakeSession

__all__ = [
    "ProgressCallback",
    "profile_workload",
    "recomputed_in_backward",
    "record_memory",
]

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[str, int, int], None]
"""Called as ``progress(what, done, total)`` while profiling."""


def _unique_bytes(tensors: list[torch.Tensor]) -> int:
    # A storage's Python object lives as long as the storage (fake ones included), so its
    # id identifies it while the tensors are held here.
    return sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())


def _module_profiles(
    model: torch.nn.Module,
    timeline: MemoryTimeline,
    forward_ms: dict[str, float],
    memory: MemoryModel | None = None,
    *,
    replay_rng: bool = False,
) -> tuple[ModuleProfile, ...]:
    """One record per module. ``replay_rng``: every module replays the forward's RNG state
    when recomputed (``uses_rng``), as a step profiled with LayerDrop off needs in training,
    where LayerDrop draws (:func:`planner.model_switches.switch_off_layerdrop`)."""
    memory = memory or MemoryModel(timeline)
    storages = timeline.storages
    call_flops = forward_totals_by_call(timeline, lambda op: op.flops)
    records = []
    for name, module in model.named_modules():
        calls = memory.calls_of(name)
        effects = [memory.effects[index] for index in calls]
        call_records = [timeline.calls[index] for index in calls]
        saved = sum(effect.saved_bytes for effect in effects)
        saving = sum(effect.retained_bytes for effect in effects)
        inputs = {i for call in call_records for i in call.input_storages}
        outputs = {i for call in call_records for i in call.output_storages}
        uses_rng = replay_rng or any(call.uses_rng for call in call_records)
        mutated = sorted({b for call in call_records for b in call.mutated_buffers})
        devices = {d for call in call_records for d in call.devices}
        if not name:
            reason = "the root module"
        elif _is_torch_layer(module):
            reason = "one of torch.nn's own layers (an op or two): checkpoint a module holding it"
        elif not calls:
            reason = "not called in the training step"
        elif updated := sorted({a for call in call_records for a in call.updated_arguments}):
            reason = (
                f"its forward stores tensors into {', '.join(updated)}: recomputing it would "
                f"store them again{_updated_argument_hint(updated)}"
            )
        elif len({device_type(d) for d in devices}) > 1:
            reason = f"its forward moves tensors across devices ({', '.join(sorted(devices))})"
        elif saving <= 0:
            reason = "checkpointing it frees nothing"
        else:
            reason = ""
        records.append(
            ModuleProfile(
                module_name=name,
                module_type=type(module).__name__,
                depth=name.count(".") + 1 if name else 0,
                call_count=len(calls),
                parameter_bytes=_unique_bytes(list(module.parameters())),
                saved_bytes=saved,
                checkpoint_saving_bytes=saving,
                input_bytes=sum(storages[i].size_bytes for i in inputs),
                output_bytes=sum(storages[i].size_bytes for i in outputs),
                recompute_peak_bytes=max((e.recompute_peak_bytes for e in effects), default=0),
                forward_ms=forward_ms.get(name, 0.0),
                uses_rng=uses_rng,
                excluded_reason=reason,
                mutated_buffers=tuple(mutated),
                forward_flops=int(sum(call_flops[index] for index in calls)),
                options=memory.module_options(name, forward_ms.get(name, 0.0))
                if not reason
                else (),
            )
        )
    return _with_nesting(tuple(records), memory)


def _with_nesting(
    records: tuple[ModuleProfile, ...], memory: MemoryModel
) -> tuple[ModuleProfile, ...]:
    """Each candidate whose calls have candidate children that free something gets the
    nesting option (``name@nested``: those children checkpointed inside it), costing its
    forward and theirs again (they run three times)."""
    by_name = {record.module_name: record for record in records}
    result = []
    for record in records:
        inner: list[str] = []
        if record.is_candidate:
            for call in memory.calls_of(record.module_name):
                for child in memory.child_calls(call):
                    name = memory.timeline.calls[child].module_name
                    child_record = by_name.get(name)
                    if (
                        child_record is not None
                        and child_record.is_candidate
                        and child_record.checkpoint_saving_bytes > 0
                        and name not in inner
                    ):
                        inner.append(name)
        if inner:
            memory.nested_inner[record.module_name] = tuple(inner)
            option = OptionCost(
                NESTED,
                nested_recompute_ms(
                    record.module_name, inner, lambda name: by_name[name].forward_ms
                ),
                record.forward_flops + sum(by_name[name].forward_flops for name in inner),
                inner_modules=tuple(inner),
                freed_bytes=record.checkpoint_saving_bytes,
            )
            record = dataclasses.replace(record, options=(*record.options, option))
        result.append(record)
    return tuple(result)


def _updated_argument_hint(updated: list[str]) -> str:
    if any("Cache" in argument for argument in updated):
        # Hugging Face models build a key/value cache in training unless told not to; HF's
        # own gradient checkpointing turns it off for the same reason.
        return " (for training, build the model with use_cache=False)"
    return ""


def record_memory(
    workload: Workload,
    *,
    session: FakeSession | None = None,
    warmup_steps: int = 1,
    seed: int = 0,
    charge_as: str | None = None,
    limit_bytes: int | None = None,
    workspace_bytes: int = 0,
    bucket_bytes: int = 0,
    around_steps: Callable[[], AbstractContextManager[Sequence[torch.Tensor]]] | None = None,
    progress: ProgressCallback | None = None,
) -> Profile:
    """The memory half of a profile (see the module docstring): times are left at 0 and
    ``cost_source`` is ``none``. With ``session`` the steps run on its fake tensors, and the
    profile is for the session's device. The workload's weights change (real steps). The
    steps run in the workload's loop shape (``workload.loop``); the warm-up steps put the
    optimizer state, and for a loop that keeps gradients during the forward the gradients,
    in place before the recorded step (with ``warmup_steps=0`` the caller must have run a
    step).
    ``limit_bytes`` stops a real step whose live memory passes it
    (:class:`~planner.measure.tracking.MemoryLimitExceeded`). ``workspace_bytes`` is memory the
    device's libraries hold for the whole step (cuBLAS workspaces on CUDA): it is added to
    the timeline as one storage alive throughout, so every predicted peak includes it.
    ``bucket_bytes``: DDP's gradient buckets (:func:`planner.measure.ddp.ddp_bucket_bytes`),
    made when DDP was built and alive throughout: one gradient storage the same way.
    ``around_steps``: a context entered (on the session's tensors) around the steps, yielding
    tensors the step's objects hold out of sight (with DDP's ``gradient_as_bucket_view``,
    its buckets: :func:`planner.measure.ddp.gradients_into_buckets`), which the
    recording does not count when an op returns a view of them: ``bucket_bytes`` counts them."""
    running = session.running if session is not None else contextlib.nullcontext
    device_type = session.device_type if session is not None else workload.device.type
    charged_as = charge_as or device_type
    # A CUDA step: each kernel's scratch is charged at its op (planner.measure.kernel_scratch).
    scratch = KernelScratch() if charged_as == "cuda" else None
    around = around_steps if around_steps is not None else (lambda: contextlib.nullcontext(()))
    with running(), around() as held:
        for step in range(warmup_steps):
            if progress:
                progress("warm-up step (creates optimizer state)", step, warmup_steps + 1)
            guard = (
                PeakMemoryTracker(
                    workload.device,
                    workload_tensors(workload.model, workload.optimizer, workload.batch),
                    limit_bytes=limit_bytes,
                    ignore=held,
                )
                if limit_bytes is not None and session is None
                else contextlib.nullcontext()
            )
            with guard:
                run_training_step(workload, seed=seed + step)
        if progress:
            progress("recording the memory timeline", warmup_steps, warmup_steps + 1)
        timeline, measured_peak = _record_step(
            workload,
            seed=seed,
            charge_as=charged_as,
            ignore=(
                *(session.host_tensors(workload.optimizer) if session is not None else ()),
                *held,
            ),
            limit_bytes=limit_bytes,
            scratch=scratch,
        )
    if workspace_bytes:
        timeline = _with_resident(timeline, workspace_bytes, StorageKind.WORKSPACE)
        measured_peak += workspace_bytes
    if bucket_bytes:
        timeline = _with_resident(timeline, bucket_bytes, StorageKind.GRADIENT)
        measured_peak += bucket_bytes
    return _profile_from_timeline(
        workload,
        timeline,
        measured_peak,
        forward_ms={},
        step_ms=0.0,
        memory_source=MemorySource.FAKE if session is not None else MemorySource.REAL,
        cost_source=CostSource.NONE,
        device=str(torch.device(device_type)) if session is not None else str(workload.device),
        assumptions=general_notes(
            (
                *(session.assumptions if session is not None else ()),
                *(scratch.assumptions() if scratch is not None else ()),
                *((ALLOCATOR_ASSUMPTION,) if charged_as == "cuda" else ()),
            )
        ),
        switches=StepSwitches(
            caches_off=workload.caches_off,
            expert_load=session.expert_load_used if session is not None else None,
            layerdrop_off=workload.layerdrop_off,
            autocast=timeline.forward_autocast,
        ),
    )


def _with_resident(timeline: MemoryTimeline, size_bytes: int, kind: StorageKind) -> MemoryTimeline:
    """``timeline`` with one more storage of ``size_bytes``, alive throughout the step."""
    resident = StorageLifetime(
        size_bytes=size_bytes,
        alloc_event=-1,
        free_event=timeline.event_count,
        alloc_call=-1,
        kind=kind,
    )
    return dataclasses.replace(timeline, storages=(*timeline.storages, resident))


def recomputed_in_backward(timeline: MemoryTimeline) -> tuple[str, ...]:
    """Modules whose forward ran again during backward in the recorded (unplanned) step:
    checkpointing the model does in its own code (``torch.utils.checkpoint``, reentrant or
    not, ``checkpoint_sequential``, timm's ``checkpoint_seq``) recomputes them there. Only
    the outermost of nested ones, in the order of their first forward."""
    forward_end = timeline.phase_end_events.get(Phase.FORWARD, timeline.event_count)
    backward_end = timeline.phase_end_events.get(Phase.BACKWARD, timeline.event_count)

    def in_backward(index: int) -> bool:
        return forward_end < timeline.calls[index].forward_start_event <= backward_end

    first_call: dict[str, int] = {}
    for index, call in enumerate(timeline.calls):
        first_call.setdefault(call.module_name, index)
    names = {
        call.module_name
        for index, call in enumerate(timeline.calls)
        if in_backward(index) and (call.parent_call < 0 or not in_backward(call.parent_call))
    }
    return tuple(sorted(names, key=first_call.__getitem__))


def _own_checkpointing_seen(timeline: MemoryTimeline) -> tuple[Note, ...]:
    recomputed = recomputed_in_backward(timeline)
    if not recomputed:
        return ()
    shown = and_more([name or "the root module" for name in recomputed], 4)
    return (
        Note(
            NoteTopic.OWN_CHECKPOINTING,
            f"{shown} itself (their forward runs again during backward: a "
            "torch.utils.checkpoint call in its code, with no switch ckpt-plan knows); it "
            "cannot be switched off here, so the plan counts it: every predicted peak "
            "includes that recomputation, and checkpointing those modules again frees nothing",
        ),
    )


def _profile_from_timeline(
    workload: Workload,
    timeline: MemoryTimeline,
    measured_peak: int,
    *,
    forward_ms: dict[str, float],
    step_ms: float,
    memory_source: MemorySource,
    cost_source: CostSource,
    device: str,
    assumptions: tuple[Note, ...],
    switches: StepSwitches | None = None,
) -> Profile:
    check_modules_unchanged(workload)
    storages = timeline.storages
    memory = MemoryModel(timeline)
    replayed_peak = memory.peak_bytes()
    if replayed_peak != measured_peak:  # internal invariant: the replay is the measurement
        raise ProfilingError(
            f"internal error: timeline replay gives {replayed_peak} bytes but the tracker "
            f"measured {measured_peak}; please report this with your model file"
        )

    def kind_bytes(kind: StorageKind) -> int:
        return sum(
            s.size_bytes
            for s in storages
            if s.kind == kind and s.free_event == timeline.event_count
        )

    switches = switches or StepSwitches(
        caches_off=workload.caches_off,
        layerdrop_off=workload.layerdrop_off,
        autocast=timeline.forward_autocast,
    )
    notes = (
        *workload.notes,
        *general_notes(switches.describe()),
        *_own_checkpointing_seen(timeline),
    )
    for note in notes:
        logger.info("%s", note)  # the CLI shows its own-checkpointing ones as warnings
    model = workload.model
    stacks = find_block_stacks(model, timeline)
    return Profile(
        schema_version=PROFILE_SCHEMA_VERSION,
        model_name=workload.model_file.name,
        model_file=str(workload.model_file.source),
        device=device,
        torch_version=torch.__version__,
        fingerprint=model_fingerprint(model),
        batch=describe_batch(workload.batch),
        step_ms=step_ms,
        measured_peak_bytes=measured_peak,
        parameter_bytes=kind_bytes(StorageKind.PARAMETER),
        buffer_bytes=kind_bytes(StorageKind.BUFFER),
        gradient_bytes=kind_bytes(StorageKind.GRADIENT),
        optimizer_state_bytes=kind_bytes(StorageKind.OPTIMIZER_STATE),
        modules=_module_profiles(
            model, timeline, forward_ms, memory, replay_rng=bool(switches.layerdrop_off)
        ),
        timeline=timeline,
        block_names=tuple(block for stack in stacks for block in stack),
        block_stacks=tuple(len(stack) for stack in stacks) if len(stacks) > 1 else (),
        memory_source=memory_source,
        cost_source=cost_source,
        assumptions=(*assumptions, *notes),
        workspace_bytes=kind_bytes(StorageKind.WORKSPACE),
        loop=workload.loop,
        switches=switches,
    )


def profile_workload(
    workload: Workload,
    *,
    warmup_steps: int = 2,
    timing_passes: int = 1,
    seed: int = 0,
    progress: ProgressCallback | None = None,
) -> Profile:
    """The all-real profile of ``workload`` (see the module docstring): warm-up steps, timed
    forward passes of the unplanned model, one real instrumented step. It needs the memory
    of the unplanned step. The workload's weights change.

    The step time is the median of the warm-up steps after the first (the first pays
    one-time costs such as creating the optimizer state); with one warm-up step, its own.
    """
    total = warmup_steps + 2
    clock = Clock(workload.device)
    warmup_ms = []
    for step in range(warmup_steps):
        if progress:
            progress("warm-up steps", step, total)
        begin = clock.mark()
        run_training_step(workload, seed=seed + step)
        warmup_ms.append(clock.elapsed_ms(begin, clock.mark()))
    step_ms = statistics.median(warmup_ms[1:] or warmup_ms)
    forward_ms = _time_forward(workload, timing_passes, seed, progress)
    if progress:
        progress("recording the memory timeline", total - 1, total)
    timeline, measured_peak = _record_step(workload, seed=seed)
    profile = _profile_from_timeline(
        workload,
        timeline,
        measured_peak,
        forward_ms=forward_ms,
        step_ms=step_ms,
        memory_source=MemorySource.REAL,
        cost_source=CostSource.MEASURED,
        device=str(workload.device),
        assumptions=(
            Note(NoteTopic.TIMES, f"{timing_passes} forward passes of the unplanned model"),
        ),
    )
    if progress:
        progress("done", total, total)
    return profile
