"""Memory tracking: live tensor storages on CPU, the caching allocator's counters on CUDA.

The budget (docs/architecture.md, "Budget meaning") is the peak memory of one training step.
On CUDA that is what ``torch.cuda.max_memory_allocated()`` reports. On CPU there is no such
counter, so we track it the same way: the bytes held by live tensor storages, each storage
counted once however many tensors view it. A
:class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every tensor an op makes
(forward, backward, recomputation and the optimizer step all run ops through it) and a weak
reference on each new storage tells us when it is freed.

:class:`StorageWatcher` is the mechanism; :class:`PeakMemoryTracker` is the small interface
used to *measure* a step (independently of the profiler's own bookkeeping), with the same
methods on both devices. :class:`AllocatorPeakTracker` measures a CPU region from the other
side, the allocator's own accounting, for what the dispatcher does not see
(``torch.compile``'s kernels).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from planner.apply.offload import HOST_MEMORY, making_host_copies
from planner.apply.tensors import iter_tensors
from planner.core.errors import ProfilingError
from planner.core.records import StorageKind
from planner.core.units import format_bytes
from planner.dispatch import DispatchWatcher

__all__ = [
    "CUDA_BLOCK_BYTES",
    "AllocatorPeakTracker",
    "MemoryLimitExceeded",
    "PeakMemoryTracker",
    "StorageWatcher",
    "allocated_bytes",
    "local_tensors",
    "returns_view",
    "workload_tensors",
    "writes_in_place",
    "written_arguments",
]

# CUDA's caching allocator hands out blocks in multiples of 512 bytes, and
# ``torch.cuda.max_memory_allocated()`` counts blocks, not requested bytes.
CUDA_BLOCK_BYTES = 512


def allocated_bytes(size_bytes: int, device_type: str) -> int:
    """What the device's allocator charges for a storage of ``size_bytes``: the size itself
    on CPU, rounded up to whole 512-byte blocks on CUDA (an empty storage costs nothing)."""
    if device_type == "cuda" and size_bytes:
        return -(-size_bytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
    return size_bytes


class MemoryLimitExceeded(ProfilingError):
    """Live tensor memory went over the limit a run was given (raised from inside the op
    that allocated past it, so the run stops before using more)."""

    def __init__(self, message: str, *, limit_bytes: int, reached_bytes: int) -> None:
        super().__init__(message)
        self.limit_bytes = limit_bytes
        self.reached_bytes = reached_bytes


_WRITE_POSITIONS: dict[Any, tuple[tuple[int, str], ...]] = {}
# Older batch-norm ops update running statistics in place without declaring it in their
# schema (``Tensor? running_mean``, no ``(a!)``); in training mode they write args 3 and 4.
_UNDECLARED_WRITES = {
    name: ((3, "running_mean"), (4, "running_var"))
    for name in ("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm")
}


def _write_positions(func: Any) -> tuple[tuple[int, str], ...]:
    """(position, name) of the arguments an op writes in place (cached per op)."""
    positions = _WRITE_POSITIONS.get(func)
    if positions is None:
        schema = getattr(func, "_schema", None)
        positions = tuple(
            (position, argument.name)
            for position, argument in enumerate(schema.arguments if schema else ())
            if argument.alias_info is not None and argument.alias_info.is_write
        )
        if schema is not None and schema.name.removeprefix("aten::") in _UNDECLARED_WRITES:
            positions += _UNDECLARED_WRITES[schema.name.removeprefix("aten::")]
        _WRITE_POSITIONS[func] = positions
    return positions


def writes_in_place(func: Any) -> bool:
    """Whether an op writes any of its arguments in place (see :func:`written_arguments`)."""
    return bool(_write_positions(func))


def written_arguments(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensor arguments an op writes in place: those its schema marks ``Tensor(a!)``,
    and the running statistics of the batch-norm ops that do not declare them."""
    written: list[torch.Tensor] = []
    for position, name in _write_positions(func):
        value = args[position] if position < len(args) else kwargs.get(name)
        written.extend(iter_tensors(value))
    return written


