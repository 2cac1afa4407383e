"""Predict the peak memory of a training step for any set of checkpointed modules.

Pure Python and numpy: no torch. The input is the :class:`MemoryTimeline` measured in one
instrumented step; the output is a peak in bytes. The solver calls :meth:`MemoryModel.peak_bytes`
many times, so the per-plan work is one vectorised pass over the timeline.

Design notes: how checkpointing changes the timeline
-----------------------------------------------------
Wrapping a module call ``c`` (forward spanning events ``[f0, f1]``) in non-reentrant
``torch.utils.checkpoint`` changes the unplanned timeline in three ways:

1. **Retained activations are dropped after forward.** A storage ``s`` made during ``c``'s
   forward, saved for backward by an op inside ``c``, not part of ``c``'s output, and still
   alive after ``f1`` is alive only because autograd saved it. Under checkpoint the saved
   tensor hooks keep nothing, so ``s`` dies when its last Python reference does: at the end
   of the innermost call (inside ``c``) that made it and did not return it. We call the set
   of such storages ``retained(c)`` and that event ``drop(s)``.
2. **Recomputation brings them back, with a spike.** Backward reaches ``c`` at the first
   unpack of a tensor saved inside it (``recompute_event``). Checkpoint then re-runs the
   forward of ``c``: memory rises by the forward's own transient peak
   (``recompute_peak_bytes``: the most bytes made inside ``c``'s forward that were alive at
   once) and settles at ``retained(c)``, which backward then frees as in the unplanned step.
3. **Inputs are kept until ``c``'s backward ends.** The checkpoint holds its arguments for
   recomputation, so an input storage that would have died earlier lives until autograd
   lets go of the last tensor saved inside ``c`` (``release_event``): each saved tensor's
   hooks hold the checkpoint, and a saved tensor is let go of once the node that saved it
   has run, its results made on top of the inputs (recorded: ``SavedTensor.release_event``;
   the last read where a profile has none). An RMSNorm under autocast, given a bf16 input
   it copies to float32, reads the copy in the backward of its ``pow`` and makes three
   tensors of its size before letting go (Laguna's query norm).
4. **Outputs that ``c`` saved itself die with their last outside use.** An output of ``c``
   that an op inside ``c`` saved (a final ReLU saves its result) lives, unplanned, until
   ``c``'s backward. Under checkpoint only its consumers hold it: it dies at the last
   backward read by a saved tensor outside ``c``, or when the caller's forward returns
   without it, whichever is later; recomputation makes it again (``released_outputs``).
   The caller's return is an upper bound: its code may let go sooner (a loop variable
   rebound by the next layer's call: Megatron-BERT's attention probabilities), which the
   step without a plan cannot show, autograd holding it there.
5. **A selective policy keeps what it saves.** Under a policy (``name@save-matmuls``,
   :mod:`planner.plan.policies`) the outputs of the ops it saves are not dropped: they stay
   in the checkpoint's cache from their op until ``recompute_event``, even those autograd
   did not save (``kept``: held like an input, until then); the recomputation takes them
   back instead of making them, and one the forward had used up dies where it died then.
6. **Nesting.** ``name@nested`` checkpoints a module and, inside it, some of its
   children (``nested_inner``). The forward drops what the module alone would; the outer
   recomputation runs the inner checkpoints, which drop their own activations again as
   their forward returns (so its spike is lower), and those come back only at each
   inner recomputation. An inner input that the outer recomputation makes again is held
   until the inner backward ends (``revived``). The inner modules run three times.
7. **Offload moves instead of recomputing.** ``name@offload`` (:mod:`planner.apply.offload`)
   runs the forward once. When it ends, every storage saved inside the call (all its
   subtree's saves) that is not one of its inputs or outputs, not static memory, not a
   cast of a parameter (``leaf_cast``: autocast's copy, which its cache holds anyway) and
   at least ``offload_min_bytes`` goes to the host, and the device storage dies there, at
   the forward's end (``retained``, dropped at ``f1``), not at the end of the call that
   made it; the first unpack of the call's backward (``recompute_event``) makes it again,
   and it dies where it died unplanned. No spike, no input held, nothing kept. One the
   unplanned step freed between the forward's end and that unpack (its saving op was let
   go of) just dies at ``f1``. One made before the call (neither an input nor static:
   an attribute, a closure's tensor) may be held elsewhere: it is left as it was and the
   copy made at the unpack is added (``revived``), an upper bound. Host memory is counted
   apart (``host``: each storage from ``f1`` to the unpack, or to its free), as the host's
   allocator takes it: on CUDA each storage in a pinned block of the next power of two
   (``pinned_host``; :func:`planner.core.allocator.pinned_host_bytes`), elsewhere its size.
   The copies themselves move the storage's bytes (``CheckpointEffect.host_bytes``).
8. **Offloaded tensors are prefetched one module early.** With a lookahead of ``k``
   (``offload_lookahead``, 1 by default; 0: none), the copy back of a call's tensors starts
   at the backward of the ``k``-th sibling call after it that saved something (in a chain
   of blocks: the next block, whose backward runs just before this one's), so that the
   copy overlaps that backward's compute. The runtime fires it at the first unpack of any
   tensor saved inside that call (``prefetch_event``); the bytes are back on the device
   just before it (``recompute_event`` is then the event before ``prefetch_event``: a
   checkpointed trigger's recompute spike sits on top of them) and leave the host there.
   A module called more than once is prefetched only where every call has the same
   trigger module, and only where the trigger's first call after the offloaded one is that
   sibling (the runtime waits for the trigger module's next call).
9. **Autocast's cache outlives the forward.** Under ``torch.autocast`` a parameter cast to
   a lower precision (``leaf_cast``: a Linear's bf16 copy of its fp32 weight) is kept in
   autocast's cache until the outermost autocast region exits, which clears it
   (``autocast_cache_clears``, recorded). A checkpointed module's cast is not saved, but
   the cache holds it: it is dropped (point 1) only there, and not at all where that is
   after its unplanned death. (An offloaded module leaves such casts on the device:
   point 7.) A cast can be saved by several calls, the cache handing one cast to each (a
   module called again, HRM's recurrent modules, first without grad). A checkpointed call
   saves none of it, so the cast outlives the cache's clear only while an unplanned saver
   outside the plan still holds it (until that saver's backward); and a checkpointed
   call that did not make it casts the weight again when it recomputes (the cache is
   empty in the backward), a copy of its own alive until its node has run (``recast``).

Everything else (parameters, gradients, optimizer state, the loss, the optimizer step's
temporaries) is replayed exactly as measured. The peak of a plan is the maximum over the
replayed timeline and over the recompute spikes. With no module wrapped the model returns
the measured peak exactly (a test checks this).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from planner.core.allocator import pinned_host_bytes
from planner.core.devices import device_type
from planner.core.records import (
    STATIC_KINDS,
    MemoryTimeline,
    OpCost,
    OptionCost,
    Phase,
    Profile,
    Unit,
)
from planner.plan.policies import (
    NESTED,
    OFFLOAD,
    OFFLOAD_AT_USE,
    OFFLOAD_MIN_BYTES,
    OFFLOAD_OPTIONS,
    PolicyRule,
    kept_storages,
    policy_rules,
)

__all__ = [
    "NESTED",
    "OFFLOAD",
    "OFFLOAD_AT_USE",
    "OFFLOAD_OPTIONS",
    "CheckpointEffect",
    "MemoryModel",
    "checkpoint_effects",
    "sequential_segments",
]


@dataclass(frozen=True)
class CheckpointEffect:
    """How wrapping one module call changes the timeline (see the design notes above).

    ``retained`` and ``released_outputs`` hold ``(storage_index, size_bytes, drop_event)``
    triples: storages that die at ``drop_event`` under checkpoint and are made again at
    ``recompute_event``. ``recompute_event`` is -1 when nothing inside the call was saved
    for backward (wrapping it would do nothing).
    """

    call_index: int
    module_name: str
    retained: tuple[tuple[int, int, int], ...]
    released_outputs: tuple[tuple[int, int, int], ...]
    recompute_event: int
    release_event: int
    input_storages: tuple[int, ...]
    recompute_peak_bytes: int
    saved_bytes: int
    # Under a selective policy: ``(storage_index, size_bytes, until_event)`` of the op
    # outputs the policy keeps, alive until the recomputation takes them back
    # (``recompute_event``), or, for an op the recomputation never reaches (it stops after
    # the last saved tensor), until the checkpoint is freed (``release_event``).
    kept: tuple[tuple[int, int, int], ...] = ()
    # Under nesting: ``(storage_index, size_bytes, from_event, until_event)`` of storages
    # alive again over that span though the unplanned step had freed them (an inner
    # checkpoint's inputs, made again by the outer recomputation and held until the inner
    # backward ends).
    revived: tuple[tuple[int, int, int, int], ...] = ()
    # ``(storage_index, size_bytes, drop_event, free_event)`` of storages saved inside the
    # call for a result the forward discards before its backward (MiniMax's attention
    # returns the next chunk's state, which its layer drops): unplanned, the saving ops'
    # graph holds them until that result dies (``free_event``); checkpointed, it holds
    # none, and they die when their call returns (``drop_event``), never made again.
    dropped: tuple[tuple[int, int, int, int], ...] = ()
    # Under offload: ``(storage_index, size_bytes, from_event, until_event)`` of the host
    # copies, and no recompute spike (point 7 of the module notes).
    host: tuple[tuple[int, int, int, int], ...] = ()
    offload: bool = False
    # ``(storage_index, size_bytes, from_event, until_event)`` of the casts of parameters
    # saved inside the call that it did not make (point 9): the recomputation makes its own
    # copy, alive from ``recompute_event`` until the call's backward lets go of it.
    recast: tuple[tuple[int, int, int, int], ...] = ()
    # The calls of the span's subtree, ``range(first, stop)``: its saves are the plan's.
    subtree: tuple[int, int] = (0, 0)
    # Under offload with a prefetch (point 8): the event at which the copy back starts (the
    # first unpack inside the trigger call), and the trigger module; -1 and "" without.
    # ``release_event`` stays the first unpack of the call's own backward (the use).
    prefetch_event: int = -1
    prefetch_module: str = ""

    @property
    def host_bytes(self) -> int:
        """The bytes its copies move each way (what the host holds may be more: see
        :meth:`MemoryModel.host_bytes`)."""
        return sum(size for _, size, _, _ in self.host)

    @property
    def retained_bytes(self) -> int:
        return sum(size for _, size, _ in self.retained)


def _subtree_end(timeline: MemoryTimeline, call_index: int) -> int:
    """Calls are recorded in pre-order, so a call's subtree is a contiguous run of indices."""
    calls = timeline.calls
    end_event = calls[call_index].forward_end_event
    last = call_index
    while last + 1 < len(calls) and calls[last + 1].forward_start_event < end_event:
        last += 1
    return last + 1


