"""A pipeline stage made from the whole model (docs/distributed.md, "Pipeline stages"): which
blocks each stage holds, the stage module, and the shapes that cross the stages'
boundaries. Running a stage in its schedule is :mod:`planner.measure.pipeline_stage`.

Design notes
------------
* **A stage is the model with the other stages' modules taken out.** The model's blocks
  (:func:`~planner.measure.candidates.find_block_stacks`: one stack) are split into
  contiguous runs, one per stage. :func:`make_stage` keeps the model object and its module
  names (so a plan names a stage's modules as it names the model's) and replaces, in their
  parents: the other stages' blocks with :class:`_Elsewhere` (no parameters; passes its
  first argument on, so the model's own loop over its blocks still runs), on every stage
  but the first the modules with parameters registered before the blocks (the embeddings)
  with :class:`_StandIn` (a zero tensor shaped like the received activation, expanded: no
  memory), and on every stage but the last those registered after them (norm, head) with
  :class:`_NotOnStage`. The stage runs the model's own forward: the first block on the
  stage takes the activation received from the previous stage in place of its input, and a
  stage before the last ends at its last block's output (raised past the rest of the
  forward). The last stage computes the model file's loss (``loss_fn``, ``.loss``, or the
  output) from the model's output, so the schedule's loss function is the identity.
* **Interleaved 1F1B: two chunks in one module.** The blocks are split into ``2S`` chunks and
  rank ``r`` keeps chunks ``r`` and ``r + S`` in its one stage module (the plan is applied to
  it once, names the model's); each chunk's ``PipelineStage`` runs a :class:`_Chunk` view
  (:func:`chunk_modules`) holding that chunk's modules alone, which stands the rank's other
  chunk in with pass-throughs for the call.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from planner.core.errors import ModelFileError, ParallelLayoutError
from planner.core.parallel import PipelineLayout
from planner.measure.candidates import find_block_stacks
from planner.measure.workload import loss_from_output

__all__ = ["batch_keywords", "boundary_metas", "chunk_modules", "make_stage", "stage_blocks"]

_BATCH_KEY = "_pipeline_batch_"  # a batch that is not a dict travels as these keywords


class _Elsewhere(nn.Module):
    """A block on another stage: passes its first argument (the hidden states) on."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if args else next(iter(kwargs.values()))


class _StandIn(nn.Module):
    """A module before the blocks, on a stage after the first: zeros shaped like the
    activation the stage received (expanded from one element: no memory). The first block
    on the stage takes the received activation instead of what was computed from these."""

    def __init__(self, received: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self._received = received

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        like = self._received["activation"]
        return torch.zeros((), dtype=like.dtype, device=like.device).expand(like.shape)


class _NotOnStage(nn.Module):
    """A module after the blocks, on a stage before the last: never reached."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise ModelFileError(
            f"{self._name} runs before the model's last block, but is registered after the "
            "blocks: pipeline stages take the modules registered before the blocks as the "
            "first stage's and those after as the last's"
        )


class _StageEnd(Exception):
    """Carries a stage's output (its last block's) past the rest of the model's forward."""

    def __init__(self, output: Any) -> None:
        super().__init__()
        self.output = output


def stage_blocks(
    model: nn.Module, stages: int, *, allow_elsewhere: bool = False
) -> tuple[str, tuple[tuple[str, ...], ...]]:
    """The parent of the model's blocks, and the blocks of each of ``stages`` stages:
    contiguous runs as even as they can be, the longer ones last (the first stages keep
    more micro-batches in flight). ``allow_elsewhere``: ``model`` is a stage already (its
    container still holds every block's place)."""
    if allow_elsewhere and hasattr(model, "_pipeline_blocks"):
        return model._pipeline_blocks  # type: ignore[return-value]
    stacks = find_block_stacks(model)
    blocks = stacks[0] if len(stacks) == 1 else ()
    parents = {name.rpartition(".")[0] for name in blocks}
    if not blocks or len(parents) != 1:
        raise ModelFileError(
            "pipeline stages split one stack of repeated blocks, all children of one "
            "module; this model has "
            + ("none" if not stacks else f"{len(stacks)} stacks or blocks in several modules")
        )
    if len(blocks) < stages:
        raise ParallelLayoutError(
            f"{stages} pipeline stages need at least {stages} blocks; the model has "
            f"{len(blocks)}: use --pp {len(blocks)} or fewer"
        )
    base, longer = divmod(len(blocks), stages)
    runs, start = [], 0
    for stage in range(stages):
        size = base + (stage >= stages - longer)
        runs.append(tuple(blocks[start : start + size]))
        start += size
    return parents.pop(), tuple(runs)


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def _outside_blocks(model: nn.Module, container: str) -> tuple[list[str], list[str]]:
    """The modules with parameters registered before and after the block container,
    along its ancestors (the embeddings before; the final norm and the head after)."""
    before: list[str] = []
    after: list[str] = []
    path = container.split(".")
    for depth in range(len(path)):
        parent = ".".join(path[:depth])
        own = path[depth]
        seen = False
        for child_name, child in model.get_submodule(parent).named_children():
            if child_name == own:
                seen = True
                continue
            if not any(True for _ in child.parameters()):
                continue
            full = f"{parent}.{child_name}" if parent else child_name
            (after if seen else before).append(full)
    return before, after


