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
   recomputation, so an input storage that would have died earlier lives until the last
   unpack of a tensor saved inside ``c`` (``release_event``).
4. **Outputs that ``c`` saved itself die with their last outside use.** An output of ``c``
   that an op inside ``c`` saved (a final ReLU saves its result) lives, unplanned, until
   ``c``'s backward. Under checkpoint only its consumers hold it: it dies at the last
   backward read by a saved tensor outside ``c``, or when the caller's forward returns
   without it, whichever is later; recomputation makes it again (``released_outputs``).

Everything else (parameters, gradients, optimizer state, the loss, the optimizer step's
temporaries) is replayed exactly as measured. The peak of a plan is the maximum over the
replayed timeline and over the recompute spikes. With no module wrapped the model returns
the measured peak exactly (a test checks this).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from planner.records import STATIC_KINDS, MemoryTimeline

__all__ = ["CheckpointEffect", "MemoryModel", "checkpoint_effects"]


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


def checkpoint_effects(timeline: MemoryTimeline) -> tuple[CheckpointEffect, ...]:
    """Derive, for every module call in the timeline, what checkpointing it would change."""
    storages = timeline.storages
    calls = timeline.calls
    by_alloc = sorted(range(len(storages)), key=lambda index: storages[index].alloc_event)
    alloc_events = [storages[index].alloc_event for index in by_alloc]
    output_sets = [frozenset(call.output_storages) for call in calls]
    # storage -> [(call that saved it, last backward read)], for outside uses of outputs.
    saves: dict[int, list[tuple[int, int]]] = {}
    for saved_tensor in timeline.saved_tensors:
        saves.setdefault(saved_tensor.storage, []).append(
            (saved_tensor.call, saved_tensor.last_unpack_event)
        )
    forward_end = timeline.phase_end_events.get("forward", timeline.event_count - 1)
    effects = []
    for call_index, call in enumerate(calls):
        start, end = call.forward_start_event, call.forward_end_event
        subtree = range(call_index, _subtree_end(timeline, call_index))

        # Storages made during this call's forward, in allocation order.
        low = bisect.bisect_right(alloc_events, start)
        high = bisect.bisect_left(alloc_events, end)
        made_inside = by_alloc[low:high]

        # The forward's own transient peak: replay its allocations and frees (frees after
        # the forward ended do not count inside it).
        changes: list[tuple[int, int]] = []
        for index in made_inside:
            record = storages[index]
            changes.append((record.alloc_event, record.size_bytes))
            if record.free_event < end:
                changes.append((record.free_event, -record.size_bytes))
        changes.sort()
        # A plan snapshots the buffers this call changes (BatchNorm statistics) while it
        # recomputes, to restore them after: they are live for the whole recomputation.
        level = recompute_peak = call.mutated_buffer_bytes
        for _, change in changes:
            level += change
            recompute_peak = max(recompute_peak, level)

        saved: set[int] = set()
        unpacks: list[int] = []
        for sub in subtree:
            saved.update(calls[sub].saved_storages)
            if calls[sub].first_unpack_event >= 0:
                unpacks.append(calls[sub].first_unpack_event)
                unpacks.append(calls[sub].last_unpack_event)
        saved = {index for index in saved if storages[index].kind not in STATIC_KINDS}
        recompute_event = min(unpacks) if unpacks else -1
        release_event = max(unpacks) if unpacks else -1

        retained = []
        if recompute_event >= 0:
            for index in made_inside:
                record = storages[index]
                if (
                    index not in saved
                    or index in output_sets[call_index]
                    or record.free_event <= max(end, recompute_event)
                ):
                    continue
                # Dropped when the innermost call that made it returns without it.
                owner = record.alloc_call
                while owner != call_index and index in output_sets[owner]:
                    owner = calls[owner].parent_call
                retained.append((index, record.size_bytes, calls[owner].forward_end_event))

        released_outputs = []
        if recompute_event >= 0:
            inside = range(subtree.start, subtree.stop)
            for index in call.output_storages:
                record = storages[index]
                if (
                    index not in saved
                    or not start < record.alloc_event < end
                    or record.free_event <= recompute_event
                ):
                    continue
                # The caller's locals hold it until the caller returns without it...
                holder = call.parent_call
                while holder >= 0 and index in output_sets[holder]:
                    holder = calls[holder].parent_call
                drop = calls[holder].forward_end_event if holder >= 0 else forward_end
                # ...and tensors saved outside this call hold it until backward reads them.
                for saving_call, last_unpack in saves.get(index, ()):
                    if saving_call not in inside:
                        drop = max(drop, last_unpack)
                if drop < recompute_event:
                    released_outputs.append((index, record.size_bytes, drop))

        inputs = tuple(
            index for index in call.input_storages if storages[index].kind not in STATIC_KINDS
        )
        effects.append(
            CheckpointEffect(
                call_index=call_index,
                module_name=call.module_name,
                retained=tuple(retained),
                released_outputs=tuple(released_outputs),
                recompute_event=recompute_event,
                release_event=release_event,
                input_storages=inputs,
                recompute_peak_bytes=recompute_peak,
                saved_bytes=sum(storages[index].size_bytes for index in saved),
            )
        )
    return tuple(effects)


