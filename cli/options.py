"""Options shared by the commands, and their parsing (budgets, devices)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from planner.core import errors
from planner.core.errors import ParallelLayoutError
from planner.core.loop import LoopShape, ZeroGrad
from planner.core.parallel import ParallelLayout, ParallelStrategy, PipelineLayout
from planner.core.units import parse_bytes

from .boundary import EXIT_CODES, fail

if TYPE_CHECKING:
    from planner.measure.source import WorkloadSource
    from planner.plan.targets import DeviceSpec

__all__ = [
    "BatchSizeOption",
    "BudgetOption",
    "Device",
    "DeviceOption",
    "Dtype",
    "DtypeOption",
    "GradAccumOption",
    "HfOption",
    "HostBudgetOption",
    "ImagesOption",
    "MeshOption",
    "NoSyncOption",
    "OffloadOption",
    "ParallelOption",
    "ProfileArgument",
    "ReferenceChoice",
    "SeqLenOption",
    "TargetOption",
    "TpOption",
    "VerboseOption",
    "WorldSizeOption",
    "ZeroGradOption",
    "given_host_budget",
    "host_budget",
    "loop_shape",
    "parallel_layout",
    "parse_budget",
    "require_device",
    "target_and_device",
    "workload_source",
]


class Device(str, enum.Enum):
    cpu = "cpu"
    cuda = "cuda"


class Dtype(str, enum.Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class AutocastDtype(str, enum.Enum):
    bfloat16 = "bfloat16"
    float16 = "float16"


class ReferenceChoice(str, enum.Enum):
    auto = "auto"
    unplanned = "unplanned"
    recomputation = "recomputation"


# -- shared options ---------------------------------------------------------------------
BudgetOption = Annotated[
    str,
    typer.Option(
        "--budget",
        "-b",
        help="Peak memory allowed for one training step, e.g. 12GB, 11.5GiB, 800MiB "
        "(GB/MB: powers of 10; GiB/MiB: powers of 2; a bare number is bytes).",
        show_default=False,
    ),
]
DeviceOption = Annotated[Device, typer.Option("--device", help="Device to profile and check on.")]
ZeroGradOption = Annotated[
    ZeroGrad,
    typer.Option(
        "--zero-grad",
        help="Where the training loop calls optimizer.zero_grad(): before-forward (a plain "
        "loop) or after-forward (Lightning: last step's gradients are alive during the "
        "forward, so the peak is higher).",
    ),
]
GradAccumOption = Annotated[
    int,
    typer.Option(
        "--grad-accum",
        min=1,
        help="Micro-batches accumulated per optimizer step (gradient accumulation; 1: none). "
        "Plans the last micro-batch, whose forward and backward run with the accumulated "
        "gradients alive.",
    ),
]
NoSyncOption = Annotated[
    bool,
    typer.Option(
        "--no-sync",
        help="With --grad-accum N on DDP or FSDP2 ranks: the micro-batches before the last "
        "skip the gradient sync (DDP's no_sync(), FSDP2's set_requires_gradient_sync(False)), "
        "as Hugging Face's Trainer, accelerate and Lightning do. FSDP2 then keeps every "
        "gradient unsharded across the cycle; the plan covers the whole cycle.",
    ),
]
WorldSizeOption = Annotated[
    int | None,
    typer.Option(
        "--world-size",
        help="Plan ONE rank of a torchrun job of this many ranks (with --parallel): the budget "
        "is each rank's peak. The ranks are simulated here on a fake process group.",
        show_default="one process",
    ),
]
ParallelOption = Annotated[
    str | None,
    typer.Option(
        "--parallel",
        help="How the job lays the model out (with --world-size): ddp (DistributedDataParallel "
        "with default buckets), fsdp2 (fully_shard on each block and the root) or tp "
        "(tensor parallelism alone, as --tp); the model file's parallelize(model, mesh) "
        "instead, where it defines one.",
        metavar="ddp|fsdp2|tp",
        show_default=False,
    ),
]
MeshOption = Annotated[
    str | None,
    typer.Option(
        "--mesh",
        help="The device mesh of an fsdp2 job as REPLICATExSHARD (e.g. 2x4 for 8 ranks): "
        "HSDP, parameters sharded over SHARD ranks and replicated over REPLICATE groups.",
        metavar="RxS",
        show_default="one dimension of --world-size",
    ),
]
TpOption = Annotated[
    int | None,
    typer.Option(
        "--tp",
        help='Tensor parallelism of this degree on the mesh\'s last dimension, "tp" (the '
        "model file's parallelize(model, mesh) applies it; --hf Llama-family models have a "
        "built-in plan): alone (N ranks, one TP group), "
        "or with --parallel fsdp2 (a mesh of --world-size/N data-parallel shards x N).",
        min=1,
        show_default="none",
    ),
]
PpOption = Annotated[
    int | None,
    typer.Option(
        "--pp",
        help="Pipeline stages (torch.distributed.pipelining): the model's blocks split into "
        "this many contiguous stages, one rank each, the first also holding what comes "
        "before the blocks and the last what comes after; a plan per stage, in one file.",
        min=2,
        show_default="none",
    ),
]
MicrobatchesOption = Annotated[
    int | None,
    typer.Option(
        "--microbatches",
        help="With --pp: the micro-batches the batch is split into (its first dimension).",
        min=1,
        show_default="--pp",
    ),
]
ScheduleOption = Annotated[
    str,
    typer.Option(
        "--schedule",
        help="With --pp: the pipeline schedule, 1f1b (Schedule1F1B: min(M, S - s) "
        "micro-batches in flight on stage s), gpipe (ScheduleGPipe: all M) or "
        "interleaved-1f1b (ScheduleInterleaved1F1B: 2 virtual stages a rank, rank s holding "
        "chunks s and s + S of 2S; M a multiple of S).",
        metavar="1f1b|gpipe|interleaved-1f1b",
    ),
]
ExpertLoadOption = Annotated[
    float,
    typer.Option(
        "--expert-load",
        min=1.0,
        help="Mixture-of-experts models whose memory depends on routing (experts run on the "
        "tokens routed to them): plan for the busiest expert getting this many times its "
        "balanced share (tokens x top-k / experts). 1 is balanced routing; the first training "
        "forward warns when real routing is busier. Ignored where no shape depends on routing.",
    ),
]
OffloadOption = Annotated[
    bool,
    typer.Option(
        "--offload/--no-offload",
        help="Let the plan offload a module's saved tensors to host memory between its "
        "forward and its backward, beside keeping and recomputing them (where the device "
        "has a host link: --target; copies hidden behind compute cost nothing).",
    ),
]
HostBudgetOption = Annotated[
    str | None,
    typer.Option(
        "--host-budget",
        help="Host memory the offloaded tensors may hold at once, e.g. 256GB (units as for "
        "--budget); for a torchrun job, per rank (each rank pins its own copies).",
        show_default="the target spec's host memory, else this machine's free memory; for a "
        "job, its share among the ranks on one host (all, up to 8)",
    ),
]
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Log details to stderr; show tracebacks on errors.")
]
ProfileArgument = Annotated[
    Path,
    typer.Argument(
        help="A profile.json written by `ckpt-plan profile` (beside its plan).",
        show_default=False,
        metavar="PROFILE.json",
    ),
]

TargetOption = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="Plan for a device that is not here: a built-in name (a100-40gb, a100-80gb, "
        "h100-80gb, h200, l4, rtx-4090) or a spec .json. Memory from fake tensors, times "
        "estimated (roofline); the plan is not run: check it with `ckpt-plan verify` there.",
        show_default=False,
    ),
]
HfOption = Annotated[
    Path | None,
    typer.Option(
        "--hf",
        help="Plan a Hugging Face model from its config instead of a model file: a local "
        "config.json, or a model folder holding one (nothing is downloaded). Builds the class "
        "its `architectures` names (else AutoModelForCausalLM's) with random weights, on "
        "--batch-size x --seq-len random token ids with labels (an image classifier: "
        "--batch-size random images of the config's image_size; a speech model: clips of "
        "--seq-len samples or frames); the loss is the model's own.",
        metavar="CONFIG",
        show_default=False,
    ),
]
BatchSizeOption = Annotated[
    int | None,
    typer.Option(
        "--batch-size",
        min=1,
        help="With --hf: sequences (images, clips) per batch. With MODEL.py: passed to its "
        "sample_batch(batch_size=...).",
        show_default=False,
    ),
]
SeqLenOption = Annotated[
    int | None,
    typer.Option(
        "--seq-len",
        min=1,
        help="With --hf: tokens per sequence; for a speech model, audio samples (or feature "
        "frames) per clip; none for an image classifier.",
        show_default=False,
    ),
]
ImagesOption = Annotated[
    int | None,
    typer.Option(
        "--images",
        min=0,
        help="With --hf on a vision-language model: images per sequence, their tokens counted "
        "in --seq-len; 0 trains it on text alone.",
        show_default="1",
    ),
]
ClipsOption = Annotated[
    int | None,
    typer.Option(
        "--clips",
        min=0,
        help="With --hf on a speech language model (Voxtral, Qwen2-Audio): 30 s clips per "
        "sequence, their tokens counted in --seq-len; 0 trains it on text alone.",
        show_default="1",
    ),
]
ChoicesOption = Annotated[
    int | None,
    typer.Option(
        "--choices",
        min=2,
        help="With --hf on a multiple-choice head (SWAG, RACE): choices per example, each "
        "--seq-len tokens.",
        show_default="4",
    ),
]
LoraOption = Annotated[
    str | None,
    typer.Option(
        "--lora",
        help="With --hf: plan LoRA fine-tuning (peft.get_peft_model) instead of training every "
        "weight: a rank (16: adapters on every linear layer but the head, peft's defaults), "
        "or peft's adapter_config.json (LoraConfig(...).save_pretrained(folder) writes one), "
        "or its folder. Apply the plan after get_peft_model, with the same config.",
        metavar="RANK|ADAPTER_CONFIG",
        show_default=False,
    ),
]
AutocastOption = Annotated[
    AutocastDtype | None,
    typer.Option(
        "--autocast",
        help="With --hf: run the forward under torch.autocast in this dtype, as "
        "Trainer(bf16=True) (bfloat16) or Trainer(fp16=True) (float16) does, its outputs cast "
        "to float32 after it; the parameters stay in --dtype (float32 for classic mixed "
        "precision).",
        show_default="no autocast",
    ),
]
DtypeOption = Annotated[
    Dtype | None,
    typer.Option(
        "--dtype",
        help="With --hf: the parameters' dtype.",
        show_default="the config's dtype, else float32",
    ),
]


def workload_source(
    model: Path | None,
    hf: Path | None,
    batch_size: int | None,
    seq_len: int | None,
    dtype: Dtype | None,
    *,
    images: int | None = None,
    clips: int | None = None,
    lora: str | None = None,
    autocast: AutocastDtype | None = None,
    choices: int | None = None,
    model_option: str = "MODEL.py",
    recorded: str | None = None,
) -> WorkloadSource | None:
    """The workload a command runs, as the library carries it: the model file (its path
    may carry a batch size, ``PATH?batch_size=N``, as printed commands write it), or the
    Hugging Face workload the ``--hf`` options name (``--batch-size``, ``--seq-len``,
    ``--dtype``, ``--images``, ``--clips``, ``--lora``, ``--autocast`` and ``--choices``
    default to those of
    ``recorded``,
    the source a profile or plan holds, where that is a Hugging Face workload). None when
    neither is given. Raises ModelFileError for a config that cannot be used; a bad
    combination of options is a usage error (exit 2)."""
    from planner.measure.hf import hf_workload
    from planner.measure.source import WorkloadSource

    if model is not None and hf is not None:
        fail(f"pass either {model_option} or --hf CONFIG, not both", 2)
    if hf is None:
        if (seq_len, dtype, images, clips, lora, autocast, choices) != (None,) * 7:
            fail(
                "--seq-len, --dtype, --images, --clips, --lora, --autocast and --choices go "
                "with --hf CONFIG",
                2,
            )
        if model is None:
            if batch_size is not None:
                fail(f"--batch-size goes with {model_option} or --hf CONFIG", 2)
            return None
        if batch_size is None:
            return WorkloadSource.parse(model)
        return WorkloadSource.model_file(model, batch_size)
    dtype_name = dtype.value if dtype is not None else None
    autocast_name = autocast.value if autocast is not None else None
    before = WorkloadSource.parse(recorded) if recorded is not None else None
    if before is not None and before.is_hugging_face:
        batch_size = batch_size or before.batch_size
        seq_len = seq_len or before.seq_len
        dtype_name = dtype_name or before.dtype
        images = before.images if images is None else images
        clips = before.clips if clips is None else clips
        lora = before.lora if lora is None else lora
        autocast_name = before.autocast if autocast_name is None else autocast_name
        choices = before.choices if choices is None else choices
    if batch_size is None:
        fail("--hf needs --batch-size (and --seq-len, for a model taking token ids)", 2)
    return hf_workload(
        hf,
        batch_size,
        seq_len,
        dtype_name,
        images,
        clips,
        lora,
        autocast=autocast_name,
        choices=choices,
    )


def loop_shape(zero_grad: ZeroGrad, grad_accum: int, no_sync: bool) -> LoopShape:
    """The training loop's shape from ``--zero-grad``, ``--grad-accum`` and ``--no-sync``;
    ``--no-sync`` without accumulation is a usage error (exit 2)."""
    if no_sync and grad_accum < 2:
        fail(
            "--no-sync needs --grad-accum N with N > 1: it names what the micro-batches "
            "before the last do, and with one micro-batch every backward syncs",
            2,
        )
    return LoopShape(zero_grad, grad_accum, no_sync)


def target_and_device(target: str | None, device: Device) -> tuple[DeviceSpec | None, Device]:
    """The ``--target`` spec (None without one) and the device the work runs on: the
    target's device type, or ``device``, which must be present here."""
    if target is None:
        require_device(device)
        return None, device
    from planner.plan.targets import load_spec

    spec = load_spec(target)
    return spec, Device(spec.device_type)


