"""Measure the link between a CUDA device and pinned host memory: what an offloaded module's
copies run at (:mod:`planner.apply.offload`), each way.

Design notes
------------
* **As the offload copies run.** A pinned host buffer and a device buffer of ``size_bytes``
  each; every copy is ``non_blocking`` on a side stream (as the offload's), timed between two
  CUDA events on that stream, after one untimed copy each way (the driver's first touch).
* **The median of several.** ``copies`` copies each way; the median of each direction's
  rates is kept (one slow copy, a clock or a neighbour, does not move it).
* **One figure for planning.** A device spec has one host-link rate, each way
  (``host_link_bytes_per_s``): the slower direction's, so that neither copy is costed
  below what it takes.
* **Nothing kept.** Freed, the two buffers would stay cached in this process, the device
  one by CUDA's caching allocator and the pinned one by its caching host allocator (up to
  256 MiB each, beside the step ``profile`` or ``fit`` measures next): both caches give
  their free blocks back once the copies are done.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from planner.core.errors import ProfilingError

__all__ = ["DEFAULT_COPY_BYTES", "HostLink", "empty_host_cache", "measure_host_link"]

DEFAULT_COPY_BYTES = 256 * 2**20
"""The size of each timed copy (256 MiB): long enough that a copy's fixed latency is lost
in its time."""


@dataclass(frozen=True)
class HostLink:
    """A measured host link: the median rate of ``copies`` copies of ``size_bytes`` each
    way, pinned host memory to ``device`` (``to_device_bytes_per_s``) and back."""

    device: str
    device_name: str
    to_device_bytes_per_s: float
    to_host_bytes_per_s: float
    size_bytes: int
    copies: int

    @property
    def bytes_per_s(self) -> float:
        """The rate a device spec records (``host_link_bytes_per_s``): the slower way."""
        return min(self.to_device_bytes_per_s, self.to_host_bytes_per_s)


def cuda_device_here(
    device: str | torch.device, purpose: str, *, not_cuda: str = "", elsewhere: str = ""
) -> torch.device:
    """``device`` as a CUDA device of this machine (``cuda`` alone: the current one), what
    ``purpose`` (``"calibration"``) needs. Raises :class:`ProfilingError` where it is not a
    CUDA device (saying ``not_cuda``, else to pass --device cuda) or none is here (saying
    ``elsewhere``, what to do instead)."""
    where = torch.device(device)
    if where.type != "cuda":
        raise ProfilingError(
            f"{purpose} needs a CUDA device, not {where}: "
            + (not_cuda or "pass --device cuda (or cuda:N)")
        )
    if not torch.cuda.is_available():
        raise ProfilingError(
            f"{purpose} needs a CUDA device, and no CUDA device is available here"
            + (f": {elsewhere}" if elsewhere else "")
        )
    return where if where.index is not None else torch.device("cuda", torch.cuda.current_device())


def measure_host_link(
    device: str = "cuda", *, size_bytes: int = DEFAULT_COPY_BYTES, copies: int = 5
) -> HostLink:
    """Time ``copies`` copies of ``size_bytes`` between pinned host memory and ``device``,
    each way (see the module notes). Raises :class:`ProfilingError` where ``device`` is not
    a CUDA device that is here."""
    where = cuda_device_here(
        device,
        "measuring the host link",
        not_cuda="on a CPU the host is the device (nothing to offload to)",
    )
    if size_bytes < 1 or copies < 1:
        raise ValueError(f"size_bytes and copies must be positive, not {size_bytes}, {copies}")
    host = torch.empty(size_bytes, dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty(size_bytes, dtype=torch.uint8, device=where)
    stream = torch.cuda.Stream(where)
    stream.wait_stream(torch.cuda.current_stream(where))

    def rate(destination: torch.Tensor, source: torch.Tensor) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            destination.copy_(source, non_blocking=True)
            end.record(stream)
        end.synchronize()
        return size_bytes / (start.elapsed_time(end) / 1000.0)

    rate(on_device, host), rate(host, on_device)  # untimed: first touch
    to_device = statistics.median(rate(on_device, host) for _ in range(copies))
    to_host = statistics.median(rate(host, on_device) for _ in range(copies))
    torch.cuda.current_stream(where).wait_stream(stream)
    del host, on_device
    torch.cuda.synchronize(where)
    torch.cuda.empty_cache()
    empty_host_cache()
    return HostLink(
        device=str(where),
        device_name=torch.cuda.get_device_name(where),
        to_device_bytes_per_s=to_device,
        to_host_bytes_per_s=to_host,
        size_bytes=size_bytes,
        copies=copies,
    )


def empty_host_cache() -> None:
    """Give back the free pinned blocks of CUDA's caching host allocator:
    ``torch.accelerator.empty_host_cache`` where torch has it (2.13 does),
    ``torch._C._host_emptyCache`` (a CUDA build's) before it."""
    accelerator = getattr(torch, "accelerator", None)
    empty = getattr(accelerator, "empty_host_cache", None)
    if empty is None:
        empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()
