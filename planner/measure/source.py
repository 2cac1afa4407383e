"""Where a workload comes from: a model file, or a Hugging Face config (``--hf``).

A workload travels between processes (a plan's check runs in a child process) and into
profiles and plans (their ``model_file``) as one line of text, its source:

* ``/abs/path/model.py``: a model file;
* ``/abs/path/model.py?batch_size=8``: a model file whose ``sample_batch(batch_size=8)``
  makes the batch;
* ``hf:/abs/path/config.json?batch_size=1&seq_len=4096&dtype=bfloat16``: a Hugging Face
  config and the synthetic batch to plan it for (:mod:`planner.measure.hf`); an image
  classifier's has no ``seq_len`` (its images are the config's size); a vision-language
  model's may name its ``images`` a sequence (``&images=0``: text alone; none: the default),
  a speech language model's its ``clips``; one fine-tuned with LoRA its adapters, ``&lora=16``
  (a rank) or ``&lora=/abs/path/adapter_config.json`` (:mod:`planner.measure.hf_lora`); one
  whose forward runs under ``torch.autocast`` (``Trainer(bf16=True)``) its dtype,
  ``&autocast=bfloat16``.

:class:`WorkloadSource` is that line as a record: :meth:`WorkloadSource.parse` reads it where
text comes in (a path passed to :func:`~planner.measure.workload.load_model_file`, a profile's
or plan's ``model_file``, a child process's argument) and ``str()`` writes it; no other
module reads or writes the text. Pure Python, no torch.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import shlex
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from planner.core.errors import ModelFileError

__all__ = ["SourceKind", "WorkloadSource", "workload_in_command"]

_HF_PREFIX = "hf:"
_BATCH_SIZE_QUERY = "?batch_size="


class SourceKind(enum.Enum):
    MODEL_FILE = "model file"
    HUGGING_FACE = "hf"


@dataclass(frozen=True)
class WorkloadSource:
    """A workload's source (see the module docstring). ``path`` is the model file, or the
    Hugging Face ``config.json``. ``batch_size``: for a model file, the one its
    ``sample_batch(batch_size=...)`` is given (None: its own default); for a Hugging Face
    workload, with ``seq_len`` (None for images) and ``dtype`` (the parameters'), the
    synthetic batch's shape, ``images``, a vision-language model's images a sequence
    (None: its default, :mod:`planner.measure.hf_images`), and ``clips``, a speech language
    model's clips (:mod:`planner.measure.hf_audio`), ``lora``, LoRA adapters to train
    instead of the weights (a rank, or an adapter config's path: :mod:`planner.measure.hf_lora`),
    ``autocast``, the dtype the forward autocasts to (None: no autocast), and ``choices``, a
    multiple-choice head's choices an example (None: its default).
    Build one with :meth:`model_file` or :meth:`hugging_face`; nothing here reads the file."""

    kind: SourceKind
    path: Path
    batch_size: int | None = None
    seq_len: int | None = None
    dtype: str | None = None
    images: int | None = None
    clips: int | None = None
    lora: str | None = None
    autocast: str | None = None
    choices: int | None = None

    def __post_init__(self) -> None:
        shape = (self.batch_size, self.dtype)
        if self.kind is SourceKind.HUGGING_FACE and None in shape:
            raise ValueError(f"a Hugging Face workload needs a batch size and dtype: {self}")
        hf_only = (
            self.seq_len,
            self.dtype,
            self.images,
            self.clips,
            self.lora,
            self.autocast,
            self.choices,
        )
        if self.kind is SourceKind.MODEL_FILE and hf_only != (None,) * len(hf_only):
            raise ValueError(
                "a model file's source takes no seq_len, dtype, images, clips, lora, autocast "
                "or choices"
            )

    @classmethod
    def model_file(
        cls, path: str | os.PathLike[str], batch_size: int | None = None
    ) -> WorkloadSource:
        return cls(SourceKind.MODEL_FILE, Path(path), batch_size)

    @classmethod
    def hugging_face(
        cls,
        config_path: str | os.PathLike[str],
        batch_size: int,
        seq_len: int | None,
        dtype: str,
        images: int | None = None,
        clips: int | None = None,
        lora: str | None = None,
        *,
        autocast: str | None = None,
        choices: int | None = None,
    ) -> WorkloadSource:
        path = Path(config_path)
        shape = (batch_size, seq_len, dtype, images, clips, lora, autocast, choices)
        return cls(SourceKind.HUGGING_FACE, path, *shape)

    @classmethod
    def parse(cls, text: str | os.PathLike[str]) -> WorkloadSource:
        """The source ``str()`` wrote, or a model file's path. A model file whose own name
        holds ``?batch_size=`` is read as that file. Raises :class:`ModelFileError` for a
        malformed batch size or Hugging Face source."""
        text = os.fspath(text)
        if text.startswith(_HF_PREFIX):
            path, _, query = text.removeprefix(_HF_PREFIX).rpartition("?")
            values = dict(urllib.parse.parse_qsl(query))
            try:
                batch_size, dtype = int(values["batch_size"]), values["dtype"]
                seq_len = int(values["seq_len"]) if "seq_len" in values else None
                images = int(values["images"]) if "images" in values else None
                clips = int(values["clips"]) if "clips" in values else None
                lora = values.get("lora") or None
                autocast = values.get("autocast") or None
                choices = int(values["choices"]) if "choices" in values else None
            except (KeyError, ValueError):
                raise ModelFileError(
                    f"{text!r} is not a Hugging Face workload source (expected "
                    f"{_HF_PREFIX}CONFIG?batch_size=B[&seq_len=S]&dtype=D[&images=N][&clips=N]"
                    "[&lora=R][&autocast=D][&choices=N]); re-create the profile"
                ) from None
            shape = (batch_size, seq_len, dtype, images, clips, lora)
            return cls.hugging_face(path, *shape, autocast=autocast, choices=choices)
        base, query, count = text.rpartition(_BATCH_SIZE_QUERY)
        if not query or Path(text).expanduser().is_file():
            return cls.model_file(text)
        if not count.isdigit() or int(count) < 1:
            raise ModelFileError(
                f"{text}: the batch size after '{_BATCH_SIZE_QUERY}' must be a whole number"
            )
        return cls.model_file(base, int(count))

    @classmethod
    def of(cls, value: WorkloadSource | str | os.PathLike[str]) -> WorkloadSource:
        """``value`` if it is a source already, else :meth:`parse` of it."""
        return value if isinstance(value, WorkloadSource) else cls.parse(value)

    def __str__(self) -> str:
        if self.kind is SourceKind.HUGGING_FACE:
            shape = {
                "batch_size": self.batch_size,
                "seq_len": self.seq_len,
                "dtype": self.dtype,
                "images": self.images,
                "clips": self.clips,
                "lora": self.lora,
                "autocast": self.autocast,
                "choices": self.choices,
            }
            query = urllib.parse.urlencode({k: v for k, v in shape.items() if v is not None})
            return f"{_HF_PREFIX}{self.path}?{query}"
        if self.batch_size is None:
            return str(self.path)
        return f"{self.path}{_BATCH_SIZE_QUERY}{self.batch_size}"

    @property
    def is_hugging_face(self) -> bool:
        return self.kind is SourceKind.HUGGING_FACE

    @property
    def name(self) -> str:
        """The model's name: a model file's stem; a Hugging Face config's folder's for a
        ``config.json`` (``Meta-Llama-3-8B``), else its stem (``llama-3-8b`` for
        ``llama-3-8b.json``)."""
        if self.is_hugging_face and self.path.name == "config.json" and self.path.parent.name:
            return self.path.parent.name
        return self.path.stem

    def with_batch_size(self, batch_size: int) -> WorkloadSource:
        return dataclasses.replace(self, batch_size=batch_size)

    def with_seq_len(self, seq_len: int) -> WorkloadSource:
        if not self.is_hugging_face:
            raise ModelFileError(
                "only a Hugging Face workload (--hf CONFIG) has a sequence length to set"
            )
        return dataclasses.replace(self, seq_len=seq_len)

    def command_arguments(self, model: str | None = None) -> list[str]:
        """The command-line options that name this workload: a Hugging Face workload's
        ``--hf CONFIG --batch-size B --seq-len S --dtype D`` (no ``--seq-len`` for images;
        ``--images N``, ``--clips N``, ``--lora R``, ``--autocast D``, ``--choices N`` where it
        names them);
        else the model file (``model``
        in its place where given, e.g. ``MODEL.py`` for a command to run on another machine)
        with ``--batch-size N`` where it has one."""
        if self.is_hugging_face:
            seq_len = ["--seq-len", str(self.seq_len)] if self.seq_len is not None else []
            batch = ["--batch-size", str(self.batch_size), *seq_len]
            media = [
                *(["--images", str(self.images)] if self.images is not None else []),
                *(["--clips", str(self.clips)] if self.clips is not None else []),
                *(["--lora", self.lora] if self.lora is not None else []),
                *(["--autocast", self.autocast] if self.autocast is not None else []),
                *(["--choices", str(self.choices)] if self.choices is not None else []),
            ]
            return ["--hf", str(self.path), *batch, "--dtype", str(self.dtype), *media]
        sized = ["--batch-size", str(self.batch_size)] if self.batch_size is not None else []
        return [model or str(self.path), *sized]


def workload_in_command(source: WorkloadSource | None) -> str:
    """How a printed command names the workload of ``source`` on the machine a plan is for:
    its ``--hf`` options, or ``MODEL.py`` (with its ``--batch-size``; plain ``MODEL.py`` for
    no source)."""
    if source is None:
        return "MODEL.py"
    return shlex.join(source.command_arguments(model="MODEL.py"))
