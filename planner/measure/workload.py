"""A workload: the model file of a source, built into a live model, batch and optimizer,
and its training step run.

:func:`load_model_file` loads the model file of any
:class:`~planner.measure.source.WorkloadSource` (a Python file,
:mod:`planner.measure.model_file`; a Hugging Face config, :mod:`planner.measure.hf`);
:func:`build_workload` makes a fresh, seeded model, batch and optimizer from it;
:func:`run_training_step` runs one step the same way everywhere (profiling, checking a plan,
benchmarks), so that every measurement is of the same step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from planner.core.errors import ModelFileError
from planner.core.loop import PLAIN_LOOP, LoopShape, ZeroGrad
from planner.core.records import Note, NoteTopic, Phase, general_notes
from planner.measure.hf import load_hf_model_file
from planner.measure.model_file import (
    ModelFile,
    _user_code,
    checked_model,
    load_python_model_file,
    optimizer_takes_model,
)
from planner.measure.source import WorkloadSource
from planner.model_switches import (
    flag_names,
    own_checkpointing_flags,
    switch_off_caches,
    switch_off_layerdrop,
)

__all__ = [
    "Workload",
    "build_optimizer",
    "build_workload",
    "compute_loss",
    "gradients_syncing",
    "gradients_unsynced",
    "load_model_file",
    "loss_from_output",
    "map_tensors",
    "run_training_step",
    "switch_off_own_checkpointing",
    "user_code_errors",
    "with_batch_size",
]


@dataclass
class Workload:
    """A live model, its batch and its optimizer on one device (mutable: it trains).
    ``notes``: what the model file assumed (``ModelFile.assumptions``) and what was changed
    in the model to plan it (its own checkpointing switched off, see
    :func:`switch_off_own_checkpointing`), one line each. ``loop``: the training loop's
    shape its steps run in (:func:`run_training_step`). ``caches_off``: the Hugging Face
    models in it whose cache was switched off for training
    (:func:`planner.model_switches.switch_off_caches`). ``layerdrop_off``: the LayerDrop
    settings set to 0 for the profile (:func:`planner.model_switches.switch_off_layerdrop`;
    training keeps them). ``step``: a step of its own that
    :func:`run_training_step` runs instead, given ``phase_ended`` (a pipeline stage's
    schedule: :mod:`planner.measure.pipeline_stage`). ``full_cycle``: with a ``no_sync``
    loop, run every micro-batch of its cycle, not the shortened cycle a recording runs
    (:attr:`LoopShape.micro_batches_run`): real ranks checking a plan run the loop as it
    trains, so their measurement stands apart from the shortening."""

    model_file: ModelFile
    model: torch.nn.Module
    batch: Any
    optimizer: torch.optim.Optimizer
    device: torch.device
    notes: tuple[Note, ...] = ()
    loop: LoopShape = PLAIN_LOOP
    caches_off: tuple[str, ...] = ()
    layerdrop_off: tuple[str, ...] = ()
    step: Callable[[Callable[[Phase], None] | None], torch.Tensor] | None = None
    full_cycle: bool = False
    # The model's module names as built (before any step), which a plan names and
    # apply_plan finds before training: see check_modules_unchanged. Empty: not checked.
    module_names: tuple[str, ...] = ()


def module_names(model: torch.nn.Module) -> tuple[str, ...]:
    """The names of ``model``'s modules, the root's (``""``) included."""
    return tuple(name for name, _ in model.named_modules())


def check_modules_unchanged(workload: Workload) -> None:
    """Raise :class:`ModelFileError` where the model's modules are not those it was built
    with: a model that adds or replaces modules during its step (BigBird's block-sparse
    attention, at sequences too short for it, swaps in full attention at the first
    forward) gets a plan naming modules the model it is applied to does not have yet."""
    if not workload.module_names:
        return
    before, after = set(workload.module_names), set(module_names(workload.model))
    if before == after:
        return
    changes = [f"{name} added" for name in sorted(after - before)]
    changes += [f"{name} removed" for name in sorted(before - after)]
    shown = "; ".join(changes[:2]) + (f" (and {len(changes) - 2} more)" if len(changes) > 2 else "")
    raise ModelFileError(
        f"{workload.model_file.name}: the model's modules changed during its training step "
        f"({shown}): a plan names the modules a model is built with, so build it in the form "
        "it trains in (a model that swaps its layers at its first forward usually has a "
        'setting for that form, e.g. BigBird\'s attention_type="original_full" for '
        "sequences too short for block-sparse attention)"
    )


def switch_off_own_checkpointing(model: torch.nn.Module) -> tuple[Note, ...]:
    """Switch off the checkpointing ``model`` does itself where it lets us, so a plan is made
    for the model without it (the plan then chooses what to checkpoint). Returns one line
    per finding for the profile's assumptions: what was on, how it was switched off (to do
    the same in training), or that it could not be (and the plan counts it)."""
    flags = own_checkpointing_flags(model)
    if not flags:
        return ()
    how = []
    if getattr(model, "is_gradient_checkpointing", False) and callable(
        getattr(model, "gradient_checkpointing_disable", None)
    ):
        model.gradient_checkpointing_disable()  # type: ignore[operator]
        how.append("model.gradient_checkpointing_disable()")
    elif getattr(model, "is_gradient_checkpointing", False) and callable(
        getattr(model, "disable_gradient_checkpointing", None)
    ):  # diffusers' models
        model.disable_gradient_checkpointing()  # type: ignore[operator]
        how.append("model.disable_gradient_checkpointing()")
    if callable(getattr(model, "set_grad_checkpointing", None)) and own_checkpointing_flags(model):
        with contextlib.suppress(Exception):
            model.set_grad_checkpointing(False)  # type: ignore[operator]
            how.append("model.set_grad_checkpointing(False)")
    left = own_checkpointing_flags(model)
    for name, flag in left:
        with contextlib.suppress(Exception):
            setattr(model.get_submodule(name), flag, False)
    if left and len(left) > len(own_checkpointing_flags(model)):
        how.append(f"setting {flag_names(left)} to False")
    found = f"itself ({flag_names(flags)} on)"
    stuck = own_checkpointing_flags(model)
    if stuck:
        return (
            Note(
                NoteTopic.OWN_CHECKPOINTING,
                f"{found}: {flag_names(stuck)} could not be switched off, so the plan counts "
                "that checkpointing (its modules are recomputed whatever the plan)",
            ),
        )
    return (
        Note(
            NoteTopic.OWN_CHECKPOINTING,
            f"{found}: switched off to plan as if it were not there, with {' and '.join(how)}; "
            "do the same in training before apply_plan, or the modules it covers are "
            "checkpointed twice",
        ),
    )


def with_batch_size(model_file: ModelFile, batch_size: int) -> ModelFile:
    """The same workload at another batch size: a Hugging Face workload's ``batch_size``, or
    the model file's ``sample_batch(batch_size=...)``. Raises :class:`ModelFileError` where
    ``sample_batch`` takes no batch size."""
    return load_model_file(model_file.source.with_batch_size(batch_size))


def load_model_file(source: WorkloadSource | str | Path) -> ModelFile:
    """Import the Python file at ``source`` and check it defines the model-file contract.

    ``source`` is a model file's path, or any :class:`~planner.measure.source.WorkloadSource`
    (as text where it comes from a profile, a plan or another process): a Hugging Face
    workload's, for which the contract is built from the config
    (:func:`~planner.measure.hf.load_hf_model_file`), or a model file's at a batch size
    (``PATH?batch_size=N``), which its ``sample_batch(batch_size=N)`` makes."""
    source = WorkloadSource.of(source)
    if source.is_hugging_face:
        return load_hf_model_file(source)
    return load_python_model_file(source)


def map_tensors(value: Any, function: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` (a batch: a tensor, dict, list, tuple or named tuple of them) with
    ``function`` applied to each tensor, the containers rebuilt as they were."""
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, dict):
        return type(value)({key: map_tensors(item, function) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        mapped = [map_tensors(item, function) for item in value]
        return type(value)(mapped) if not hasattr(value, "_fields") else type(value)(*mapped)
    return value


def _to_device(value: Any, device: torch.device) -> Any:
    return map_tensors(value, lambda tensor: tensor.to(device))


def build_workload(
    model_file: ModelFile,
    device: str | torch.device = "cpu",
    seed: int = 0,
    *,
    loop: LoopShape = PLAIN_LOOP,
) -> Workload:
    """A fresh model, batch and optimizer. The same seed gives the same weights and batch.
    Its steps run in the training loop's shape ``loop`` (:func:`run_training_step`)."""
    target = torch.device(device)
    with _user_code("build_model()", model_file.path):
        torch.manual_seed(seed)
        model = checked_model(model_file, model_file.build_model())
    model = model.to(target)
    model.train()
    with _user_code("switching off the model's own checkpointing", model_file.path):
        notes = (*general_notes(model_file.assumptions), *switch_off_own_checkpointing(model))
    caches_off = switch_off_caches(model)
    layerdrop_off = switch_off_layerdrop(model)
    with _user_code("sample_batch()", model_file.path):
        torch.manual_seed(seed + 1)
        batch = _to_device(model_file.sample_batch(), target)
    optimizer = build_optimizer(model_file, model)
    return Workload(
        model_file,
        model,
        batch,
        optimizer,
        target,
        notes,
        loop,
        caches_off,
        layerdrop_off=layerdrop_off,
        module_names=module_names(model),
    )


def build_optimizer(model_file: ModelFile, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The model file's optimizer over ``model``'s parameters (default: AdamW, lr 1e-3),
    given the model or its parameters as :func:`optimizer_takes_model` says."""
    with _user_code("build_optimizer()", model_file.path):
        if model_file.build_optimizer is not None:
            takes_model = optimizer_takes_model(model_file)
            optimizer = model_file.build_optimizer(model if takes_model else model.parameters())
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ModelFileError(
            f"build_optimizer() in {model_file.path} must return a torch.optim.Optimizer"
        )
    return optimizer


def compute_loss(
    model_file: ModelFile, model: torch.nn.Module, batch: Any, *, require_grad: bool = True
) -> torch.Tensor:
    """The loss of one batch, following the contract's precedence. ``require_grad=False``
    for a forward run without grad on purpose (the loss is then not checked)."""
    if model_file.training_step is not None:
        loss = model_file.training_step(model, batch)
        source = "training_step()"
    else:
        if isinstance(batch, dict):
            output = model(**batch)
        elif isinstance(batch, (list, tuple)):
            output = model(*batch)
        else:
            output = model(batch)
        loss, source = loss_from_output(model_file, output, batch)
    if not require_grad:
        return loss  # type: ignore[no-any-return]
    if not (isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.requires_grad):
        got = (
            f"a tensor of shape {tuple(loss.shape)}"
            if isinstance(loss, torch.Tensor)
            else type(loss).__name__
        )
        raise ModelFileError(
            f"{source} gave {got}, not a scalar loss that requires grad; define "
            "loss_fn(output, batch) or training_step(model, batch) in the model file"
        )
    return loss


def loss_from_output(model_file: ModelFile, output: Any, batch: Any) -> tuple[Any, str]:
    """The loss of a model output, by the contract's precedence (``loss_fn``, else the
    output's ``.loss``, else the output), and where it came from, for errors."""
    if model_file.loss_fn is not None:
        return model_file.loss_fn(output, batch), "loss_fn()"
    if getattr(output, "loss", None) is not None:
        return output.loss, "the model output's .loss"
    return output, "the model output"


@contextlib.contextmanager
def gradients_unsynced(model: torch.nn.Module) -> Iterator[None]:
    """Within the block ``model``'s backward syncs no gradients across ranks, as a loop
    accumulating without syncing runs the micro-batches before the last: DDP's
    ``no_sync()``; FSDP2's ``set_requires_gradient_sync(False)`` on every sharded module
    (turned back on after). A model neither wraps (one process, or a simulated DDP rank,
    whose buckets :func:`planner.measure.ddp.ddp_bucket_bytes` counts apart) syncs nothing;
    :func:`gradients_syncing` says False within the block for the simulated rank's buckets
    (:func:`planner.measure.ddp.gradients_into_buckets`)."""
    from torch.distributed.fsdp import FSDPModule

    _UNSYNCED.append(model)
    try:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            with model.no_sync():
                yield
            return
        sharded = [module for module in model.modules() if isinstance(module, FSDPModule)]
        for module in sharded:
            module.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for module in sharded:
                module.set_requires_gradient_sync(True, recurse=False)
    finally:
        _UNSYNCED.pop()


_UNSYNCED: list[torch.nn.Module] = []
"""The models inside :func:`gradients_unsynced` (a list, not a context variable: backward
hooks may run on autograd's own threads)."""


def gradients_syncing() -> bool:
    """Whether a backward now would sync gradients (False inside :func:`gradients_unsynced`)."""
    return not _UNSYNCED


def _micro_batches(workload: Workload, phase_ended: Callable[[Phase], None] | None) -> torch.Tensor:
    """:func:`run_training_step`'s step (see there), in the model's code: one micro-batch,
    or with ``no_sync`` the shortened cycle, its micro-batches before the last unsynced."""
    loop = workload.loop
    count = loop.grad_accum if loop.no_sync and workload.full_cycle else loop.micro_batches_run
    zeroes = loop.starts_a_cycle  # zero_grad comes once a cycle
    if zeroes and loop.zero_grad is ZeroGrad.BEFORE_FORWARD:
        workload.optimizer.zero_grad(set_to_none=True)
    losses: list[torch.Tensor] = []  # no tensor made here: the step is the model's alone
    for micro_batch in range(count):
        last = micro_batch == count - 1
        with contextlib.nullcontext() if last else gradients_unsynced(workload.model):
            loss = compute_loss(workload.model_file, workload.model, workload.batch)
            if loop.accumulates:
                # Scaled so that the accumulated gradient is the mean's, as loops do.
                loss = loss / loop.grad_accum
            if last and phase_ended:
                phase_ended(Phase.FORWARD)
            if zeroes and micro_batch == 0 and loop.zero_grad is ZeroGrad.AFTER_FORWARD:
                workload.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            losses[:] = [loss.detach()]
    if phase_ended:
        phase_ended(Phase.BACKWARD)
    workload.optimizer.step()
    if phase_ended:
        phase_ended(Phase.OPTIMIZER)
    return losses[0]


def user_code_errors(workload: Workload) -> contextlib.AbstractContextManager[None]:
    """Report an exception from the model file's code as a one-line ProfilingError."""
    return _user_code("the training step", workload.model_file.path)


def run_training_step(
    workload: Workload,
    seed: int | None = None,
    *,
    phase_ended: Callable[[Phase], None] | None = None,
) -> torch.Tensor:
    """One steady-state step in the workload's loop shape (``workload.loop``): the one
    training step every stage runs (warm-up, timing, the recorded and the measured step).

    * ``zero_grad`` before the forward (the plain loop): zero grads (to None), forward +
      loss, backward, optimizer step.
    * ``zero_grad`` after the forward (Lightning): forward + loss with last step's gradients
      alive, zero grads (to None), backward, optimizer step.
    * ``grad_accum`` N > 1: the last micro-step of N, the worst for memory: forward + loss
      (divided by N) with the gradients of the micro-steps before it alive, backward adding
      into them, optimizer step. Its ``zero_grad`` belongs to the first micro-step of the
      next cycle, which is not this one, so no step zeroes: each step leaves its gradients
      in place for the next, as the micro-steps before the last would.

    In the last two shapes the step expects gradients to exist when it starts: run one step
    before the measured one (a warm-up step, which also creates the optimizer state); the
    first step of a fresh workload runs as the first step of such a loop does, with none.

    * ``no_sync``: the accumulation cycle, shortened (:attr:`LoopShape.micro_batches_run`;
      whole with ``workload.full_cycle``):
      ``zero_grad`` (before the first forward, or after it), each micro-batch's forward and
      backward, the ones before the last under :func:`gradients_unsynced`, the optimizer
      step. It starts from the gradients the last cycle left, as the loop's cycles do.

    Returns the loss it ran backward on (divided by N when accumulating), detached.
    ``seed`` reseeds the global RNG first so that random ops (dropout) draw the same numbers
    in runs that should be comparable. ``phase_ended`` is called with each :class:`Phase`
    as it ends (forward: the loss computed). An error in the model's code is a one-line
    :class:`ProfilingError`.
    """
    if seed is not None:
        torch.manual_seed(seed)
    if workload.step is not None:
        with _user_code("the training step", workload.model_file.path):
            return workload.step(phase_ended)
    with _user_code("the training step", workload.model_file.path):
        return _micro_batches(workload, phase_ended)