def _first_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    if isinstance(value, dict) and value:
        return _first_tensor(next(iter(value.values())))
    raise ModelFileError(
        f"a block returned {type(value).__name__}; pipeline stages send a block's output "
        "tensor (or the first of a tuple) to the next stage"
    )


def make_stage(
    model: nn.Module, model_file: Any, pipeline: PipelineLayout, stage: int
) -> nn.Module:
    """Make ``model`` stage ``stage`` of ``pipeline``, in place (see the module's design
    notes), and return it. Its forward takes the activation received from the previous
    stage (none on the first) and the micro-batch as keywords; the last stage's returns the
    loss."""
    if model_file.training_step is not None:
        raise ModelFileError(
            f"{model_file.path} defines training_step(model, batch); a pipeline stage runs "
            "the model's forward and its loss: define loss_fn(output, batch) instead"
        )
    container, runs = stage_blocks(model, pipeline.chunks)
    model._pipeline_blocks = (container, runs)  # type: ignore[assignment]
    chunks = pipeline.chunks_of(stage)
    mine = {name for chunk in chunks for name in runs[chunk]}
    first, last = stage == 0, stage == pipeline.stages - 1
    before, after = _outside_blocks(model, container)
    tied = _tied_across(model, before, after)
    if tied:
        raise ModelFileError(
            f"{tied} is shared by the first and the last pipeline stage (tied weights): "
            "untie them to split the model into stages"
        )
    received: dict[str, torch.Tensor] = {}
    for run in runs:
        for name in run:
            if name not in mine:
                _replace(model, name, _Elsewhere())
    if not first:
        for name in before:
            _replace(model, name, _StandIn(received))
    if not last:
        for name in after:
            _replace(model, name, _NotOnStage(name))

    def take_received(module: nn.Module, args: Any, kwargs: Any) -> Any:
        activation = received.pop("activation", None)
        if activation is None:
            return None
        if args:
            return (activation, *args[1:]), kwargs
        key = next(iter(kwargs))
        return args, {**kwargs, key: activation}

    def end_stage(module: nn.Module, args: Any, output: Any) -> Any:
        raise _StageEnd(_first_tensor(output))

    for chunk in chunks:
        if chunk:
            model.get_submodule(runs[chunk][0]).register_forward_pre_hook(
                take_received, with_kwargs=True
            )
        if chunk != pipeline.chunks - 1:
            model.get_submodule(runs[chunk][-1]).register_forward_hook(end_stage)
    if len(chunks) > 1:
        model._pipeline_chunks = (chunks, before, after, received)  # type: ignore[assignment]
    model_forward = model.forward

    def stage_forward(*activation: torch.Tensor, **batch: Any) -> Any:
        if activation:
            received["activation"] = activation[0]
        inputs = _batch_from_keywords(batch)
        try:
            if isinstance(inputs, dict):
                output = model_forward(**inputs)
            elif isinstance(inputs, (list, tuple)):
                output = model_forward(*inputs)
            else:
                output = model_forward(inputs)
        except _StageEnd as end:
            return end.output
        finally:
            received.clear()
        loss, source = loss_from_output(model_file, output, inputs)
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
            raise ModelFileError(
                f"{source} is not a scalar loss; define loss_fn(output, batch) in the model file"
            )
        return loss

    model.forward = stage_forward  # type: ignore[method-assign]
    return model


class _Chunk(nn.Module):
    """One chunk of a rank's stage module under interleaved 1F1B, as its ``PipelineStage``
    runs it: it holds the chunk's own modules (so the stage scales and steps only their
    gradients) and runs the rank's stage module with the rank's other chunks' blocks (and,
    on the first rank, the modules before the blocks, for its later chunks) standing in as
    pass-throughs for the call. The rank's plan is applied to the stage module, whose
    module names are the model's."""

    def __init__(
        self, model: nn.Module, held: list[nn.Module], stand_ins: dict[str, nn.Module]
    ) -> None:
        super().__init__()
        self.held = nn.ModuleList(held)
        object.__setattr__(self, "_stage_module", model)  # not a submodule: not its own
        self._stand_ins = stand_ins

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        model: nn.Module = self._stage_module  # type: ignore[assignment]
        kept = {name: model.get_submodule(name) for name in self._stand_ins}
        for name, module in self._stand_ins.items():
            _replace(model, name, module)
        try:
            return model(*args, **kwargs)
        finally:
            for name, module in kept.items():
                _replace(model, name, module)


