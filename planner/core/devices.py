"""Device names as torch writes them (``cpu``, ``cuda``, ``cuda:1``), read without torch."""

from __future__ import annotations

__all__ = ["device_type"]


def device_type(device: str) -> str:
    """The type of the device named ``device``: ``cuda`` for ``cuda:1``, ``cpu`` for ``cpu``."""
    return device.split(":")[0]
