"""The model-file contract (docs/architecture.md, "Model file"): a Python file that defines
``build_model()`` and ``sample_batch()``, and optionally ``training_step(model, batch)``,
``loss_fn(output, batch)``, ``build_optimizer(parameters)`` or ``build_optimizer(model)``
(see :func:`optimizer_takes_model`), and ``parallelize(model, mesh)``.

:func:`load_python_model_file` imports a file and checks the contract once, returning a
:class:`ModelFile`; :mod:`planner.measure.hf` builds the same record from a Hugging Face
config, and :func:`planner.measure.workload.load_model_file` loads either from its source.
Errors in the file's own code are reported with the file's line (:func:`_user_code`).
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
from planner.measure.source import WorkloadSource

__all__ = [
    "ModelFile",
    "checked_model",
    "load_python_model_file",
    "optimizer_takes_model",
    "takes_batch_size",
]


@dataclass(frozen=True)
class ModelFile:
    """The functions a model file provides, checked against the contract.

    ``source`` is what :func:`~planner.measure.workload.load_model_file` builds it again
    from, in another process or from a saved profile (:mod:`planner.measure.source`): the
    file's path, with the batch size given to its ``sample_batch``, or a Hugging Face
    workload (:mod:`planner.measure.hf`; ``path`` is then its config). ``assumptions``: what
    the workload itself assumed, one line each, for the profile's assumptions.
    ``parallelize(model, mesh)`` (optional) lays the model out for a ``torchrun`` job, as
    torchtitan's ``parallelize_*`` functions do, after ``apply_plan``: ``fully_shard`` for
    FSDP2, tensor parallelism on ``mesh["tp"]``, or DDP (:mod:`planner.measure.distributed`)."""

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


def load_python_model_file(source: WorkloadSource) -> ModelFile:
    """Import the model file at ``source.path`` and check it defines the contract (module
    docstring); with ``source.batch_size``, its ``sample_batch`` is given that batch size.
    Raises :class:`ModelFileError` naming what to fix."""
    assert not source.is_hugging_face, source
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
        elif "FlexAttention does not support backward on CPU" in str(error):
            # torch 2.13 trains FlexAttention on CUDA only; the emulated CUDA step runs it
            # (planner/measure/cuda_emulation.py), with times from the target's roofline.
            hint = (
                " Plan for the GPU you train on with --target (e.g. --target h100-80gb): "
                "the step is then recorded as on CUDA, on fake tensors."
            )
        elif "no padding token is defined" in str(error):
            # A decoder-only sequence classifier finds each sequence's last token by it;
            # --hf takes the eos id where the config names one (planner/measure/hf.py).
            hint = (
                "; set pad_token_id in the model's config (in config.json for --hf): "
                "your tokenizer's pad id, or its eos id as fine-tuning scripts do"
            )
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
    "build_model() in {path} shards or wraps the model itself (fully_shard, tensor "
    "parallelism or DistributedDataParallel): return the unsharded model and move that code into "
    "parallelize(model, mesh), which ckpt-plan calls after applying the plan, as training must"
)


def _is_laid_out(model: torch.nn.Module) -> bool:
    """Whether ``model`` is sharded by ``fully_shard`` or tensor parallelism (``DTensor``
    parameters), or wrapped in DDP already."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return True
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return True
    if not (torch.distributed.is_available() and "torch.distributed.fsdp" in sys.modules):
        return False
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(module, FSDPModule) for module in model.modules())


def _error_location(error: BaseException, path: Path) -> str:
    """``path:line`` of the deepest frame of ``error`` inside the model file, if any."""
    if isinstance(error, SyntaxError) and error.lineno:
        return f"{path}:{error.lineno}"
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if Path(frame.filename).resolve() == path:
            return f"{path}:{frame.lineno}"
    return str(path)