def chunk_modules(model: nn.Module, pipeline: PipelineLayout) -> list[nn.Module]:
    """The modules a rank's ``PipelineStage`` objects run, one per chunk it holds: the
    stage module itself (one chunk), or under interleaved 1F1B a :class:`_Chunk` per chunk
    (each over the stage module, after its plan is applied)."""
    chunked = getattr(model, "_pipeline_chunks", None)
    if chunked is None:
        return [model]
    chunks, before, after, received = chunked
    _, runs = model._pipeline_blocks  # type: ignore[misc]
    views: list[nn.Module] = []
    held_parameters: set[int] = set()
    for chunk in chunks:
        names = list(runs[chunk])
        if chunk == 0:
            names = [*before, *names]
        if chunk == pipeline.chunks - 1:
            names = [*names, *after]
        stand_ins: dict[str, nn.Module] = {
            name: _Elsewhere() for other in chunks if other != chunk for name in runs[other]
        }
        if chunk and 0 in chunks:
            stand_ins.update({name: _StandIn(received) for name in before})
        held = [model.get_submodule(name) for name in names]
        held_parameters.update(id(p) for module in held for p in module.parameters())
        views.append(_Chunk(model, held, stand_ins))
    outside = [name for name, p in model.named_parameters() if id(p) not in held_parameters]
    if outside:
        raise ModelFileError(
            f"{outside[0]} belongs to no chunk of the interleaved pipeline (neither a block "
            "nor a module registered before or after them): use --schedule 1f1b or gpipe"
        )
    return views


def _tied_across(model: nn.Module, before: list[str], after: list[str]) -> str | None:
    """A parameter held both by a module before the blocks and by one after them."""
    owners = {
        id(parameter): f"{name}.{parameter_name}"
        for name in before
        for parameter_name, parameter in model.get_submodule(name).named_parameters()
    }
    for name in after:
        for parameter in model.get_submodule(name).parameters():
            if id(parameter) in owners:
                return owners[id(parameter)]
    return None


def batch_keywords(batch: Any) -> dict[str, Any]:
    """The batch as the keywords a schedule splits into micro-batches and gives every
    stage: a dict as it is, else its tensors under private names."""
    if isinstance(batch, dict):
        return dict(batch)
    if isinstance(batch, (list, tuple)):
        return {f"{_BATCH_KEY}{index}": value for index, value in enumerate(batch)}
    return {_BATCH_KEY: batch}


def _batch_from_keywords(keywords: dict[str, Any]) -> Any:
    if _BATCH_KEY in keywords:
        return keywords[_BATCH_KEY]
    if any(key.startswith(_BATCH_KEY) for key in keywords):
        return tuple(keywords[f"{_BATCH_KEY}{index}"] for index in range(len(keywords)))
    return keywords


def _micro_batch(batch: Any, microbatches: int) -> Any:
    """The first of ``microbatches`` micro-batches (every tensor split on its first
    dimension, as the schedule splits them)."""
    from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

    for name, value in batch_keywords(batch).items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] % microbatches:
            raise ParallelLayoutError(
                f"the batch's {name.removeprefix(_BATCH_KEY) or 'tensor'} is not a tensor "
                f"whose first dimension splits into {microbatches} equal micro-batches: "
                "pick --microbatches dividing the batch size (or a batch of tensors)"
            )
    _, chunks = split_args_kwargs_into_chunks((), batch_keywords(batch), microbatches)
    return _batch_from_keywords(chunks[0])


def boundary_metas(
    model: nn.Module, model_file: Any, batch: Any, pipeline: PipelineLayout
) -> tuple[torch.Tensor, ...]:
    """Each stage's output before the last (the next one's input), for one micro-batch:
    empty tensors of its shape and dtype on the meta device, from a no-grad forward of the
    whole model on fake tensors (no memory; the model's real weights are not touched)."""
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    _, runs = stage_blocks(model, pipeline.chunks)
    ends = {run[-1]: index for index, run in enumerate(runs[:-1])}
    found: dict[int, torch.Tensor] = {}
    handles = []
    for name, index in ends.items():

        def keep(module: nn.Module, args: Any, output: Any, index: int = index) -> None:
            found[index] = _first_tensor(output)

        handles.append(model.get_submodule(name).register_forward_hook(keep))
    micro = _micro_batch(batch, pipeline.microbatches)
    on_fake = any(is_fake(parameter) for parameter in model.parameters())
    mode = (
        contextlib.nullcontext()
        if on_fake
        else FakeTensorMode(allow_non_fake_inputs=True, static_shapes=True)
    )
    try:
        with mode, torch.no_grad():
            if isinstance(micro, dict):
                model(**micro)
            elif isinstance(micro, tuple):
                model(*micro)
            else:
                model(micro)
    finally:
        for handle in handles:
            handle.remove()
    return tuple(
        torch.empty(found[index].shape, dtype=found[index].dtype, device="meta")
        for index in range(len(runs) - 1)
    )
