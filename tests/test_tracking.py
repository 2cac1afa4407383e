"""The live-storage tracker: what it counts is what the budget means on CPU."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from planner.apply.tensors import iter_tensors
from planner.core.errors import ProfilingError
from planner.core.records import StorageKind
from planner.measure.tracking import (
    AllocatorPeakTracker,
    PeakMemoryTracker,
    StorageWatcher,
)


def test_views_share_one_storage_and_frees_are_seen() -> None:
    watcher = StorageWatcher("cpu")
    with watcher:
        base = torch.ones(1000)  # 4000 bytes
        view = base[10:20]
        reshaped = base.view(10, 100)
        assert watcher.current_bytes == 4000
        other = base * 2  # a new 4000-byte storage
        assert watcher.current_bytes == 8000
        del other
        assert watcher.current_bytes == 4000
    assert watcher.peak_bytes == 8000
    del view, reshaped, base


def test_in_place_ops_allocate_nothing_new() -> None:
    watcher = StorageWatcher("cpu")
    with watcher:
        x = torch.zeros(256)
        x.add_(1).mul_(3)
    assert watcher.peak_bytes == 256 * 4


def test_peak_tracker_counts_existing_tensors_and_backward() -> None:
    weight = torch.randn(100, 100, requires_grad=True)  # 40000 bytes, live before
    with PeakMemoryTracker("cpu", {"parameter": [weight]}) as tracker:
        hidden = (torch.ones(50, 100) @ weight).relu()  # 20000 bytes, saved by relu
        hidden.sum().backward()  # weight.grad: 40000 bytes
        del hidden
    assert tracker.start_bytes == 40000
    # weight + input ones (20000) + hidden + grad at least; each counted once.
    assert tracker.peak_bytes >= 40000 + 20000 + 20000 + 40000
    assert tracker.peak_bytes < 40000 + 6 * 20000 + 40000


def _hidden_step(weight: torch.Tensor, *, checkpointed: bool, preserve_rng_state: bool) -> None:
    def hidden(x: torch.Tensor) -> torch.Tensor:
        return (x @ weight).relu()

    x = torch.ones(50, 100)
    out = (
        checkpoint(hidden, x, use_reentrant=False, preserve_rng_state=preserve_rng_state)
        if checkpointed
        else hidden(x)
    )
    out.sum().backward()


@pytest.mark.parametrize(
    ("checkpointed", "preserve_rng_state", "stash_bytes"),
    [(False, False, 0), (True, False, 0), (True, True, 5056)],
)
def test_allocator_tracker_agrees_with_the_storage_tracker_but_sees_the_rng_stash(
    checkpointed: bool, preserve_rng_state: bool, stash_bytes: int
) -> None:
    """The allocator's accounting equals live storages, except what the dispatcher does not
    see: the CPU RNG state checkpoint stashes (``torch.get_rng_state()``, 5,056 bytes)."""
    weight = torch.randn(100, 100, requires_grad=True)
    peaks = []
    for tracker_type in (PeakMemoryTracker, AllocatorPeakTracker):
        weight.grad = None
        existing = {"parameter": [weight]}
        tracker = (
            PeakMemoryTracker("cpu", existing)
            if tracker_type is PeakMemoryTracker
            else AllocatorPeakTracker(existing)
        )
        with tracker:
            _hidden_step(weight, checkpointed=checkpointed, preserve_rng_state=preserve_rng_state)
        assert tracker.start_bytes == 40000
        peaks.append(tracker.peak_bytes)
    assert peaks[0] >= 40000 + 20000 + 20000 + 40000
    assert peaks[1] == peaks[0] + stash_bytes


def test_allocator_tracker_refuses_a_region_that_frees_what_it_started_with() -> None:
    gradient = torch.ones(1000)
    holder = {"gradient": gradient}
    tracker = AllocatorPeakTracker({"gradient": [gradient]})
    with pytest.raises(ProfilingError, match="release them before the region"), tracker:
        del gradient
        holder.clear()  # the last reference: freed inside the region


def test_iter_tensors_walks_containers_and_plain_objects() -> None:
    class Cache:
        def __init__(self) -> None:
            self.keys = [torch.zeros(1), torch.zeros(2)]

    a = torch.zeros(3)
    found = list(iter_tensors({"a": a, "cache": Cache(), "again": (a, "text", 3)}))
    assert [t.numel() for t in found] == [3, 1, 2]


def test_allocator_tracker_does_not_subtract_a_free_of_an_earlier_regions_memory() -> None:
    """The allocator reports the free of a block allocated in an earlier profiled region, with
    its size; counted, it would pull the running total below what the region holds."""
    with AllocatorPeakTracker():
        kept = torch.ones(1000)  # 4000 bytes, allocated in the first region
    with AllocatorPeakTracker() as second:
        del kept  # freed in the second region
        made = torch.ones(1000)
    assert second.peak_bytes == 4000
    del made


def test_peak_tracker_ignores_views_of_data_the_caller_holds() -> None:
    """A view of a tensor made before the region is counted once the region's ops return it
    (its storage becomes known), unless the caller asked to ignore it."""
    data = torch.ones(1000)  # 4000 bytes, made before the region
    peaks = []
    for ignore in ((), (data,)):
        with PeakMemoryTracker("cpu", ignore=ignore) as tracker:
            row = data[:10] * 2  # indexing returns a view of data's storage; * 2: 40 bytes
        peaks.append(tracker.peak_bytes)
        del row
    assert peaks == [4040, 40]


def test_a_storage_resized_to_nothing_is_freed_and_resized_back_is_made_again() -> None:
    """FSDP2 frees a gathered parameter with ``storage.resize_(0)`` and gathers it again by
    resizing back, with no op the dispatcher sees: the watcher counts both."""
    tensor = torch.ones(1024)  # 4096 bytes
    original_resize = torch.UntypedStorage.resize_
    watcher = StorageWatcher("cpu")
    watcher.add_existing({StorageKind.ACTIVATION: [tensor]})
    with watcher:
        tensor.untyped_storage().resize_(0)
        assert watcher.current_bytes == 0
        tensor.untyped_storage().resize_(8192)
        assert watcher.current_bytes == 8192
        tensor.untyped_storage().resize_(0)
    assert watcher.current_bytes == 0
    assert watcher.peak_bytes == 8192
    assert torch.UntypedStorage.resize_ is original_resize  # put back on exit
    del tensor
    assert watcher.current_bytes == 0  # its death after the resize is not a second free


def test_a_dtensor_counts_its_local_shard() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from planner.core.parallel import ParallelLayout
    from planner.measure.distributed import simulated_ranks

    with simulated_ranks(ParallelLayout(4, "fsdp2")):  # type: ignore[arg-type]
        mesh = init_device_mesh("cpu", (4,))
        shard = distribute_tensor(torch.ones(8, 16), mesh, [Shard(0)])  # (2, 16) per rank
        watcher = StorageWatcher("cpu")
        watcher.add_existing({StorageKind.PARAMETER: [shard]})
        assert watcher.current_bytes == 2 * 16 * 4
        with watcher:
            doubled = shard * 2  # a DTensor op: its local op makes one (2, 16) storage
        assert watcher.peak_bytes == 2 * 2 * 16 * 4
        del doubled


def _held_by_a_thread(tensor: torch.Tensor) -> tuple[threading.Thread, threading.Event]:
    """A thread that holds ``tensor`` until the returned event is set, then drops it (as a
    ``gloo`` worker drops a collective's tensors once it runs again)."""
    held = [tensor]
    release = threading.Event()

    def hold() -> None:
        release.wait()
        held.clear()  # the storage dies here, on this thread

    thread = threading.Thread(target=hold)
    thread.start()
    return thread, release


@pytest.mark.parametrize("released_before_the_peak", [False, True])
def test_a_peak_that_counts_a_storage_another_thread_held_is_flagged(
    released_before_the_peak: bool,
) -> None:
    """The region lets go of a buffer; another thread drops it later. Counted at the peak,
    it makes the peak the scheduler's (PeakMemoryTracker.peak_held_by_other_threads); freed
    by that thread before the peak, it does not."""
    with PeakMemoryTracker("cpu") as tracker:
        buffer = torch.ones(1000)  # 4000 bytes
        thread, release = _held_by_a_thread(buffer)
        del buffer  # the region's last reference: the thread still holds it
        if released_before_the_peak:
            release.set()
            thread.join()
        later = torch.ones(2000)  # 8000 bytes: the peak, with the buffer if still held
        release.set()
        thread.join()
        del later
    assert tracker.peak_bytes == (8000 if released_before_the_peak else 12000)
    assert tracker.peak_held_by_other_threads is not released_before_the_peak


def test_a_storage_the_region_itself_frees_after_the_peak_is_not_flagged() -> None:
    with PeakMemoryTracker("cpu") as tracker:
        buffer = torch.ones(1000)
        later = torch.ones(500)
        del buffer, later
    assert tracker.peak_bytes == 6000
    assert not tracker.peak_held_by_other_threads
