"""The global state a forward starts from, for the places that re-run a forward themselves
(the recomputation probe, the timing of selective options), as ``torch.utils.checkpoint``
does for a recomputation: the RNG state, taken and put back (its ``preserve_rng_state``),
and the autocast regions the forward ran in, entered again (:class:`AutocastState`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

from planner.core.switches import AUTOCAST_OFF

__all__ = ["AutocastState", "RngState"]


@dataclass(frozen=True)
class RngState:
    """The CPU generator's state and, for a CUDA ``device``, that device's."""

    device: torch.device
    cpu: torch.Tensor
    cuda: torch.Tensor | None

    @classmethod
    def now(cls, device: torch.device) -> RngState:
        cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        return cls(device, torch.get_rng_state(), cuda)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)

    @staticmethod
    @contextlib.contextmanager
    def forked(device: torch.device) -> Iterator[None]:
        """Draws inside leave the step's RNG state (CPU's, and ``device``'s) as it was."""
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield


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
