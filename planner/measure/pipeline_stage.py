"""One stage of a pipeline (``torch.distributed.pipelining``) run in its schedule, simulated
or on a real rank (docs/distributed.md, "Pipeline stages"). The stage module is made by
:mod:`planner.measure.stage_split`.

Design notes
------------
* **The stage's step is its schedule.** :class:`StageStep` runs ``Schedule1F1B``,
  ``ScheduleGPipe`` or ``ScheduleInterleaved1F1B`` (the rank's two chunks, each its own
  ``PipelineStage``) over the batch's micro-batches, then the optimizer step: a stage
  holds the saved activations of the micro-batches its schedule keeps in flight, the
  inputs and outputs it keeps for their backward, and the gradients across micro-batches
  exactly as the real rank does, because it is the real rank's step. Its receive buffers
  (one per micro-batch, for activations and for gradients) outlive the step; they are a
  plain attribute of the stage module, so every measurement counts them from the step's
  start (:func:`~planner.measure.tracking.workload_tensors`).
* **Simulated.** On the fake process group (rank ``s`` of ``S``) every send and receive
  returns at once and the received buffers hold what they held; the stage is given its
  input and output shapes (:func:`~planner.measure.stage_split.boundary_metas`, from a
  no-grad forward of the whole model on fake tensors) so that no metadata is exchanged, and
  the schedule's warm-up vote (a collective whose answer a fake group cannot give) is
  skipped there: the stages are static, as on real ranks, where the vote finds them so. A
  real group's send work holds the tensor it sends until the schedule drops the work; the
  fake group's does not, so the simulated sends hold theirs (:class:`_HeldWork`): in 1F1B a
  stage's first output outlives its backward by that (4,096 bytes on tests/data/tp_gpt.py's
  first stage, before).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from planner.core.parallel import (
    ParallelLayout,
    ParallelStrategy,
    PipelineLayout,
    PipelineSchedule,
)
from planner.core.records import Phase
from planner.measure.stage_split import (
    batch_keywords,
    boundary_metas,
    chunk_modules,
    make_stage,
    stage_blocks,
)
from planner.measure.workload import Workload, build_optimizer, module_names

__all__ = [
    "StageStep",
    "pipeline_stage",
    "record_stage_memory",
    "split_into_stage",
    "stage_schedule",
]

logger = logging.getLogger(__name__)


def stage_schedule(
    stage_module: nn.Module,
    pipeline: PipelineLayout,
    stage: int,
    boundaries: tuple[torch.Tensor, ...],
    device: torch.device | str,
    group: Any = None,
) -> tuple[list[Any], Any]:
    """The ``PipelineStage`` objects of ``stage_module`` (made by :func:`make_stage`, its
    plan applied), one per chunk the rank holds (one, but two under interleaved 1F1B:
    :func:`~planner.measure.stage_split.chunk_modules`), and their schedule
    (``Schedule1F1B``, ``ScheduleGPipe`` or ``ScheduleInterleaved1F1B`` over
    ``pipeline.microbatches``, its loss the last chunk's output), on ``group`` (default:
    the world). The chunks' input and output shapes are given (``boundaries``, from
    :func:`boundary_metas`): no metadata is exchanged. Run a step with
    ``schedule.step(**batch_keywords(batch), ...)`` on every rank, the last also given
    ``target`` (any tensor of ``microbatches`` rows) and ``losses``."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    device = torch.device(device)

    def example(meta: torch.Tensor) -> torch.Tensor:
        return torch.empty(meta.shape, dtype=meta.dtype, device=device, requires_grad=True)

    stages: list[Any] = []
    for chunk, module in zip(
        pipeline.chunks_of(stage), chunk_modules(stage_module, pipeline), strict=True
    ):
        inputs = (example(boundaries[chunk - 1]),) if chunk else ()
        outputs = (
            (torch.empty((), device=device, requires_grad=True),)
            if chunk == pipeline.chunks - 1
            else (example(boundaries[chunk]),)
        )
        stages.append(
            PipelineStage(
                module,
                chunk,
                pipeline.chunks,
                device,
                input_args=inputs,
                output_args=outputs,
                group=group,
            )
        )
    if pipeline.schedule is PipelineSchedule.INTERLEAVED_1F1B:
        return stages, ScheduleInterleaved1F1B(
            stages, pipeline.microbatches, loss_fn=lambda loss, target: loss
        )
    kind = ScheduleGPipe if pipeline.schedule is PipelineSchedule.GPIPE else Schedule1F1B
    return stages, kind(stages[0], pipeline.microbatches, loss_fn=lambda loss, target: loss)


