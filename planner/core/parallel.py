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
* **Tensor parallelism** (``parallelize_module`` with torchtitan-style plans, on the mesh's
  last dimension, ``"tp"``): each rank of a TP group holds 1/T of each parallelized weight
  (column- or row-wise) and of the activations between blocks (sequence parallelism); the
  all-gathers before the column-wise projections make whole-sequence activations, saved for
  backward. Alone (strategy ``tp``: T = the world size) or under FSDP2, whose data-parallel
  dimension(s) come first: ``(dp, tp)``, or HSDP's ``(replicate, shard, tp)``.

A :class:`ParallelLayout` names the world size, the strategy, the device mesh's shape and
the TP degree; profiles and plans record it (``"parallel": {"world_size": 8, "strategy":
"fsdp2", "mesh_shape": [4, 2], "tp": 2}``; ``tp`` absent: 1; absent altogether: one
process). Pure Python, no torch.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from planner.core.errors import ParallelLayoutError

__all__ = [
    "ParallelLayout",
    "ParallelStrategy",
    "PipelineLayout",
    "PipelineSchedule",
    "parallel_from_dict",
    "parallel_to_dict",
]


class ParallelStrategy(str, enum.Enum):
    """How the model is spread over the ranks."""

    DDP = "ddp"
    """``DistributedDataParallel``: replicated model, gradients all-reduced in buckets."""
    FSDP2 = "fsdp2"
    """``fully_shard``: parameters, gradients and optimizer state sharded over the ranks."""
    TP = "tp"
    """Tensor parallelism alone: every rank in one TP group, no data-parallel dimension."""
    PP = "pp"
    """Pipeline stages alone: rank ``s`` holds stage ``s`` (:class:`PipelineLayout`)."""


class PipelineSchedule(str, enum.Enum):
    """The ``torch.distributed.pipelining`` schedule a pipeline runs its micro-batches in."""

    ONE_F_ONE_B = "1f1b"
    """``Schedule1F1B``: stage ``s`` of ``S`` runs ``min(M, S - s)`` forwards, then
    alternates one backward and one forward: that many micro-batches in flight."""
    GPIPE = "gpipe"
    """``ScheduleGPipe``: every forward, then every backward: ``M`` in flight on each stage."""
    INTERLEAVED_1F1B = "interleaved-1f1b"
    """``ScheduleInterleaved1F1B``: the blocks split into ``V * S`` chunks, rank ``s`` holding
    chunks ``s, s + S, ...`` (``V`` virtual stages a rank), 1F1B over them depth first."""


