"""Profile one training step: the memory timeline, per-module saved bytes, op costs.

:func:`record_memory` is the memory half of a profile. It runs ``warmup_steps`` steps (so
the optimizer state exists, and the gradients where the loop keeps them during the forward:
the step is steady-state), then ONE instrumented step, in the workload's loop shape, under
:class:`TimelineRecorder`, which records, in order, every storage made and freed, every
module forward entered and left, every tensor saved for backward (packed) and read back
(unpacked), and each op's FLOPs and bytes. With a :class:`~planner.measure.fake.FakeSession` all of
it runs on fake tensors (the default of ``ckpt-plan profile``: no memory is used); without
one, for real. Times are not taken here: :mod:`planner.measure.timing` measures them in steps that
fit the budget, and :mod:`planner.plan.targets` estimates them for a target device.

:func:`profile_workload` is the all-real profile (a real instrumented step, then timed
forward passes of the unplanned model): the cross-check for fake profiles, for models that
fit the machine.

Everything the planner needs about checkpointing a module is derived from the timeline by
:mod:`planner.plan.memory_model` (pure Python), so the derivation can be tested on hand-written
timelines and re-run from a saved profile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import statistics
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.flop_counter import flop_registry

from planner.apply import model_fingerprint
from planner.apply.tensors import describe_batch, iter_tensors
from planner.core.devices import device_type
from planner.core.errors import ProfilingError
from planner.core.records import (
    PROFILE_SCHEMA_VERSION,
    CostSource,
    MemorySource,
    MemoryTimeline,
    ModuleCall,
    ModuleProfile,
    OpCost,
    OptionCost,
    Phase,
    Profile,
    SavedTensor,
    StorageKind,
    StorageLifetime,
    forward_totals_by_call,
)
from planner.core.switches import StepSwitches
from planner.measure.timing import Clock, summed_ms, timed_module_calls
from planner.measure.tracking import (
    PeakMemoryTracker,
    StorageWatcher,
    returns_view,
    workload_tensors,
    writes_in_place,
    written_arguments,
)
from planner.measure.workload import (
    OWN_CHECKPOINTING_NOTE,
    Workload,
    compute_loss,
    run_training_step,
    user_code_errors,
)
from planner.plan.memory_model import NESTED, MemoryModel
from planner.plan.policies import nested_recompute_ms

if TYPE_CHECKING:
    from planner.measure.fake import FakeSession

__all__ = [
    "ProgressCallback",
    "TimelineRecorder",
    "find_blocks",
    "profile_workload",
    "recomputed_in_backward",
    "record_memory",
]

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[str, int, int], None]
"""Called as ``progress(what, done, total)`` while profiling."""


def _time_forward(
    workload: Workload, passes: int, seed: int, progress: ProgressCallback | None
) -> dict[str, float]:
    """Per module, the median over ``passes`` forward passes of its summed forward time.

    Recomputation is a forward with grad enabled, so that is what we time: forward and loss
    only (the graph is dropped), about a third of a step, so medians are cheap.
    """
    clock = Clock(workload.device)
    names = [name for name, _ in workload.model.named_modules()]
    per_pass: list[dict[str, float]] = []
    with timed_module_calls(workload.model, clock) as spans:
        for index in range(passes):
            if progress:
                progress("timing module forwards", index, passes)
            spans.clear()
            torch.manual_seed(seed)
            with user_code_errors(workload):
                loss = compute_loss(workload.model_file, workload.model, workload.batch)
            del loss
            per_pass.append(summed_ms(spans, clock)[0])
    return {name: statistics.median(sample.get(name, 0.0) for sample in per_pass) for name in names}


_RANDOM: dict[Any, bool] = {}


def _is_random(func: Any) -> bool:
    """Whether an op draws from the RNG (dropout, bernoulli, rand*), by its schema tag."""
    random = _RANDOM.get(func)
    if random is None:
        random = _RANDOM[func] = torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
    return random


class TimelineRecorder(StorageWatcher):
    """Records the memory timeline of one step (see the module docstring).

    Use as a context manager around exactly one training step. Module hooks and saved-tensor
    hooks are installed on enter and removed on exit.
    """

    def __init__(
        self,
        workload: Workload,
        *,
        charge_as: str | None = None,
        limit_bytes: int | None = None,
    ) -> None:
        super().__init__(workload.device.type, charge_as=charge_as, limit_bytes=limit_bytes)
        self.workload = workload
        self._op_costs: list[OpCost] = []
        self.event = 0
        # index -> size, event, call, kind
        self._alloc: dict[int, tuple[int, int, int, StorageKind]] = {}
        self._free: dict[int, int] = {}
        # Storages made by the op running now; each storage's op; storages written in place.
        self._fresh: list[int] = []
        self._alloc_op: dict[int, str] = {}
        self._written: set[int] = set()
        self._calls: list[dict[str, Any]] = []
        self._stack: list[int] = []
        # [storage index or -1, call index or -1, pack event, last unpack event or -1]
        self._packs: list[list[int]] = []
        self._module_names = {id(m): name for name, m in workload.model.named_modules()}
        self._buffers = {id(m): list(m.named_buffers()) for m in workload.model.modules()}
        self._handles: list[Any] = []
        self._saved_hooks: Any = None
        self.phase_end_events: dict[Phase, int] = {}

    def _tick(self) -> int:
        self.event += 1
        return self.event

    # -- storages ----------------------------------------------------------------------
    def on_alloc(self, index: int, size_bytes: int, kind: StorageKind) -> None:
        started = self._saved_hooks is not None
        event = self._tick() if started else -1
        call = self._stack[-1] if self._stack else -1
        self._alloc[index] = (size_bytes, event, call, kind)
        if started:
            self._fresh.append(index)

    def on_free(self, index: int) -> None:
        self._free[index] = self._tick()

    def on_op(
        self, func: Any, args: Any, kwargs: Any, outputs: list[torch.Tensor], result: Any
    ) -> None:
        started = self._saved_hooks is not None
        if started:
            cost = _op_cost(func, args, kwargs, outputs, result, self)
            self._op_costs.append(cost)
            # The storages this op made are its outputs (what a selective policy keeps).
            for fresh in self._fresh:
                self._alloc_op[fresh] = cost.op
            self._fresh.clear()
        written = [
            index
            for tensor in written_arguments(func, args, kwargs)
            if (index := self.storage_index(tensor)) is not None
        ]
        if started:
            self._written.update(written)
        if not self._stack:
            return
        random = _is_random(func)
        foreign = [str(t.device) for t in outputs if t.device.type != self.device_type]
        if not (random or foreign or written):
            return
        for call_index in self._stack:
            call = self._calls[call_index]
            call["uses_rng"] = call["uses_rng"] or random
            call["devices"].update(foreign)
            call["written"].update(written)

    # -- module calls ----------------------------------------------------------------
    def _indices(self, value: Any) -> tuple[int, ...]:
        found = []
        for tensor in iter_tensors(value):
            index = self.storage_index(tensor)
            if index is not None and index not in found:
                found.append(index)
        return tuple(found)

    def _before(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        call_index = len(self._calls)
        self._calls.append(
            {
                "module_name": self._module_names[id(module)],
                "parent_call": self._stack[-1] if self._stack else -1,
                "forward_start_event": self._tick(),
                "input_storages": self._indices((args, kwargs)),
                "keyword_input_storages": self._indices(kwargs),
                "saved": [],
                "unpacks": [],
                "uses_rng": False,
                "written": set(),
                "devices": {str(t.device) for t in iter_tensors((args, kwargs))},
                "buffer_versions": [(n, b._version) for n, b in self._buffers[id(module)]],
                "argument_storages": [
                    (position, set(self._indices(value)))
                    for position, value in _argument_objects(args, kwargs)
                ],
            }
        )
        self._stack.append(call_index)

    def _after(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not self._stack:
            return
        call_index = self._stack.pop()
        call = self._calls[call_index]
        call["forward_end_event"] = self._tick()
        call["output_storages"] = self._indices(output)
        # A buffer changed in place: its version moved, or an op wrote its storage (native
        # batch_norm updates running statistics without bumping their version).
        versions = dict(call.pop("buffer_versions"))
        written = call.pop("written")
        mutated = [
            (name, buffer)
            for name, buffer in self._buffers[id(module)]
            if buffer._version != versions[name] or self.storage_index(buffer) in written
        ]
        call["mutated_buffers"] = tuple(name for name, _ in mutated)
        call["mutated_buffer_bytes"] = sum(b.untyped_storage().nbytes() for _, b in mutated)
        # An object it was given (a key/value cache) now holds tensors it did not hold.
        updated = [
            (position, value)
            for (position, before), (_, value) in zip(
                call.pop("argument_storages"), _argument_objects(args, kwargs), strict=True
            )
            if not set(self._indices(value)) <= before
        ]
        call["updated_arguments"] = tuple(
            f"{_argument_name(module, position)} ({type(value).__name__})"
            for position, value in updated
        )

    # -- saved tensors -----------------------------------------------------------------
    def _pack(self, tensor: torch.Tensor) -> tuple[int, torch.Tensor]:
        pack_id = len(self._packs)
        index = self.storage_index(tensor)
        call = self._stack[-1] if self._stack else -1
        self._packs.append([-1 if index is None else index, call, self._tick(), -1])
        if call >= 0 and index is not None:
            self._calls[call]["saved"].append(index)
        return pack_id, tensor

    def _unpack(self, packed: tuple[int, torch.Tensor]) -> torch.Tensor:
        pack_id, tensor = packed
        call = self._packs[pack_id][1]
        event = self._tick()
        self._packs[pack_id][3] = event
        if call >= 0:
            self._calls[call]["unpacks"].append(event)
        return tensor

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> TimelineRecorder:
        model, optimizer, batch = self.workload.model, self.workload.optimizer, self.workload.batch
        self.add_existing(workload_tensors(model, optimizer, batch))
        for module in model.modules():
            self._handles.append(module.register_forward_pre_hook(self._before, with_kwargs=True))
            self._handles.append(
                module.register_forward_hook(self._after, with_kwargs=True, always_call=True)
            )
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saved_hooks.__enter__()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._saved_hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.close()

    def mark_phase_end(self, phase: Phase) -> None:
        self.phase_end_events[phase] = self._tick()

    def timeline(self, final_kinds: dict[int, StorageKind]) -> MemoryTimeline:
        """The recorded timeline. ``final_kinds`` relabels storages identified after the
        step (gradients and optimizer state made during it)."""
        event_count = self.event + 1
        storages = tuple(
            StorageLifetime(
                size_bytes=size,
                alloc_event=event,
                free_event=self._free.get(index, event_count),
                alloc_call=call,
                kind=final_kinds.get(index, kind),
                alloc_op=self._alloc_op.get(index, ""),
                written_in_place=index in self._written,
            )
            for index, (size, event, call, kind) in sorted(self._alloc.items())
        )
        calls = []
        for call in self._calls:
            unpacks = call["unpacks"]
            calls.append(
                ModuleCall(
                    module_name=call["module_name"],
                    parent_call=call["parent_call"],
                    forward_start_event=call["forward_start_event"],
                    forward_end_event=call.get("forward_end_event", event_count),
                    first_unpack_event=min(unpacks) if unpacks else -1,
                    last_unpack_event=max(unpacks) if unpacks else -1,
                    input_storages=call["input_storages"],
                    keyword_input_storages=call["keyword_input_storages"],
                    output_storages=call.get("output_storages", ()),
                    saved_storages=tuple(dict.fromkeys(call["saved"])),
                    uses_rng=call["uses_rng"],
                    mutated_buffers=call.get("mutated_buffers", ()),
                    mutated_buffer_bytes=call.get("mutated_buffer_bytes", 0),
                    updated_arguments=call.get("updated_arguments", ()),
                    devices=tuple(sorted(call["devices"])),
                )
            )
        return MemoryTimeline(
            event_count=event_count,
            storages=storages,
            calls=tuple(calls),
            saved_tensors=tuple(
                SavedTensor(storage, call, pack_event, last_unpack)
                for storage, call, pack_event, last_unpack in self._packs
                if storage >= 0
            ),
            phase_end_events=dict(self.phase_end_events),
            op_costs=tuple(self._op_costs),
        )


def _argument_objects(args: Any, kwargs: Any) -> list[tuple[int | str, Any]]:
    """A call's arguments that are containers or objects (not tensors, not modules), by
    position or keyword: the ones whose contents the call could change."""
    found: list[tuple[int | str, Any]] = [(position, value) for position, value in enumerate(args)]
    found.extend(kwargs.items())
    return [
        (position, value)
        for position, value in found
        if not isinstance(value, (torch.Tensor, torch.nn.Module, str, bytes, int, float, bool))
        and value is not None
    ]


def _argument_name(module: torch.nn.Module, position: int | str) -> str:
    """A keyword's name, or the name of ``forward``'s parameter at ``position``."""
    if isinstance(position, str):
        return position
    try:
        parameters = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        parameters = []
    return parameters[position] if position < len(parameters) else f"argument {position}"


def _argument_tensors(values: Any, found: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors among an op's arguments (one level of lists, as op schemas allow)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(item for item in value if isinstance(item, torch.Tensor))
    return found


_OP_NAMES: dict[Any, str] = {}


def _storage_of(tensor: torch.Tensor) -> object:
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # no storage (nested, sparse): its own
        return tensor


def _op_cost(
    func: Any,
    args: Any,
    kwargs: Any,
    outputs: list[torch.Tensor],
    result: Any,
    recorder: TimelineRecorder,
) -> OpCost:
    formula = flop_registry.get(getattr(func, "_overloadpacket", None))
    flops = 0
    if formula is not None:
        try:
            flops = int(formula(*args, **kwargs, out_val=result))
        except Exception:  # a formula that does not cover this overload's arguments
            flops = 0
    inputs = _argument_tensors(kwargs.values(), _argument_tensors(args, []))
    moved = 0
    # No data moves for a view, an op that returns no tensor (``prim.device``, sizes), or
    # one whose outputs all share an input's storage without writing it (``_unsafe_view``).
    input_storages = {id(_storage_of(t)) for t in inputs}
    aliases_only = all(id(_storage_of(t)) in input_storages for t in outputs) and not (
        writes_in_place(func)
    )
    if not returns_view(func) and outputs and not aliases_only:
        seen: set[int] = set()
        for tensor in (*inputs, *outputs):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                moved += tensor.numel() * tensor.element_size()
    dtype = next(
        (t.dtype for t in (*inputs, *outputs) if t.is_floating_point()),
        inputs[0].dtype if inputs else (outputs[0].dtype if outputs else torch.float32),
    )
    name = _OP_NAMES.get(func)
    if name is None:
        name = _OP_NAMES[func] = str(func)
    return OpCost(
        op=name,
        call=recorder._stack[-1] if recorder._stack else -1,
        event=recorder.event,
        flops=flops,
        bytes_moved=moved,
        dtype=str(dtype).removeprefix("torch."),
    )


def _record_step(
    workload: Workload,
    seed: int,
    charge_as: str | None = None,
    ignore: tuple[torch.Tensor, ...] = (),
    limit_bytes: int | None = None,
) -> tuple[MemoryTimeline, int]:
    """Run one instrumented step; return its timeline and the tracker's measured peak.
    ``ignore``: tensors not on the planned device (see ``FakeSession.host_tensors``)."""
    if workload.loop.gradients_in_forward and all(
        parameter.grad is None for parameter in workload.model.parameters()
    ):
        raise ProfilingError(
            "internal error: the step of this loop shape starts with gradients in place, "
            "but none exist: run a warm-up step before recording it"
        )
    recorder = TimelineRecorder(workload, charge_as=charge_as, limit_bytes=limit_bytes)
    recorder.ignore(ignore)
    with recorder:
        run_training_step(workload, seed=seed, phase_ended=recorder.mark_phase_end)
    # Storages that became gradients or optimizer state during the step are static memory.
    final_kinds: dict[int, StorageKind] = {}
    for kind, tensors in workload_tensors(workload.model, workload.optimizer, None).items():
        if kind in (StorageKind.GRADIENT, StorageKind.OPTIMIZER_STATE):
            for tensor in tensors:
                index = recorder.storage_index(tensor)
                if index is not None:
                    final_kinds[index] = kind
    return recorder.timeline(final_kinds), recorder.peak_bytes


_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)


def _is_block(module: torch.nn.Module) -> bool:
    """Whether a module can be one block of a stack: it has submodules, or it is a model's
    own layer holding its parameters itself and computing with ``torch`` functions (not one
    of ``torch.nn``'s layers: a run of ``nn.Linear`` is a stack of layers, not of blocks)."""
    if any(True for _ in module.children()):
        return True
    return not _is_torch_layer(module) and any(True for _ in module.parameters(recurse=False))


def _is_torch_layer(module: torch.nn.Module) -> bool:
    """One of ``torch.nn``'s own layers with no submodules (Linear, LayerNorm, Dropout, GELU):
    checkpointed alone it frees a few bytes per element at most (a mask, a norm's
    statistics: its input is kept as the checkpoint's) for a checkpoint call each (about
    0.2 ms on the CPU machine), and a module holding it recomputes it anyway. Not a
    candidate. A model's own leaf layers (a functional block, Hugging Face's activations
    and norms, which run several ops) are judged by what they free, like any module."""
    return type(module).__module__.startswith("torch.nn.") and not any(
        True for _ in module.children()
    )


def _stack_class(module: torch.nn.Module, *, at_least: int = 2) -> type | None:
    """The class of the blocks ``module`` stacks: a ``ModuleList``/``Sequential`` whose
    ``at_least`` or more children are all of one class and blocks (:func:`_is_block`; a run
    of Linear and ReLU is not a stack of blocks). None for anything else."""
    if not isinstance(module, _CONTAINERS):
        return None
    children = list(module.children())
    if len(children) < at_least or len({type(child) for child in children}) != 1:
        return None
    if not _is_block(children[0]):
        return None
    return type(children[0])


def _inner_blocks(name: str, module: torch.nn.Module) -> list[str]:
    """The residual blocks inside one block of a stack, where it is a stage of them: a stage
    that is itself an ``nn.Sequential`` of blocks (``stages.0`` -> ``stages.0.1``), or a
    stage module holding one (timm's ``stages.0`` -> ``stages.0.blocks.1``). Only
    ``nn.Sequential`` counts, which runs its children one after the other: a ``ModuleList``
    inside a block (experts of a mixture) is not a chain of blocks. Otherwise ``[name]``."""
    if isinstance(module, torch.nn.Sequential) and _stack_class(module, at_least=1):
        stage = [(name, module)]
    else:
        stage = [
            (f"{name}.{child_name}", child)
            for child_name, child in module.named_children()
            if isinstance(child, torch.nn.Sequential) and _stack_class(child, at_least=1)
        ]
        if len(stage) != 1:
            return [name]
    stage_name, stage_module = stage[0]
    return [
        block
        for child_name, child in stage_module.named_children()
        for block in _inner_blocks(f"{stage_name}.{child_name}", child)
    ]


def find_blocks(model: torch.nn.Module) -> tuple[str, ...]:
    """The model's repeated blocks, the ones a user checkpoints by hand ("every block").

    Start from the stack with the most parameters: the children of the
    ``ModuleList``/``Sequential`` holding two or more blocks of one class
    (``blocks.*`` of a GPT, ``model.layers.*`` of a Llama). On convolutional networks that
    stack is one stage, or a stack of stages, and checkpointing a whole stage saves little,
    so two rules make it every residual block instead:

    * Sibling stages: an ``nn.Sequential`` stack joins its siblings (same parent) that are
      ``nn.Sequential`` stacks of the same block class, in registration order (torchvision's
      ``layer1.0`` ... ``layer4.1``).
    * Nested stages: a block that is itself an ``nn.Sequential`` of blocks, or that holds
      exactly one such ``nn.Sequential``, is replaced by those blocks, recursively
      (``stages.0.1``; timm's ``stages.0.blocks.1``).

    Transformer stacks are ``ModuleList``s whose blocks hold no ``nn.Sequential`` of blocks,
    so neither rule changes them; stacks in different parents (T5's encoder and decoder
    blocks) stay apart.
    """
    best: tuple[int, str, torch.nn.Module | None] = (0, "", None)
    for name, module in model.named_modules():
        if _stack_class(module) is None:
            continue
        size = sum(p.numel() for p in module.parameters()) + len(module)
        if size > best[0]:
            best = (size, name, module)
    _, name, stack = best
    if stack is None:
        return ()
    stacks = [(name, stack)]
    if name and isinstance(stack, torch.nn.Sequential):
        parent_name, _, _ = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        stacks = [
            (f"{parent_name}.{sibling_name}" if parent_name else sibling_name, sibling)
            for sibling_name, sibling in parent.named_children()
            if sibling is stack
            or (
                isinstance(sibling, torch.nn.Sequential)
                and _stack_class(sibling, at_least=1) is _stack_class(stack)
            )
        ]
    return tuple(
        block
        for stack_name, stack_module in stacks
        for child_name, child in stack_module.named_children()
        for block in _inner_blocks(
            f"{stack_name}.{child_name}" if stack_name else child_name, child
        )
    )


def _unique_bytes(tensors: list[torch.Tensor]) -> int:
    # A storage's Python object lives as long as the storage (fake ones included), so its
    # id identifies it while the tensors are held here.
    return sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())