def require_device(device: Device | None) -> None:
    if device is Device.cuda:
        import torch

        if not torch.cuda.is_available():
            fail("--device cuda: no CUDA device is available here; use --device cpu", 2)


def parse_budget(text: str, option: str = "--budget") -> int:
    try:
        return parse_bytes(text)
    except errors.BudgetError as error:
        fail(f"{option}: {error}", EXIT_CODES[errors.BudgetError])


def given_host_budget(text: str | None, offload: bool) -> int | None:
    """``--host-budget`` in bytes, None where it is not given; a usage error (exit 2) where
    it does not parse or goes with --no-offload. Commands that learn the job's ranks later
    call it first, so that a bad option fails before any work."""
    if text is None:
        return None
    if not offload:
        fail("--host-budget goes with --offload (the default), not --no-offload", 2)
    return parse_budget(text, "--host-budget")


def host_budget(
    text: str | None, offload: bool, spec: DeviceSpec | None, world_size: int = 1
) -> int | None:
    """The host budget in bytes of one process (of one rank of a job of ``world_size``):
    ``--host-budget``, else the default (see
    :func:`planner.plan.targets.default_host_budget`); None where nothing offloads."""
    given = given_host_budget(text, offload)
    if given is not None or not offload:
        return given
    from planner.plan.targets import default_host_budget

    return default_host_budget(spec, world_size)[0]


