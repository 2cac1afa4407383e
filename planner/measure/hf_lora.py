"""LoRA adapters on a ``--hf`` model (``--lora``): plan the model ``peft`` fine-tunes.

Most people whose model does not fit fine-tune it with LoRA (``peft.get_peft_model``): the
base weights are frozen, small adapters beside the chosen linear layers train. Its step
is another step than full training: no gradients or optimizer state for the base weights,
and a frozen linear layer saves nothing for its weight's gradient (it keeps its input
only where an adapter beside it trains), so a plan made for full training is made for
another workload. ``--lora`` names the adapters, in one of two forms:

* **a rank**, ``--lora 16``: ``peft.LoraConfig(r=16, target_modules="all-linear")``, peft's
  other defaults (``lora_alpha`` 8, no dropout), and the task type of the head
  (``CAUSAL_LM`` for a causal language model, ``SEQ_CLS`` for a sequence classifier, which
  also trains its head, ...: :data:`TASK_TYPES`);
* **peft's own config**, ``--lora adapter_config.json`` (or the folder holding one): the
  file ``LoraConfig(...).save_pretrained(folder)`` writes, or an adapter's from the Hub,
  read as ``LoraConfig.from_pretrained`` reads it. Its dropout, targets, DoRA and modules to
  save are planned as they are; ``inference_mode`` is taken as off (the adapters train),
  and an ``init_lora_weights`` that computes from the weights (PiSSA, OLoRA, LoftQ, EVA,
  ...) as peft's default initialization: the same shapes and dtypes, so the same memory.

``peft.get_peft_model`` builds the adapters exactly as training does (float32 adapters
on a bfloat16 or float16 model, as peft makes them), so the
plan names the modules of the model it returns: in ``train.py``, ``apply_plan`` after
``get_peft_model(model, config)`` with the same config. The check is the fingerprint, as
for any plan: other adapters are a :class:`~planner.core.errors.PlanMismatchError`.

Quantized base weights (QLoRA's 4-bit ``bitsandbytes`` layers) are not built here: they
need CUDA kernels that neither fake tensors nor this CPU run.

Pure Python where a source is checked (:func:`lora_spec`); ``peft`` and torch are imported
when the adapters are built.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.core.errors import ModelFileError

if TYPE_CHECKING:
    import torch

__all__ = ["ADAPTER_CONFIG", "TASK_TYPES", "LoraAdapters", "lora_adapters", "lora_spec"]

ADAPTER_CONFIG = "adapter_config.json"
"""The file peft writes an adapter's config to (``PeftConfig.save_pretrained``)."""

TASK_TYPES = {
    "causal-lm": "CAUSAL_LM",
    "seq2seq-lm": "SEQ_2_SEQ_LM",
    "sequence-classification": "SEQ_CLS",
    "token-classification": "TOKEN_CLS",
    "question-answering": "QUESTION_ANS",
}
"""peft's task type for a ``--lora RANK`` on each kind of head (other heads: none, a plain
``PeftModel``, as ``get_peft_model`` gives a config without one)."""

_FROZEN = "; the base weights frozen (no gradients or optimizer state)"


def lora_spec(value: str | Path) -> str:
    """``--lora``'s value as a source carries it: a rank (``"16"``), or the absolute path of
    an adapter config (a folder given: its ``adapter_config.json``). Raises
    :class:`ModelFileError` naming the fix for anything else. Reads the file: it must be
    a JSON object of a LoRA adapter."""
    text = str(value).strip()
    if re.fullmatch(r"[+-]?\d+", text):
        if int(text) < 1:
            raise ModelFileError(
                f"--lora {text}: a LoRA rank is 1 or more (16 is common); or give peft's "
                f"{ADAPTER_CONFIG}"
            )
        return str(int(text))
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / ADAPTER_CONFIG
    if not path.is_file():
        raise ModelFileError(
            f"--lora {text}: not a rank or a file; give a rank (--lora 16) or peft's "
            f"{ADAPTER_CONFIG} (written by LoraConfig(...).save_pretrained(folder)), or the "
            "folder holding it"
        )
    _read(path)
    return str(path.resolve())