class _EffectBuilder:
    """Indexes over one timeline, to derive the effect of checkpointing any span of calls."""

    def __init__(self, timeline: MemoryTimeline) -> None:
        self.timeline = timeline
        storages = timeline.storages
        self.by_alloc = sorted(range(len(storages)), key=lambda index: storages[index].alloc_event)
        self.alloc_events = [storages[index].alloc_event for index in self.by_alloc]
        self.output_sets = [frozenset(call.output_storages) for call in timeline.calls]
        self.forward_end = timeline.phase_end_events.get(Phase.FORWARD, timeline.event_count - 1)
        self.autocast_cache_clears = sorted(timeline.autocast_cache_clears)
        # storage -> [(call that saved it, last backward read)], for outside uses of outputs.
        self.saves: dict[int, list[tuple[int, int]]] = {}
        # (storage, call that saved it) -> the last event before autograd let go of it
        # (recorded since profile files carry it; absent: the last read stands for it).
        self.releases: dict[tuple[int, int], int] = {}
        # call -> the last event at which a tensor was saved while it was innermost.
        self.last_pack: dict[int, int] = {}
        for saved_tensor in timeline.saved_tensors:
            self.saves.setdefault(saved_tensor.storage, []).append(
                (saved_tensor.call, saved_tensor.last_unpack_event)
            )
            key = (saved_tensor.storage, saved_tensor.call)
            release = max(saved_tensor.release_event, saved_tensor.last_unpack_event)
            self.releases[key] = max(self.releases.get(key, -1), release)
            if saved_tensor.call >= 0 and saved_tensor.pack_event <= self.forward_end:
                self.last_pack[saved_tensor.call] = max(
                    self.last_pack.get(saved_tensor.call, -1), saved_tensor.pack_event
                )

    def cache_cleared_after(self, event: int) -> int:
        """The first event after ``event`` at which autocast cleared its cast cache (see
        the module notes, point 9); past the step's end where it never did."""
        position = bisect.bisect_right(self.autocast_cache_clears, event)
        if position < len(self.autocast_cache_clears):
            return self.autocast_cache_clears[position]
        return self.timeline.event_count

    def made_inside(self, call_index: int) -> list[int]:
        """Storages made during a call's forward, in allocation order."""
        call = self.timeline.calls[call_index]
        return self.made_between(call.forward_start_event, call.forward_end_event)

    def made_between(self, start: int, end: int) -> list[int]:
        """Storages made strictly between two events, in allocation order."""
        low = bisect.bisect_right(self.alloc_events, start)
        high = bisect.bisect_left(self.alloc_events, end)
        return self.by_alloc[low:high]

    def nested(self, outer: int, inner: list[int], name: str) -> list[CheckpointEffect]:
        """The effects of checkpointing call ``outer`` with its child calls ``inner``
        checkpointed inside it (see the module notes, point 6): the outer effect without
        the storages the inner checkpoints keep dropped, and one effect per inner call
        whose storages come back only at its own recomputation."""
        storages = self.timeline.storages
        whole = self.span(outer, outer, name)
        if whole.recompute_event < 0:
            return [whole]
        effects = [self.span(index, index, name) for index in inner]
        effects = [effect for effect in effects if effect.recompute_event >= 0]
        inner_drop = {index: drop for effect in effects for index, _size, drop in effect.retained}
        # Every storage the outer checkpoint drops is dropped in forward where it was;
        # those an inner checkpoint owns come back at the inner recomputation instead.
        outer_drop = {index: drop for index, _size, drop in whole.retained}
        retained = tuple(entry for entry in whole.retained if entry[0] not in inner_drop)
        # The outer recomputation runs the inner checkpoints, which drop their retained
        # storages again when their forward returns: its spike replays that.
        end = whole.recompute_event
        changes: list[tuple[int, int]] = []
        for index in self.made_inside(outer):
            record = storages[index]
            changes.append((record.alloc_event, record.size_bytes))
            free = inner_drop.get(index, record.free_event)
            if free < self.timeline.calls[outer].forward_end_event:
                changes.append((free, -record.size_bytes))
        changes.sort()
        level = peak = self.timeline.calls[outer].mutated_buffer_bytes
        for _, change in changes:
            level += change
            peak = max(peak, level)
        inputs_made_inside = set(self.made_inside(outer))
        inner_effects = []
        for effect in effects:
            # An inner checkpoint holds its keyword arguments by reference from the
            # forward on (the outer checkpoint cannot drop them); its positional ones are
            # saved tensors, dropped in the forward and made again by the outer recompute.
            keyword = set(self.timeline.calls[effect.call_index].keyword_input_storages)
            revived = tuple(
                (index, storages[index].size_bytes, end, effect.release_event)
                for index in effect.input_storages
                if index in inputs_made_inside
                and index not in keyword
                and index not in outer_drop
                and storages[index].free_event < end < effect.release_event
            )
            inner_effects.append(
                CheckpointEffect(
                    call_index=effect.call_index,
                    module_name=name,
                    retained=tuple(
                        (index, size, outer_drop.get(index, drop))
                        for index, size, drop in effect.retained
                    ),
                    # An inner output it saved itself: made again by the outer
                    # recomputation, it dies with its last outside use, as under the
                    # inner checkpoint alone, and comes back at the inner recomputation.
                    released_outputs=tuple(
                        (index, size, max(drop, whole.recompute_event))
                        if index in outer_drop
                        else (index, size, drop)
                        for index, size, drop in effect.released_outputs
                    ),
                    recompute_event=effect.recompute_event,
                    release_event=effect.release_event,
                    input_storages=tuple(i for i in effect.input_storages if i in keyword),
                    # An inner recomputation at the outer one's event runs right after it
                    # (the outer one stops early, at the inner checkpoint's saved inputs):
                    # on top of what the outer recomputation brought back, which the curve
                    # at that event does not hold yet. Counted in full (an upper bound).
                    recompute_peak_bytes=effect.recompute_peak_bytes
                    + (
                        sum(size for _, size, _ in retained)
                        if effect.recompute_event <= whole.recompute_event
                        else 0
                    ),
                    saved_bytes=effect.saved_bytes,
                    revived=revived,
                )
            )
        outer_effect = CheckpointEffect(
            call_index=whole.call_index,
            module_name=name,
            retained=retained,
            released_outputs=whole.released_outputs,
            recompute_event=whole.recompute_event,
            release_event=whole.release_event,
            input_storages=whole.input_storages,
            recompute_peak_bytes=peak,
            saved_bytes=whole.saved_bytes,
        )
        return [outer_effect, *inner_effects]

    def released(self, storage: int, call: int) -> int:
        """The last event before autograd let go of ``storage`` as ``call`` saved it: when
        the node that saved it has run, its own results made (recorded), else its last read."""
        return self.releases[(storage, call)]

    def first_unpack(self, call_index: int) -> int:
        """The first unpack of a tensor saved inside a call's subtree (-1: none)."""
        calls = self.timeline.calls
        unpacks = [
            calls[sub].first_unpack_event
            for sub in range(call_index, _subtree_end(self.timeline, call_index))
            if calls[sub].first_unpack_event >= 0
        ]
        return min(unpacks) if unpacks else -1

    def prefetch_trigger(self, call_index: int, lookahead: int) -> int:
        """The call at whose backward an offloaded call's tensors start back (the module
        notes, point 8): its ``lookahead``-th later sibling that saved something, if the
        next call of that module after this one is that sibling; -1 for none."""
        calls = self.timeline.calls
        parent = calls[call_index].parent_call
        sibling, found = _subtree_end(self.timeline, call_index), 0
        while lookahead > 0 and sibling < len(calls) and calls[sibling].parent_call == parent:
            if parent < 0 and calls[sibling].forward_start_event >= self.forward_end:
                break  # a call after the loss: not part of this forward
            if self.first_unpack(sibling) >= 0:
                found += 1
                if found == lookahead:
                    name = calls[sibling].module_name
                    between = range(_subtree_end(self.timeline, call_index), sibling)
                    if any(calls[index].module_name == name for index in between):
                        return -1
                    return sibling
            sibling = _subtree_end(self.timeline, sibling)
        return -1

    def offload(
        self, call_index: int, name: str, min_bytes: int, trigger: int = -1
    ) -> CheckpointEffect:
        """The effect of offloading one call's saved tensors (the module notes, point 7),
        prefetched at the backward of call ``trigger`` (point 8; -1: at its own)."""
        timeline, storages, calls = self.timeline, self.timeline.storages, self.timeline.calls
        call = calls[call_index]
        end = call.forward_end_event
        inside = range(call_index, _subtree_end(timeline, call_index))
        saved: set[int] = set()
        for sub in inside:
            saved.update(calls[sub].saved_storages)
        use = self.first_unpack(call_index)
        prefetch = self.first_unpack(trigger) if trigger >= 0 else -1
        if not end < prefetch < use:
            prefetch = -1
        # The bytes are back after this event: just before the prefetch, or at the use.
        back = prefetch - 1 if prefetch >= 0 else use
        stays = set(call.input_storages) | self.output_sets[call_index]
        made = set(self.made_inside(call_index))
        dropped, copies, host = [], [], []
        for index in sorted(saved - stays):
            record = storages[index]
            if (
                record.kind in STATIC_KINDS
                or record.leaf_cast
                or record.size_bytes < min_bytes
                or back < 0
            ):
                continue
            if index not in made:
                if record.free_event > back:  # the copy made at the unpack, on top
                    copies.append((index, record.size_bytes, back, record.free_event))
                    host.append((index, record.size_bytes, end, back))
                continue
            if record.free_event <= end:
                continue  # autograd let go of it inside the forward: never sent
            if record.free_event <= back:
                # Its saving op was let go of before the backward came: it dies at f1
                # instead (a negative span: the bytes are gone from f1 to its free).
                copies.append((index, -record.size_bytes, end, record.free_event))
                host.append((index, record.size_bytes, end, record.free_event))
                continue
            dropped.append((index, record.size_bytes, end))
            host.append((index, record.size_bytes, end, back))
        return CheckpointEffect(
            call_index=call_index,
            module_name=name,
            # Dead from the forward's end to the first unpack of the call's backward.
            retained=tuple(dropped),
            released_outputs=(),
            recompute_event=back,
            release_event=use,
            input_storages=(),
            recompute_peak_bytes=0,
            saved_bytes=sum(storages[index].size_bytes for index in saved),
            revived=tuple(copies),
            host=tuple(host),
            offload=True,
            prefetch_event=prefetch,
            prefetch_module=calls[trigger].module_name if prefetch >= 0 else "",
        )

    def span(
        self, first: int, last: int, name: str, rule: PolicyRule | None = None
    ) -> CheckpointEffect:
        """The effect of checkpointing calls ``first..last`` (consecutive siblings) as one
        unit: a module call (``first == last``) or a ``checkpoint_sequential`` segment.
        With ``rule`` (one call only), under that selective policy: the outputs of the ops
        it saves are kept from the forward to the recomputation, which skips those ops."""
        timeline, storages, calls = self.timeline, self.timeline.storages, self.timeline.calls
        output_sets = self.output_sets
        members = {
            index
            for index in range(first, last + 1)
            if index == first or calls[index].parent_call == calls[first].parent_call
        }
        start, end = calls[first].forward_start_event, calls[last].forward_end_event
        inside = range(first, _subtree_end(timeline, last))
        outputs = output_sets[last]

        made_inside = self.made_between(start, end)  # during the span's forward
        keep: set[int] = set()
        if rule is not None:
            positions = kept_storages([storages[index] for index in made_inside], rule)
            keep = {made_inside[position] for position in positions}

        # The recomputation stops once it has made the last tensor saved inside the span
        # (torch.utils.checkpoint's early stop): no later op runs again, and a policy's
        # cached output of a later op is never taken back.
        last_pack = max((self.last_pack.get(sub, -1) for sub in inside), default=-1)

        # The forward's own transient peak, up to that stop: replay its allocations and
        # frees (frees after the forward ended do not count inside it). A plan snapshots
        # the buffers the span changes (BatchNorm statistics) while it recomputes, to
        # restore them after.
        changes: list[tuple[int, int]] = []
        for index in made_inside:
            record = storages[index]
            if index in keep:
                # Handed back from the cache (alive already), not made again; one that
                # the forward used up dies in the recomputation where it died before.
                if record.free_event < end:
                    changes.append((record.free_event, -record.size_bytes))
                continue
            changes.append((record.alloc_event, record.size_bytes))
            if record.free_event < end:
                changes.append((record.free_event, -record.size_bytes))
        changes.sort()
        level = recompute_peak = sum(calls[index].mutated_buffer_bytes for index in members)
        for event, change in changes:
            if event > last_pack >= 0:
                break
            level += change
            recompute_peak = max(recompute_peak, level)

        saved: set[int] = set()
        unpacks: list[int] = []
        for sub in inside:
            saved.update(calls[sub].saved_storages)
            if calls[sub].first_unpack_event >= 0:
                unpacks.append(calls[sub].first_unpack_event)
                unpacks.append(calls[sub].last_unpack_event)
        saved = {index for index in saved if storages[index].kind not in STATIC_KINDS}
        recompute_event = min(unpacks) if unpacks else -1
        release_event = max(unpacks) if unpacks else -1
        # storage saved inside the span -> when autograd lets go of its last save there
        held: dict[int, int] = {}
        for index in saved:
            for call, last in self.saves.get(index, ()):
                if first <= call < inside.stop and last >= 0:
                    held[index] = max(held.get(index, -1), self.released(index, call))
        if release_event >= 0:
            # The checkpoint lets go of its inputs when autograd lets go of the last tensor
            # saved inside the span (each saved tensor's hooks hold the checkpoint): once
            # the node that read it last has run, its own results made on top of them.
            release_event = max([release_event, *held.values()])

        retained = []
        released_outputs = []
        dropped = []
        if recompute_event >= 0:
            for index in made_inside:
                record = storages[index]
                if (
                    index not in saved
                    or index in outputs
                    or index in keep
                    or record.free_event <= end
                ):
                    continue
                # Dropped when the innermost call that made it returns without it; one
                # handed from member to member lives until the span returns.
                owner = record.alloc_call
                while owner not in members and owner >= 0 and index in output_sets[owner]:
                    owner = calls[owner].parent_call
                drop = (
                    end
                    if owner < 0 or (owner in members and index in output_sets[owner])
                    else calls[owner].forward_end_event
                )
                if record.leaf_cast:
                    # Autocast's cache holds a parameter's cast until it is cleared.
                    drop = max(drop, self.cache_cleared_after(record.alloc_event))
                    if drop >= record.free_event:
                        continue
                if record.free_event <= recompute_event:
                    # Saved for a result discarded before the backward: unplanned, its
                    # graph held it until then; checkpointed, nothing does (drop <= end,
                    # and a cast held past its free was skipped above).
                    dropped.append((index, record.size_bytes, drop, record.free_event))
                    continue
                retained.append((index, record.size_bytes, drop))

            for index in outputs:
                record = storages[index]
                if (
                    index not in saved
                    or index in keep
                    or not start < record.alloc_event < end
                    or record.free_event <= recompute_event
                ):
                    continue
                # The caller's locals hold it until the caller returns without it...
                holder = calls[first].parent_call
                while holder >= 0 and index in output_sets[holder]:
                    holder = calls[holder].parent_call
                drop = calls[holder].forward_end_event if holder >= 0 else self.forward_end
                # ...and tensors saved outside the span hold it until backward reads them.
                for saving_call, last_unpack in self.saves.get(index, ()):
                    if saving_call not in inside:
                        drop = max(drop, last_unpack)
                if drop < recompute_event:
                    released_outputs.append((index, record.size_bytes, drop))

        recast = []
        if recompute_event >= 0:
            made = set(made_inside)
            for index in sorted(saved - made):
                if storages[index].leaf_cast and index in held:
                    size = storages[index].size_bytes
                    recast.append((index, size, recompute_event, held[index]))

        inputs = tuple(
            index
            for index in calls[first].input_storages
            if storages[index].kind not in STATIC_KINDS
        )
        return CheckpointEffect(
            recast=tuple(recast),
            subtree=(first, inside.stop),
            call_index=first,
            module_name=name,
            retained=tuple(retained),
            released_outputs=tuple(released_outputs),
            recompute_event=recompute_event,
            release_event=release_event,
            input_storages=inputs,
            recompute_peak_bytes=recompute_peak,
            saved_bytes=sum(storages[index].size_bytes for index in saved),
            dropped=tuple(dropped),
            kept=tuple(
                (
                    index,
                    storages[index].size_bytes,
                    recompute_event
                    if storages[index].alloc_event < last_pack
                    else max(recompute_event, release_event),
                )
                for index in sorted(keep)
                if recompute_event >= 0 and storages[index].kind not in STATIC_KINDS
            ),
        )


