"""Device names as torch writes them (``cpu``, ``cuda``, ``cuda:1``), read without torch; and
the host memory this machine has free."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["available_host_memory_bytes", "device_type"]


def device_type(device: str) -> str:
    """The type of the device named ``device``: ``cuda`` for ``cuda:1``, ``cpu`` for ``cpu``."""
    return device.split(":")[0]


def available_host_memory_bytes() -> int:
    """The memory this machine can give a process now without swapping: Linux's
    ``MemAvailable`` (free memory and the caches it can drop), else the free pages
    (``sysconf``), else 0 where neither can be read."""
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
