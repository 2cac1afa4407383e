"""The autocast regions a forward ran in, entered again: what ``torch.utils.checkpoint``
does for a recomputation, for the places that re-run a forward themselves (the recomputation
probe, the timing of selective options), and what the recorded step and the first training
forward compare (:attr:`planner.core.switches.StepSwitches.autocast`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import torch

from planner.core.switches import AUTOCAST_OFF

__all__ = ["AutocastState"]

_AUTOCAST_DEVICES = ("cpu", "cuda")


class AutocastState(NamedTuple):
    """The autocast regions open when a forward ran, ``(device type, dtype, cache
    enabled)`` for each device autocasting then. Re-run outside them, a forward under
    ``torch.autocast`` (``Trainer(bf16=True)``) hands its float32 layers bf16 inputs they
    were cast for and fails, or saves other tensors."""

    regions: tuple[tuple[str, torch.dtype, bool], ...]

    @classmethod
    def now(cls) -> AutocastState:
        cache = torch.is_autocast_cache_enabled()
        return cls(
            tuple(
                (device, torch.get_autocast_dtype(device), cache)
                for device in _AUTOCAST_DEVICES
                if torch.is_autocast_enabled(device)
            )
        )

    @property
    def dtype_name(self) -> str:
        """The dtype the regions cast to (``bfloat16``), :data:`AUTOCAST_OFF` for none (what
        :attr:`~planner.core.switches.StepSwitches.autocast` records)."""
        if not self.regions:
            return AUTOCAST_OFF
        return str(self.regions[0][1]).removeprefix("torch.")

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for device_type, dtype, cache_enabled in self.regions:
                stack.enter_context(torch.autocast(device_type, dtype, cache_enabled=cache_enabled))
            yield