def parallel_layout(
    world_size: int | None,
    parallel: str | None,
    mesh: str | None = None,
    tp: int | None = None,
    pp: int | None = None,
    microbatches: int | None = None,
    schedule: str = "1f1b",
) -> ParallelLayout | None:
    """The layout --world-size, --parallel, --mesh and --tp name (the first two both or
    neither, but for --tp N alone: N ranks of tensor parallelism), or None: one process;
    or the pipeline --pp, --microbatches and --schedule name (alone: one stage a rank).
    Raises :class:`ParallelLayoutError` (one line, exit 2) for anything else."""
    if pp is not None:
        if mesh is not None or tp is not None or parallel not in (None, "fsdp2"):
            raise ParallelLayoutError(
                f"--pp {pp} is planned alone ({pp} ranks, one stage each) or with "
                "--world-size N --parallel fsdp2, not yet with --mesh, --tp or ddp"
            )
        pipeline = PipelineLayout(pp, microbatches or pp, schedule)  # type: ignore[arg-type]
        if parallel is None:
            if world_size not in (None, pp):
                raise ParallelLayoutError(
                    f"--pp {pp} with data parallelism needs --world-size N --parallel fsdp2"
                )
            return ParallelLayout(pp, ParallelStrategy.PP, pipeline=pipeline)
        if world_size is None:
            raise ParallelLayoutError("--parallel fsdp2 needs --world-size N (the job's ranks)")
        return ParallelLayout(world_size, ParallelStrategy.FSDP2, pipeline=pipeline)
    if microbatches is not None:
        raise ParallelLayoutError("--microbatches needs --pp S (the pipeline's stages)")
    if tp is not None and parallel is None:
        if world_size not in (None, tp) or mesh is not None:
            raise ParallelLayoutError(
                f"--tp {tp} alone is one group of {tp} ranks; for data parallelism too add "
                "--parallel fsdp2 (--world-size N --parallel fsdp2 --tp T)"
            )
        return ParallelLayout(tp, ParallelStrategy.TP)
    if world_size is None and parallel is None:
        if mesh is not None:
            raise ParallelLayoutError("--mesh needs --world-size N --parallel fsdp2")
        return None
    if parallel is None:
        raise ParallelLayoutError("--world-size needs --parallel ddp or --parallel fsdp2")
    if world_size is None:
        raise ParallelLayoutError(f"--parallel {parallel} needs --world-size N (the job's ranks)")
    shape: tuple[int, ...] = ()
    if mesh is not None:
        parts = mesh.lower().split("x")
        if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
            raise ParallelLayoutError(
                f"--mesh takes REPLICATExSHARD, two whole numbers such as 2x4, not {mesh!r}"
            )
        shape = (int(parts[0]), int(parts[1]))
        if tp is not None:
            shape = (*shape, tp)
    return ParallelLayout(world_size, parallel, shape, tp or 1)  # type: ignore[arg-type]