class MemoryModel:
    """Replays a measured timeline with a set of modules checkpointed.

    Build once per profile (``O(events)``), then call :meth:`peak_bytes` per plan.
    """

    def __init__(self, timeline: MemoryTimeline) -> None:
        self.timeline = timeline
        self.effects = checkpoint_effects(timeline)
        self._calls_by_module: dict[str, list[int]] = {}
        for index, call in enumerate(timeline.calls):
            self._calls_by_module.setdefault(call.module_name, []).append(index)
        # delta[k + 1] is the change in live bytes at event k; delta[0] the bytes live at start.
        size = timeline.event_count + 2
        self._base_delta = np.zeros(size, dtype=np.int64)
        for record in timeline.storages:
            self._base_delta[record.alloc_event + 1] += record.size_bytes
            self._base_delta[record.free_event + 1] -= record.size_bytes

    def module_names(self) -> list[str]:
        return list(self._calls_by_module)

    def calls_of(self, module_name: str) -> list[int]:
        return self._calls_by_module.get(module_name, [])

    def _delta_and_spikes(self, wrapped: Iterable[str]) -> tuple[np.ndarray, list[tuple[int, int]]]:
        storages = self.timeline.storages
        delta = self._base_delta.copy()
        spikes: list[tuple[int, int]] = []
        # storage -> (end of its first life, start of its second life at a recomputation)
        gaps: dict[int, tuple[int, int]] = {}
        kept_until: dict[int, int] = {}
        for module_name in wrapped:
            for call_index in self._calls_by_module.get(module_name, ()):
                effect = self.effects[call_index]
                if effect.recompute_event < 0:
                    continue
                for index, _size, drop_event in effect.retained + effect.released_outputs:
                    gaps[index] = (drop_event, effect.recompute_event)
                spikes.append((effect.recompute_event, effect.recompute_peak_bytes))
                for index in effect.input_storages:
                    kept_until[index] = max(kept_until.get(index, -1), effect.release_event)
        for index in gaps.keys() | kept_until.keys():
            record = storages[index]
            held_until = kept_until.get(index, -1)
            if index in gaps:
                drop_event, recompute_event = gaps[index]
                drop_event = max(drop_event, held_until)  # another checkpoint holds it
                if drop_event < recompute_event:
                    delta[drop_event + 1] -= record.size_bytes
                    delta[recompute_event + 1] += record.size_bytes
            elif held_until > record.free_event:
                delta[record.free_event + 1] += record.size_bytes
                delta[held_until + 1] -= record.size_bytes
        return delta, spikes

    def memory_curve(self, wrapped: Iterable[str] = ()) -> np.ndarray:
        """Live bytes after each event (index ``k + 1`` is after event ``k``; 0 is the start).

        The entry for the end of the step (where storages still live are released from
        the books, not freed) is left out. Recompute spikes are not on this curve; see
        :meth:`recompute_spikes`.
        """
        delta, _ = self._delta_and_spikes(wrapped)
        return np.cumsum(delta)[:-1]

    def recompute_spikes(self, wrapped: Iterable[str] = ()) -> list[tuple[int, int]]:
        """``(event, peak_bytes)`` of each recomputation: live bytes at its transient peak."""
        delta, spikes = self._delta_and_spikes(wrapped)
        curve = np.cumsum(delta)
        return [(event, int(curve[event]) + extra) for event, extra in spikes]

    def peak_bytes(self, wrapped: Iterable[str] = ()) -> int:
        """Predicted peak of the step with the named modules checkpointed."""
        delta, spikes = self._delta_and_spikes(wrapped)
        curve = np.cumsum(delta)
        peak = int(curve.max())
        for event, spike_bytes in spikes:
            # curve[event] is the level just before the recompute at ``event``.
            peak = max(peak, int(curve[event]) + spike_bytes)
        return peak
