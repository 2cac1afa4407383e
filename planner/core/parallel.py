"""The parallel layout a step is planned for: one rank of a ``torchrun`` job
(docs/architecture.md, "On more than one machine").

A plan made for a job of N ranks describes ONE rank's step: its budget is each rank's peak.
What a rank holds depends on how the job is laid out:

* **DDP** (``DistributedDataParallel``): every rank holds the whole model, its gradients and
  optimizer state, plus DDP's gradient buckets (one flat buffer per bucket, together as large
  as the gradients), into which backward copies each gradient to all-reduce it.
* **FSDP2** (``fully_shard``): each rank holds 1/N of every parameter, gradient and optimizer
  state. A sharded module's parameters are gathered whole just before its forward and freed
  after it, gathered again before its backward (when its recomputation, if it is checkpointed,
  runs with them) and freed after; its gradients are reduce-scattered to their 1/N shards.

A :class:`ParallelLayout` names the world size, the strategy and the device mesh's shape;
profiles and plans record it (``"parallel": {"world_size": 8, "strategy": "fsdp2",
"mesh_shape": [8]}``; absent: one process). Pure Python, no torch.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from planner.core.errors import ParallelLayoutError

__all__ = ["ParallelLayout", "ParallelStrategy", "parallel_from_dict", "parallel_to_dict"]


class ParallelStrategy(str, enum.Enum):
    """How the model is spread over the ranks."""

    DDP = "ddp"
    """``DistributedDataParallel``: replicated model, gradients all-reduced in buckets."""
    FSDP2 = "fsdp2"
    """``fully_shard``: parameters, gradients and optimizer state sharded over the ranks."""


@dataclass(frozen=True)
class ParallelLayout:
    """One rank of a job of ``world_size`` ranks laid out by ``strategy`` on a device mesh of
    ``mesh_shape`` (default: one dimension of ``world_size``; its sizes multiply to it). A
    2-D mesh is FSDP2's HSDP: ``(replicate, shard)``, each parameter sharded over ``shard``
    ranks and the shards replicated over ``replicate`` groups."""

    world_size: int
    strategy: ParallelStrategy
    mesh_shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if (
            not isinstance(self.world_size, int)
            or isinstance(self.world_size, bool)
            or self.world_size < 1
        ):
            raise ParallelLayoutError(
                f"the world size must be a whole number of ranks >= 1, not {self.world_size!r}"
            )
        try:
            object.__setattr__(self, "strategy", ParallelStrategy(self.strategy))
        except ValueError:
            choices = ", ".join(choice.value for choice in ParallelStrategy)
            raise ParallelLayoutError(
                f"the parallel strategy must be one of {choices}, not {self.strategy!r}"
            ) from None
        shape = tuple(self.mesh_shape) or (self.world_size,)
        if any(not isinstance(size, int) or size < 1 for size in shape) or (
            math.prod(shape) != self.world_size
        ):
            raise ParallelLayoutError(
                f"the mesh shape {list(shape)} does not multiply to the world size "
                f"{self.world_size}"
            )
        if len(shape) > 2 or (len(shape) == 2 and self.strategy is ParallelStrategy.DDP):
            raise ParallelLayoutError(
                f"a mesh of shape {list(shape)} is not planned for {self.strategy.value}: "
                "ddp takes one dimension, fsdp2 one or two (REPLICATExSHARD, HSDP)"
            )
        object.__setattr__(self, "mesh_shape", shape)

    def describe(self) -> str:
        """One line for summaries."""
        mesh = "x".join(str(size) for size in self.mesh_shape)
        return f"one rank of {self.world_size} ({self.strategy.value}, mesh {mesh})"


def parallel_to_dict(layout: ParallelLayout | None) -> dict[str, Any] | None:
    """The JSON object plans and profiles record (None: one process)."""
    if layout is None:
        return None
    return {
        "world_size": layout.world_size,
        "strategy": layout.strategy.value,
        "mesh_shape": list(layout.mesh_shape),
    }


def parallel_from_dict(data: Any) -> ParallelLayout | None:
    """The layout of a plan's or profile's ``"parallel"`` object; None (absent) means one
    process. Raises :class:`ParallelLayoutError` for anything else."""
    if data is None:
        return None
    if not isinstance(data, dict) or set(data) - {"world_size", "strategy", "mesh_shape"}:
        raise ParallelLayoutError(
            f'"parallel" should be an object with world_size, strategy and mesh_shape, not {data!r}'
        )
    return ParallelLayout(
        world_size=data.get("world_size"),  # type: ignore[arg-type]
        strategy=data.get("strategy"),  # type: ignore[arg-type]
        mesh_shape=tuple(data.get("mesh_shape") or ()),
    )