_VIEWS: dict[Any, bool] = {}


def returns_view(func: Any) -> bool:
    """Whether an op's outputs alias its inputs without writing them (a view, such as
    ``detach`` or ``transpose``: no values are computed, no data moves)."""
    view = _VIEWS.get(func)
    if view is None:
        returns = getattr(getattr(func, "_schema", None), "returns", ())
        view = _VIEWS[func] = any(
            r.alias_info is not None and not r.alias_info.is_write for r in returns
        )
    return view


def workload_tensors(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, batch: Any
) -> dict[StorageKind, list[torch.Tensor]]:
    """The tensors a training step starts with, by kind (parameters, gradients, ...). A
    module's ``DeviceMesh`` (a ``DistributedDataParallel`` built with ``device_mesh=``
    keeps it) is the process group's bookkeeping, its table of ranks made with the mesh
    whatever the model, not the step's: its tensor is not counted (a simulated DDP rank,
    which builds no DDP, would not see it)."""
    parameters: list[torch.Tensor] = list(model.parameters())
    state = [] if optimizer is None else list(iter_tensors(list(optimizer.state.values())))
    not_the_steps = (dict, torch.nn.Module, *_device_mesh_types())
    module_attributes = [
        tensor
        for module in model.modules()
        for value in vars(module).values()
        if not isinstance(value, not_the_steps)
        for tensor in iter_tensors(value)
    ]
    return {
        StorageKind.PARAMETER: parameters,
        StorageKind.GRADIENT: [p.grad for p in parameters if p.grad is not None],
        StorageKind.BUFFER: list(model.buffers()),
        StorageKind.OPTIMIZER_STATE: state,
        StorageKind.BATCH: list(iter_tensors(batch)),
        StorageKind.OTHER: module_attributes,
    }


def _device_mesh_types() -> tuple[type, ...]:
    """``DeviceMesh``, where torch has distributed support (else none)."""
    if not torch.distributed.is_available():
        return ()
    from torch.distributed.device_mesh import DeviceMesh

    return (DeviceMesh,)


def _has_inner_tensors(kind: type) -> bool:
    """Whether tensors of this class are wrappers whose memory is in tensors inside them
    (``DTensor``; fake tensors are not: they stand for their own storage)."""
    return hasattr(kind, "__tensor_flatten__")


def _is_wrapper(tensor: torch.Tensor) -> bool:
    return type(tensor) is not torch.Tensor and _has_inner_tensors(type(tensor))


