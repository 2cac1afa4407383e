"""A Hugging Face model from a local ``config.json``, as a workload (``--hf CONFIG``).

A user of ``transformers`` already has the model as a config: this builds the model-file
contract from it, so no model file needs writing. :func:`hf_workload` checks the config and
the batch shape and returns an :class:`HfWorkload`; :func:`load_hf_model_file` turns that
into a :class:`~planner.measure.workload.ModelFile`, which every stage then runs like any
other (the fake-tensor profile, timing, the check in a separate process, ``verify``).

What is built, and why:

* **The model**: the class the config's ``architectures`` names where that is a
  ``transformers`` class, else ``AutoModelForCausalLM``'s class for its ``model_type``;
  built with ``_from_config(config, dtype=...)`` (what ``from_config`` calls), random
  weights from the seeded global RNG. On fake tensors it is built on the meta device, as any
  model file's is, so an 8B config plans on a laptop. ``use_cache`` is set to False: a
  training step keeps no key/value cache (a model that fills one is not checkpointable).
* **The batch**: ``input_ids`` (``batch_size`` x ``seq_len``, int64, uniform below
  ``vocab_size``, from the seeded RNG), ``attention_mask`` (all ones) and ``labels`` (a copy
  of ``input_ids``: the model shifts them itself, as a causal-LM data collator gives them).
  The loss is the model's own ``output.loss``.
* **The optimizer**: ``torch.optim.AdamW(fused=True, lr=5e-5)``, the Hugging Face Trainer's
  default (``optim="adamw_torch_fused"``). Its state is in the parameters' dtype.
* **The dtype**: ``--dtype``, else the config's own (``dtype`` or ``torch_dtype``), else
  float32. The parameters are made in it; no autocast.

Nothing is downloaded: the config is read from disk, and a config that needs remote code (a
class ``transformers`` does not have) is an error naming the fix.

A workload travels between processes and into profiles and plans as its **source**, one
string: ``hf:/abs/path/config.json?batch_size=1&seq_len=4096&dtype=bfloat16``
(:attr:`HfWorkload.source`, :func:`parse_hf_source`). Where a model file's path is carried,
this string is carried instead, and :func:`planner.measure.workload.load_model_file` reads
either.
"""

from __future__ import annotations

import json
import shlex
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.core.errors import ModelFileError

if TYPE_CHECKING:
    import torch

    from planner.measure.workload import ModelFile

__all__ = [
    "BATCH_SIZE_QUERY",
    "DTYPES",
    "HF_SOURCE_PREFIX",
    "HfWorkload",
    "hf_workload",
    "is_hf_source",
    "load_hf_model_file",
    "max_seq_len",
    "parse_hf_source",
    "workload_arguments",
    "workload_in_command",
]

HF_SOURCE_PREFIX = "hf:"
DTYPES = ("float32", "bfloat16", "float16")
"""The parameter dtypes ``--dtype`` takes."""

# The Hugging Face Trainer's default optimizer (optim="adamw_torch_fused", learning_rate).
_LEARNING_RATE = 5e-5


@dataclass(frozen=True)
class HfWorkload:
    """A Hugging Face config and the synthetic batch to plan it for (see the module
    docstring). ``config_path`` is the ``config.json`` itself, resolved."""

    config_path: Path
    batch_size: int
    seq_len: int
    dtype: str

    @property
    def source(self) -> str:
        """The one string this workload is carried as (module docstring)."""
        query = urllib.parse.urlencode(
            {"batch_size": self.batch_size, "seq_len": self.seq_len, "dtype": self.dtype}
        )
        return f"{HF_SOURCE_PREFIX}{self.config_path}?{query}"

    @property
    def name(self) -> str:
        """The model's name: its folder's for a ``config.json`` (``Meta-Llama-3-8B``),
        else the file's stem (``llama-3-8b`` for ``llama-3-8b.json``)."""
        if self.config_path.name == "config.json" and self.config_path.parent.name:
            return self.config_path.parent.name
        return self.config_path.stem

    def command_arguments(self) -> list[str]:
        """The command-line options that name this workload (``--hf CONFIG --batch-size B
        --seq-len S --dtype D``), for commands printed to the user."""
        return [
            "--hf",
            str(self.config_path),
            "--batch-size",
            str(self.batch_size),
            "--seq-len",
            str(self.seq_len),
            "--dtype",
            self.dtype,
        ]


def is_hf_source(source: object) -> bool:
    """Whether ``source`` (a model file's path, or a workload's source string) names a
    Hugging Face workload."""
    return isinstance(source, str) and source.startswith(HF_SOURCE_PREFIX)


BATCH_SIZE_QUERY = "?batch_size="
"""How a model file's source names a batch size: ``PATH?batch_size=N``
(:func:`planner.measure.workload.model_file_source`)."""


