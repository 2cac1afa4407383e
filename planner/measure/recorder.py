"""Record the memory timeline of one training step.

:class:`TimelineRecorder` records, in order, every storage made and freed, every module
forward entered and left, every tensor saved for backward (packed) and read back
(unpacked), and each op's FLOPs and bytes (:func:`_op_cost`), on fake tensors or real ones
alike; :func:`_record_step` runs one instrumented step under it. The profiler
(:mod:`planner.measure.profiler`) turns the timeline into a profile.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from planner.apply.autocast import AutocastState
from planner.apply.offload import casts_a_leaf
from planner.core.errors import ProfilingError
from planner.core.records import (
    MemoryTimeline,
    ModuleCall,
    OpCost,
    Phase,
    SavedTensor,
    StorageKind,
    StorageLifetime,
)
from planner.measure.kernel_scratch import KernelScratch
from planner.measure.tracking import (
    StorageWatcher,
    iter_tensors,
    returns_view,
    workload_tensors,
    writes_in_place,
    written_arguments,
)
from planner.measure.workload import Workload, run_training_step

__all__ = ["TimelineRecorder"]


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
        scratch: KernelScratch | None = None,
    ) -> None:
        super().__init__(workload.device.type, charge_as=charge_as, limit_bytes=limit_bytes)
        self.workload = workload
        self.scratch = scratch
        self._op_costs: list[OpCost] = []
        self.event = 0
        # index -> size, event, call, kind
        self._alloc: dict[int, tuple[int, int, int, StorageKind]] = {}
        self._free: dict[int, int] = {}
        # Storages made by the op running now; each storage's op; storages written in place.
        self._fresh: list[int] = []
        self._alloc_op: dict[int, str] = {}
        self._written: set[int] = set()
        # Saved storages that are casts of parameters (autocast's copies), and the events
        # at which autocast cleared its cache of them (see _clear_autocast_cache).
        self._leaf_casts: set[int] = set()
        self._autocast_clears: list[int] = []
        self._forward_autocast: str | None = None  # at the first call of a submodule
        self._clear_cache: Any = None
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
            # The kernel's scratch: alive with the outputs while the op runs, none of them.
            scratch = self.scratch.charge(func, args, kwargs, outputs) if self.scratch else 0
            if scratch:
                self._fresh.remove(self.charge_transient(scratch))
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
        if self._stack and self._forward_autocast is None:
            self._forward_autocast = AutocastState.now().dtype_name
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
    def _pack(self, tensor: torch.Tensor) -> _Packed:
        pack_id = len(self._packs)
        index = self.storage_index(tensor)
        call = self._stack[-1] if self._stack else -1
        self._packs.append([-1 if index is None else index, call, self._tick(), -1, -1])
        if call >= 0 and index is not None:
            self._calls[call]["saved"].append(index)
        if index is not None and casts_a_leaf(tensor):
            self._leaf_casts.add(index)
        # Held detached: an op's saved output holds, through its grad_fn, the node that
        # holds this pack; a node backward never reaches (a branch with no gradient, as an
        # index computed by topk) would then keep its saved tensors to the end of the step,
        # which it does not without the recorder.
        with torch.utils._python_dispatch._disable_current_modes():
            return _Packed(self, pack_id, tensor.detach())

    def _released(self, pack_id: int) -> None:
        self._packs[pack_id][4] = self.event

    def _unpack(self, packed: _Packed) -> torch.Tensor:
        pack_id, tensor = packed.pack_id, packed.tensor
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
        # torch.autocast's __exit__ calls torch.clear_autocast_cache() when the outermost
        # region ends: recorded, it is where casts the cache held can die. Swapped in last,
        # so that nothing after it can fail and leave torch's own function replaced.
        self._clear_cache = torch.clear_autocast_cache
        torch.clear_autocast_cache = self._clear_autocast_cache
        return self

    def _clear_autocast_cache(self) -> None:
        self._clear_cache()
        self._autocast_clears.append(self._tick())

    def __exit__(self, *exc: object) -> None:
        torch.clear_autocast_cache = self._clear_cache
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
                leaf_cast=index in self._leaf_casts,
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
                SavedTensor(storage, call, pack_event, last_unpack, release)
                for storage, call, pack_event, last_unpack, release in self._packs
                if storage >= 0
            ),
            phase_end_events=dict(self.phase_end_events),
            op_costs=tuple(self._op_costs),
            autocast_cache_clears=tuple(self._autocast_clears),
            forward_autocast=self._forward_autocast,
        )


class _Packed:
    """What autograd holds for one saved tensor while recording: when autograd lets go of
    it (the node that saved it has run, or its graph died), the recorder notes the event,
    before the tensor it holds can be freed."""

    __slots__ = ("pack_id", "recorder", "tensor")

    def __init__(self, recorder: TimelineRecorder, pack_id: int, tensor: torch.Tensor) -> None:
        self.recorder, self.pack_id, self.tensor = recorder, pack_id, tensor

    def __del__(self) -> None:
        self.recorder._released(self.pack_id)


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
    # FlexAttention's formulas are registered under its higher-order operators themselves.
    formula = flop_registry.get(getattr(func, "_overloadpacket", func))
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
    scratch: KernelScratch | None = None,
) -> tuple[MemoryTimeline, int]:
    """Run one instrumented step; return its timeline and the tracker's measured peak.
    ``ignore``: tensors not on the planned device (see ``FakeSession.host_tensors``).
    ``scratch``: charge each op's CUDA kernel scratch as a transient storage."""
    if workload.loop.gradients_in_forward and all(
        parameter.grad is None for parameter in workload.model.parameters()
    ):
        raise ProfilingError(
            "internal error: the step of this loop shape starts with gradients in place, "
            "but none exist: run a warm-up step before recording it"
        )
    recorder = TimelineRecorder(
        workload, charge_as=charge_as, limit_bytes=limit_bytes, scratch=scratch
    )
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