def local_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding a wrapper subclass's memory (a ``DTensor``'s local shard),
    or ``[tensor]`` itself."""
    if not _is_wrapper(tensor):
        return [tensor]
    names, _ = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
    inner = [getattr(tensor, name) for name in names]
    tensors = [value for value in inner if isinstance(value, torch.Tensor)]
    return [local for value in tensors for local in local_tensors(value)]


class StorageWatcher(DispatchWatcher):
    """Counts the bytes of live tensor storages on one device type.

    Subclasses override :meth:`on_alloc`, :meth:`on_free` and :meth:`on_op` to record more.
    Storages that exist before the watcher starts are counted only if registered with
    :meth:`add_existing`. The device is the tensor's (a fake tensor's is the device it
    stands for). ``charge_as`` is the device type whose allocator rounding applies (see
    :func:`allocated_bytes`; default ``device_type``): a CUDA step emulated on CPU fake
    tensors is charged as CUDA. With ``limit_bytes``, an op that takes live memory past
    the limit raises :class:`MemoryLimitExceeded`. With ``real_only`` fake tensors (whose
    storage is on the meta device) are not counted: only memory actually allocated is.

    A storage can die on another thread than the one running the region: a ``gloo`` worker
    thread keeps each collective's tensors until it has finished its own bookkeeping after
    waking the caller, and when the ranks share cores that can take milliseconds, long
    after the step let go of them. :attr:`peak_held_by_other_threads` says whether the peak
    counted such a storage: then the peak depends on thread scheduling, and may be above
    the step's own.

    A higher-order operator (FlexAttention) runs below the watcher as one op: what it
    allocates is its outputs, as its fused kernel's are on the device.
    """

    def __init__(
        self,
        device_type: str = "cpu",
        *,
        charge_as: str | None = None,
        limit_bytes: int | None = None,
        real_only: bool = False,
    ) -> None:
        super().__init__()
        self.device_type = device_type
        self.charge_as = charge_as or device_type
        self.limit_bytes = limit_bytes
        self.real_only = real_only
        self.current_bytes = 0
        self.peak_bytes = 0
        self._index_by_storage_id: dict[int, int] = {}
        self._size_by_index: dict[int, int] = {}
        self._kind_by_index: dict[int, StorageKind] = {}
        self._metadata_depth = 0
        self._propagator: tuple[Any, Any] = (None, None)
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._next_index = 0
        self._closed = False
        self._ignored: set[int] = set()
        # Events (each alloc and free) are numbered, to say which storages the peak counted.
        self._event = 0
        self._peak_event = 0
        self._made_at_event: dict[int, int] = {}
        self._region_thread: int | None = None
        self._freed_elsewhere: list[tuple[int, int]] = []  # (made at, freed at) events

    # -- registration ------------------------------------------------------------------
    def storage_index(self, tensor: torch.Tensor) -> int | None:
        """Index of the live storage behind ``tensor``, or None if it is not tracked."""
        if _is_wrapper(tensor):
            inner = local_tensors(tensor)
            return self.storage_index(inner[0]) if inner else None
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None
        return self._index_by_storage_id.get(id(storage))

    def ignore(self, tensors: Iterable[torch.Tensor]) -> None:
        """Never count these tensors' storages (the caller keeps them alive)."""
        self._ignored.update(id(tensor.untyped_storage()) for tensor in tensors)

    def track(self, tensor: torch.Tensor, kind: StorageKind) -> int | None:
        """Start tracking the storage behind ``tensor`` (no-op if already tracked). A
        wrapper subclass (a ``DTensor``: a rank's shard of a parameter) holds no memory of its
        own: the storages of the tensors inside it are tracked instead."""
        # Hot path (every op output): the cheapest checks first.
        if _is_wrapper(tensor):
            found = [self.track(inner, kind) for inner in local_tensors(tensor)]
            return found[0] if found else None
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, wrapper subclasses
            return None
        key = id(storage)
        index = self._index_by_storage_id.get(key)
        if index is not None:
            return index
        if tensor.device.type != self.device_type or key in self._ignored:
            return None
        if self.real_only and storage.device.type == "meta":
            return None
        size = allocated_bytes(storage.nbytes(), self.charge_as)
        index = self._next_index
        self._next_index += 1
        self._index_by_storage_id[key] = index
        self._size_by_index[index] = size
        self._kind_by_index[index] = kind
        self._refs[index] = weakref.ref(storage, self._release_callback(index, key))
        self.current_bytes += size
        self._event += 1
        self._made_at_event[index] = self._event
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            self._peak_event = self._event
        self.on_alloc(index, size, kind)
        if self.limit_bytes is not None and self.current_bytes > self.limit_bytes:
            self._over_limit()
        return index

    def _over_limit(self) -> None:
        assert self.limit_bytes is not None
        raise MemoryLimitExceeded(
            f"live tensor memory reached {format_bytes(self.current_bytes)}, over the "
            f"{format_bytes(self.limit_bytes)} this run may use",
            limit_bytes=self.limit_bytes,
            reached_bytes=self.current_bytes,
        )

    def charge_transient(self, size_bytes: int) -> int:
        """Count ``size_bytes`` made and freed at once, at this point of the region: memory
        no tensor shows (a CUDA kernel's scratch, :mod:`planner.measure.kernel_scratch`). It
        takes part in the peak and in :meth:`on_alloc` and :meth:`on_free`, never in the
        limit (it is modelled, not allocated here). Returns its index."""
        index = self._next_index
        self._next_index += 1
        self.current_bytes += size_bytes
        self._event += 1
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            self._peak_event = self._event
        self.on_alloc(index, size_bytes, StorageKind.ACTIVATION)
        self.current_bytes -= size_bytes
        self._event += 1
        self.on_free(index)
        return index

    def add_existing(self, tensors_by_kind: Mapping[StorageKind, Iterable[torch.Tensor]]) -> None:
        for kind, tensors in tensors_by_kind.items():
            for tensor in tensors:
                self.track(tensor, kind)

    def _release_callback(self, index: int, key: int) -> Callable[[Any], None]:
        def release(_reference: Any) -> None:
            self._release(index, key)

        return release

    def _release(self, index: int, key: int) -> None:
        if self._closed or index not in self._size_by_index:
            return  # already released: resized to nothing before the storage died
        if self._index_by_storage_id.get(key) == index:
            del self._index_by_storage_id[key]
        self._refs.pop(index, None)
        self._kind_by_index.pop(index, None)
        size = self._size_by_index.pop(index)
        self.current_bytes -= size
        self._event += 1
        made_at = self._made_at_event.pop(index, None)
        thread = self._region_thread
        if made_at is not None and thread is not None and threading.get_ident() != thread:
            self._freed_elsewhere.append((made_at, self._event))
        self.on_free(index)

    def close(self) -> None:
        """Stop reacting to frees (storages still live keep their callbacks)."""
        self._closed = True

    @property
    def peak_held_by_other_threads(self) -> bool:
        """Whether a storage counted at the peak died later on another thread than the one
        that entered the watcher (see the class docstring): the region had let go of it at
        some point before, possibly before the peak, and the peak may be above the region's
        own. Measuring the region again gives its own peak when this is False."""
        return any(
            made_at <= self._peak_event < freed_at for made_at, freed_at in self._freed_elsewhere
        )

    # -- hooks for subclasses ---------------------------------------------------------
    def on_alloc(self, index: int, size_bytes: int, kind: StorageKind) -> None:
        pass

    def on_free(self, index: int) -> None:
        pass

    def on_op(
        self, func: Any, args: Any, kwargs: Any, outputs: list[torch.Tensor], result: Any
    ) -> None:
        """Called after each op with its tensor outputs (tracked) and its raw result."""

    # -- resized storages --------------------------------------------------------------
    def _watch_resizes(self) -> None:
        """FSDP2 frees and re-gathers a parameter's unsharded memory by resizing its storage
        (``storage.resize_(0)``, then back to full size), which no op reports to the
        dispatcher. While watching, a resize of a tracked storage is its free, and a resize
        to a non-zero size makes a new storage (of the kind the old one had)."""
        self._resize = torch.UntypedStorage.resize_
        original = self._resize

        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            key = id(storage)
            index = self._index_by_storage_id.get(key)
            kind = None if index is None else self._kind_by_index.get(index)
            result = original(storage, size)
            if index is not None:
                self._release(index, key)
                self._refs.pop(index, None)
            if size and (kind is not None or storage.device.type == self.device_type):
                with torch.utils._python_dispatch._disable_current_modes():
                    view = torch.empty(0, dtype=torch.uint8, device=storage.device)
                    view = view.set_(storage)
                self.track(view, kind or StorageKind.ACTIVATION)
            return result

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]

    def _unwatch_resizes(self) -> None:
        torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]

    def _skip_metadata_propagation(self) -> None:
        """A ``DTensor`` op first runs on fake tensors of the global shapes, to learn its
        output's shape (once per op and shapes: the result is cached). Those fakes are not a
        rank's memory: while that runs, nothing is tracked."""
        propagation = sys.modules.get("torch.distributed.tensor._sharding_prop")
        propagator = getattr(propagation, "ShardingPropagator", None)
        original = getattr(propagator, "_propagate_tensor_meta_non_cached", None)
        self._propagator = (propagator, original)
        if propagator is None or original is None:
            return

        def metadata_only(*args: Any, **kwargs: Any) -> Any:
            self._metadata_depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._metadata_depth -= 1

        propagator._propagate_tensor_meta_non_cached = metadata_only

    def _restore_metadata_propagation(self) -> None:
        propagator, original = self._propagator
        if propagator is not None and original is not None:
            propagator._propagate_tensor_meta_non_cached = original

    def __enter__(self) -> StorageWatcher:
        self._region_thread = threading.get_ident()
        self._watch_resizes()
        self._skip_metadata_propagation()
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._restore_metadata_propagation()
        self._unwatch_resizes()

    # -- dispatch ------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if any(_has_inner_tensors(kind) for kind in types):
            # Let a wrapper subclass (DTensor) run its ops on its local tensors, which
            # come back through this mode: those are the storages that hold memory.
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if self._metadata_depth or making_host_copies():
            # Host copies of offloaded saved tensors are not the device's memory (on CPU
            # too, where the host is the device): planner.apply.offload counts them.
            return out
        if isinstance(out, torch.Tensor):
            tensors = [out]
        elif isinstance(out, (tuple, list)):
            tensors = [t for t in out if isinstance(t, torch.Tensor)]
        else:
            tensors = list(iter_tensors(out))
        for tensor in tensors:
            self.track(tensor, StorageKind.ACTIVATION)
        self.on_op(func, args, kwargs or {}, tensors, out)
        return out


