"""Load a model file and run training steps on it (docs/architecture.md, "Model file").

A model file defines ``build_model()`` and ``sample_batch()``, and optionally
``training_step(model, batch)``, ``loss_fn(output, batch)`` and
``build_optimizer(parameters)`` or ``build_optimizer(model)`` (see
:func:`optimizer_takes_model`). :func:`load_model_file` checks that contract once and
returns a :class:`ModelFile`; :func:`build_workload` makes a fresh, seeded model, batch and
optimizer; :func:`run_training_step` runs one step the same way everywhere (profiling,
checking a plan, benchmarks), so that every measurement is of the same step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from planner.core.errors import ModelFileError, ProfilingError
from planner.core.loop import PLAIN_LOOP, LoopShape, ZeroGrad
from planner.core.records import Phase
from planner.measure.source import WorkloadSource
from planner.model_switches import flag_names, own_checkpointing_flags, switch_off_caches

__all__ = [
    "ModelFile",
    "Workload",
    "build_optimizer",
    "build_workload",
    "checked_model",
    "compute_loss",
    "load_model_file",
    "map_tensors",
    "optimizer_takes_model",
    "own_checkpointing_notes",
    "run_training_step",
    "switch_off_own_checkpointing",
    "takes_batch_size",
    "with_batch_size",
]


@dataclass(frozen=True)
class ModelFile:
    """The functions a model file provides, checked against the contract.

    ``source`` is what :func:`load_model_file` builds it again from, in another process or
    from a saved profile (:mod:`planner.measure.source`): the file's path, with the batch
    size given to its ``sample_batch``, or a Hugging Face workload (:mod:`planner.measure.hf`;
    ``path`` is then its config). ``assumptions``: what
    the workload itself assumed, one line each, for the profile's assumptions.
    ``parallelize(model, mesh)`` (optional) lays the model out with ``fully_shard`` for an
    FSDP2 ``torchrun`` job, as torchtitan's ``parallelize_*`` functions do, after
    ``apply_plan`` (:mod:`planner.measure.distributed`)."""

    path: Path
    name: str
    build_model: Callable[[], torch.nn.Module]
    sample_batch: Callable[[], Any]
    training_step: Callable[[torch.nn.Module, Any], torch.Tensor] | None
    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    build_optimizer: Callable[[Any], torch.optim.Optimizer] | None
    source: WorkloadSource
    parallelize: Callable[[torch.nn.Module, Any], Any] | None = None
    assumptions: tuple[str, ...] = ()


@dataclass
class Workload:
    """A live model, its batch and its optimizer on one device (mutable: it trains).
    ``notes``: what the model file assumed (``ModelFile.assumptions``) and what was changed
    in the model to plan it (its own checkpointing switched off, see
    :func:`switch_off_own_checkpointing`), one line each. ``loop``: the training loop's
    shape its steps run in (:func:`run_training_step`). ``caches_off``: the Hugging Face
    models in it whose cache was switched off for training
    (:func:`planner.model_switches.switch_off_caches`)."""

    model_file: ModelFile
    model: torch.nn.Module
    batch: Any
    optimizer: torch.optim.Optimizer
    device: torch.device
    notes: tuple[str, ...] = ()
    loop: LoopShape = PLAIN_LOOP
    caches_off: tuple[str, ...] = ()


OWN_CHECKPOINTING_NOTE = "the model checkpoints "
"""How a profile's ``assumptions`` line about the model's own checkpointing begins."""


def own_checkpointing_notes(assumptions: tuple[str, ...]) -> tuple[str, ...]:
    """The lines of a profile's or plan's ``assumptions`` about checkpointing the model does
    itself (switched off to plan, or counted where it could not be)."""
    return tuple(line for line in assumptions if line.startswith(OWN_CHECKPOINTING_NOTE))


def switch_off_own_checkpointing(model: torch.nn.Module) -> tuple[str, ...]:
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
    found = f"{OWN_CHECKPOINTING_NOTE}itself ({flag_names(flags)} on)"
    stuck = own_checkpointing_flags(model)
    if stuck:
        return (
            f"{found}: {flag_names(stuck)} could not be switched off, so the plan counts that "
            "checkpointing (its modules are recomputed whatever the plan)",
        )
    return (
        f"{found}: switched off to plan as if it were not there, with {' and '.join(how)}; "
        "do the same in training before apply_plan, or the modules it covers are "
        "checkpointed twice",
    )


def _error_location(error: BaseException, path: Path) -> str:
    """``path:line`` of the deepest frame of ``error`` inside the model file, if any."""
    if isinstance(error, SyntaxError) and error.lineno:
        return f"{path}:{error.lineno}"
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if Path(frame.filename).resolve() == path:
            return f"{path}:{frame.lineno}"
    return str(path)


def takes_batch_size(sample_batch: Callable[..., Any]) -> bool:
    """Whether ``sample_batch`` accepts a ``batch_size`` keyword (needed by ``--batch-size``
    on a model file and by ``ckpt-plan fit``)."""
    try:
        parameters = inspect.signature(sample_batch).parameters
    except (TypeError, ValueError):
        return False
    return "batch_size" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
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
        from planner.measure.hf import load_hf_model_file

        return load_hf_model_file(source)
    path, batch_size = source.path, source.batch_size
    source_file = path.expanduser().resolve()
    if not source_file.is_file():
        raise ModelFileError(f"model file {path} does not exist; pass the path to a .py file")
    digest = hashlib.sha1(str(source_file).encode()).hexdigest()[:12]
    module_name = f"ckpt_plan_model_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, source_file)
    if spec is None or spec.loader is None:
        raise ModelFileError(f"cannot import {path}: is it a Python (.py) file?")
    module: ModuleType = importlib.util.module_from_spec(spec)
    # Let the file import its neighbours, as `python model.py` would.
    sys.path.insert(0, str(source_file.parent))
    try:
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(module_name, None)
        where = _error_location(error, source_file)
        raise ModelFileError(
            f"cannot import model file ({where}): {type(error).__name__}: {error}"
        ) from error
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(source_file.parent))

    def required(name: str, signature: str) -> Callable[..., Any]:
        function = getattr(module, name, None)
        if not callable(function):
            raise ModelFileError(
                f"model file {path} must define {signature}; see the README's 'Model file' section"
            )
        return function

    def optional(name: str) -> Callable[..., Any] | None:
        function = getattr(module, name, None)
        if function is not None and not callable(function):
            raise ModelFileError(f"{name} in {path} must be a function")
        return function

    model_file = ModelFile(
        path=source_file,
        name=source_file.stem,
        build_model=required("build_model", "build_model() -> torch.nn.Module"),
        sample_batch=required("sample_batch", "sample_batch() returning one training batch"),
        training_step=optional("training_step"),
        loss_fn=optional("loss_fn"),
        build_optimizer=optional("build_optimizer"),
        parallelize=optional("parallelize"),
        source=WorkloadSource.model_file(source_file),
    )
    if model_file.build_optimizer is not None:
        optimizer_takes_model(model_file)  # a wrong signature fails here, before any work
    if batch_size is not None:
        if not takes_batch_size(model_file.sample_batch):
            raise ModelFileError(
                f"sample_batch() in {path} takes no batch size: define it as "
                "sample_batch(batch_size=...) to choose the batch size from the command line"
            )
        sample_batch: Callable[..., Any] = model_file.sample_batch
        model_file = dataclasses.replace(
            model_file,
            sample_batch=functools.partial(sample_batch, batch_size=batch_size),
            source=WorkloadSource.model_file(source_file, batch_size),
        )
    return model_file


def optimizer_takes_model(model_file: ModelFile) -> bool:
    """Whether the model file's ``build_optimizer`` is given the model, or its parameters.

    The rule, by the signature: a function whose one parameter is named ``model`` gets the
    model (``build_optimizer(model)``: weight-decay groups by module type, as nanoGPT's
    ``configure_optimizers`` builds them); any other name gets ``model.parameters()``
    (``build_optimizer(parameters)``). It must take exactly one argument."""
    function = model_file.build_optimizer
    assert function is not None
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: the classic contract
        return False
    positional = [
        parameter
        for parameter in signature.parameters.values()
        if parameter.kind
        in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required = [
        parameter
        for parameter in signature.parameters.values()
        if parameter.default is inspect.Parameter.empty
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if not positional or len(required) > 1 or (required and required[0] is not positional[0]):
        raise ModelFileError(
            f"build_optimizer{signature} in {model_file.path} must take one argument: "
            "build_optimizer(model) to get the model, or build_optimizer(parameters) to get "
            "model.parameters()"
        )
    return positional[0].name == "model"


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


@contextlib.contextmanager
def _user_code(what: str, path: Path) -> Iterator[None]:
    """Turn an exception raised by the model file's code into a one-line ProfilingError."""
    try:
        yield
    except (ModelFileError, ProfilingError):
        raise
    except Exception as error:
        where = _error_location(error, path)
        hint = ""
        if what == "build_model()" and _raised_in_torch_distributed(error):
            hint = f"; {_SHARDED_AT_BUILD.format(path=path)}"
        raise ProfilingError(
            f"{what} raised {type(error).__name__} ({where}): {error}{hint}"
        ) from error