class StageStep:
    """A pipeline stage's training step: its schedule over the batch's micro-batches, then
    the optimizer step (the workload's ``step``). Returns the mean of the micro-batches'
    losses on the last stage, a zero elsewhere (made once, before any step)."""

    def __init__(
        self,
        workload: Workload,
        pipeline: PipelineLayout,
        stage: int,
        boundaries: tuple[torch.Tensor, ...],
        *,
        simulated: bool,
        group: Any = None,
    ) -> None:
        self.workload = workload
        self.pipeline = pipeline
        self.stage_index = stage
        device = workload.device
        last = stage == pipeline.stages - 1
        self.stages, self.schedule = stage_schedule(
            workload.model, pipeline, stage, boundaries, device, group
        )
        if simulated:
            self.schedule._warmup_p2p = _static_stages  # type: ignore[method-assign]
        self.simulated = simulated
        self.is_last = last
        self._target = torch.zeros(pipeline.microbatches, device=device)
        self._zero = torch.zeros((), device=device)
        self._phase_ended: Callable[[Phase], None] | None = None
        self._forwards = 0
        forwards = pipeline.microbatches * len(self.stages)
        for pipeline_stage in self.stages:
            pipeline_stage.forward_one_chunk = self._counted(  # type: ignore[method-assign]
                pipeline_stage.forward_one_chunk, forwards
            )

    def _counted(self, forward_one_chunk: Callable[..., Any], forwards: int) -> Any:
        """``forward_one_chunk`` ending the forward phase at the step's last forward."""

        def counted(*args: Any, **kwargs: Any) -> Any:
            output = forward_one_chunk(*args, **kwargs)
            self._forwards += 1
            if self._forwards == forwards and self._phase_ended is not None:
                self._phase_ended(Phase.FORWARD)
            return output

        return counted

    def __call__(self, phase_ended: Callable[[Phase], None] | None = None) -> torch.Tensor:
        workload = self.workload
        workload.optimizer.zero_grad(set_to_none=True)
        self._phase_ended, self._forwards = phase_ended, 0
        keywords = batch_keywords(workload.batch)
        losses: list[torch.Tensor] = []
        holding = _works_hold_their_tensors() if self.simulated else contextlib.nullcontext()
        with holding:
            try:
                if self.is_last:
                    self.schedule.step(
                        target=self._target, losses=losses, return_outputs=False, **keywords
                    )
                else:
                    self.schedule.step(return_outputs=False, **keywords)
            finally:
                self._phase_ended = None
        if phase_ended:
            phase_ended(Phase.BACKWARD)
        workload.optimizer.step()
        if phase_ended:
            phase_ended(Phase.OPTIMIZER)
        # The receive buffers outlive the step (see the module's design notes).
        workload.model._pipeline_buffers = self.buffers()  # type: ignore[assignment]
        if not self.is_last:
            return self._zero
        with torch.no_grad():
            return torch.stack([loss.detach() for loss in losses]).mean()

    def buffers(self) -> list[torch.Tensor]:
        """The stage's receive buffers: activations (on stages after the first) and
        gradients (on stages before the last), one per micro-batch."""
        found = []
        for stage in self.stages:
            for infos in (*stage.args_recv_info.values(), *stage.grad_recv_info.values()):
                for info in infos:
                    buffer = getattr(info, "buffer", None)
                    if isinstance(buffer, torch.Tensor):
                        found.append(buffer)
        return found


class _HeldWork:
    """A send's or receive's work on the fake process group, holding its tensor for as
    long as the schedule holds the work, as a real group's work does (gloo's holds it
    until the work is dropped): a stage's output stays alive until its send's work is let
    go of, after its backward in 1F1B (see the module's design notes)."""

    def __init__(self, work: Any, tensors: list[torch.Tensor]) -> None:
        self._work = work
        self._tensors = tensors

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        return self._work.wait(*args, **kwargs)