class PeakMemoryTracker:
    """Measure the peak memory of a region, the same way on CPU and CUDA.

    On CPU the peak counts the live storages of ``existing`` (a mapping of kind to tensors:
    what the step starts with) plus every storage made inside the region. On CUDA it is
    ``torch.cuda.max_memory_allocated()`` over the region, which counts everything the
    allocator holds for tensors, and ``existing`` is not needed. The tracker lets go of
    ``existing`` on enter; the caller must not keep its own reference to it either.
    ``limit_bytes`` (CPU) stops the region with :class:`MemoryLimitExceeded` as soon as
    live memory passes it; on CUDA the peak is only known afterwards. ``ignore`` (CPU):
    tensors made before the region that it must not count when its ops return views of them
    (data the caller holds, such as a data set a training run indexes); the caller keeps
    them alive. ``host_peak_bytes``: the most host memory offloaded saved tensors held at
    once in the region (:data:`planner.apply.offload.HOST_MEMORY`), apart from the device's.
    ``reserved_peak_bytes`` (CUDA; None elsewhere): the most memory the caching allocator
    held reserved from the driver in the region (``torch.cuda.max_memory_reserved()``),
    which is what runs out (:mod:`planner.core.allocator`).
    """

    def __init__(
        self,
        device: torch.device | str,
        existing: Mapping[StorageKind, Iterable[torch.Tensor]] | None = None,
        *,
        limit_bytes: int | None = None,
        ignore: Iterable[torch.Tensor] = (),
    ) -> None:
        self.device = torch.device(device)
        self.limit_bytes = limit_bytes
        self._existing = existing or {}
        self._ignore = list(ignore)
        self._watcher: StorageWatcher | None = None
        self.peak_bytes = 0
        self.start_bytes = 0
        self.host_peak_bytes = 0
        self.reserved_peak_bytes: int | None = None
        self.peak_held_by_other_threads = False

    def __enter__(self) -> PeakMemoryTracker:
        HOST_MEMORY.reset_peak()
        if self.device.type == "cuda":
            # The allocator counts every tensor: holding last step's gradients here would
            # count them after ``zero_grad(set_to_none=True)`` freed them in the step.
            self._existing = {}
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = torch.cuda.memory_allocated(self.device)
        else:
            self._watcher = StorageWatcher(
                self.device.type, limit_bytes=self.limit_bytes, real_only=True
            )
            self._watcher.ignore(self._ignore)
            self._ignore = []
            self._watcher.add_existing(self._existing)
            # Drop our references: holding them would keep e.g. last step's gradients alive
            # after ``zero_grad(set_to_none=True)`` and inflate the very peak we measure.
            self._existing = {}
            self.start_bytes = self._watcher.current_bytes
            self._watcher.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.host_peak_bytes = HOST_MEMORY.peak_bytes
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
            self.reserved_peak_bytes = torch.cuda.max_memory_reserved(self.device)
        else:
            assert self._watcher is not None
            self._watcher.__exit__(*exc)
            self._watcher.close()
            self.peak_bytes = self._watcher.peak_bytes
            self.peak_held_by_other_threads = self._watcher.peak_held_by_other_threads


