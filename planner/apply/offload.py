"""Offload a module's saved tensors to host memory between its forward and its backward.

An offloaded module (a plan decision with the ``offload`` method) runs its forward under
``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves inside it is
packed into a :class:`_Saved` handle. When the forward returns, the storages those handles
hold are sorted: the module's inputs and outputs (alive outside it anyway), the model's
parameters and buffers, storages below the plan's size threshold and storages viewed in
more than one dtype stay on the device; every other storage is copied, whole, to a host
buffer, and the handles let go of the device storage, which dies (autograd held it only
through them). The first unpack of any of the call's handles in backward brings every
storage of the call back (each into one new device storage of the same size, the views
rebuilt with their sizes, strides and offsets): so the values backward reads are the
forward's, bit for bit, and the device holds them again from the module's backward on, as
without the plan.

Design notes
------------
* **Decided when the forward ends, by storage.** The pack hook only records; what leaves
  is chosen when the forward returns, once its outputs are known (an output a caller still
  uses cannot leave). The memory model (:mod:`planner.plan.memory_model`, point 7) applies
  the same rule to the recorded timeline: the storages saved inside the call, less its
  inputs, its outputs, static memory and those below the threshold.
* **No reference cycles.** A handle holds its tensor detached (an op's saved output would
  otherwise hold, through its ``grad_fn``, the node that holds the handle: a cycle through
  autograd that leaks), its storage record and the call; the call holds its records;
  nothing points back, so everything dies with the autograd graph, when the unplanned step
  would free it.
* **Host copies are not device memory.** They are made inside :func:`host_copies`, which
  the memory trackers read (:mod:`planner.measure.tracking`): on CPU, where the host is the
  device, they are counted apart, in :data:`HOST_MEMORY`, on every device.
* **On CUDA** the host buffers are pinned and the copies run on a side stream: the copy to
  the host starts when the forward ends (the device storage is released at once, with
  ``record_stream``, so its block is reused only once the copy is done), and the copy back
  at the first unpack, which the compute stream waits for. Elsewhere the copies run in line.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from planner.apply.tensors import iter_tensors

__all__ = ["HOST_MEMORY", "HostMemory", "OffloadedCall", "host_copies", "making_host_copies"]


class HostMemory:
    """Bytes of host memory offloaded saved tensors hold in this process: now, and the most
    at once since :meth:`reset_peak`."""

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

    __slots__ = ("device", "dtype", "home", "host", "nbytes", "numel", "offloadable")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.nbytes = tensor.untyped_storage().nbytes()
        self.dtype = tensor.dtype
        self.home = tensor.device
        size = tensor.element_size()
        self.offloadable = size > 0 and self.nbytes % size == 0
        self.numel = self.nbytes // size if self.offloadable else 0
        self.device: torch.Tensor | None = None
        self.host: torch.Tensor | None = None

    @property
    def charged(self) -> int:
        """Its size as the device's allocator counts it (CUDA: whole 512-byte blocks), which
        the threshold is compared with, as the memory model does."""
        if self.home.type == "cuda" and self.nbytes:
            return -(-self.nbytes // 512) * 512
        return self.nbytes

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
        HOST_MEMORY.add(self.nbytes)

    def to_device(self) -> None:
        host = self.host
        assert host is not None
        with torch.no_grad():
            restored = torch.empty(self.numel, dtype=self.dtype, device=self.home)
            if self.home.type == "cuda":
                stream = _side_stream(self.home)
                current = torch.cuda.current_stream(self.home)
                stream.wait_stream(current)
                with torch.cuda.stream(stream):
                    restored.copy_(host, non_blocking=True)
                current.wait_stream(stream)
            else:
                with host_copies():
                    restored.copy_(host)
        self.device = restored
        self.host = None
        HOST_MEMORY.remove(self.nbytes)

    def __del__(self) -> None:
        # A graph freed before its backward ran (an exception, a forward without backward).
        if getattr(self, "host", None) is not None:
            HOST_MEMORY.remove(self.nbytes)


class _Saved:
    """What the pack hook returns for one saved tensor: the tensor itself (detached) until
    the forward ends, or, once its storage has gone to the host, how to rebuild it."""

    __slots__ = ("__weakref__", "call", "offset", "size", "stored", "stride", "tensor")

    def __init__(self, call: OffloadedCall, tensor: torch.Tensor, stored: _Stored | None) -> None:
        self.call = call
        self.tensor: torch.Tensor | None = tensor
        self.stored = stored
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

    def __init__(self, min_bytes: int, static: frozenset[int]) -> None:
        self.min_bytes = min_bytes
        self.static = static
        self._stored: dict[int, _Stored] = {}
        self._packed: list[weakref.ref[_Saved]] | None = []
        self._offloaded: list[_Stored] = []
        self._mixed: set[int] = set()

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: torch.Tensor) -> _Saved:
        # Held detached: a tensor an op saves may be its own output, whose grad_fn holds
        # this handle (a reference cycle through autograd that no collector frees).
        # Autograd gives the unpacked tensor its place in the graph again.
        tensor = tensor.detach()
        key = _storage_key(tensor)
        stored = None
        if key is not None and key not in self.static and tensor.layout is torch.strided:
            stored = self._stored.get(key)
            if stored is None:
                stored = self._stored[key] = _Stored(tensor)
            elif stored.dtype != tensor.dtype:
                self._mixed.add(key)
        saved = _Saved(self, tensor, stored)
        assert self._packed is not None, "a tensor saved after the offloaded forward ended"
        self._packed.append(weakref.ref(saved))
        return saved

    def unpack(self, saved: _Saved) -> torch.Tensor:
        if self._offloaded:
            self.bring_back()
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

    def bring_back(self) -> None:
        """Copy every storage of this call back to the device (the first unpack of its
        backward)."""
        offloaded, self._offloaded = self._offloaded, []
        for stored in offloaded:
            stored.to_device()


def model_storage_keys(model: torch.nn.Module) -> frozenset[int]:
    """Keys of the storages of a model's parameters and buffers (never offloaded)."""
    keys = set()
    for tensor in (*model.parameters(), *model.buffers()):
        key = _storage_key(tensor)
        if key is not None:
            keys.add(key)
    return frozenset(keys)