@contextlib.contextmanager
def _works_hold_their_tensors() -> Any:
    """Inside: the schedules' sends and receives return :class:`_HeldWork`."""
    from torch.distributed.pipelining import schedules

    batch_p2p = schedules._batch_p2p

    def held(ops: list[Any], desc: str | None = None) -> list[Any]:
        works = batch_p2p(ops, desc=desc)
        if not works:
            return works
        return [_HeldWork(works[0], [op.tensor for op in ops]), *works[1:]]

    schedules._batch_p2p = held  # type: ignore[assignment]
    try:
        yield
    finally:
        schedules._batch_p2p = batch_p2p


def _static_stages(stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
    """The schedule's warm-up on a fake process group: every stage is static (its shapes
    were given), which the vote on real ranks finds (see the module's design notes)."""
    from torch.distributed.pipelining._utils import InferenceMode

    for stage in stages:
        stage._inference_mode = InferenceMode.STATIC


def split_into_stage(
    workload: Workload, pipeline: PipelineLayout, stage: int
) -> tuple[torch.Tensor, ...]:
    """``workload``'s model made stage ``stage`` in place (:func:`make_stage`), its optimizer
    over the stage's parameters. Returns the boundary shapes :func:`pipeline_stage` takes,
    found first on the whole model. Apply the stage's plan after this, before
    :func:`pipeline_stage`, as training does."""
    boundaries = boundary_metas(workload.model, workload.model_file, workload.batch, pipeline)
    make_stage(workload.model, workload.model_file, pipeline, stage)
    workload.module_names = module_names(workload.model)  # the stage's, as applied
    workload.optimizer = build_optimizer(workload.model_file, workload.model)
    return boundaries


def pipeline_stage(
    workload: Workload,
    layout: ParallelLayout,
    stage: int,
    boundaries: tuple[torch.Tensor, ...],
    *,
    simulated: bool = False,
) -> Workload:
    """``workload`` (split by :func:`split_into_stage`, its plan applied) laid out for
    ``layout`` on the running process group: with FSDP2, ``fully_shard`` on the stage's
    blocks and its root over the mesh's ``dp`` dimension (the stage's ranks); then its
    stage's schedule as its step (:class:`StageStep`) over the ``pp`` dimension, and its
    optimizer built again over the stage's (sharded, checkpointed) parameters."""
    assert layout.pipeline is not None
    group = None
    if layout.strategy is ParallelStrategy.FSDP2:
        from torch.distributed.fsdp import fully_shard

        from planner.measure.distributed import device_mesh

        mesh = device_mesh(layout, workload.device.type)
        _, runs = stage_blocks(workload.model, layout.pipeline.chunks, allow_elsewhere=True)
        for name in runs[stage]:
            fully_shard(workload.model.get_submodule(name), mesh=mesh["dp"])
        fully_shard(workload.model, mesh=mesh["dp"])
        group = mesh["pp"].get_group()
    workload.optimizer = build_optimizer(workload.model_file, workload.model)
    workload.step = StageStep(
        workload, layout.pipeline, stage, boundaries, simulated=simulated, group=group
    )
    return workload


def record_stage_memory(
    model_file: Any,
    layout: Any,
    *,
    device_type: str = "cpu",
    seed: int = 0,
    workspace_bytes: int = 0,
    progress: Any = None,
) -> Any:
    """The memory half of the profile of ONE stage (``layout.pipeline.stage``) of a pipeline,
    simulated: rank ``stage`` on a fake process group, on fake tensors, its schedule's step
    recorded (see the module's design notes). The profile records ``layout``."""
    from planner.measure.distributed import _module_types, _with_layout, simulated_ranks
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory

    pipeline = layout.pipeline
    stage = pipeline.stage
    if progress:
        progress(f"simulating {pipeline.describe()}", 0, 0)
    ranks_per_stage = layout.world_size // pipeline.stages
    with simulated_ranks(layout, rank=stage * ranks_per_stage):
        workload, session = build_fake_workload(model_file, device_type, seed)
        with session.running():
            boundaries = split_into_stage(workload, pipeline, stage)
            types = _module_types(workload.model)
            pipeline_stage(workload, layout, stage, boundaries, simulated=True)
        profile = record_memory(
            workload,
            session=session,
            seed=seed,
            warmup_steps=2,
            workspace_bytes=workspace_bytes,
            progress=progress,
        )
    return _with_layout(profile, layout, "the model's blocks split into contiguous stages", types)