class AllocatorPeakTracker:
    """Measure the peak memory of a CPU region from the CPU allocator's own accounting.

    :class:`PeakMemoryTracker` sees the storages that ops make through the dispatcher. What
    is allocated below it is invisible to it, and one thing runs differently under it:
    ``torch.compile``'s generated kernels allocate their buffers directly, and while a
    ``TorchDispatchMode`` is active TorchDynamo does not run compiled code at all (the
    region would measure the eager step, and later calls may stay eager). This tracker
    reads ``torch.profiler``'s memory events instead (``profile_memory=True``): every
    allocation and free of the CPU allocator in the region, compiled kernels' and the RNG
    state ``checkpoint`` stashes (a CPU tensor of 5,056 bytes per region that preserves RNG
    state) included. The peak is the bytes of ``existing`` (a mapping of kind to tensors,
    each storage counted once) plus the highest running total of the region's allocations
    less its frees (of memory allocated in the region: a block freed there that was allocated
    before is not subtracted).

    The profiler does not see the free of memory allocated before it started, so a storage
    of ``existing`` freed in the region would stay counted: release what the region would
    free before entering it (``optimizer.zero_grad(set_to_none=True)`` before a plain
    step). A region that frees one raises :class:`ProfilingError`. The tracker lets go of
    ``existing`` on enter, as :class:`PeakMemoryTracker` does.
    """

    def __init__(
        self, existing: Mapping[StorageKind, Iterable[torch.Tensor]] | None = None
    ) -> None:
        self._existing = existing or {}
        self._existing_refs: list[weakref.ref[Any]] = []
        self._profiler: Any = None
        self.start_bytes = 0
        self.peak_bytes = 0

    def __enter__(self) -> AllocatorPeakTracker:
        from torch.profiler import ProfilerActivity, profile

        seen: set[int] = set()
        for tensors in self._existing.values():
            for tensor in (local for wrapper in tensors for local in local_tensors(wrapper)):
                storage = tensor.untyped_storage()
                if tensor.device.type != "cpu" or id(storage) in seen:
                    continue
                seen.add(id(storage))
                self.start_bytes += storage.nbytes()
                self._existing_refs.append(weakref.ref(storage))
        self._existing = {}
        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profiler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._profiler.__exit__(*exc)
        if exc[0] is not None:
            return
        freed = sum(1 for reference in self._existing_refs if reference() is None)
        if freed:
            raise ProfilingError(
                f"{freed} of the storages the region started with were freed inside it, and "
                "the profiler cannot see those frees: release them before the region (zero "
                "the gradients to None before a plain step)"
            )
        from torch._C._profiler import _EventType

        # Every allocation event of the region, in the order they happened (the tree's
        # depth-first order breaks ties in time).
        events: list[tuple[int, int, Any]] = []
        stack = list(reversed(self._profiler.profiler.kineto_results.experimental_event_tree()))
        while stack:
            node = stack.pop()
            if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == "cpu":
                events.append((node.start_time_ns, len(events), node.typed[1]))
            stack.extend(reversed(node.children))
        events.sort(key=lambda event: event[:2])
        # A free is counted only for memory allocated in the region: the allocator also
        # reports the frees of blocks from an earlier profiled region, with their sizes.
        live: dict[int, int] = {}
        running = highest = 0
        for _, _, allocation in events:
            if allocation.alloc_size > 0:
                live[allocation.ptr] = allocation.alloc_size
                running += allocation.alloc_size
                highest = max(highest, running)
            else:
                running -= live.pop(allocation.ptr, 0)
        self.peak_bytes = self.start_bytes + highest