def _module_profiles(
    model: torch.nn.Module,
    timeline: MemoryTimeline,
    forward_ms: dict[str, float],
    memory: MemoryModel | None = None,
) -> tuple[ModuleProfile, ...]:
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
        uses_rng = any(call.uses_rng for call in call_records)
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
    ``bucket_bytes``: DDP's gradient buckets (:func:`planner.measure.distributed.ddp_bucket_bytes`),
    made when DDP was built and alive throughout: one gradient storage the same way.
    ``around_steps``: a context entered (on the session's tensors) around the steps, yielding
    tensors the step's objects hold out of sight (with DDP's ``gradient_as_bucket_view``,
    its buckets: :func:`planner.measure.distributed.gradients_into_buckets`), which the
    recording does not count when an op returns a view of them: ``bucket_bytes`` counts them."""
    running = session.running if session is not None else contextlib.nullcontext
    device_type = session.device_type if session is not None else workload.device.type
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
            charge_as=charge_as or device_type,
            ignore=(
                *(session.host_tensors(workload.optimizer) if session is not None else ()),
                *held,
            ),
            limit_bytes=limit_bytes,
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
        assumptions=session.assumptions if session is not None else (),
        switches=StepSwitches(
            caches_off=workload.caches_off,
            expert_load=session.expert_load_used if session is not None else None,
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


def _own_checkpointing_seen(timeline: MemoryTimeline) -> tuple[str, ...]:
    recomputed = recomputed_in_backward(timeline)
    if not recomputed:
        return ()
    shown = ", ".join(name or "the root module" for name in recomputed[:4])
    shown += f" and {len(recomputed) - 4} more" if len(recomputed) > 4 else ""
    return (
        f"{OWN_CHECKPOINTING_NOTE}{shown} itself (their forward runs again during backward: "
        "a torch.utils.checkpoint call in its code, with no switch ckpt-plan knows); it "
        "cannot be switched off here, so the plan counts it: every predicted peak includes "
        "that recomputation, and checkpointing those modules again frees nothing",
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
    assumptions: tuple[str, ...],
    switches: StepSwitches | None = None,
) -> Profile:
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

    switches = switches or StepSwitches(caches_off=workload.caches_off)
    notes = (*workload.notes, *switches.describe(), *_own_checkpointing_seen(timeline))
    for note in notes:
        logger.info("%s", note)  # the CLI shows them as warnings (own_checkpointing_notes)
    model = workload.model
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
        modules=_module_profiles(model, timeline, forward_ms, memory),
        timeline=timeline,
        block_names=find_blocks(model),
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
        assumptions=(f"times: {timing_passes} forward passes of the unplanned model",),
    )
    if progress:
        progress("done", total, total)
    return profile