@dataclass(frozen=True)
class PipelineLayout:
    """A pipeline of ``stages`` stages running ``microbatches`` micro-batches per step in
    ``schedule``; ``stage``: the one stage a profile or a stage's plan is for (None: the
    whole pipeline, a plan holding every stage's). Pure data (docs/distributed.md,
    "Pipeline stages")."""

    stages: int
    microbatches: int
    schedule: PipelineSchedule = PipelineSchedule.ONE_F_ONE_B
    stage: int | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "schedule", PipelineSchedule(self.schedule))
        except ValueError:
            choices = ", ".join(choice.value for choice in PipelineSchedule)
            raise ParallelLayoutError(
                f"the pipeline schedule must be one of {choices}, not {self.schedule!r}"
            ) from None
        for name in ("stages", "microbatches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ParallelLayoutError(
                    f"the pipeline's {name} must be a whole number >= 1, not {value!r}"
                )
        if self.stages < 2:
            raise ParallelLayoutError("a pipeline has at least 2 stages (--pp 2 or more)")
        if self.schedule is PipelineSchedule.ONE_F_ONE_B and self.microbatches < self.stages:
            raise ParallelLayoutError(
                f"1F1B runs at least as many micro-batches as stages: --microbatches "
                f"{self.microbatches} is fewer than --pp {self.stages}"
            )
        rounds = max(1, self.microbatches // self.stages)
        if self.schedule is PipelineSchedule.INTERLEAVED_1F1B and self.microbatches % rounds:
            raise ParallelLayoutError(
                f"interleaved 1F1B runs the micro-batches in rounds of --pp {self.stages}: "
                f"--microbatches {self.microbatches} is not a multiple of its "
                f"{rounds} rounds (use a multiple of {self.stages})"
            )
        if self.stage is not None and not 0 <= self.stage < self.stages:
            raise ParallelLayoutError(
                f"stage {self.stage} is not one of the pipeline's {self.stages} stages"
            )

    def in_flight(self, stage: int) -> int:
        """How many micro-batches' activations stage ``stage`` holds at most: 1F1B's warm-up
        forwards, ``min(M, S - stage)`` (``S - stage``: 1F1B needs ``M >= S``); GPipe's,
        all ``M``; interleaved 1F1B's, in chunk micro-batches (each one chunk's),
        ``ScheduleInterleaved1F1B``'s warm-up forwards and one:
        ``(V - 1) * M / rounds + 2 * (S - 1 - stage) + 1``, at most ``V * M``."""
        if self.schedule is PipelineSchedule.GPIPE:
            return self.microbatches
        if self.schedule is PipelineSchedule.INTERLEAVED_1F1B:
            per_round = self.microbatches // max(1, self.microbatches // self.stages)
            warmup = (self.virtual_stages - 1) * per_round + 2 * (self.stages - 1 - stage)
            return min(self.virtual_stages * self.microbatches, warmup + 1)
        return min(self.microbatches, self.stages - stage)

    @property
    def virtual_stages(self) -> int:
        """The chunks each rank holds: 2 under interleaved 1F1B, else 1."""
        return 2 if self.schedule is PipelineSchedule.INTERLEAVED_1F1B else 1

    @property
    def chunks(self) -> int:
        """How many contiguous chunks the blocks are split into: ``virtual_stages * S``."""
        return self.stages * self.virtual_stages

    def chunks_of(self, stage: int) -> tuple[int, ...]:
        """The chunks rank (stage) ``stage`` holds: ``stage, stage + S, ...`` (one, itself,
        but under interleaved 1F1B)."""
        return tuple(stage + index * self.stages for index in range(self.virtual_stages))

    def describe(self) -> str:
        which = f"stage {self.stage} of " if self.stage is not None else ""
        virtual = f" x {self.virtual_stages} virtual" if self.virtual_stages > 1 else ""
        return (
            f"{which}{self.stages}{virtual} pipeline stages, {self.microbatches} "
            f"micro-batches, {self.schedule.value}"
        )


# The device mesh's dimension names, by the number of data-parallel dimensions; a TP
# dimension, where there is one, is last and named "tp".
_DATA_DIM_NAMES = {0: (), 1: ("dp",), 2: ("replicate", "shard")}


@dataclass(frozen=True)
class ParallelLayout:
    """One rank of a job of ``world_size`` ranks laid out by ``strategy`` on a device mesh of
    ``mesh_shape`` (its sizes multiply to the world size), with tensor parallelism of degree
    ``tp`` on the mesh's last dimension where ``tp`` > 1.

    Without TP the mesh is data-parallel only: one dimension of ``world_size`` by default,
    or FSDP2's HSDP ``(replicate, shard)``, each parameter sharded over ``shard`` ranks and
    the shards replicated over ``replicate`` groups. With ``tp`` (FSDP2 only) the default
    mesh is ``(world_size / tp, tp)``, and a given one is the data-parallel dimensions with
    ``tp`` last. Strategy ``tp`` is TP alone: ``tp`` is the world size, the mesh ``(tp,)``."""

    world_size: int
    strategy: ParallelStrategy
    mesh_shape: tuple[int, ...] = ()
    tp: int = 1
    pipeline: PipelineLayout | None = None

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
        if not isinstance(self.tp, int) or isinstance(self.tp, bool) or self.tp < 1:
            raise ParallelLayoutError(
                f"the tensor-parallel degree must be a whole number >= 1, not {self.tp!r}"
            )
        if self.strategy is ParallelStrategy.PP and self.pipeline is None:
            raise ParallelLayoutError("strategy pp needs a pipeline (--pp S --microbatches M)")
        if self.pipeline is not None:
            self._check_pipeline(self.pipeline)
            return
        if self.strategy is ParallelStrategy.TP:
            if self.tp not in (1, self.world_size):
                raise ParallelLayoutError(
                    f"tensor parallelism alone puts every rank in one TP group: tp "
                    f"{self.tp} is not the world size {self.world_size} (with data "
                    "parallelism too: --parallel fsdp2 --tp N)"
                )
            object.__setattr__(self, "tp", self.world_size)
        elif self.tp > 1 and self.strategy is ParallelStrategy.DDP:
            raise ParallelLayoutError(
                "tensor parallelism is planned alone (--tp N) or under FSDP2 (--parallel fsdp2 "
                "--tp N), not under ddp (DistributedDataParallel does not take the sharded "
                "parameters TP makes)"
            )
        elif self.tp > 1 and self.world_size % self.tp:
            raise ParallelLayoutError(
                f"the tensor-parallel degree {self.tp} does not divide the world size "
                f"{self.world_size}"
            )
        default = (self.world_size // self.tp, self.tp) if self.tp > 1 else (self.world_size,)
        if self.strategy in (ParallelStrategy.TP, ParallelStrategy.PP):
            default = (self.world_size,)
        shape = tuple(self.mesh_shape) or default
        if any(not isinstance(size, int) or size < 1 for size in shape) or (
            math.prod(shape) != self.world_size
        ):
            raise ParallelLayoutError(
                f"the mesh shape {list(shape)} does not multiply to the world size "
                f"{self.world_size}"
            )
        has_tp_dim = self.strategy is ParallelStrategy.TP or self.tp > 1
        if has_tp_dim and shape[-1] != self.tp:
            raise ParallelLayoutError(
                f"the mesh shape {list(shape)} does not end in the tensor-parallel degree {self.tp}"
            )
        data_dims = len(shape) - has_tp_dim
        if (
            data_dims > 2
            or (data_dims == 2 and self.strategy is ParallelStrategy.DDP)
            or (self.strategy is ParallelStrategy.TP and data_dims)
        ):
            raise ParallelLayoutError(
                f"a mesh of shape {list(shape)} is not planned for {self.strategy.value}: "
                "ddp takes one dimension, fsdp2 one or two (REPLICATExSHARD, HSDP), each "
                "followed by the tp dimension with --tp"
            )
        object.__setattr__(self, "mesh_shape", shape)

    def _check_pipeline(self, pipeline: PipelineLayout) -> None:
        """A pipeline's mesh: ``(pp,)`` alone, one rank per stage; ``(pp, dp)`` with FSDP2,
        each stage sharded over ``dp`` ranks (the stage of rank r is r // dp)."""
        stages = pipeline.stages
        if self.strategy not in (ParallelStrategy.PP, ParallelStrategy.FSDP2) or self.tp != 1:
            raise ParallelLayoutError(
                "pipeline stages are planned alone (--pp S) or with FSDP2 (--pp S "
                "--world-size N --parallel fsdp2), not with ddp or tensor parallelism yet"
            )
        if self.strategy is ParallelStrategy.FSDP2 and pipeline.virtual_stages > 1:
            raise ParallelLayoutError(
                "--schedule interleaved-1f1b is planned for pipeline stages alone, not yet "
                "with --parallel fsdp2: use 1f1b or gpipe with FSDP2"
            )
        if self.world_size % stages:
            raise ParallelLayoutError(
                f"{stages} pipeline stages do not divide the world size {self.world_size}"
            )
        data = self.world_size // stages
        if self.strategy is ParallelStrategy.PP and data != 1:
            raise ParallelLayoutError(
                f"a pipeline of {stages} stages alone is {stages} ranks, one stage each, not "
                f"{self.world_size} (with data parallelism too: --parallel fsdp2)"
            )
        shape = (stages,) if self.strategy is ParallelStrategy.PP else (stages, data)
        if self.mesh_shape and tuple(self.mesh_shape) != shape:
            raise ParallelLayoutError(
                f"the mesh of {stages} pipeline stages over {self.world_size} ranks is "
                f"{list(shape)}, not {list(self.mesh_shape)}"
            )
        object.__setattr__(self, "mesh_shape", shape)

    def stage_of_rank(self, rank: int) -> int:
        """The pipeline stage rank ``rank`` holds (the mesh is ``(pp, dp)``, row-major)."""
        if self.pipeline is None:
            raise ParallelLayoutError("this layout has no pipeline stages")
        return rank // (self.world_size // self.pipeline.stages)

    @property
    def data_mesh_shape(self) -> tuple[int, ...]:
        """The mesh's data-parallel dimensions (all but the TP one; none for TP or PP
        alone)."""
        if self.pipeline is not None:
            return self.mesh_shape[1:]
        if self.strategy is ParallelStrategy.TP or self.tp > 1:
            return self.mesh_shape[:-1]
        return self.mesh_shape

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        """The device mesh's dimension names, as the model file's ``parallelize`` finds
        them: ``("dp",)``, HSDP's ``("replicate", "shard")``, then ``"tp"`` where the
        layout has a TP dimension (``("tp",)``, ``("dp", "tp")``, ...)."""
        if self.pipeline is not None:
            return ("pp",) if self.strategy is ParallelStrategy.PP else ("pp", "dp")
        names = _DATA_DIM_NAMES[len(self.data_mesh_shape)]
        if len(self.data_mesh_shape) < len(self.mesh_shape):
            names = (*names, "tp")
        return names

    def describe(self) -> str:
        """One line for summaries."""
        if self.pipeline is not None:
            data = self.world_size // self.pipeline.stages
            each = "one rank each" if data == 1 else f"each FSDP2-sharded over {data} ranks"
            return f"{self.pipeline.describe()} ({each}; {self.world_size} ranks)"
        mesh = "x".join(str(size) for size in self.mesh_shape)
        tp = f", tp {self.tp}" if self.tp > 1 and self.strategy is not ParallelStrategy.TP else ""
        return f"one rank of {self.world_size} ({self.strategy.value}, mesh {mesh}{tp})"

    def command_options(self) -> str:
        """The ``ckpt-plan profile`` options that plan this layout."""
        if self.strategy is ParallelStrategy.TP:
            return f"--tp {self.tp}"
        if self.pipeline is not None:
            pipeline = self.pipeline
            options = (
                f"--pp {pipeline.stages} --microbatches {pipeline.microbatches} "
                f"--schedule {pipeline.schedule.value}"
            )
            if self.strategy is ParallelStrategy.FSDP2:
                options += f" --world-size {self.world_size} --parallel fsdp2"
            return options
        options = f"--world-size {self.world_size} --parallel {self.strategy.value}"
        if len(self.data_mesh_shape) == 2:
            options += " --mesh " + "x".join(str(size) for size in self.data_mesh_shape)
        if self.tp > 1:
            options += f" --tp {self.tp}"
        return options


def parallel_to_dict(layout: ParallelLayout | None) -> dict[str, Any] | None:
    """The JSON object plans and profiles record (None: one process)."""
    if layout is None:
        return None
    data: dict[str, Any] = {
        "world_size": layout.world_size,
        "strategy": layout.strategy.value,
        "mesh_shape": list(layout.mesh_shape),
    }
    if layout.tp > 1:  # absent: 1, as in plans written before tensor parallelism
        data["tp"] = layout.tp
    if layout.pipeline is not None:  # absent: no pipeline
        pipeline = layout.pipeline
        data["pipeline"] = {
            "stages": pipeline.stages,
            "microbatches": pipeline.microbatches,
            "schedule": pipeline.schedule.value,
            "stage": pipeline.stage,
        }
    return data


def parallel_from_dict(data: Any) -> ParallelLayout | None:
    """The layout of a plan's or profile's ``"parallel"`` object; None (absent) means one
    process. Raises :class:`ParallelLayoutError` for anything else."""
    if data is None:
        return None
    known = {"world_size", "strategy", "mesh_shape", "tp", "pipeline"}
    if not isinstance(data, dict) or set(data) - known:
        raise ParallelLayoutError(
            '"parallel" should be an object with world_size, strategy, mesh_shape and '
            f"(optional) tp and pipeline, not {data!r}"
        )
    pipeline = data.get("pipeline")
    if pipeline is not None and (
        not isinstance(pipeline, dict)
        or set(pipeline) - {"stages", "microbatches", "schedule", "stage"}
    ):
        raise ParallelLayoutError(
            '"pipeline" should be an object with stages, microbatches, schedule and stage, '
            f"not {pipeline!r}"
        )
    return ParallelLayout(
        world_size=data.get("world_size"),  # type: ignore[arg-type]
        strategy=data.get("strategy"),  # type: ignore[arg-type]
        mesh_shape=tuple(data.get("mesh_shape") or ()),
        tp=data.get("tp", 1),
        pipeline=None
        if pipeline is None
        else PipelineLayout(
            stages=pipeline.get("stages"),  # type: ignore[arg-type]
            microbatches=pipeline.get("microbatches"),  # type: ignore[arg-type]
            schedule=pipeline.get("schedule", "1f1b"),
            stage=pipeline.get("stage"),
        ),
    )
