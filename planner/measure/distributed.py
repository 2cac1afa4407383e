"""One rank of a ``torchrun`` job, simulated in one process or run for real
(docs/architecture.md, "On more than one machine"; docs/distributed.md;
:mod:`planner.core.parallel` for what a rank holds). What DDP adds to a rank, and how the
model file's DDP is read, is :mod:`planner.measure.ddp`.

Design notes
------------
* **Simulated ranks.** :func:`simulated_ranks` starts torch's *fake* process group
  (``torch.testing._internal.distributed.fake_pg``: every collective returns at once, with
  its output buffers allocated and left as they are) as rank 0 of the layout's world size, as
  ``torch.distributed._tools.fsdp2_mem_tracker`` does. Under it ``fully_shard`` shards for
  real: each rank's 1/N shards of the parameters, the gradients and the optimizer state, the
  gathered parameters, the all-gather and reduce-scatter buffers are allocated as on a real
  rank, on fake tensors as well as real ones, so the recorded timeline is one rank's. The
  values are not a real rank's (nothing is summed across ranks), which the memory of a step
  does not depend on.
* **Order.** A plan is applied before sharding: :func:`parallelized` takes the model with the
  plan already on it, so the step recorded for a plan (and the step checked on real ranks) is
  made the way training makes it: ``apply_plan``, then ``parallelize``, then the optimizer
  over the sharded parameters.
* **FSDP2's gathered parameters** are freed by resizing their storage to nothing and
  gathered again by resizing it back (no op the dispatcher sees):
  :class:`~planner.measure.tracking.StorageWatcher` counts those resizes. Its hooks run
  around each sharded module's forward as the hooks of a user's module do: the gather before
  the module's forward begins and the free inside it, so the memory model's replay of a
  checkpointed block holds its parameters gathered during recomputation exactly as the
  unplanned step held them during its backward (FSDP gathers them before the backward that
  triggers the recomputation).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from planner.core.errors import ModelFileError, ParallelLayoutError, ProfilingError
from planner.core.loop import PLAIN_LOOP, LoopShape
from planner.core.parallel import ParallelLayout, ParallelStrategy
from planner.core.records import Note, NoteTopic, Profile
from planner.measure.candidates import find_blocks
from planner.measure.ddp import (
    _call_parallelize,
    _check_ddp_of_the_model,
    _ddp_intercepted,
    _DdpCaptured,
    _no_communication_hook,
    ddp_bucket_bytes,
    ddp_options,
    gradients_into_buckets,
)
from planner.measure.model_file import ModelFile
from planner.measure.workload import Workload, build_optimizer, module_names

if TYPE_CHECKING:
    from planner.measure.profiler import ProgressCallback

__all__ = [
    "device_mesh",
    "is_sharded",
    "parallelized",
    "record_rank_memory",
    "running_layout",
    "simulated_ranks",
]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def simulated_ranks(layout: ParallelLayout, *, rank: int = 0) -> Iterator[None]:
    """Run the block as rank ``rank`` (default 0) of ``layout.world_size`` ranks on a fake
    process group (see the module's design notes). Refused inside a process group that
    already exists (a real job: plan before launching it, or in a separate process)."""
    if dist.is_initialized():
        raise ParallelLayoutError(
            "a process group is already running in this process; plan for a parallel layout "
            "before launching the job (ckpt-plan profile ... --world-size N --parallel ...)"
        )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def running_layout() -> tuple[int, int] | None:
    """(rank, world size) of the process group this process runs in, or None outside one."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(), dist.get_world_size()


def device_mesh(layout: ParallelLayout, device_type: str) -> Any:
    """The layout's device mesh on the running process group, its dimensions named by
    :attr:`~planner.core.parallel.ParallelLayout.mesh_dim_names` (1-D: ``("dp",)``; HSDP's
    ``("replicate", "shard")``; with tensor parallelism ``"tp"`` last: ``("tp",)``, ``("dp",
    "tp")``, ...). Made outside fake mode, also on a fake session: a mesh finds this rank's
    row by computing with its tensor of ranks, and on a fake tensor the row found is garbage
    (a 2-D mesh fails; HSDP)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh

    with unset_fake_temporarily():
        return init_device_mesh(
            device_type, layout.mesh_shape, mesh_dim_names=layout.mesh_dim_names
        )


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is already laid out for a job: sharded by ``fully_shard`` (its
    parameters are ``DTensor`` shards, or it is an ``FSDPModule``) or wrapped in DDP."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return True
    return any(isinstance(m, FSDPModule) for m in model.modules()) or any(
        isinstance(p, DTensor) for p in model.parameters()
    )


def _default_parallelize(
    model: torch.nn.Module, layout: ParallelLayout, mesh: Any, model_file: ModelFile
) -> torch.nn.Module:
    """Without the model file's ``parallelize``: ``fully_shard`` on each block
    (:func:`~planner.measure.candidates.find_blocks`) and then the root, or DDP with its
    default buckets. Tensor parallelism has a default only for a Hugging Face Llama-family
    model (``--hf``: :func:`~planner.measure.tensor_parallel.parallelize_hf_llama`): which
    weights a model file's model splits, and how, is its own."""
    if layout.tp > 1 or layout.strategy is ParallelStrategy.TP:
        if model_file.source.is_hugging_face:
            from planner.measure.tensor_parallel import parallelize_hf_llama

            return parallelize_hf_llama(model, mesh)
        raise ModelFileError(
            f"{model_file.path} defines no parallelize(model, mesh), and tensor parallelism "
            f"({layout.command_options()}) needs one: define it, applying "
            'parallelize_module(model, mesh["tp"], plan) (and fully_shard over the mesh\'s '
            "data-parallel dimensions with --parallel fsdp2)"
        )
    if layout.strategy is ParallelStrategy.DDP:
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for name in find_blocks(model):
        fully_shard(model.get_submodule(name), mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def parallelized(
    workload: Workload, layout: ParallelLayout, *, simulated: bool = False
) -> Workload:
    """``workload`` laid out for ``layout`` on the running process group: with FSDP2 or
    tensor parallelism its model given to the model file's ``parallelize(model, mesh)``
    where it defines one, else (and always with DDP, whose layout is its wrapper) to
    :func:`_default_parallelize`; its optimizer built again over the sharded parameters
    (before any step). Apply a plan to ``workload.model`` before this, as training does.
    ``simulated``: the process group is fake (DDP then all-reduces nothing; see the
    module's design notes)."""
    model_file: ModelFile = workload.model_file
    mesh = device_mesh(layout, workload.device.type)
    model = workload.model
    if model_file.parallelize is not None:
        if layout.strategy is not ParallelStrategy.DDP:
            try:
                with _ddp_intercepted():
                    result = _call_parallelize(model_file, model, mesh)
            except _DdpCaptured:
                raise ModelFileError(
                    f"parallelize() in {model_file.path} builds DistributedDataParallel, but "
                    f"the plan is for {layout.command_options()}: plan with --parallel ddp"
                ) from None
        else:
            result = _call_parallelize(model_file, model, mesh)
        model = result if isinstance(result, torch.nn.Module) else model
        if layout.strategy is ParallelStrategy.DDP:
            _check_ddp_of_the_model(model_file, model, workload.model)
        elif layout.tp > 1:
            _check_tensor_parallel(model_file, model, layout)
    else:
        model = _default_parallelize(model, layout, mesh, model_file)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and simulated:
        model.register_comm_hook(None, _no_communication_hook)
    workload.model = model
    workload.module_names = module_names(model)  # DDP's "module." prefix, as laid out
    workload.optimizer = build_optimizer(model_file, model)
    return workload


def _check_tensor_parallel(
    model_file: ModelFile, model: torch.nn.Module, layout: ParallelLayout
) -> None:
    """With tensor parallelism, ``parallelize`` must shard some parameter over the mesh's
    ``"tp"`` dimension by TP: a model file that ignores it would be planned as if it did not.
    TP's shard of a parameter is on the ``tp`` dimension, and under FSDP2 also sharded over
    the data-parallel ones (``fully_shard`` given the whole mesh instead shards over ``tp``
    and replicates over ``dp``: HSDP, not TP)."""
    from torch.distributed.tensor import DTensor, Replicate

    for parameter in model.parameters():
        if not isinstance(parameter, DTensor):
            continue
        mesh = parameter.device_mesh
        names = mesh.mesh_dim_names or ()
        if "tp" in names:
            tp_dim = names.index("tp")
        elif mesh.ndim == len(layout.mesh_shape):
            tp_dim = mesh.ndim - 1
        else:
            continue
        placements = list(parameter.placements)
        on_tp = placements.pop(tp_dim)
        if not isinstance(on_tp, Replicate) and (
            not placements or not all(isinstance(p, Replicate) for p in placements)
        ):
            return
    raise ModelFileError(
        f'parallelize() in {model_file.path} shards no parameter over the mesh\'s "tp" '
        f"dimension by tensor parallelism, but the plan is for {layout.command_options()}: "
        'apply parallelize_module(model, mesh["tp"], ...) in it (and fully_shard over the '
        "data-parallel dimensions only), or plan without --tp"
    )


def record_rank_memory(
    model_file: ModelFile,
    layout: ParallelLayout,
    *,
    device_type: str = "cpu",
    seed: int = 0,
    loop: LoopShape = PLAIN_LOOP,
    budget_bytes: int | None = None,
    workspace_bytes: int = 0,
    progress: ProgressCallback | None = None,
    expert_load: float = 1.0,
) -> Profile:
    """The memory half of a profile of ONE rank of ``layout`` (times not taken: ``cost_source``
    ``none``), recorded in this process on simulated ranks (see the module's design notes):
    on fake tensors, or where fake tensors cannot run the step, on real ones, stopped if a
    real step passes ``budget_bytes``. The profile records ``layout``."""
    from planner.measure.fake import FakeExecutionError, build_fake_workload
    from planner.measure.profiler import record_memory
    from planner.measure.tracking import MemoryLimitExceeded
    from planner.measure.workload import build_workload

    if layout.pipeline is not None:
        from planner.measure.pipeline_stage import record_stage_memory

        if loop != PLAIN_LOOP:
            raise ParallelLayoutError(
                "a pipeline stage's step is its schedule's: plan it in the plain loop "
                "(without --zero-grad-after-forward or --grad-accum)"
            )
        return record_stage_memory(
            model_file,
            layout,
            device_type=device_type,
            seed=seed,
            workspace_bytes=workspace_bytes,
            progress=progress,
        )
    if loop.no_sync and layout.strategy is ParallelStrategy.TP:
        raise ParallelLayoutError(
            "--no-sync skips the data-parallel gradient sync, and tensor parallelism alone "
            "has none: plan it with --grad-accum alone, or with --parallel fsdp2 --tp T"
        )
    if progress:
        progress(f"simulating {layout.describe()}", 0, 0)
    with simulated_ranks(layout):
        try:
            workload, session = build_fake_workload(
                model_file, device_type, seed, loop=loop, expert_load=expert_load
            )
            if layout.strategy is ParallelStrategy.DDP:
                # DDP cannot be built on fake tensors; its rank is the step plus its buckets.
                with session.running():
                    bucket_bytes, around_steps, how = _ddp_rank(workload, layout)
                profile = record_memory(
                    workload,
                    session=session,
                    seed=seed,
                    workspace_bytes=workspace_bytes,
                    bucket_bytes=bucket_bytes,
                    around_steps=around_steps,
                    progress=progress,
                )
                return _with_layout(profile, layout, how, _module_types(workload.model))
            types = _module_types(workload.model)
            with session.running():
                parallelized(workload, layout, simulated=True)
            profile = record_memory(
                workload,
                session=session,
                seed=seed,
                warmup_steps=2,
                workspace_bytes=workspace_bytes,
                progress=progress,
            )
            return _with_layout(profile, layout, _fsdp2_layout(model_file, layout), types)
        except FakeExecutionError as error:
            logger.warning("%s; recording a real step of the rank instead", error)
        workload = build_workload(model_file, device=device_type, seed=seed, loop=loop)
        bucket_bytes = 0
        types = _module_types(workload.model)
        around_steps = None
        if layout.strategy is ParallelStrategy.DDP:
            bucket_bytes, around_steps, how = _ddp_rank(workload, layout)
        else:
            parallelized(workload, layout, simulated=True)
            how = _fsdp2_layout(model_file, layout)
        try:
            profile = record_memory(
                workload,
                seed=seed,
                warmup_steps=2,
                limit_bytes=budget_bytes,
                workspace_bytes=workspace_bytes,
                bucket_bytes=bucket_bytes,
                around_steps=around_steps,
                progress=progress,
            )
        except MemoryLimitExceeded as over:
            raise ProfilingError(
                f"fake tensors cannot run this step, and a real unplanned step of one rank "
                f"needs more than the budget ({over}): avoid that op in the training step"
            ) from over
        return _with_layout(profile, layout, how, types)


def _module_types(model: torch.nn.Module) -> dict[str, str]:
    """Each module's class name before ``fully_shard`` gives it a class of its own
    (``FSDPBlock``)."""
    return {name: type(module).__name__ for name, module in model.named_modules()}


def _ddp_rank(workload: Workload, layout: ParallelLayout) -> tuple[int, Any, str]:
    """What a simulated DDP rank's recording adds to the single-process step (DDP is not
    built; see :mod:`planner.measure.ddp`): its buckets' bytes, the ``around_steps`` that
    puts the gradients into the buckets with ``gradient_as_bucket_view`` (else None), and
    the layout's description. On a fake session, call it inside ``session.running()``."""
    mesh = device_mesh(layout, workload.device.type)
    options = ddp_options(workload.model_file, workload.model, mesh)
    model = workload.model
    around_steps = None
    if options.gradient_as_bucket_view:
        around_steps = lambda: gradients_into_buckets(model)  # noqa: E731
    return ddp_bucket_bytes(model), around_steps, options.describe()


def _fsdp2_layout(model_file: ModelFile, layout: ParallelLayout) -> str:
    if model_file.parallelize is not None:
        return "the model file's parallelize(model, mesh)"
    if layout.tp > 1 or layout.strategy is ParallelStrategy.TP:
        return "the built-in tensor-parallel plan for Llama (torchtitan's layout)"
    return "fully_shard on each block and the root"


def _with_layout(
    profile: Profile,
    layout: ParallelLayout,
    how: str,
    types: dict[str, str],
) -> Profile:
    note = Note(
        NoteTopic.GENERAL,
        f"{layout.describe()}: laid out by {how}, simulated on a fake process group",
    )
    modules = tuple(
        dataclasses.replace(record, module_type=types.get(record.module_name, record.module_type))
        for record in profile.modules
    )
    return dataclasses.replace(
        profile, modules=modules, parallel=layout, assumptions=(*profile.assumptions, note)
    )