def _call_effects(builder: _EffectBuilder) -> tuple[CheckpointEffect, ...]:
    return tuple(
        builder.span(index, index, call.module_name)
        for index, call in enumerate(builder.timeline.calls)
    )


def checkpoint_effects(timeline: MemoryTimeline) -> tuple[CheckpointEffect, ...]:
    """Derive, for every module call in the timeline, what checkpointing it would change."""
    return _call_effects(_EffectBuilder(timeline))


def sequential_segments(child_count: int, segments: int) -> list[tuple[int, int]]:
    """The child ranges ``(first, last)`` that ``torch.utils.checkpoint.checkpoint_sequential``
    checkpoints: ``segments - 1`` runs of ``child_count // segments`` children; the last
    segment (the rest) runs without checkpointing."""
    size = child_count // segments
    if size < 1:
        return []
    return [(start, start + size - 1) for start in range(0, size * (segments - 1), size)]


class MemoryModel:
    """Replays a measured timeline with a set of modules checkpointed.

    Build once per profile (``O(events)``), then call :meth:`peak_bytes` per plan.
    """

    def __init__(
        self,
        timeline: MemoryTimeline,
        nested: Mapping[str, tuple[str, ...]] | None = None,
        *,
        offload_min_bytes: int = OFFLOAD_MIN_BYTES,
        offload_lookahead: int = 1,
        pinned_host: bool = False,
    ) -> None:
        if offload_lookahead < 0:
            raise ValueError(f"offload_lookahead must be 0 or more, not {offload_lookahead}")
        self.timeline = timeline
        # Host copies in pinned blocks of CUDA's caching host allocator (a CUDA step): each
        # counted as the power of two it takes (point 7).
        self.pinned_host = pinned_host
        # The smallest saved storage an offloaded module sends to the host.
        self.offload_min_bytes = offload_min_bytes
        # How many sibling modules early an offloaded module's tensors start back (point 8).
        self.offload_lookahead = offload_lookahead
        # module -> the child modules its "name@nested" unit checkpoints inside it.
        self.nested_inner: dict[str, tuple[str, ...]] = dict(nested or {})
        self._builder = _EffectBuilder(timeline)
        self.effects = _call_effects(self._builder)
        self._unit_effects: dict[Unit, tuple[CheckpointEffect, ...]] = {}
        self._policy_rules: dict[str, dict[str, PolicyRule]] = {}
        self._op_events = [op.event for op in timeline.op_costs]
        self._calls_by_module: dict[str, list[int]] = {}
        for index, call in enumerate(timeline.calls):
            self._calls_by_module.setdefault(call.module_name, []).append(index)
        # delta[k + 1] is the change in live bytes at event k; delta[0] the bytes live at start.
        size = timeline.event_count + 2
        self._base_delta = np.zeros(size, dtype=np.int64)
        for record in timeline.storages:
            self._base_delta[record.alloc_event + 1] += record.size_bytes
            self._base_delta[record.free_event + 1] -= record.size_bytes

    @classmethod
    def for_profile(cls, profile: Profile) -> MemoryModel:
        """The model of a profile's timeline, with the profile's nesting options; a CUDA
        profile's host copies counted in pinned blocks."""
        pinned = device_type(profile.device) == "cuda"
        return cls(profile.timeline, pinned_host=pinned).include_nesting(profile)

    def include_nesting(self, profile: Profile) -> MemoryModel:
        """Learn the profile's nesting options (which children each ``name@nested`` unit
        checkpoints inside it); the profile must be of this model's timeline."""
        for record in profile.modules:
            for option in record.options:
                if option.option == NESTED:
                    self.nested_inner[record.module_name] = option.inner_modules
        return self

    def module_names(self) -> list[str]:
        return list(self._calls_by_module)

    def calls_of(self, module_name: str) -> list[int]:
        return self._calls_by_module.get(module_name, [])

    def child_calls(self, call_index: int) -> list[int]:
        """The direct child calls of a call, in the order they ran."""
        return [
            index
            for index in range(call_index + 1, _subtree_end(self.timeline, call_index))
            if self.timeline.calls[index].parent_call == call_index
        ]

    def policy_rules(self, module_name: str) -> dict[str, PolicyRule]:
        """The selective policies that make sense for a module, by name, with their op
        lists (:func:`planner.plan.policies.policy_rules`, over all its calls)."""
        rules = self._policy_rules.get(module_name)
        if rules is None:
            storages = self.timeline.storages
            made = [
                storages[index]
                for call_index in self.calls_of(module_name)
                for index in self._builder.made_inside(call_index)
            ]
            rules = {str(rule.policy): rule for rule in policy_rules(made)}
            self._policy_rules[module_name] = rules
        return rules

    def largest_allocation(self, module_name: str) -> int:
        """The most bytes one op allocates in the module's forward (any call): how far past
        a limit one op can take live memory before a watcher sees it."""
        storages = self.timeline.storages
        by_op: dict[int, int] = defaultdict(int)
        for call_index in self.calls_of(module_name):
            for index in self._builder.made_inside(call_index):
                by_op[storages[index].alloc_event] += storages[index].size_bytes
        return max(by_op.values(), default=0)

    def recomputed_ops(self, unit: Unit) -> list[OpCost]:
        """The ops a module unit's recomputation runs, all its calls: every op of its
        forward, less, under a selective policy, the calls whose outputs the policy saves
        (counted as :func:`~planner.plan.policies.kept_storages` counts them)."""
        if unit.segments is not None:
            raise ValueError(f"recomputed_ops takes a module or an option unit, not {unit}")
        rule = None if unit.option is None else self.policy_rules(unit.module)[unit.option]
        ops = self.timeline.op_costs
        recomputed: list[OpCost] = []
        for call_index in self.calls_of(unit.module):
            call = self.timeline.calls[call_index]
            low = bisect.bisect_right(self._op_events, call.forward_start_event)
            high = bisect.bisect_left(self._op_events, call.forward_end_event)
            forward = ops[low:high]
            if rule is None:
                recomputed.extend(forward)
                continue
            saved = rule.saved_flags(op.op for op in forward)
            recomputed.extend(op for op, kept in zip(forward, saved, strict=True) if not kept)
        return recomputed

    def module_options(self, module_name: str, forward_ms: float) -> tuple[OptionCost, ...]:
        """A candidate's selective options that free something, each with the FLOPs its
        recomputation runs and a first time estimate, ``forward_ms`` (no cheaper than the
        whole module until measured or roofline times replace it: the ops a policy skips
        are not all of the time, and its dispatch costs some)."""
        options = []
        for option in self.policy_rules(module_name):
            unit = Unit(module_name, option=option)
            if sum(effect.retained_bytes for effect in self.unit_effects(unit)) <= 0:
                continue
            flops = sum(op.flops for op in self.recomputed_ops(unit))
            options.append(
                OptionCost(option, forward_ms, flops, freed_bytes=self.freed_bytes(unit))
            )
        return tuple(options)

    def freed_bytes(self, unit: Unit) -> int:
        """What a unit frees between its forward and its recomputation, all calls: the
        storages it drops, less those a selective policy keeps past their own end."""
        storages = self.timeline.storages
        freed = 0
        for effect in self.unit_effects(unit):
            freed += effect.retained_bytes
            freed -= sum(
                size for index, size, until in effect.kept if storages[index].free_event < until
            )
        return freed

    def unit_effects(self, unit: Unit) -> tuple[CheckpointEffect, ...]:
        """The effects of one plan unit: a module (all its calls), ``checkpoint_sequential``
        over a module's children in ``segments`` segments, or a module under an option (a
        selective policy, or nesting)."""
        cached = self._unit_effects.get(unit)
        if cached is not None:
            return cached
        name, segments, option = unit.module, unit.segments, unit.option
        if option in OFFLOAD_OPTIONS:
            calls = self.calls_of(name)
            lookahead = self.offload_lookahead if option == OFFLOAD else 0
            triggers = [self._builder.prefetch_trigger(index, lookahead) for index in calls]
            modules = {
                self.timeline.calls[trigger].module_name for trigger in triggers if trigger >= 0
            }
            if len(modules) != 1 or min(triggers) < 0:
                triggers = [-1] * len(calls)  # no one trigger module for every call
            effects = tuple(
                self._builder.offload(index, name, self.offload_min_bytes, trigger)
                for index, trigger in zip(calls, triggers, strict=True)
            )
        elif option == NESTED:
            inner_names = set(self.nested_inner.get(name, ()))
            if not inner_names:
                raise KeyError(f"{name} has no nested checkpointing option")
            effects = tuple(
                effect
                for index in self.calls_of(name)
                for effect in self._builder.nested(
                    index,
                    [
                        child
                        for child in self.child_calls(index)
                        if self.timeline.calls[child].module_name in inner_names
                    ],
                    name,
                )
            )
        elif option is not None:
            rule = self.policy_rules(name).get(option)
            if rule is None:
                raise KeyError(f"{name} has no selective checkpointing option {option!r}")
            effects = tuple(
                self._builder.span(index, index, name, rule) for index in self.calls_of(name)
            )
        elif segments is None:
            effects = tuple(self.effects[index] for index in self.calls_of(name))
        else:
            spans = []
            for call_index in self.calls_of(name):
                children = self.child_calls(call_index)
                for first, last in sequential_segments(len(children), segments):
                    spans.append(self._builder.span(children[first], children[last], name))
            effects = tuple(spans)
        self._unit_effects[unit] = effects
        return effects

    def _delta_and_spikes(
        self, wrapped: Iterable[Unit]
    ) -> tuple[np.ndarray, list[tuple[int, int]]]:
        storages = self.timeline.storages
        delta = self._base_delta.copy()
        spikes: list[tuple[int, int]] = []
        # storage -> [(end of a life, start of the next at a recomputation)]: one gap, or
        # under nesting two (dropped by the outer checkpoint, then by an inner one).
        gaps: dict[int, list[tuple[int, int]]] = {}
        kept_until: dict[int, int] = {}
        covered: list[tuple[int, int]] = []  # subtrees whose saves the checkpoints drop
        casts: set[int] = set()  # parameter casts saved inside a checkpointed call
        for unit in wrapped:
            for effect in self.unit_effects(unit):
                if effect.recompute_event < 0:
                    continue
                if not effect.offload:
                    covered.append(effect.subtree)
                    casts.update(index for index, _, _ in effect.retained)
                casts.update(index for index, _, _, _ in effect.recast)
                for index, _size, drop_event in effect.retained + effect.released_outputs:
                    gaps.setdefault(index, []).append((drop_event, effect.recompute_event))
                for index, _size, drop_event, free_event in effect.dropped:
                    gaps.setdefault(index, []).append((drop_event, free_event))
                if not effect.offload:
                    spikes.append((effect.recompute_event, effect.recompute_peak_bytes))
                for index in effect.input_storages:
                    kept_until[index] = max(kept_until.get(index, -1), effect.release_event)
                for index, _size, until in effect.kept:
                    kept_until[index] = max(kept_until.get(index, -1), until)
                for _index, size, start, until in effect.revived + effect.recast:
                    delta[start + 1] += size
                    delta[until + 1] -= size
        for index in casts:
            record = storages[index]
            if not record.leaf_cast:
                continue
            # Saved by calls outside the plan's checkpoints too: held until those let go
            # (point 9); saved by none of them: dead at the cache's clear.
            needed = [
                self._builder.released(index, call)
                for call, last in self._builder.saves.get(index, ())
                if last >= 0 and not any(lo <= call < hi for lo, hi in covered)
            ]
            if needed:
                kept_until[index] = max(kept_until.get(index, -1), max(needed))
            if index not in gaps:
                drop = max(
                    self._builder.cache_cleared_after(record.alloc_event),
                    kept_until.get(index, -1),
                )
                if drop < record.free_event:
                    gaps[index] = [(drop, record.free_event)]
        for index in gaps.keys() | kept_until.keys():
            record = storages[index]
            held_until = kept_until.get(index, -1)
            if index in gaps:
                # Another checkpoint that holds it delays each drop; under nesting the outer
                # and an inner effect may name the same gap: dead is dead once.
                intervals = sorted(
                    (max(drop_event, held_until), recompute_event)
                    for drop_event, recompute_event in gaps[index]
                )
                dead_until = -1
                for drop_event, recompute_event in intervals:
                    drop_event = max(drop_event, dead_until)
                    if drop_event < recompute_event:
                        delta[drop_event + 1] -= record.size_bytes
                        delta[recompute_event + 1] += record.size_bytes
                        dead_until = recompute_event
            elif held_until > record.free_event:
                delta[record.free_event + 1] += record.size_bytes
                delta[held_until + 1] -= record.size_bytes
        return delta, spikes

    def memory_curve(self, wrapped: Iterable[Unit] = ()) -> np.ndarray:
        """Live bytes after each event (index ``k + 1`` is after event ``k``; 0 is the start).

        The entry for the end of the step (where storages still live are released from
        the books, not freed) is left out. Recompute spikes are not on this curve; see
        :meth:`recompute_spikes`.
        """
        delta, _ = self._delta_and_spikes(wrapped)
        return np.cumsum(delta)[:-1]

    def recompute_spikes(self, wrapped: Iterable[Unit] = ()) -> list[tuple[int, int]]:
        """``(event, peak_bytes)`` of each recomputation: live bytes at its transient peak."""
        delta, spikes = self._delta_and_spikes(wrapped)
        curve = np.cumsum(delta)
        return [(event, int(curve[event]) + extra) for event, extra in spikes]

    def host_bytes(self, unit: Unit) -> int:
        """What an offloaded unit holds in host memory, all calls, as the host's allocator
        takes it (point 7; 0 for other units)."""
        if unit.option not in OFFLOAD_OPTIONS:
            return 0
        return sum(
            self._host_allocated(size)
            for effect in self.unit_effects(unit)
            for _index, size, _start, _until in effect.host
        )

    def _host_allocated(self, size_bytes: int) -> int:
        return pinned_host_bytes(size_bytes) if self.pinned_host else size_bytes

    def prefetch_module(self, unit: Unit) -> str | None:
        """The module at whose backward an offloaded unit's tensors start back (point 8 of
        the module notes), or None: at the unit's own backward."""
        if unit.option not in OFFLOAD_OPTIONS:
            return None
        modules = {e.prefetch_module for e in self.unit_effects(unit) if e.prefetch_module}
        return modules.pop() if len(modules) == 1 else None

    def host_curve(self, wrapped: Iterable[Unit] = ()) -> np.ndarray:
        """Host bytes offloaded saved tensors hold after each event (indexed as
        :meth:`memory_curve`)."""
        delta = np.zeros(self.timeline.event_count + 2, dtype=np.int64)
        for unit in wrapped:
            if unit.option not in OFFLOAD_OPTIONS:
                continue
            for effect in self.unit_effects(unit):
                for _index, size, start, until in effect.host:
                    held = self._host_allocated(size)
                    delta[start + 1] += held
                    delta[until + 1] -= held
        return np.cumsum(delta)[:-1]

    def host_peak_bytes(self, wrapped: Iterable[Unit] = ()) -> int:
        """The most host memory the ``wrapped`` units' offloaded tensors hold at once."""
        return int(self.host_curve(wrapped).max(initial=0))

    def peak_bytes(self, wrapped: Iterable[Unit] = ()) -> int:
        """Predicted peak of the step with the ``wrapped`` units checkpointed."""
        delta, spikes = self._delta_and_spikes(wrapped)
        curve = np.cumsum(delta)
        peak = int(curve.max())
        for event, spike_bytes in spikes:
            # curve[event] is the level just before the recompute at ``event``.
            peak = max(peak, int(curve[event]) + spike_bytes)
        return peak
