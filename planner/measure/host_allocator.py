"""Time CPU steps on a host allocator that keeps freed memory for reuse.

On Linux, glibc's ``malloc`` gives freed memory back to the operating system: large blocks
(above a threshold that it adjusts as it goes, up to 32 MiB) are ``mmap``-ed and unmapped
one by one, and the top of the heap is trimmed when enough of it is free. A training step
frees tens of MiB of activations and allocates them again in the next step, so every step
takes page faults for memory it had a moment ago, and how many depends on where the heap
happened to end up: timed that way, a recomputation costs what the faults of that moment
cost, and the same plan's overhead differs from one process to the next.

:func:`steady_host_allocator` keeps freed memory in the process while times are taken: no
trimming, and ``mmap`` only above glibc's largest threshold (32 MiB), so that once the
heap has grown the same blocks are reused. That is how CUDA's caching allocator behaves on
a GPU, and what the tcmalloc or jemalloc that PyTorch's CPU performance guide recommends
do; a step's compute, not the operating system's bookkeeping, is then what the times
compare. The measured faults and spreads, with glibc's defaults and with this allocator:
docs/results.md, "The host allocator" (``benchmarks/host_allocator.py``).

Design notes
------------
* **Only glibc, only CPU.** ``mallopt`` is glibc's; elsewhere (macOS, musl) nothing is
  changed and the context says so (``False``). On CUDA the step's memory is the device's.
* **Left as glibc would have it.** glibc cannot report its settings, so they cannot be put
  back as they were. On exit trimming is set to 64 MiB, twice the mmap threshold, which is
  where glibc's own adjustment ends after the first freed 32 MiB block, and
  ``malloc_trim`` returns what the timing held: the process goes on as a long-running
  glibc process would, not with memory it will never give back.
* **Memory figures do not change.** The budget counts live tensor storages (CPU), which
  the allocator's policy does not touch; only the resident set of the process stays at its
  high-water mark while the context is open.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
from collections.abc import Iterator

__all__ = ["steady_host_allocator"]

logger = logging.getLogger(__name__)

# mallopt(3) parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_LARGEST_MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
_TRIM_THRESHOLD_AFTER_BYTES = 2 * _LARGEST_MMAP_THRESHOLD_BYTES


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    needed = ("gnu_get_libc_version", "mallopt", "malloc_trim")
    return libc if all(hasattr(libc, name) for name in needed) else None


@contextlib.contextmanager
def steady_host_allocator(device_type: str = "cpu") -> Iterator[bool]:
    """While open, the process keeps freed host memory for reuse (see the module notes).
    Yields whether that was arranged: ``False`` off CPU or without glibc."""
    libc = _glibc() if device_type == "cpu" else None
    if libc is None:
        yield False
        return
    applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, _LARGEST_MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, -1)  # -1: never trim
    )
    if not applied:
        logger.info("glibc refused the allocator settings for timing; timing without them")
    try:
        yield applied
    finally:
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_AFTER_BYTES)
        libc.malloc_trim(0)
