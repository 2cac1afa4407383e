"""A Hugging Face model from a local ``config.json``, as a workload (``--hf CONFIG``).

A user of ``transformers`` already has the model as a config: this builds the model-file
contract from it, so no model file needs writing. :func:`hf_workload` checks the config and
the batch shape and returns the workload's
:class:`~planner.measure.source.WorkloadSource`; :func:`load_hf_model_file` turns that into a
:class:`~planner.measure.model_file.ModelFile`, which every stage then runs like any other (the
fake-tensor profile, timing, the check in a separate process, ``verify``).

What is built, and why:

* **The model**: the class the config's ``architectures`` names where that is a
  ``transformers`` class, else ``AutoModelForCausalLM``'s class for its ``model_type``;
  built with ``_from_config(config, dtype=...)`` (what ``from_config`` calls; on a
  composite config's text part where the class takes that: :func:`_for_class`), random
  weights from the seeded global RNG. On fake tensors it is built on the meta device, as any
  model file's is, so an 8B config plans on a laptop. ``use_cache`` is set to False: a
  training step keeps no key/value cache (a model that fills one is not checkpointable).
* **The batch**: ``input_ids`` (``batch_size`` x ``seq_len``, int64, uniform below
  ``vocab_size``, from the seeded RNG), ``attention_mask`` (all ones) and the targets the
  class's head takes, as its data collator gives them (:func:`_targets`): for a language
  model (causal, masked, sequence-to-sequence) ``labels``, a copy of ``input_ids`` (the model
  shifts them itself); for a sequence classifier one label per sequence (below
  ``num_labels``; floats for regression and multi-label problems); for a token classifier
  one per token; for extractive question answering ``start_positions`` and
  ``end_positions``; for a multiple-choice head ``choices`` sequences an example
  (``batch_size`` x ``choices`` x ``seq_len``; ``--choices``, else :data:`_CHOICES`) and the
  right one's index. A sequence classifier whose config names no ``pad_token_id`` gets its
  ``eos_token_id`` as one (what fine-tuning scripts set: decoder-only classifiers find each
  sequence's last token by it and refuse batches of more than one without it); an
  encoder-decoder's (BART, T5) has each sequence end in its one eos token, as its tokenizer
  appends it (the classifier pools there, and raises without it). An image classifier's
  batch is ``batch_size`` images instead (``pixel_values``, channels x height x width, from
  the normal distribution as a processor's normalized pixels are, in the parameters'
  dtype) of the config's ``image_size`` (or its vision tower's; 224 where it names none,
  as ResNet's) and ``num_channels`` (else 3), with a label per image as for a sequence
  classifier, or for a semantic segmentation model a class map (a label per pixel); it
  has no ``seq_len``. An image encoder with a text decoder (``VisionEncoderDecoderModel``)
  takes such images, of its encoder's ``image_size``, and ``seq_len`` tokens of text a
  sequence (``labels``, none of the ids its config names), which it shifts right itself
  behind ``decoder_start_token_id``; a captioner (BLIP, no image token among its ids) the
  same images, and the caption as its ``input_ids`` and ``labels``. A dual encoder (CLIP,
  SigLIP: a class taking ``input_ids``, ``pixel_values`` and ``return_loss``, no labels)
  takes such images with a caption of ``seq_len`` tokens each, and ``return_loss=True``
  (:mod:`planner.measure.hf_pairs`). A video classifier takes ``batch_size`` videos of its
  ``num_frames`` such images, ``(B, frames, C, H, W)``, with a label per video; a masked
  autoencoder pretraining on images (ViT-MAE) the images alone (its loss is its own, over
  the mask it draws); a masked image model taking its mask (SimMIM's heads, VideoMAE's
  pretraining) the images and ``bool_masked_pos`` over their patches, as many masked in
  each (its ``mask_ratio``, else :data:`_MASK_RATIO` or a video's
  :data:`_VIDEO_MASK_RATIO`). A speech recognizer's (CTC head) or an audio
  classifier's batch is ``batch_size`` clips of ``seq_len`` steps of its main input
  (normal, as a feature extractor's normalized output): raw audio samples
  (``input_values``) or feature frames (``input_features``, of the width its config names,
  with an all-ones ``attention_mask``), with a label per clip for a classifier, and for a
  recognizer a transcript of a label per 2000 samples or 8 frames (about a subword
  tokenizer's rate on read speech: 8 a second at 16 kHz) below ``vocab_size``, none of them
  the blank (``pad_token_id``); a speech-to-text model (Whisper, Speech2Text) a transcript
  of as many tokens (at most its decoder's positions), none of the ids its config names.
  Whisper takes one window of ``2 x max_source_positions`` frames (3000), laid out mel bins
  first, with no mask. The loss is the model's own ``output.loss``. Any other class
  whose main input is not token ids (a segmentation model's ``pixel_values``; AST's and
  Whisper's audio classifiers, whose spectrograms have one fixed length and layout), an
  object detector (boxes per image, matched to its queries by their values), or a
  speech model whose audio is
  codes of its own codec (Kyutai's, Dia: a plan for text alone would leave its audio out),
  is an error naming it: its batch needs a model file. A vision-language model's sequences
  hold images (:mod:`planner.measure.hf_images`); a speech language model's (token ids, and
  audio besides: Voxtral, Qwen2-Audio, Granite Speech) a clip (:mod:`planner.measure.hf_audio`).
* **The optimizer**: ``torch.optim.AdamW(fused=True, lr=5e-5)``, the Hugging Face Trainer's
  default (``optim="adamw_torch_fused"``). Its state is in the parameters' dtype.
* **The dtype**: ``--dtype``, else the config's own (``dtype`` or ``torch_dtype``), else
  float32. The parameters are made in it.
* **Autocast** (``--autocast bfloat16``/``float16``; none by default): the step
  ``Trainer(bf16=True)`` (``fp16=True``) runs, as ``accelerate`` wraps the model's forward:
  the forward under ``torch.autocast`` on the device the step runs on, then its outputs'
  16-bit tensors cast to float32 (a float32 copy of the logits, alive from the forward's
  end until the loss is taken). The parameters stay in the dtype above: float32 for
  classic mixed precision (``--dtype float32``). ``fp16=True``'s loss scaling is left out:
  ``GradScaler`` scales the loss and unscales the gradients in place, holding no tensor
  of the model's size (two scalars a device).
* **LoRA** (``--lora``): the model ``peft.get_peft_model`` returns, its base weights frozen
  and its adapters trained (:mod:`planner.measure.hf_lora`); the optimizer takes the
  parameters that train, as the Trainer's does.

Nothing is downloaded: the config is read from disk, and a config that needs remote code (a
class ``transformers`` does not have) is an error naming the fix.

A workload travels between processes and into profiles and plans as its source
(:mod:`planner.measure.source`: ``hf:/abs/path/config.json?batch_size=1&seq_len=4096&dtype=
bfloat16``), as a model file's does, and :func:`planner.measure.workload.load_model_file`
loads either.
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from planner.core.errors import ModelFileError
from planner.measure.hf_audio import AudioTokens, audio_batch, audio_tokens, takes_audio
from planner.measure.hf_images import (
    ImageTokens,
    image_batch,
    image_token_id,
    image_tokens,
    named_ids,
    takes_images,
    text_tokens,
)
from planner.measure.hf_lora import lora_adapters, lora_spec
from planner.measure.hf_pairs import PairImages, is_dual_encoder, pair_batch, pair_images
from planner.measure.source import WorkloadSource

if TYPE_CHECKING:
    import torch

    from planner.measure.model_file import ModelFile

__all__ = [
    "AUTOCAST",
    "DTYPES",
    "InputKind",
    "hf_workload",
    "input_kind",
    "load_hf_model_file",
    "max_seq_len",
    "min_seq_len",
    "whisper_frames",
]

DTYPES = ("float32", "bfloat16", "float16")
"""The parameter dtypes ``--dtype`` takes."""

AUTOCAST = ("bfloat16", "float16")
"""The dtypes ``--autocast`` takes (``Trainer(bf16=True)``, ``Trainer(fp16=True)``)."""

# The Hugging Face Trainer's default optimizer (optim="adamw_torch_fused", learning_rate).
_LEARNING_RATE = 5e-5


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


_SPECIAL_FLOATS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}
"""How ``transformers`` 5 writes the floats JSON has none for: ``{"__float__": "Infinity"}``
(Mamba-2's, Bamba's, Falcon-H1's and Granite 4's ``time_step_limit``), read back as it reads
them (``PreTrainedConfig._decode_special_floats``)."""


def _special_floats(value: Any) -> Any:
    if isinstance(value, dict):
        tag = value.get("__float__")
        if len(value) == 1 and isinstance(tag, str) and tag in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[tag]
        return {key: _special_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_special_floats(item) for item in value]
    return value


def _read_config(path: Path) -> dict[str, Any]:
    """The config's JSON object, with a ``model_type`` (special floats decoded:
    :data:`_SPECIAL_FLOATS`)."""
    try:
        data = _special_floats(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelFileError(
            f"--hf {path}: not a readable JSON config ({error}); pass a Hugging Face config.json"
        ) from error
    if not isinstance(data, dict):
        raise ModelFileError(f"--hf {path}: not a Hugging Face config (expected a JSON object)")
    if "_diffusers_version" in data:
        raise ModelFileError(
            f"--hf {path}: a diffusers config ({data.get('_class_name', 'a diffusers model')}); "
            "--hf builds transformers models: write a model file that builds it "
            "(from_config), its batch and its training step (one per diffusers class in "
            "benchmarks/models/diffusers/)"
        )
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


def max_seq_len(source: WorkloadSource) -> int | None:
    """The most positions the workload's config allows its token ids, or None where it names
    no limit (or the model takes no token ids: audio samples are no positions)."""
    positions = _positions(_read_config(source.path))
    if positions is None or _classified(source).kind is not InputKind.TOKENS:
        return None
    return positions


def min_seq_len(source: WorkloadSource) -> int:
    """The shortest sequence the workload's batch can be: 1, or a vision-language model's
    images' tokens and one of text (:mod:`planner.measure.hf_images`), or a speech language
    model's clip's and one (:mod:`planner.measure.hf_audio`)."""
    config, model_class, _, kind, _, _ = _classified(source)
    clips = _clips(source, kind, model_class)
    if clips:
        return clips * _audio_spec(source, _shape(source)[2]).per_clip + 1
    images = _images(source, kind, model_class, config)
    if not images:
        return 1
    return images * _image_spec(source, _shape(source)[2]).per_image + 1


def _hears(kind: InputKind, model_class: Any) -> bool:
    """Whether the class is a speech language model, whose sequences hold clips: token ids,
    and audio besides (a model taking images too plans its images)."""
    return kind is InputKind.TOKENS and takes_audio(model_class) and not takes_images(model_class)


def _clips(source: WorkloadSource, kind: InputKind, model_class: Any) -> int:
    """The clips each sequence holds: ``--clips``, else 1, for a speech language model; 0
    for any other."""
    if not _hears(kind, model_class):
        return 0
    return 1 if source.clips is None else source.clips


def _images(source: WorkloadSource, kind: InputKind, model_class: Any, config: Any) -> int:
    """The images each sequence holds: ``--images``, else 1, for a vision-language model
    (token ids, and images besides) whose config holds its vision tower; 0 for any other
    (Gemma 4's config without ``vision_config`` builds a model of text alone)."""
    if kind is not InputKind.TOKENS or not takes_images(model_class) or _no_vision(config):
        return 0
    return 1 if source.images is None else source.images


def _no_vision(config: Any) -> bool:
    """Whether the config leaves its vision tower out (``vision_config`` null)."""
    return getattr(config, "vision_config", False) is None


def _image_spec(source: WorkloadSource, dtype_name: str) -> ImageTokens:
    """How the workload's sequences hold an image (:func:`image_tokens`)."""
    spec: ImageTokens = _counted_spec(image_tokens, source, dtype_name)
    return spec


def _audio_spec(source: WorkloadSource, dtype_name: str) -> AudioTokens:
    """How the workload's sequences hold a clip (:func:`audio_tokens`)."""
    spec: AudioTokens = _counted_spec(audio_tokens, source, dtype_name)
    return spec


def _counted_spec(count: Callable[..., Any], source: WorkloadSource, dtype_name: str) -> Any:
    """``count(path, config, class, dtype)``, once per config file and dtype in a process:
    counting an image's or a clip's tokens builds the model on fake tensors (5 s for an 8B
    model)."""
    path = source.path
    return _counted_once(count, str(path), path.stat().st_mtime_ns, dtype_name)


@functools.lru_cache(maxsize=16)
def _counted_once(count: Callable[..., Any], path: str, mtime_ns: int, dtype_name: str) -> Any:
    del mtime_ns  # part of the key: an edited config is counted again
    source = WorkloadSource.hugging_face(path, 1, None, dtype_name)
    config, model_class = _config_and_class(source)
    return count(source.path, config, model_class, _torch_dtype(dtype_name))


def hf_workload(
    config: str | Path,
    batch_size: int,
    seq_len: int | None,
    dtype: str | None = None,
    images: int | None = None,
    clips: int | None = None,
    lora: str | Path | None = None,
    *,
    autocast: str | None = None,
    choices: int | None = None,
) -> WorkloadSource:
    """Check a Hugging Face workload before anything is built: ``config`` is a local
    ``config.json`` or a folder holding one, with a ``model_type``; ``batch_size`` and
    ``seq_len`` are positive (``seq_len`` None: an image classifier's, whose images are the
    config's size; whether the class takes tokens, and fits them in its positions, is
    checked when it is loaded: :func:`load_hf_model_file`); ``dtype`` (default: the
    config's, else float32) is one of :data:`DTYPES`; ``images`` (a vision-language model's
    images a sequence; None: its default) and ``clips`` (a speech language model's) are not
    negative; ``lora`` (LoRA adapters to train, :mod:`planner.measure.hf_lora`) a rank of 1
    or more or an adapter config on disk; ``autocast`` (the forward's autocast dtype) one of
    :data:`AUTOCAST`; ``choices`` (a multiple-choice head's, an example) 2 or more. Raises
    :class:`ModelFileError` naming the fix."""
    path = _config_file(config)
    data = _read_config(path)
    if batch_size < 1 or (seq_len is not None and seq_len < 1):
        raise ModelFileError(
            f"--batch-size {batch_size} --seq-len {seq_len}: both must be at least 1"
        )
    if dtype is not None and dtype not in DTYPES:
        raise ModelFileError(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
    if autocast is not None and autocast not in AUTOCAST:
        raise ModelFileError(f"--autocast {autocast}: use one of {', '.join(AUTOCAST)}")
    for option, count in (("--images", images), ("--clips", clips)):
        if count is not None and count < 0:
            raise ModelFileError(f"{option} {count}: give 0 (text alone) or more")
    if choices is not None and choices < 2:
        raise ModelFileError(f"--choices {choices}: an example has 2 choices or more")
    adapters = lora_spec(lora) if lora is not None else None
    dtype_name = dtype or _config_dtype(data, path)
    return WorkloadSource.hugging_face(
        path,
        batch_size,
        seq_len,
        dtype_name,
        images,
        clips,
        adapters,
        autocast=autocast,
        choices=choices,
    )


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as error:
        raise ModelFileError(
            "--hf needs the transformers package: pip install transformers"
        ) from error
    return transformers


def _build_config(source: WorkloadSource) -> Any:
    """The ``transformers`` config object, for training (``use_cache=False``)."""
    transformers = _transformers()
    data = _read_config(source.path)
    model_type = data["model_type"]
    try:
        config_class = transformers.CONFIG_MAPPING[model_type]
    except KeyError:
        raise ModelFileError(
            f"--hf {source.path}: transformers {transformers.__version__} does not "
            f"know model_type {model_type!r} (a model needing remote code, or a newer "
            "transformers); upgrade transformers, or write a model file for it"
        ) from None
    try:
        config = config_class.from_dict(data)
    except Exception as error:  # the config's own validation: a field out of range
        said = " ".join(str(error).split())  # one line: its validators' messages have several
        raise ModelFileError(
            f"--hf {source.path}: transformers rejects the config "
            f"({type(error).__name__}: {said}); fix that field"
        ) from error
    try:
        config.get_text_config()  # read later (the vocabulary, the special tokens)
    except ValueError as error:  # MusicGen's: a text encoder and a decoder
        found = str(error).split(". ")[0]
        raise ModelFileError(
            f"--hf {source.path}: transformers cannot tell which part of this config is the "
            f"text model ({found}); pass the config of the part you train alone, or write "
            "a model file"
        ) from error
    config.use_cache = False
    return config


def _for_class(config: Any, model_class: Any) -> Any:
    """The config ``model_class`` is built from: a composite config's text part where the
    class takes that (a vision-language config naming its causal LM: Qwen3.5's, Llama 4's),
    as ``AutoModelForCausalLM`` builds it; else ``config``."""
    text_class = (getattr(config, "sub_configs", None) or {}).get("text_config")
    if text_class is None or getattr(model_class, "config_class", None) is not text_class:
        return config
    text = config.get_text_config()
    text.use_cache = False
    return text


def _config_and_class(source: WorkloadSource) -> tuple[Any, Any]:
    """The config for training and the class built from it (:func:`_model_class`, on the
    config's part it takes: :func:`_for_class`)."""
    config = _build_config(source)
    model_class = _model_class(source, config)
    return _for_class(config, model_class), model_class


def _model_class(source: WorkloadSource, config: Any) -> Any:
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
        f"--hf {source.path}: transformers has no causal language model for "
        f"model_type {config.model_type!r}, and the config's architectures "
        f"({', '.join(getattr(config, 'architectures', None) or ['none'])}) name no "
        'transformers class; name one in "architectures", or write a model file'
    )


_HEADS = {
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "sequence-classification",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": "token-classification",
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES": "question-answering",
    "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES": "multiple-choice",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": "image-classification",
    "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES": "semantic-segmentation",
    "MODEL_FOR_CTC_MAPPING_NAMES": "ctc",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES": "speech-seq2seq",
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES": "audio-classification",
    "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES": "video-classification",
    "MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING_NAMES": "masked-image-modeling",
    "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES": "object-detection",
    "MODEL_FOR_ZERO_SHOT_OBJECT_DETECTION_MAPPING_NAMES": "object-detection",
}
"""The heads whose targets are not the tokens, by the ``transformers`` auto mapping that
names their classes."""

_TARGETS_SAID = {
    None: "labels (the tokens)",
    "sequence-classification": "a label per sequence",
    "token-classification": "a label per token",
    "question-answering": "start_positions and end_positions",
    "multiple-choice": "the right choice's index per example",
    "image-classification": "a label per image",
    "semantic-segmentation": "a label per pixel",
    "audio-classification": "a label per clip",
    "ctc": "a transcript per clip",
    "speech-seq2seq": "a transcript per clip",
    "video-classification": "a label per video",
    "image-pretraining": "no labels: its own loss, reconstructing the patches it masks "
    "(its mask_ratio, drawn each step)",
    "masked-image-modeling": "no labels: its own loss, reconstructing the masked patches",
    "contrastive": "return_loss=True (no labels: the model's own contrastive loss over the "
    "batch's pairs)",
}

_IMAGE_SIZE = 224
"""The image size of an image classifier whose config names none (ResNet's, ConvNeXt's
pretraining and fine-tuning size)."""


def _pretrains(model_class: type) -> bool:
    """Whether ``model_class`` is a pretraining class (its mapping's: ViT-MAE, VideoMAE)."""
    from transformers.models.auto import modeling_auto

    return model_class.__name__ in modeling_auto.MODEL_FOR_PRETRAINING_MAPPING_NAMES.values()


_CHOICES = 4
"""A multiple-choice example's choices without ``--choices``: SWAG's, RACE's and
HellaSwag's 4, those of transformers' ``run_swag.py``."""

_MASK_RATIO = 0.6
"""The patches a masked-image-modeling batch masks, without a ``mask_ratio`` in its config:
SimMIM's and transformers' ``run_mim.py``'s."""

_VIDEO_MASK_RATIO = 0.9
"""The same for a video (VideoMAE's tube masking: its paper's and model cards' ratio)."""


def _masked_patches(path: Path, config: Any, image_shape: tuple[int, ...]) -> tuple[int, float]:
    """How many patches a masked-image-modeling model's ``bool_masked_pos`` covers
    (its patch grid; a video's tubelets times that) and the share of them masked."""
    frames, (height, width) = image_shape[:-3], image_shape[-2:]
    patch = getattr(config, "patch_size", None)
    patch = patch[0] if isinstance(patch, list | tuple) else patch
    if not isinstance(patch, int) or patch < 1:
        raise ModelFileError(
            f"--hf {path}: a masked image model's config names no patch_size, the grid its "
            "mask covers; add it"
        )
    patches = (height // patch) * (width // patch)
    if frames:  # VideoMAE: one mask over its tubelets (frames // tubelet_size of them)
        patches *= frames[0] // int(getattr(config, "tubelet_size", 1) or 1)
    ratio = getattr(config, "mask_ratio", None)
    if not isinstance(ratio, float) or not 0 < ratio < 1:
        ratio = _VIDEO_MASK_RATIO if frames else _MASK_RATIO
    return patches, ratio


def _video_frames(config: Any) -> int | None:
    """The frames of the videos a video model's config takes (``num_frames``, V-JEPA 2's
    ``frames_per_clip``), else None."""
    for field in ("num_frames", "frames_per_clip"):
        for owner in (config, getattr(config, "vision_config", None)):
            frames = getattr(owner, field, None)
            if isinstance(frames, int) and frames > 0:
                return frames
    return None


def _head(model_class: type) -> str | None:
    """Which of :data:`_HEADS` ``model_class`` is, or None (a language model's head)."""
    from transformers.models.auto import modeling_auto

    for mapping, head in _HEADS.items():
        for names in getattr(modeling_auto, mapping, {}).values():
            if model_class.__name__ in ((names,) if isinstance(names, str) else names):
                return head
    return None


def _first(token_id: Any) -> Any:
    """A config's token id, the first where it lists several (``eos_token_id``)."""
    return token_id[0] if isinstance(token_id, list) and token_id else token_id


def _targets(
    head: str | None, config: Any, inputs: torch.Tensor, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """What the head's loss takes besides its ``inputs`` (token ids, or images for an image
    classifier), drawn from the seeded RNG as a data collator would give it (module
    docstring). Float targets are in the parameters' dtype (the classifier's logits are,
    and its loss takes both alike)."""
    import torch

    if head is None:
        return {"labels": inputs.clone()}  # the model shifts them by one position itself
    batch_size = len(inputs)
    if head == "multiple-choice":  # inputs: (B, choices, T)
        return {"labels": torch.randint(0, inputs.shape[1], (batch_size,))}
    if head == "question-answering":
        seq_len = inputs.shape[1]
        return {
            "start_positions": torch.randint(0, seq_len, (batch_size,)),
            "end_positions": torch.randint(0, seq_len, (batch_size,)),
        }
    classes = int(config.num_labels)
    if head == "token-classification":
        return {"labels": torch.randint(0, classes, inputs.shape)}
    if head == "semantic-segmentation":  # (B, H, W), a class map as large as the image
        return {"labels": torch.randint(0, classes, (batch_size, *inputs.shape[-2:]))}
    problem = getattr(config, "problem_type", None)
    if problem == "regression" or (problem is None and classes == 1):
        shape = (batch_size,) if classes == 1 else (batch_size, classes)
        return {"labels": torch.randn(shape).to(dtype)}
    if problem == "multi_label_classification":
        return {"labels": torch.randint(0, 2, (batch_size, classes)).to(dtype)}
    return {"labels": torch.randint(0, classes, (batch_size,))}


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype


def _shape(source: WorkloadSource) -> tuple[int, int | None, str]:
    """A Hugging Face workload's batch size, sequence length (None for images) and dtype."""
    if not source.is_hugging_face:
        raise ValueError(f"not a Hugging Face workload: {source}")
    assert source.batch_size is not None and source.dtype is not None
    return source.batch_size, source.seq_len, source.dtype


def _image_shape(path: Path, config: Any) -> tuple[int, int, int]:
    """(channels, height, width) of the images an image classifier's config takes: its
    ``image_size`` (one size, or height and width), or its vision tower's, else its
    ``crop_size`` (V-JEPA 2's), else :data:`_IMAGE_SIZE`; its ``num_channels``, else 3."""
    owners = (config, getattr(config, "vision_config", None), getattr(config, "encoder", None))
    owner = next((o for o in owners if getattr(o, "image_size", None) is not None), None)
    size = getattr(owner, "image_size", None)
    if owner is None:  # V-JEPA 2 names its frames' size crop_size
        owner = next((o for o in owners if getattr(o, "crop_size", None) is not None), config)
        size = getattr(owner, "crop_size", None) or _IMAGE_SIZE
    sizes = [size, size] if isinstance(size, int) else size
    if not (
        isinstance(sizes, list | tuple)
        and len(sizes) == 2
        and all(isinstance(side, int) and side > 0 for side in sizes)
    ):
        raise ModelFileError(
            f'--hf {path}: the config\'s "image_size" {size!r} is neither a size nor a '
            "height and width; set it to the size of the images the model takes"
        )
    channels = getattr(owner, "num_channels", None) or getattr(config, "num_channels", None)
    return int(channels or 3), int(sizes[0]), int(sizes[1])


class InputKind(enum.Enum):
    """What a class takes, as --hf builds its batch; the value is said in messages."""

    TOKENS = "token ids"  # --seq-len tokens per sequence
    IMAGES = "images"  # of the config's size: no --seq-len
    IMAGE_TEXT = "images and their text"  # an image each, --seq-len tokens of text (labels)
    IMAGE_CAPTIONS = "images and their captions"  # a dual encoder's pairs (hf_pairs.py)
    AUDIO = "audio"  # clips of --seq-len samples or feature frames


class _Inputs(NamedTuple):
    """What a class takes, as --hf builds its batch (:func:`_classified`)."""

    config: Any  # for training (use_cache=False)
    model_class: Any
    head: str | None  # :data:`_HEADS`, None for a language model
    kind: InputKind
    main_input: str  # input_ids, pixel_values, input_values or input_features
    pairs: PairImages | None = None  # a dual encoder's images (hf_pairs.py)


_FIXED_SPECTROGRAMS = frozenset({"ASTForAudioClassification", "WhisperForAudioClassification"})
"""Audio classifiers whose input is a spectrogram of one fixed length, laid out as their
feature extractor gives it (AST: 1024 frames x 128 bins; Whisper: 80 bins x 3000 frames)."""


def _classified(source: WorkloadSource) -> _Inputs:
    """The config, the class, its head and its inputs; raises :class:`ModelFileError` for a
    class whose batch --hf cannot make (module docstring)."""
    config, model_class = _config_and_class(source)
    name = model_class.__name__
    main_input = getattr(model_class, "main_input_name", "input_ids")
    head = _head(model_class)
    if source.choices is not None and head != "multiple-choice":
        raise ModelFileError(
            f"--choices {source.choices}: {name} is no multiple-choice head; leave out --choices"
        )
    if head == "object-detection":  # DETR's kin: boxes per image, matched to its queries
        raise ModelFileError(
            f"--hf {source.path}: {name} is an object detector, trained on boxes and their "
            "classes per image, which --hf does not build; write a model file whose "
            "sample_batch() gives them (its loss matches them to its queries on their "
            "values, so profile records a real step, within the budget)"
        )
    if name in _FIXED_SPECTROGRAMS:
        raise ModelFileError(
            f"--hf {source.path}: {name} takes {main_input}, a spectrogram of one length and "
            "layout (its feature extractor's), and --hf builds clips of --seq-len samples or "
            f"frames; write a model file whose sample_batch() gives {main_input}"
        )
    kind = InputKind.TOKENS if main_input == "input_ids" else None
    # Perceiver's image classifiers name their input "inputs" and take pixel_values too;
    # a semantic segmentation model takes images, and a class map per image.
    forward = _forward_parameters(model_class)
    if is_dual_encoder(model_class):  # CLIP, SigLIP: image-caption pairs (hf_pairs.py)
        pairs = pair_images(source.path, model_class, config, _image_shape(source.path, config))
        kind = InputKind.IMAGE_CAPTIONS
        return _Inputs(config, model_class, "contrastive", kind, main_input, pairs)
    on_images = head in (
        "image-classification",
        "semantic-segmentation",
        "video-classification",
        "masked-image-modeling",
    )
    if kind is None and on_images and "pixel_values" in forward:
        kind, main_input = InputKind.IMAGES, "pixel_values"
    if head == "video-classification" and kind is None and "pixel_values_videos" in forward:
        kind, main_input = InputKind.IMAGES, "pixel_values_videos"  # V-JEPA 2's name
    if head is None and main_input == "pixel_values" and _pretrains(model_class):
        # Masked autoencoding: images alone, the mask drawn inside the model (ViT-MAE) or
        # given with them (VideoMAE), as SimMIM's is (the masked-image-modeling head)
        masked = "bool_masked_pos" in forward
        kind, head = InputKind.IMAGES, "masked-image-modeling" if masked else "image-pretraining"
    # An image's encoder and a text decoder (TrOCR's, Donut's VisionEncoderDecoderModel):
    # images, and the text its decoder learns to write (labels, shifted right inside).
    decoded = {"labels", "decoder_input_ids"} <= forward and "input_ids" not in forward
    # A captioner whose text decoder reads the image's features beside its own tokens
    # (BLIP): the caption is its input_ids and its labels, no image token among them.
    others = {"qformer_input_ids", "image_embeds_position_mask", "decoder_input_ids"}
    captioned = {"input_ids", "labels"} <= forward and not others & forward
    captioned = captioned and image_token_id(config) is None
    if kind is None and main_input == "pixel_values" and (decoded or captioned):
        kind = InputKind.IMAGE_TEXT
    audio = main_input in ("input_values", "input_features")
    if head in ("ctc", "audio-classification", "speech-seq2seq") and audio:
        kind = InputKind.AUDIO
    if kind is None:
        raise ModelFileError(
            f"--hf {source.path}: {name} takes {main_input}, and --hf builds batches of "
            "token ids, images for an image classifier or semantic segmentation model, "
            "images and their text for an image-to-text model (VisionEncoderDecoderModel, "
            "BLIP), images and their captions for a dual encoder (CLIP, SigLIP: return_loss), "
            "or audio for a speech recognizer or audio classifier; write a model file "
            f"whose sample_batch() gives {main_input}"
        )
    # Kyutai's, Dia's audio: codes of their own, which --hf does not build (a speech
    # language model's clips it does: planner/measure/hf_audio.py)
    codes = head == "speech-seq2seq" and not takes_audio(model_class)
    if kind is InputKind.TOKENS and codes and not takes_images(model_class):
        raise ModelFileError(
            f"--hf {source.path}: {name} is a speech model: it trains on audio codes besides "
            "token ids, which --hf does not build (a plan for text alone would leave its "
            "audio encoder out); write a model file whose sample_batch() gives them"
        )
    return _Inputs(config, model_class, head, kind, main_input)


def _forward_parameters(model_class: Any) -> set[str]:
    """The names ``model_class.forward`` takes."""
    return set(inspect.signature(model_class.forward).parameters)


def input_kind(source: WorkloadSource) -> InputKind:
    """What the Hugging Face workload's class takes; raises
    :class:`ModelFileError` as :func:`load_hf_model_file` does for a class whose batch
    --hf cannot make."""
    return _classified(source).kind


_SEQ_LEN_SAID = {
    "input_ids": "the tokens per sequence",
    "pixel_values": "the tokens of each image's text",
    "input_values": "the audio samples per clip (16000 a second at 16 kHz)",
    "input_features": "the feature frames per clip (100 a second)",
}

_SAMPLES_PER_LABEL = {"input_values": 2000, "input_features": 8}
"""A speech recognizer's transcript: a label per 2000 samples (8 a second at 16 kHz) or per
8 feature frames (12.5 a second), about a subword tokenizer's rate on read speech."""


def _feature_width(source: WorkloadSource, config: Any) -> int:
    """The width of the feature frames a speech model takes, from its config or its
    encoder's."""
    for owner in (config, getattr(config, "encoder_config", None)):
        fields = ("feature_projection_input_dim", "num_mel_bins", "feature_size")
        for field in (*fields, "input_feat_per_channel"):  # the last: Speech2Text's
            width = getattr(owner, field, None)
            if isinstance(width, int) and width > 0:
                return width
    raise ModelFileError(
        f"--hf {source.path}: the config names no feature width (feature_size, num_mel_bins); "
        "add the one its feature extractor gives"
    )


def whisper_frames(config: Any) -> int | None:
    """The one window length a Whisper encoder takes, in feature frames (3000: 30 s), or
    None for a model taking clips of any length. Whisper's features are laid out
    (batch, mel bins, frames), channels first."""
    if getattr(config, "model_type", None) != "whisper":
        return None
    return 2 * int(config.max_source_positions)  # its convolutions' strides: 1, then 2


def load_hf_model_file(source: WorkloadSource) -> ModelFile:
    """The model-file contract for ``source`` (module docstring). The workload is checked
    as :func:`hf_workload` checks a new one, and the config read and its class found here,
    so an architecture ``transformers`` cannot build fails now, before any work."""
    # Imported here: the cli reads --hf options (hf_workload) without importing torch.
    import torch

    from planner.measure.model_file import ModelFile

    batch_size, seq_len, dtype_name = _shape(source)
    source = hf_workload(
        source.path,
        batch_size,
        seq_len,
        dtype_name,
        source.images,
        source.clips,
        source.lora,
        autocast=source.autocast,
        choices=source.choices,
    )
    transformers = _transformers()
    config, model_class, head, kind, main_input, pairs = _classified(source)
    name = model_class.__name__
    dtype = _torch_dtype(dtype_name)
    vision_language = kind is InputKind.TOKENS and takes_images(model_class)
    if source.images is not None and not vision_language:
        raise ModelFileError(
            f"--images {source.images}: {name} takes no images besides its "
            f"{kind.value}; leave out --images"
        )
    if source.images and _no_vision(config):
        raise ModelFileError(
            f"--images {source.images}: {source.path} has no vision_config, so {name} is "
            "built without a vision tower; leave out --images, or add the vision_config "
            "of the checkpoint"
        )
    images = _images(source, kind, model_class, config)
    image_spec = _image_spec(source, dtype_name) if images else None
    hears = _hears(kind, model_class)
    if source.clips is not None and not hears:
        raise ModelFileError(
            f"--clips {source.clips}: {name} takes no audio besides its {kind.value}; leave "
            "out --clips"
        )
    clips = _clips(source, kind, model_class)
    audio_spec = _audio_spec(source, dtype_name) if clips else None
    if hears:  # a language model (of the speech-seq2seq mapping or not)
        head = None  # its labels are its tokens, with clips or without
    if kind is InputKind.IMAGES and seq_len is not None:
        channels, height, width = _image_shape(source.path, config)
        raise ModelFileError(
            f"--hf {source.path}: {name} takes images ({channels} x {height} x {width}, the "
            "config's image_size), not sequences; leave out --seq-len"
        )
    window = whisper_frames(config) if main_input == "input_features" else None
    if kind is not InputKind.IMAGES and seq_len is None:
        said = f"its window, {window}" if window is not None else _SEQ_LEN_SAID[main_input]
        if kind is InputKind.IMAGE_CAPTIONS:
            said = "the tokens of each caption"
        raise ModelFileError(
            f"--hf {source.path}: {name} takes {kind.value}; pass --seq-len, {said}"
        )
    positions = _positions(_read_config(source.path)) if kind is InputKind.TOKENS else None
    limited = "the config"
    if kind is InputKind.IMAGE_TEXT:  # its text decoder's positions
        positions, limited = _positions(config.get_text_config().to_dict()), "the decoder of"
    if kind is InputKind.IMAGE_CAPTIONS:  # its text tower's (CLIP's 77)
        positions, limited = _positions(config.get_text_config().to_dict()), "the text tower of"
    if window is not None and seq_len != window:
        raise ModelFileError(
            f"--seq-len {seq_len}: {name} takes windows of {window} feature frames "
            f"({window // 100} s), every clip padded to one as its feature extractor pads "
            f"it; pass --seq-len {window}"
        )
    if positions is not None and seq_len is not None and seq_len > positions:
        raise ModelFileError(
            f"--seq-len {seq_len} is longer than the {positions} positions {limited} "
            f"{source.path} allows (max_position_embeddings); pass --seq-len {positions} "
            "or less"
        )
    if image_spec is not None and seq_len is not None and seq_len <= images * image_spec.per_image:
        least = images * image_spec.per_image + 1
        raise ModelFileError(
            f"--seq-len {seq_len} leaves no text after {name}'s {images} image(s) of "
            f"{image_spec.per_image} tokens each; pass --seq-len {least} or more (or fewer "
            "--images)"
        )
    if audio_spec is not None and seq_len is not None and seq_len <= clips * audio_spec.per_clip:
        raise ModelFileError(
            f"--seq-len {seq_len} leaves no text after {name}'s {clips} clip(s) of "
            f"{audio_spec.per_clip} tokens each; pass --seq-len "
            f"{clips * audio_spec.per_clip + 1} or more (or fewer --clips)"
        )
    captions = kind is InputKind.IMAGE_TEXT and "input_ids" in _forward_parameters(model_class)
    if kind is InputKind.IMAGE_TEXT and not captions:  # shift_tokens_right needs both
        for field, said in (
            ("decoder_start_token_id", "the token its decoder starts from"),
            ("pad_token_id", "the token the labels' -100 become in the decoder's inputs"),
        ):
            if not isinstance(getattr(config, field, None), int):
                raise ModelFileError(
                    f"--hf {source.path}: the config names no {field}, {said} (the labels "
                    "are shifted right to make the decoder's inputs); add the one its "
                    "tokenizer gives"
                )
    # A sequence classifier's eos is its pad where the config names none (decoder-only
    # classifiers find each sequence's last token by the pad), and an encoder-decoder's
    # (BART's, T5's) ends each sequence (their classifiers pool there, and raise without one).
    eos = _first(getattr(config, "eos_token_id", None))
    classifier_eos = eos if head == "sequence-classification" and isinstance(eos, int) else None
    pad_from_eos = eos_last = None
    batch_note = ""
    if classifier_eos is not None and getattr(config, "pad_token_id", None) is None:
        pad_from_eos = classifier_eos
        batch_note += f"; pad_token_id set to the eos_token_id {eos} (the config names none)"
    if classifier_eos is not None and getattr(config, "is_encoder_decoder", False):
        eos_last = classifier_eos
        batch_note += "; each sequence ends in the eos token (the classifier pools there)"
    vocab_size = getattr(config.get_text_config(), "vocab_size", None)
    text_kinds = (InputKind.TOKENS, InputKind.IMAGE_TEXT, InputKind.IMAGE_CAPTIONS)
    if (kind in text_kinds or head in ("ctc", "speech-seq2seq")) and (
        not isinstance(vocab_size, int) or vocab_size < 1
    ):
        drawn = "its transcripts' labels" if kind is InputKind.AUDIO else "token ids"
        raise ModelFileError(
            f'--hf {source.path}: the config has no "vocab_size"; add it (the synthetic '
            f"batch draws {drawn} below it)"
        )
    causal_models = transformers.MODEL_FOR_CAUSAL_LM_MAPPING  # lazy: look up one key only
    causal = type(config) in causal_models and causal_models[type(config)] is model_class
    adapters = None
    if source.lora is not None:
        seq2seq = transformers.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING
        seq2seq_lm = type(config) in seq2seq and seq2seq[type(config)] is model_class
        task = "causal-lm" if causal else "seq2seq-lm" if seq2seq_lm else head
        adapters = lora_adapters(source.lora, task)

    def build_model() -> torch.nn.Module:
        built_config = _for_class(_build_config(source), model_class)
        if pad_from_eos is not None:
            built_config.pad_token_id = pad_from_eos
        model = model_class._from_config(built_config, dtype=dtype)
        if causal and model.loss_type is None:
            # transformers picks the loss from the class name, which some causal LMs'
            # ("GPT2LMHeadModel") do not match: it falls back to this same loss with a
            # warning. Naming it avoids the warning.
            model.loss_type = "ForCausalLM"
        if adapters is not None:  # the model peft fine-tunes (planner/measure/hf_lora.py)
            return adapters.apply(model)
        return model

    targets_said = _TARGETS_SAID[head]
    choices = None
    if head == "multiple-choice":  # SWAG's and RACE's 4 where --choices names none
        choices = source.choices or _CHOICES
    caption_eos = None
    if pairs is not None:  # images and captions (planner/measure/hf_pairs.py)
        caption_eos = _first(getattr(config.get_text_config(), "eos_token_id", None))
        if not (isinstance(caption_eos, int) and 0 <= caption_eos < (vocab_size or 0)):
            caption_eos = None
        ending = f", each ending in the eos token {caption_eos}" if caption_eos is not None else ""
        inputs_said = (
            f"{pairs.said(batch_size)} and their captions of {seq_len} token ids{ending} "
            "(attention_mask all ones)"
        )
    elif kind in (InputKind.IMAGES, InputKind.IMAGE_TEXT):
        image_shape: tuple[int, ...] = _image_shape(source.path, config)
        inputs_said = "{} random {} x {} x {} images ({})".format(
            batch_size, *image_shape, main_input
        )
        frames_per_video = _video_frames(config)
        videos = head == "masked-image-modeling" and frames_per_video is not None
        if head == "video-classification" or videos:  # (B, frames, C, H, W)
            if frames_per_video is None:
                raise ModelFileError(
                    f"--hf {source.path}: {name} classifies videos, and its config names no "
                    "num_frames; add the frames a video of its checkpoint has"
                )
            image_shape = (frames_per_video, *image_shape)
            inputs_said = "{} random videos of {} frames of {} x {} x {} ({})".format(
                batch_size, *image_shape, main_input
            )
        if head == "masked-image-modeling":  # the mask it learns to fill in
            mask_patches, mask_ratio = _masked_patches(source.path, config, image_shape)
            masked_count = int(mask_ratio * mask_patches)
            inputs_said += (
                f", bool_masked_pos masking {masked_count} of their {mask_patches} patches "
                f"({mask_ratio:.0%}, uniformly drawn)"
            )
    elif main_input == "input_features":
        assert seq_len is not None
        frames = (seq_len, _feature_width(source, config))
        if window is not None:  # Whisper: (B, mel bins, frames), no mask
            frames = frames[::-1]
        masked = " with attention_mask" if window is None else " (mel bins first)"
        inputs_said = "{} x {} x {} random feature frames{}".format(batch_size, *frames, masked)
    elif main_input == "input_values":
        inputs_said = f"{batch_size} x {seq_len} random audio samples (input_values)"
    elif audio_spec is not None:
        inputs_said = (
            f"{batch_size} x {seq_len} token ids with attention_mask, {audio_spec.said(clips)}"
        )
    elif image_spec is not None:
        shown = image_spec.said(images, token_labels=head is None)  # a classifier: its head's
        inputs_said = f"{batch_size} x {seq_len} token ids with attention_mask, {shown}"
        if takes_audio(model_class):  # Qwen2.5-Omni's thinker, Gemma 3n, Phi-4-multimodal
            inputs_said += " (no audio: --hf plans a model taking images and audio on images)"
    else:
        inputs_said = f"{batch_size} x {seq_len} random token ids with attention_mask"
        if head == "multiple-choice":  # (B, choices, T): each choice a sequence of its own
            inputs_said = (
                f"{batch_size} examples of {choices} choices of {seq_len} random token ids "
                f"(input_ids of {batch_size} x {choices} x {seq_len}) with attention_mask"
            )
        if vision_language and _no_vision(config):
            inputs_said += " (no vision_config: text alone)"
        elif vision_language:
            inputs_said += " (--images 0: text alone)"
        elif hears:
            inputs_said += " (--clips 0: text alone)"
    transcript = blank = 0
    if kind is InputKind.IMAGE_TEXT:
        targets_said = (
            f"labels: {seq_len} tokens of text an image (none of the ids the config names), "
            + (
                "the caption, which are its input_ids too"
                if captions
                else "which the model shifts right behind decoder_start_token_id"
            )
        )
    elif head == "ctc":
        assert seq_len is not None and isinstance(vocab_size, int)
        transcript = max(1, seq_len // _SAMPLES_PER_LABEL[main_input])
        pad = getattr(config, "pad_token_id", None)  # CTC's blank
        blank = pad if isinstance(pad, int) and 0 <= pad < vocab_size else 0
        targets_said = f"a transcript of {transcript} labels per clip (none the blank, {blank})"
    elif head == "speech-seq2seq":  # as long as its decoder's positions allow
        assert seq_len is not None
        transcript = max(1, seq_len // _SAMPLES_PER_LABEL[main_input])
        longest = getattr(config, "max_target_positions", None)
        if isinstance(longest, int) and longest > 0:
            transcript = min(transcript, longest)
        targets_said = (
            f"a transcript of {transcript} tokens per clip (none of the ids the config names)"
        )

    def sample_batch() -> dict[str, torch.Tensor]:
        if kind is InputKind.IMAGES:  # (B, C, H, W), normalized pixels as a processor gives them
            pixel_values = torch.randn(batch_size, *image_shape).to(dtype)  # videos: (B, T, ...)
            if head == "image-pretraining":  # its own loss, of its own mask
                return {main_input: pixel_values}
            if head == "masked-image-modeling":  # as many patches masked in each
                order = torch.rand(batch_size, mask_patches).argsort(dim=1)
                return {main_input: pixel_values, "bool_masked_pos": order < masked_count}
            return {main_input: pixel_values, **_targets(head, config, pixel_values, dtype)}
        assert seq_len is not None
        if pairs is not None:  # a dual encoder's images and captions
            assert isinstance(vocab_size, int)
            reserved = named_ids(config)
            return pair_batch(pairs, batch_size, seq_len, vocab_size, reserved, caption_eos, dtype)
        if kind is InputKind.IMAGE_TEXT:  # the images, and the text the decoder writes
            assert isinstance(vocab_size, int)
            pixel_values = torch.randn(batch_size, *image_shape).to(dtype)
            labels = text_tokens((batch_size, seq_len), vocab_size, named_ids(config))
            if captions:  # the caption is the decoder's input too
                mask = torch.ones_like(labels)
                return {
                    "pixel_values": pixel_values,
                    "input_ids": labels,
                    "attention_mask": mask,
                    "labels": labels.clone(),
                }
            return {"pixel_values": pixel_values, "labels": labels}
        if kind is InputKind.AUDIO:  # normalized, as a feature extractor gives it
            if main_input == "input_features":  # (B, T, features); Whisper's (B, mel, T)
                values = torch.randn(batch_size, *frames).to(dtype)
                batch = {main_input: values}
                if window is None:
                    batch["attention_mask"] = torch.ones(batch_size, seq_len, dtype=torch.long)
            else:
                batch = {main_input: torch.randn(batch_size, seq_len).to(dtype)}  # (B, T)
            if head == "ctc":  # labels below the vocabulary, skipping CTC's blank
                assert isinstance(vocab_size, int)
                labels = text_tokens((batch_size, transcript), vocab_size, (blank,))
                return {**batch, "labels": labels}
            if head == "speech-seq2seq":  # the decoder's tokens (it shifts them itself)
                assert isinstance(vocab_size, int)
                shape = (batch_size, transcript)
                return {**batch, "labels": text_tokens(shape, vocab_size, named_ids(config))}
            return {**batch, **_targets(head, config, batch[main_input], dtype)}
        assert isinstance(vocab_size, int)
        if audio_spec is not None:  # clips, then text (planner/measure/hf_audio.py)
            return audio_batch(audio_spec, clips, batch_size, seq_len, vocab_size, dtype)
        if image_spec is not None:  # images, then text (planner/measure/hf_images.py)
            batch = image_batch(image_spec, images, batch_size, seq_len, vocab_size, dtype)
            if head is not None:  # a classifier's targets, not a language model's labels
                del batch["labels"]
                batch.update(_targets(head, config, batch["input_ids"], dtype))
            return batch
        ids_shape = (batch_size, seq_len) if choices is None else (batch_size, choices, seq_len)
        input_ids = torch.randint(0, vocab_size, ids_shape)  # (B, T); multiple choice (B, C, T)
        if eos_last is not None:  # one eos, last, as the tokenizer appends it
            input_ids[input_ids == eos_last] = (eos_last + 1) % vocab_size
            input_ids[:, -1] = eos_last
        targets = _targets(head, config, input_ids, dtype)
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), **targets}

    def build_optimizer(parameters: Any) -> torch.optim.Optimizer:
        trained = [parameter for parameter in parameters if parameter.requires_grad]  # Trainer's
        return torch.optim.AdamW(trained, lr=_LEARNING_RATE, fused=True)

    training_step = None
    autocast_said: tuple[str, ...] = ()
    if source.autocast is not None:
        training_step = _autocast_step(_torch_dtype(source.autocast))
        flag = "bf16" if source.autocast == "bfloat16" else "fp16"
        autocast_said = (
            f"the forward under torch.autocast({source.autocast}) and its 16-bit outputs cast "
            f"to float32, as Trainer({flag}=True) runs it (accelerate)"
            + ("; no GradScaler (its scaling is in place)" if flag == "fp16" else ""),
        )

    return ModelFile(
        path=source.path,
        name=source.name,
        build_model=build_model,
        sample_batch=sample_batch,
        training_step=training_step,
        loss_fn=None,
        build_optimizer=build_optimizer,
        source=source,
        assumptions=(
            f"Hugging Face {name} from {source.path} in {dtype_name} (use_cache=False); "
            f"a synthetic batch of {inputs_said} with {targets_said}{batch_note}; "
            "AdamW(fused=True, lr=5e-5), the Trainer's default",
            *([adapters.said] if adapters is not None else []),
            *autocast_said,
        ),
    )


def _autocast_step(dtype: torch.dtype) -> Callable[[torch.nn.Module, Any], torch.Tensor]:
    """The training step of ``Trainer(bf16=True)`` (``dtype`` bfloat16) or ``fp16=True``, as
    ``accelerate`` wraps the model's forward (``Accelerator.prepare_model``): the forward under
    ``torch.autocast`` on the device the batch is on, then every 16-bit tensor of its output
    cast to float32 (``convert_outputs_to_fp32``), outside autocast; the loss is the output's
    ``.loss``, as the Trainer takes it."""
    import torch

    def step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        device_type = next(iter(batch.values())).device.type
        with torch.autocast(device_type, dtype=dtype):
            output = model(**batch)
        loss: torch.Tensor = _in_float32(output).loss
        return loss

    return step


def _in_float32(value: Any) -> Any:
    """``value`` with its float16 and bfloat16 tensors cast to float32, in containers of the
    same types (``accelerate.utils.convert_to_fp32``: a ``ModelOutput`` stays one)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, dict):  # ModelOutput is an OrderedDict of its fields that are set
        return type(value)({key: _in_float32(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_in_float32(item) for item in value)
    return value
