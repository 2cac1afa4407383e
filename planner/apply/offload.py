"""Offload a module's saved tensors to host memory between its forward and its backward.

An offloaded module (a plan decision with the ``offload`` method) runs its forward under
``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves inside it is
packed into a :class:`_Saved` handle. When the forward returns, the storages those handles
hold are sorted: the module's inputs and outputs (alive outside it anyway), the model's
parameters and buffers and their casts (autocast's copies), storages below the plan's size
threshold and storages viewed in more than one dtype or through a conjugate or negative view
stay on the device; every other storage is copied, whole, to a host buffer, and the handles
let go of the device storage, which dies (autograd held it only through them). Every storage
of the call comes back (each into one new device storage of the same size, the views rebuilt
with their sizes, strides and offsets) at the backward of the module the plan prefetches it
at (see "Prefetched one module early"), or else at the first unpack of any of the call's
handles: so the values backward reads are the forward's, bit for bit, and the device holds
them again from then on, as without the plan.

Design notes
------------
* **Decided when the forward ends, by storage.** The pack hook only records; what leaves
  is chosen when the forward returns, once its outputs are known (an output a caller still
  uses cannot leave). The memory model (:mod:`planner.plan.memory_model`, point 7) applies
  the same rule to the recorded timeline: the storages saved inside the call, less its
  inputs, its outputs, static memory, casts of parameters and those below the threshold.
* **A parameter's cast stays.** Under ``torch.autocast`` with fp32 weights, a Linear saves
  the low-precision copy of its weight that autocast made, and autocast keeps that copy in
  its cache until the outermost autocast exits (the end of the forward, or of the step):
  sent to the host, it would stay on the device as well, and come back as a second copy.
  So a cast of a leaf tensor that requires grad (:func:`casts_a_leaf`, what autocast's
  cache holds) stays, as the parameter does; the profile marks the same storages
  (``StorageLifetime.leaf_cast``). Turning the cache off inside the module instead would
  send the copies away, but a weight cast there and again elsewhere in the step (a layer
  called twice) would then have two casts, whose gradients reach the fp32 weight summed in
  a different order: not bit-identical.
* **No reference cycles.** A handle holds its tensor detached (an op's saved output would
  otherwise hold, through its ``grad_fn``, the node that holds the handle: a cycle through
  autograd that leaks), its storage record and the call; the call holds its records;
  nothing points back, so everything dies with the autograd graph, when the unplanned step
  would free it.
* **Host copies are not device memory.** They are made inside :func:`host_copies`, which
  the memory trackers read (:mod:`planner.measure.tracking`): on CPU, where the host is the
  device, they are counted apart, in :data:`HOST_MEMORY`, on every device. A pinned copy
  (CUDA) is counted as the block CUDA's caching host allocator takes for it, the next power
  of two (:func:`planner.core.allocator.pinned_host_bytes`), as the memory model counts it;
  so is a copy of the CUDA step emulated on fake CPU tensors (:func:`charged_as`).
* **Prefetched one module early.** A plan names, per offloaded module, the module at whose
  backward its tensors start back (``prefetch_module``: the next block, whose backward runs
  just before this one's; the memory model's point 8). When the offloaded forward ends,
  its call waits on that module (:func:`wait_for`); the module's next forward call takes
  the waiting calls into a :class:`PrefetchTrigger`, active while that forward runs
  (:class:`PrefetchWatch`, a pair of forward hooks). Everything that packs a saved tensor
  inside it takes the active triggers along and fires them at its first unpack: the
  watch's own saved-tensor hooks (what the module saves itself), an offloaded call
  (:class:`OffloadedCall`), a checkpoint's recomputation
  (:func:`fire_at_recomputation`). So the copy back starts at the first unpack of any
  tensor saved inside the trigger's call, the event the memory model uses, and the
  offloaded module's own first unpack only waits for it.
* **On CUDA** the host buffers are pinned and the copies run on a side stream. The copy to
  the host starts when the forward ends, after the side stream waits for the compute
  stream; the device storage is released at once, with ``record_stream``, so its block is
  reused only once the copy is done. The copy back is made into blocks allocated on the
  compute stream, after the side stream waits for it (a reused block's last readers are
  done), and is recorded on the side stream too (a block freed early is not reused under
  the copy); an event recorded after the copies is what the first unpack makes the
  compute stream wait for (at the unpack itself where nothing was prefetched). A pinned
  buffer may be dropped as soon as its copy is queued: the host allocator keeps it until
  the copy's event has passed. Elsewhere (CPU, and the emulated CUDA step on fake CPU
  tensors) the copies run in line, at the same points, so the memory is the same.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from planner.apply.tensors import iter_tensors
from planner.core.allocator import pinned_host_bytes

__all__ = [
    "HOST_MEMORY",
    "HostMemory",
    "OffloadedCall",
    "PrefetchTrigger",
    "PrefetchWatch",
    "active_triggers",
    "casts_a_leaf",
    "charged_as",
    "fire_at_recomputation",
    "host_copies",
    "making_host_copies",
    "wait_for",
]


class HostMemory:
    """Bytes of host memory offloaded saved tensors hold in this process, as the host's
    allocator takes them (see "Host copies are not device memory"): now, and the most at
    once since :meth:`reset_peak`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current_bytes = 0
        self.peak_bytes = 0

    def add(self, size: int) -> None:
        with self._lock:
            self.current_bytes += size
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def remove(self, size: int) -> None:
        with self._lock:
            self.current_bytes -= size

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_bytes = self.current_bytes


