"""The CUDA caching allocator setting a CUDA plan assumes, and the checks that follow from it.

Pure Python (no torch). An out-of-memory error comes from the memory the caching allocator
has *reserved* from the driver, not from the bytes it has handed out to tensors
(``max_memory_allocated``, what a budget bounds): by default it reserves whole segments
(2 MiB for small blocks, 20 MiB and up for large ones) and hands a cached block whose spare
part is under 1 MiB out whole, so reserved can run well above allocated (gpt on an H100:
172 MB allocated, 180 MB reserved; ``reports/benchmarks/cuda_gaps.md``). With
``expandable_segments:True`` the allocator grows one segment per stream by 2 MiB pages
and always splits a block down to the request rounded to 512 bytes, so allocated is the
rounded requests (what the memory model charges) and reserved stays within a few pages of
the allocated peak. A CUDA plan assumes that setting (its ``assumptions`` say so);
``apply_plan`` warns where it is not in effect, and ``ckpt-plan verify`` on a GPU fails a
plan whose reserved peak passes the budget (:func:`reserved_verdict`).

Pinned host memory has an allocator of its own, which offloaded saved tensors go through
(``torch.empty(..., pin_memory=True)``: :mod:`planner.apply.offload`): CUDA's caching host
allocator (``aten/src/ATen/core/CachingHostAllocator.h``, ``CachingHostAllocatorImpl::
allocate``, as in torch 2.13). It rounds every request up to a power of two
(``c10::llvm::PowerOf2Ceil``; the ``pinned_max_round_threshold`` setting, unlimited by
default, bounds that) and never splits a block; a freed block is cached in the free list of
its power of two, reused by the next request of that size once the copies recorded on it
are done, and given back only by ``empty_cache``. So a pinned tensor of 3 MiB holds 4 MiB,
and what a step's host copies hold is the sum of those powers of two
(:func:`pinned_host_bytes`): a CUDA plan's host peak counts them, and its host budget
bounds them (:data:`PINNED_HOST_ASSUMPTION`). The pool the allocator keeps is, per power of
two, the most blocks of that size alive at once: in a plain step, where every offloaded
forward ends before any backward begins, the host peak itself.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ALLOCATOR_ASSUMPTION",
    "ALLOCATOR_SETTING",
    "ALLOCATOR_VARIABLE",
    "PINNED_HOST_ASSUMPTION",
    "ReservedVerdict",
    "expandable_segments_on",
    "missing_setting_warning",
    "pinned_host_bytes",
    "reserved_verdict",
]

ALLOCATOR_VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"
ALLOCATOR_SETTING = "expandable_segments:True"
ALLOCATOR_ASSUMPTION = (
    f"CUDA caching allocator with {ALLOCATOR_VARIABLE}={ALLOCATOR_SETTING} (blocks split "
    "to the request in 512-byte blocks, so the allocated peak is the prediction; reserved "
    "memory stays close to it): set it before the training script starts"
)


PINNED_HOST_ASSUMPTION = (
    "offloaded tensors in pinned host memory from CUDA's caching host allocator, which "
    "takes each request rounded up to a power of two (the host peak and the host budget "
    "count those; planner.core.allocator)"
)


def pinned_host_bytes(size_bytes: int) -> int:
    """What CUDA's caching host allocator takes for a pinned request of ``size_bytes``: the
    smallest power of two at least as large (``PowerOf2Ceil``; nothing for an empty request,
    which allocates no block). See the module notes."""
    if size_bytes < 0:
        raise ValueError(f"size_bytes is a byte count, not {size_bytes}")
    if size_bytes == 0:
        return 0
    return 1 << (size_bytes - 1).bit_length()


def expandable_segments_on(settings: str) -> bool:
    """Whether an allocator settings string (``PYTORCH_CUDA_ALLOC_CONF``'s form:
    ``"expandable_segments:True,max_split_size_mb:128"``) turns expandable segments on
    for the native caching allocator (``backend:cudaMallocAsync`` has none)."""
    options: dict[str, str] = {}
    for item in settings.split(","):
        key, _, value = item.partition(":")
        options[key.strip()] = value.strip()
    if options.get("backend", "native") != "native":
        return False
    return options.get("expandable_segments") == "True"


def missing_setting_warning(settings: str) -> str | None:
    """The one warning to give where a CUDA plan runs without the allocator setting it
    assumes (None where it is in effect). ``settings``: the allocator's settings now."""
    if expandable_segments_on(settings):
        return None
    now = f"it is {settings!r}" if settings else "it is not set"
    return (
        f"this plan assumes {ALLOCATOR_VARIABLE}={ALLOCATOR_SETTING} ({now}): without it the "
        "caching allocator hands out cached blocks whole and reserves whole segments, so "
        "memory can run out above the planned peak; set it in the environment before the "
        "training script starts"
    )


@dataclass(frozen=True)
class ReservedVerdict:
    """What ``verify`` on a GPU says about the allocator's reserved peak."""

    allocated_peak_bytes: int
    reserved_peak_bytes: int
    budget_bytes: int

    @property
    def within_budget(self) -> bool:
        """Both peaks within the budget: reserved is what runs out of memory."""
        return max(self.allocated_peak_bytes, self.reserved_peak_bytes) <= self.budget_bytes

    @property
    def reserved_over_bytes(self) -> int:
        """How far reserved passed the budget (0 where it did not)."""
        return max(0, self.reserved_peak_bytes - self.budget_bytes)


def reserved_verdict(
    allocated_peak_bytes: int, reserved_peak_bytes: int, budget_bytes: int
) -> ReservedVerdict:
    """The verdict on one measured step's peaks against the budget (see
    :class:`ReservedVerdict`)."""
    if min(allocated_peak_bytes, reserved_peak_bytes, budget_bytes) < 0:
        raise ValueError("peaks and budget are byte counts: none can be negative")
    return ReservedVerdict(allocated_peak_bytes, reserved_peak_bytes, budget_bytes)