def workload_arguments(source: str, model: str | None = None) -> list[str]:
    """The command-line options that name the workload of ``source`` (a profile's or plan's
    ``model_file``): the ``--hf`` options of a Hugging Face workload, else the model file
    (``model`` in its place where given, e.g. ``MODEL.py`` for a command to run on another
    machine), with ``--batch-size N`` for a model file's ``PATH?batch_size=N``."""
    if is_hf_source(source):
        return parse_hf_source(source).command_arguments()
    path, query, batch_size = source.rpartition(BATCH_SIZE_QUERY)
    if not (query and batch_size.isdigit()):
        path, batch_size = source, ""
    return [model or path, *(["--batch-size", batch_size] if batch_size else [])]


def workload_in_command(source: str | None) -> str:
    """How a printed command names the workload of ``source`` on the machine a plan is for:
    its ``--hf`` options, or ``MODEL.py`` (see :func:`workload_arguments`)."""
    return shlex.join(workload_arguments(source or "", model="MODEL.py"))


def parse_hf_source(source: str) -> HfWorkload:
    """The :class:`HfWorkload` that :attr:`HfWorkload.source` wrote, as written: its config
    is not read here (a plan made elsewhere names a config path of that machine);
    :func:`load_hf_model_file` checks it."""
    path, _, query = source.removeprefix(HF_SOURCE_PREFIX).rpartition("?")
    values = dict(urllib.parse.parse_qsl(query))
    try:
        batch_size, seq_len = int(values["batch_size"]), int(values["seq_len"])
        dtype = values["dtype"]
    except (KeyError, ValueError):
        raise ModelFileError(
            f"{source!r} is not a Hugging Face workload source (expected "
            f"{HF_SOURCE_PREFIX}CONFIG?batch_size=B&seq_len=S&dtype=D); re-create the profile"
        ) from None
    return HfWorkload(Path(path), batch_size, seq_len, dtype)


def _config_file(config: str | Path) -> Path:
    given = Path(config).expanduser()
    path = given / "config.json" if given.is_dir() else given
    if not path.is_file():
        where = f"{given} holds no config.json" if given.is_dir() else f"{given} does not exist"
        raise ModelFileError(
            f"--hf {config}: {where}; pass a local config.json or a model folder holding "
            "one (nothing is downloaded: save one with "
            "AutoConfig.from_pretrained(NAME).save_pretrained(FOLDER))"
        )
    return path.resolve()


def _read_config(path: Path) -> dict[str, Any]:
    """The config's JSON object, with a ``model_type``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelFileError(
            f"--hf {path}: not a readable JSON config ({error}); pass a Hugging Face config.json"
        ) from error
    if not isinstance(data, dict):
        raise ModelFileError(f"--hf {path}: not a Hugging Face config (expected a JSON object)")
    if not isinstance(data.get("model_type"), str) or not data["model_type"]:
        raise ModelFileError(
            f'--hf {path}: the config has no "model_type"; add the family transformers '
            'builds it as (e.g. "model_type": "llama"), as config.json files from the Hub have'
        )
    return data


def _config_dtype(data: dict[str, Any], path: Path) -> str:
    """The dtype the config names (``dtype``, or ``torch_dtype`` before transformers 5),
    float32 if none."""
    named = data.get("dtype") or data.get("torch_dtype")
    if named is None or named == "auto":
        return "float32"
    named = str(named).removeprefix("torch.")
    if named not in DTYPES:
        raise ModelFileError(
            f"--hf {path}: the config's dtype {named!r} is not one of {', '.join(DTYPES)}; "
            "pass --dtype"
        )
    return named


def _positions(data: dict[str, Any]) -> int | None:
    """The most positions a config allows (``max_position_embeddings``, GPT-2's
    ``n_positions``), or None where it names no limit."""
    positions = data.get("max_position_embeddings", data.get("n_positions"))
    return positions if isinstance(positions, int) else None


def max_seq_len(workload: HfWorkload) -> int | None:
    """The most positions the workload's config allows, or None where it names no limit."""
    return _positions(_read_config(workload.config_path))


