"""The global RNG state a forward starts from, taken and put back: what
``torch.utils.checkpoint``'s ``preserve_rng_state`` does for a recomputation, for the places
that re-run a forward themselves (the recomputation probe, the timing of selective options;
the autocast regions they re-enter: :mod:`planner.apply.autocast`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = ["RngState"]


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