HOST_MEMORY = HostMemory()

_host_copy_depth = 0


def making_host_copies() -> bool:
    """Whether the tensors being made now are host copies of saved tensors (a memory
    tracker counts them apart from the device's memory)."""
    return _host_copy_depth > 0


@contextlib.contextmanager
def host_copies() -> Iterator[None]:
    """Mark the tensors made inside as host copies (see :func:`making_host_copies`)."""
    global _host_copy_depth
    _host_copy_depth += 1
    try:
        yield
    finally:
        _host_copy_depth -= 1


_charged_as: str | None = None


@contextlib.contextmanager
def charged_as(device_type: str) -> Iterator[None]:
    """Inside, saved storages are charged as ``device_type``'s allocators charge them,
    whatever device their tensors are on: the CUDA step emulated on fake CPU tensors
    (:mod:`planner.measure.cuda_emulation`), whose device blocks and pinned host blocks are
    CUDA's."""
    global _charged_as
    outer, _charged_as = _charged_as, device_type
    try:
        yield
    finally:
        _charged_as = outer


def casts_a_leaf(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` (a saved tensor, before it is detached) is a copy of a leaf tensor
    that requires grad, or a view of one: what autocast casts a parameter to and keeps in its
    cache (``.to()`` of a parameter in the model's code looks the same)."""
    base = tensor._base if tensor._base is not None else tensor
    node = base.grad_fn
    if node is None or type(node).__name__ != "ToCopyBackward0":
        return False
    sources = node.next_functions
    return len(sources) == 1 and type(sources[0][0]).__name__ == "AccumulateGrad"


def _storage_key(tensor: torch.Tensor) -> int | None:
    try:
        return int(tensor.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError, AttributeError):  # no storage: never moved
        return None


_streams: dict[torch.device, Any] = {}


def _side_stream(device: torch.device) -> Any:
    stream = _streams.get(device)
    if stream is None:
        stream = _streams[device] = torch.cuda.Stream(device)
    return stream


class _Stored:
    """One storage saved inside an offloaded call: on the device (the tensors of its
    handles; ``device``, the whole storage as a flat tensor, once brought back), or on the
    host (``host``) between the forward's end and the backward's first unpack."""

    __slots__ = (
        "charged_as",
        "device",
        "dtype",
        "home",
        "host",
        "nbytes",
        "numel",
        "offloadable",
        "pin",
    )

    def __init__(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        # Until the forward ends: a storage saved inside it may die before (its saving op
        # let go of), and a weak reference keeps its StorageImpl's address, the key it is
        # found by, from going to a new storage that would then be taken for this one.
        self.pin: StorageWeakRef | None = StorageWeakRef(storage)
        self.nbytes = storage.nbytes()
        self.dtype = tensor.dtype
        self.home = tensor.device
        self.charged_as = _charged_as or tensor.device.type
        size = tensor.element_size()
        self.offloadable = size > 0 and self.nbytes % size == 0
        self.numel = self.nbytes // size if self.offloadable else 0
        self.device: torch.Tensor | None = None
        self.host: torch.Tensor | None = None

    @property
    def charged(self) -> int:
        """Its size as the device's allocator counts it (CUDA: whole 512-byte blocks), which
        the threshold is compared with, as the memory model does."""
        if self.charged_as == "cuda" and self.nbytes:
            return -(-self.nbytes // 512) * 512
        return self.nbytes

    @property
    def host_charged(self) -> int:
        """Its host copy's size as the host's allocator takes it (CUDA: a pinned block of
        the next power of two), which :data:`HOST_MEMORY` counts, as the memory model
        does."""
        return pinned_host_bytes(self.nbytes) if self.charged_as == "cuda" else self.nbytes

    def to_host(self, view: torch.Tensor) -> None:
        """Copy the whole storage behind ``view`` to a host buffer."""
        flat = view.as_strided((self.numel,), (1,), 0)
        cuda = flat.device.type == "cuda"
        with torch.no_grad(), host_copies():
            host = torch.empty(self.numel, dtype=self.dtype, device="cpu", pin_memory=cuda)
            if cuda:
                stream = _side_stream(flat.device)
                stream.wait_stream(torch.cuda.current_stream(flat.device))
                with torch.cuda.stream(stream):
                    host.copy_(flat, non_blocking=True)
                # The allocator reuses the block only once the side stream is done with it.
                flat.record_stream(stream)
            else:
                host.copy_(flat)
        self.host = host
        HOST_MEMORY.add(self.host_charged)

    def to_device(self) -> None:
        """Start the copy back into a new device storage (on CUDA: queued on the side
        stream; the caller makes the compute stream wait before the storage is read)."""
        host = self.host
        assert host is not None
        with torch.no_grad():
            restored = torch.empty(self.numel, dtype=self.dtype, device=self.home)
            if self.home.type == "cuda":
                stream = _side_stream(self.home)
                # The block may have been another tensor's until just now, on this stream.
                stream.wait_stream(torch.cuda.current_stream(self.home))
                with torch.cuda.stream(stream):
                    restored.copy_(host, non_blocking=True)
                # Freed before the compute stream waits (a graph dropped): not reused early.
                restored.record_stream(stream)
            else:
                with host_copies():
                    restored.copy_(host)
        self.device = restored
        self.host = None
        HOST_MEMORY.remove(self.host_charged)

    def __del__(self) -> None:
        # A graph freed before its backward ran (an exception, a forward without backward).
        if getattr(self, "host", None) is not None:
            HOST_MEMORY.remove(self.host_charged)


class _Saved:
    """What the pack hook returns for one saved tensor: the tensor itself (detached) until
    the forward ends, or, once its storage has gone to the host, how to rebuild it."""

    __slots__ = ("__weakref__", "call", "offset", "size", "stored", "stride", "tensor")

    def __init__(self, call: OffloadedCall, tensor: torch.Tensor, stored: _Stored | None) -> None:
        self.call = call
        self.tensor: torch.Tensor | None = tensor
        self.stored = stored
        # The view, where its storage may leave (a sparse or nested tensor has no strides).
        if stored is not None:
            self.size = tensor.size()
            self.stride = tensor.stride()
            self.offset = tensor.storage_offset()


class OffloadedCall:
    """One forward call of an offloaded module: the hooks, the storages its saved tensors
    hold, and what leaves when the forward ends (see the module notes).

    ``min_bytes``: the smallest storage that leaves; ``static``: keys (``_storage_key``) of
    the storages that never leave (the model's parameters and buffers). The call holds its
    handles weakly until the forward ends: a storage whose every saving op autograd let go
    of in the forward dies there, as without the plan."""

    def __init__(
        self, min_bytes: int, static: frozenset[int], prefetch_at: torch.nn.Module | None = None
    ) -> None:
        self.min_bytes = min_bytes
        self.static = static
        self._stored: dict[int, _Stored] = {}
        self._packed: list[weakref.ref[_Saved]] | None = []
        self._offloaded: list[_Stored] = []
        # Keys of the storages that stay: viewed in two dtypes, or through a conjugate or
        # negative view (the copy would resolve its bit, and the other views would read the
        # result; a handle records no bit to set again).
        self._mixed: set[int] = set()
        # The module whose next call's backward starts the copy back (None: the first unpack).
        self.prefetch_at = prefetch_at
        # Triggers of the calls this one runs inside: fired at its first unpack.
        self._triggers = active_triggers()
        # (device, CUDA event): what the compute stream waits for before reading what came
        # back.
        self._arrivals: list[tuple[torch.device, Any]] = []

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: torch.Tensor) -> _Saved:
        # Held detached: a tensor an op saves may be its own output, whose grad_fn holds
        # this handle (a reference cycle through autograd that no collector frees).
        # Autograd gives the unpacked tensor its place in the graph again.
        leaf_cast = casts_a_leaf(tensor)
        tensor = tensor.detach()
        key = _storage_key(tensor)
        stored = None
        if (
            key is not None
            and key not in self.static
            and not leaf_cast
            and tensor.layout is torch.strided
            and not tensor.is_nested
        ):
            stored = self._stored.get(key)
            if stored is None:
                stored = self._stored[key] = _Stored(tensor)
            elif stored.dtype != tensor.dtype:
                self._mixed.add(key)
            if tensor.is_conj() or tensor.is_neg():
                self._mixed.add(key)
        saved = _Saved(self, tensor, stored)
        assert self._packed is not None, "a tensor saved after the offloaded forward ended"
        self._packed.append(weakref.ref(saved))
        return saved

    def unpack(self, saved: _Saved) -> torch.Tensor:
        # Its own copies back first: on CUDA they share the side stream with those the
        # triggers start, and the event this unpack waits for is recorded after its own.
        if self._offloaded:
            self.prefetch()
        if self._triggers:
            triggers, self._triggers = self._triggers, ()
            for trigger in triggers:
                trigger.fire()
        if self._arrivals:
            arrivals, self._arrivals = self._arrivals, []
            for device, event in arrivals:
                torch.cuda.current_stream(device).wait_event(event)
        if saved.tensor is not None:
            return saved.tensor
        stored = saved.stored
        assert stored is not None and stored.device is not None
        return stored.device.as_strided(saved.size, saved.stride, saved.offset)

    def finish_forward(self, args: Any, kwargs: Any, output: Any) -> None:
        """The forward returned ``output``: send every storage that may leave to the host
        and let go of it here."""
        packed, self._packed = self._packed, None
        stored_by_key, self._stored = self._stored, {}
        assert packed is not None
        for stored in stored_by_key.values():
            stored.pin = None
        stays = set(self._mixed)
        for tensor in iter_tensors((args, kwargs, output)):
            key = _storage_key(tensor)
            if key is not None:
                stays.add(key)
        leaving = {
            id(stored)
            for key, stored in stored_by_key.items()
            if key not in stays and stored.offloadable and stored.charged >= self.min_bytes
        }
        del stored_by_key
        for reference in packed:
            saved = reference()
            if saved is None or saved.stored is None or id(saved.stored) not in leaving:
                continue
            stored = saved.stored
            if stored.host is None:
                assert saved.tensor is not None
                stored.to_host(saved.tensor)
                self._offloaded.append(stored)
            saved.tensor = None
        if self._offloaded and self.prefetch_at is not None:
            wait_for(self.prefetch_at, self)

    def prefetch(self) -> None:
        """Start copying every storage of this call back to the device: at the backward of
        its trigger module, or at its own first unpack. On CUDA the copies are queued on the
        side stream, and the first unpack waits for them."""
        offloaded, self._offloaded = self._offloaded, []
        devices = set()
        for stored in offloaded:
            stored.to_device()
            if stored.home.type == "cuda":
                devices.add(stored.home)
        for device in devices:
            event = torch.cuda.Event()
            event.record(_side_stream(device))
            self._arrivals.append((device, event))


# -- prefetching at the backward of the module before, in backward order -----------------------
# Offloaded calls waiting for the next forward call of their trigger module, by module.
_waiting: weakref.WeakKeyDictionary[torch.nn.Module, list[weakref.ref[OffloadedCall]]] = (
    weakref.WeakKeyDictionary()
)
# The triggers of the forward calls running now, outermost first.
_active: list[PrefetchTrigger | None] = []


def wait_for(module: torch.nn.Module, call: OffloadedCall) -> None:
    """Have ``call``'s copy back start at the backward of ``module``'s next forward call."""
    waiting = [reference for reference in _waiting.get(module, ()) if reference() is not None]
    # (Calls whose graph died before their trigger module ran again are dropped here.)
    _waiting[module] = [*waiting, weakref.ref(call)]


def active_triggers() -> tuple[PrefetchTrigger, ...]:
    """The triggers of the forward calls running now: what a tensor saved now fires."""
    return tuple(trigger for trigger in _active if trigger is not None)


class PrefetchTrigger:
    """One forward call of a trigger module: the offloaded calls whose copies back start
    at the first unpack of a tensor saved inside it (fired once; held weakly, so a graph
    dropped without a backward frees its host copies as before)."""

    __slots__ = ("__weakref__", "_calls")

    def __init__(self, calls: list[weakref.ref[OffloadedCall]]) -> None:
        self._calls = calls

    def fire(self) -> None:
        calls, self._calls = self._calls, []
        for reference in calls:
            call = reference()
            if call is not None and call._offloaded:
                call.prefetch()


class _Watched:
    """What the watch's pack hook returns: the saved tensor (detached, as in
    :meth:`OffloadedCall.pack`) and the triggers active when it was saved."""

    __slots__ = ("tensor", "triggers")

    def __init__(self, tensor: torch.Tensor, triggers: tuple[PrefetchTrigger, ...]) -> None:
        self.tensor: torch.Tensor = tensor
        self.triggers = triggers


def _watch_pack(tensor: torch.Tensor) -> _Watched:
    return _Watched(tensor.detach(), active_triggers())


def _watch_unpack(watched: _Watched) -> torch.Tensor:
    if watched.triggers:
        for trigger in watched.triggers:
            trigger.fire()
        watched.triggers = ()
    return watched.tensor


class PrefetchWatch:
    """The forward pre-hook and hook of a trigger module (``register``): while a call
    for which offloaded calls wait runs, its :class:`PrefetchTrigger` is active and the
    tensors saved directly under it (not inside a checkpoint or another offloaded module,
    which take the trigger along themselves) go through saved-tensor hooks that fire it.
    A plain class, so models stay copyable and picklable."""

    def register(self, module: torch.nn.Module) -> None:
        module.register_forward_pre_hook(self.enter)
        module.register_forward_hook(self.leave, always_call=True)

    @staticmethod
    def remove(module: torch.nn.Module) -> None:
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for key in [key for key, hook in hooks.items() if _is_watch_hook(hook)]:
                del hooks[key]
                module._forward_hooks_always_called.pop(key, None)

    @staticmethod
    def registered(module: torch.nn.Module) -> bool:
        return any(_is_watch_hook(hook) for hook in module._forward_pre_hooks.values())

    def enter(self, module: torch.nn.Module, args: Any) -> None:
        calls = _waiting.pop(module, None)
        if not calls or not torch.is_grad_enabled():
            _active.append(None)
            return
        trigger = PrefetchTrigger(calls)
        hooks = torch.autograd.graph.saved_tensors_hooks(_watch_pack, _watch_unpack)
        hooks.__enter__()
        _active.append(trigger)
        _entered.append(hooks)

    def leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if _active.pop() is not None:
            _entered.pop().__exit__(None, None, None)


_entered: list[torch.autograd.graph.saved_tensors_hooks] = []


def _is_watch_hook(hook: Any) -> bool:
    return isinstance(getattr(hook, "__self__", None), PrefetchWatch)


def fire_at_recomputation(function: Any) -> Any:
    """``function`` (a checkpoint's), firing the triggers active now when it runs again:
    the recomputation, at the checkpoint's first unpack. ``function`` itself where none is
    active."""
    triggers = active_triggers()
    if not triggers:
        return function
    runs = 0

    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal runs
        runs += 1
        if runs > 1:
            with _outside_selective_recomputation():
                for trigger in triggers:
                    trigger.fire()
        return function(*args, **kwargs)

    return run


@contextlib.contextmanager
def _outside_selective_recomputation() -> Iterator[None]:
    """Dispatch as outside a selective checkpoint's recomputation. While that runs, its
    policy's mode (torch.utils.checkpoint's ``_CachedTorchDispatchMode``) is on top of the
    dispatch mode stack: it answers each op from what the forward stored and raises at any
    op the forward did not run, such as a copy back's ``empty``. So the copies back that a
    recomputation fires start with that mode popped, and it is pushed back after."""
    from torch.utils._python_dispatch import (
        _get_current_dispatch_mode_stack,
        _pop_mode_temporarily,
    )
    from torch.utils.checkpoint import _CachedTorchDispatchMode

    stack = _get_current_dispatch_mode_stack()
    if not stack or not isinstance(stack[-1], _CachedTorchDispatchMode):
        yield
        return
    with _pop_mode_temporarily():
        yield


def model_storage_keys(model: torch.nn.Module) -> frozenset[int]:
    """Keys of the storages of a model's parameters and buffers (never offloaded)."""
    keys = set()
    for tensor in (*model.parameters(), *model.buffers()):
        key = _storage_key(tensor)
        if key is not None:
            keys.add(key)
    return frozenset(keys)