def hf_workload(
    config: str | Path, batch_size: int, seq_len: int, dtype: str | None = None
) -> HfWorkload:
    """Check a Hugging Face workload before anything is built: ``config`` is a local
    ``config.json`` or a folder holding one, with a ``model_type``; ``batch_size`` and
    ``seq_len`` are positive and the sequence fits the config's positions; ``dtype``
    (default: the config's, else float32) is one of :data:`DTYPES`. Raises
    :class:`ModelFileError` naming the fix."""
    path = _config_file(config)
    data = _read_config(path)
    if batch_size < 1 or seq_len < 1:
        raise ModelFileError(
            f"--batch-size {batch_size} --seq-len {seq_len}: both must be at least 1"
        )
    positions = _positions(data)
    if positions is not None and seq_len > positions:
        raise ModelFileError(
            f"--seq-len {seq_len} is longer than the {positions} positions the config "
            f"{path} allows (max_position_embeddings); pass --seq-len {positions} or less"
        )
    if dtype is not None and dtype not in DTYPES:
        raise ModelFileError(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
    return HfWorkload(path, batch_size, seq_len, dtype or _config_dtype(data, path))


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as error:
        raise ModelFileError(
            "--hf needs the transformers package: pip install transformers"
        ) from error
    return transformers


def _build_config(workload: HfWorkload) -> Any:
    """The ``transformers`` config object, for training (``use_cache=False``)."""
    transformers = _transformers()
    data = _read_config(workload.config_path)
    model_type = data["model_type"]
    try:
        config_class = transformers.CONFIG_MAPPING[model_type]
    except KeyError:
        raise ModelFileError(
            f"--hf {workload.config_path}: transformers {transformers.__version__} does not "
            f"know model_type {model_type!r} (a model needing remote code, or a newer "
            "transformers); upgrade transformers, or write a model file for it"
        ) from None
    try:
        config = config_class.from_dict(data)
    except Exception as error:  # the config's own validation: a field out of range
        raise ModelFileError(
            f"--hf {workload.config_path}: transformers rejects the config "
            f"({type(error).__name__}: {error}); fix that field"
        ) from error
    config.use_cache = False
    return config


def _model_class(workload: HfWorkload, config: Any) -> Any:
    """The class the config's ``architectures`` names, if ``transformers`` has it, else
    ``AutoModelForCausalLM``'s class for the config."""
    transformers = _transformers()
    for name in getattr(config, "architectures", None) or ():
        named = getattr(transformers, str(name), None)
        if isinstance(named, type) and issubclass(named, transformers.PreTrainedModel):
            return named
    causal = transformers.MODEL_FOR_CAUSAL_LM_MAPPING
    if type(config) in causal:
        return causal[type(config)]
    raise ModelFileError(
        f"--hf {workload.config_path}: transformers has no causal language model for "
        f"model_type {config.model_type!r}, and the config's architectures "
        f"({', '.join(getattr(config, 'architectures', None) or ['none'])}) name no "
        'transformers class; name one in "architectures", or write a model file'
    )


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype


def load_hf_model_file(workload: HfWorkload) -> ModelFile:
    """The model-file contract for ``workload`` (module docstring). The workload is checked
    as :func:`hf_workload` checks a new one, and the config read and its class found here,
    so an architecture ``transformers`` cannot build fails now, before any work."""
    import torch

    from planner.measure.workload import ModelFile

    workload = hf_workload(
        workload.config_path, workload.batch_size, workload.seq_len, workload.dtype
    )
    transformers = _transformers()
    config = _build_config(workload)
    model_class = _model_class(workload, config)
    vocab_size = getattr(config.get_text_config(), "vocab_size", None)
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise ModelFileError(
            f'--hf {workload.config_path}: the config has no "vocab_size"; add it (the '
            "synthetic batch draws token ids below it)"
        )
    dtype = _torch_dtype(workload.dtype)
    causal_models = transformers.MODEL_FOR_CAUSAL_LM_MAPPING  # lazy: look up one key only
    causal = type(config) in causal_models and causal_models[type(config)] is model_class

    def build_model() -> torch.nn.Module:
        model = model_class._from_config(_build_config(workload), dtype=dtype)
        if causal and model.loss_type is None:
            # transformers picks the loss from the class name, which some causal LMs'
            # ("GPT2LMHeadModel") do not match: it falls back to this same loss with a
            # warning. Naming it avoids the warning.
            model.loss_type = "ForCausalLM"
        return model

    def sample_batch() -> dict[str, torch.Tensor]:
        shape = (workload.batch_size, workload.seq_len)  # (B, T)
        input_ids = torch.randint(0, vocab_size, shape)
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "labels": input_ids.clone(),  # the model shifts them by one position itself
        }

    def build_optimizer(parameters: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(parameters, lr=_LEARNING_RATE, fused=True)

    return ModelFile(
        path=workload.config_path,
        name=workload.name,
        build_model=build_model,
        sample_batch=sample_batch,
        training_step=None,
        loss_fn=None,
        build_optimizer=build_optimizer,
        source=workload.source,
        assumptions=(
            f"Hugging Face {model_class.__name__} from {workload.config_path} in "
            f"{workload.dtype} (use_cache=False); a synthetic batch of {workload.batch_size} "
            f"x {workload.seq_len} random token ids with attention_mask and labels; "
            "AdamW(fused=True, lr=5e-5), the Trainer's default",
        ),
    )