def _read(path: Path) -> dict[str, Any]:
    """The adapter config at ``path``, checked to be a LoRA adapter's."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelFileError(f"--lora {path}: cannot read it as JSON ({error})") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"--lora {path}: expected a JSON object, peft's adapter config")
    kind = data.get("peft_type", "LORA")
    if kind != "LORA":
        raise ModelFileError(
            f"--lora {path}: peft_type is {kind!r}; --lora plans LoRA adapters (peft_type "
            '"LORA"): plan other adapters with a model file whose build_model() returns '
            "get_peft_model(model, config)"
        )
    rank = data.get("r", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ModelFileError(f"--lora {path}: its rank r is {rank!r}; a rank is 1 or more")
    return data


@dataclasses.dataclass(frozen=True)
class LoraAdapters:
    """The adapters of a ``--lora`` spec, ready to put on a model: :meth:`apply` is
    ``peft.get_peft_model`` with :attr:`config`; :attr:`said`, for the assumptions."""

    config: Any  # peft.LoraConfig
    said: str
    fix: str  # what to do where peft cannot put them on the model

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        import peft

        with warnings.catch_warnings():
            # peft asks the model is_gradient_checkpointing, which transformers 5 deprecates
            warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
            try:
                return peft.get_peft_model(model, self.config)  # type: ignore[no-any-return]
            except (ValueError, TypeError, KeyError) as error:
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                raise ModelFileError(
                    f"--lora: peft could not put the adapters on {type(model).__name__} "
                    f"({type(error).__name__}: {first.rstrip('.')}); {self.fix}"
                ) from None


def lora_adapters(spec: str, head: str | None) -> LoraAdapters:
    """The adapters ``spec`` (:func:`lora_spec`'s) names, for a model of ``head``
    (:data:`TASK_TYPES`' keys). Imports peft: a one-line error naming the install where it
    is missing."""
    try:
        import peft
    except ImportError:
        raise ModelFileError(
            "--lora needs peft, which is not installed here: pip install peft"
        ) from None
    if spec.isdigit():
        task_type = TASK_TYPES.get(head or "")
        config = peft.LoraConfig(r=int(spec), target_modules="all-linear", task_type=task_type)
        task = f", task type {task_type}" if task_type else ""
        said = (
            f"LoRA adapters (peft {peft.__version__}): rank {spec} on every linear layer but "
            f"the output head, lora_alpha {config.lora_alpha}, no dropout{task}"
        )
        fix = (
            f"give --lora peft's {ADAPTER_CONFIG} naming the layers to adapt instead: "
            f"LoraConfig(r={spec}, target_modules=[...]).save_pretrained(FOLDER), then "
            "--lora FOLDER"
        )
        return LoraAdapters(config, said + _FROZEN, fix)
    path = Path(spec)
    data = _read(path)
    known = {field.name for field in dataclasses.fields(peft.LoraConfig)}
    values = {key: value for key, value in data.items() if key in known}
    values["inference_mode"] = False  # a trained adapter's file says true: it trains on
    init = values.get("init_lora_weights", True)
    computed = not isinstance(init, bool)
    if computed:
        values["init_lora_weights"] = True
    for key in ("peft_type", "peft_version", "auto_mapping", "revision", "base_model_name_or_path"):
        values.pop(key, None)
    try:
        config = peft.LoraConfig(**values)
    except (TypeError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ModelFileError(
            f"--lora {path}: peft refuses this config: {type(error).__name__}: {first}"
        ) from None
    targets = config.target_modules
    if targets is None:  # peft picks the layers it knows for the architecture
        shown = "peft's default layers for the architecture"
    else:
        shown = targets if isinstance(targets, str) else ", ".join(sorted(targets))
    extras = []
    if config.lora_dropout:
        extras.append(f"dropout {config.lora_dropout:g}")
    if config.use_dora:
        extras.append("DoRA")
    if config.modules_to_save:
        extras.append(f"training {', '.join(config.modules_to_save)} whole")
    if computed:
        extras.append(f"initialized as peft's default (its {init!r}: same shapes)")
    task = f", task type {config.task_type}" if config.task_type else ""
    said = (
        f"LoRA adapters (peft {peft.__version__}) from {path}: rank {config.r} on {shown}"
        f"{''.join(', ' + extra for extra in extras)}{task}"
    )
    fix = f"name layers the model has in target_modules in {path} (a name's last part: q_proj)"
    return LoraAdapters(config, said + _FROZEN, fix)