def _raised_in_torch_distributed(error: BaseException) -> bool:
    """Whether ``error`` came from inside ``torch.distributed`` (a model file sharding its
    model, or starting a process group, where there is none)."""
    frames = traceback.extract_tb(error.__traceback__)
    return any(f"torch{os.sep}distributed{os.sep}" in frame.filename for frame in frames)


def checked_model(model_file: ModelFile, model: object) -> torch.nn.Module:
    """What ``build_model()`` returned, if it is a module (a one-line error if not)."""
    if not isinstance(model, torch.nn.Module):
        raise ModelFileError(
            f"build_model() in {model_file.path} returned {type(model).__name__}, "
            "not a torch.nn.Module"
        )
    if _is_laid_out(model):
        raise ModelFileError(_SHARDED_AT_BUILD.format(path=model_file.path))
    return model


_SHARDED_AT_BUILD = (
    "build_model() in {path} shards or wraps the model itself (fully_shard or "
    "DistributedDataParallel): return the unsharded model and move that code into "
    "parallelize(model, mesh), which ckpt-plan calls after applying the plan, as training must"
)


def _is_laid_out(model: torch.nn.Module) -> bool:
    """Whether ``model`` is sharded by ``fully_shard`` or wrapped in DDP already."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return True
    if not (torch.distributed.is_available() and "torch.distributed.fsdp" in sys.modules):
        return False
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(module, FSDPModule) for module in model.modules())


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
        notes = (*model_file.assumptions, *switch_off_own_checkpointing(model))
    caches_off = switch_off_caches(model)
    with _user_code("sample_batch()", model_file.path):
        torch.manual_seed(seed + 1)
        batch = _to_device(model_file.sample_batch(), target)
    optimizer = build_optimizer(model_file, model)
    return Workload(model_file, model, batch, optimizer, target, notes, loop, caches_off)


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
        if model_file.loss_fn is not None:
            loss = model_file.loss_fn(output, batch)
            source = "loss_fn()"
        elif getattr(output, "loss", None) is not None:
            loss = output.loss
            source = "the model output's .loss"
        else:
            loss = output
            source = "the model output"
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

    Returns the loss it ran backward on (divided by N when accumulating), detached.
    ``seed`` reseeds the global RNG first so that random ops (dropout) draw the same numbers
    in runs that should be comparable. ``phase_ended`` is called with each :class:`Phase`
    as it ends (forward: the loss computed). An error in the model's code is a one-line
    :class:`ProfilingError`.
    """
    loop = workload.loop
    if seed is not None:
        torch.manual_seed(seed)
    with _user_code("the training step", workload.model_file.path):
        if loop.zero_grad is ZeroGrad.BEFORE_FORWARD and not loop.accumulates:
            workload.optimizer.zero_grad(set_to_none=True)
        loss = compute_loss(workload.model_file, workload.model, workload.batch)
        if loop.accumulates:
            # Scaled so that the accumulated gradient is the mean's, as loops do.
            loss = loss / loop.grad_accum
        if phase_ended:
            phase_ended(Phase.FORWARD)
        if loop.zero_grad is ZeroGrad.AFTER_FORWARD and not loop.accumulates:
            workload.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if phase_ended:
            phase_ended(Phase.BACKWARD)
        workload.optimizer.step()
        if phase_ended:
            phase_ended(Phase.OPTIMIZER)
    return loss.detach()
