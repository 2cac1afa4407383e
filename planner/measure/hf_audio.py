"""Audio in a speech language model's batch under ``--hf`` (Voxtral, Qwen2-Audio, Qwen3-ASR,
GLM-ASR, Audio Flamingo 3, Granite Speech, OmniASR, ...).

Such a model is a language model whose sequences hold audio: placeholder tokens its audio
encoder's features replace, as a vision-language model's hold images
(:mod:`planner.measure.hf_images`). Planned on token ids alone its audio encoder never runs
and its activations (a Whisper encoder's, 1500 positions a clip) are not counted. Here each
sequence holds ``--clips`` clips (one by default; 0: text alone), and ``--seq-len`` counts
every token the language model sees, the clips' included:

* **The clip** is :data:`CLIP_SECONDS` of audio, the window a Whisper encoder takes (its
  feature extractor pads every clip to it, so a shorter clip costs the encoder the same) and
  the longest most speech recipes train on. Its tensors are normal like a feature
  extractor's normalized output, in the parameters' dtype, in one of three layouts
  (:class:`AudioLayout`), read from the config: mel frames of its ``num_mel_bins``
  (Whisper's encoder: Voxtral, Qwen2-Audio, Qwen3-ASR, GLM-ASR, Audio Flamingo 3), frames of
  its encoder's ``input_dim`` (Granite Speech: two mel frames stacked, 50 a second), or raw
  16 kHz samples (OmniASR; VibeVoice-ASR's processor samples at 24 kHz, so its 480000 are
  20 s). Where the class takes masks of them (``input_features_mask`` or
  ``feature_attention_mask`` of the frames, ``padding_mask`` of the raw samples), they are
  all ones.
* **The sequence** is the clip's start token where the config names one
  (``audio_bos_token_id``, ...), as many audio tokens as the encoder gives features, its end
  token where named; then text tokens to ``--seq-len``, uniform below ``vocab_size`` and none
  of the ids the config names. ``labels`` are the tokens with the clip's positions -100, as
  speech collators mask them (the transcript is the text); ``attention_mask`` all ones.
* **How many tokens a clip is** is the model's own answer: its ``get_audio_features`` run
  once on one clip on fake tensors, its features counted (Qwen2-Audio, which has none: its
  audio tower's positions, which its linear projector keeps). The model checks the count on
  every step, so a wrong count cannot pass unseen.

A class whose audio inputs are none of these, or whose features cannot be counted on fake
tensors, is an error naming what it takes and the way on: a model file.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.core.errors import ModelFileError
from planner.measure.hf_images import features_counted, int_field, named_ids, placeholder_tokens

if TYPE_CHECKING:
    import torch

__all__ = [
    "CLIP_SECONDS",
    "AudioLayout",
    "AudioTokens",
    "audio_batch",
    "audio_tokens",
    "takes_audio",
]

CLIP_SECONDS = 30
"""A clip's length: a Whisper encoder's window (:data:`FRAMES_PER_SECOND` x 30 = 3000 mel
frames), every clip padded to it by its feature extractor."""
FRAMES_PER_SECOND = 100  # Whisper's feature extractor: a frame per 160 samples at 16 kHz
STACKED_FRAMES_PER_SECOND = 50  # Granite Speech's: two of those frames stacked in one
SAMPLE_RATE = 16_000

_AUDIO_INPUTS = ("input_features", "input_values")
_MASKS = ("input_features_mask", "feature_attention_mask", "padding_mask")
_AUDIO_FIELDS = ("audio_token_id", "audio_token_index")
_START_FIELDS = ("audio_bos_token_id", "audio_start_token_id", "boa_token_id")
_END_FIELDS = ("audio_eos_token_id", "audio_end_token_id", "eoa_token_id")


class AudioLayout(enum.Enum):
    """The tensors a class's audio encoder takes; the value is said in messages."""

    MEL = "mel frames"  # input_features (n, mel bins, frames): Whisper's encoder
    FRAMES = "feature frames"  # input_features (n, frames, width): Granite Speech
    SAMPLES = "audio samples"  # input_values (n, 1, samples): OmniASR


@dataclass(frozen=True)
class AudioTokens:
    """How a speech language model's sequences hold a clip (module docstring)."""

    layout: AudioLayout
    width: int  # MEL: mel bins; FRAMES: a frame's features; SAMPLES: 1
    length: int  # frames or samples a clip
    tokens: int  # audio tokens a clip
    audio_token: int
    start: int | None  # the token before each clip's, where the config names one
    end: int | None  # the token after them
    reserved: tuple[int, ...]  # every id the config names: text tokens are none of them
    masks: tuple[str, ...] = ()  # the inputs masking the clip's real frames or samples

    @property
    def per_clip(self) -> int:
        """Tokens one clip takes in a sequence, its start and end tokens included."""
        return self.tokens + (self.start is not None) + (self.end is not None)

    def said(self, clips: int) -> str:
        """The clips, as a workload's assumptions say them."""
        if self.layout is AudioLayout.SAMPLES:
            shape = f"{self.length} samples"
        elif self.layout is AudioLayout.MEL:
            shape = f"{self.width} mel bins x {self.length} frames"
        else:
            shape = f"{self.length} frames of {self.width} features"
        plural = "clip" if clips == 1 else "clips"
        return (
            f"{clips} random {CLIP_SECONDS} s {plural} a sequence ({shape}; "
            f"{self.tokens} audio tokens each, labels -100 there)"
        )


def takes_audio(model_class: Any) -> bool:
    """Whether ``model_class`` is a speech language model: its main input is token ids and
    its forward takes audio (``input_features`` or ``input_values``) besides."""
    if getattr(model_class, "main_input_name", "input_ids") != "input_ids":
        return False
    forward = inspect.signature(model_class.forward).parameters
    return any(name in forward for name in _AUDIO_INPUTS)


def _encoder_config(config: Any) -> Any:
    for field in ("audio_config", "encoder_config", "audio_encoder_config"):
        owner = getattr(config, field, None)
        if owner is not None:
            return owner
    return config


def _named(function: Any) -> list[str]:
    """The named parameters of ``function`` (none where it takes ``*args, **kwargs`` only),
    less an optional mask: counting runs without it (OmniASR's reads its lengths' values,
    which fake tensors do not have), every frame being real."""
    kinds = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    parameters = inspect.signature(function).parameters.items()
    return [
        name
        for name, parameter in parameters
        if parameter.kind not in kinds
        and not (name in _MASKS and parameter.default is not inspect.Parameter.empty)
    ]


def _audio_features(model: Any) -> tuple[Any, list[str]]:
    """The built model's ``get_audio_features`` and the inputs it and its base model's name,
    or where it passes ``(*args, **kwargs)`` on, its base model's; where neither has one
    (Qwen2-Audio), its audio tower."""
    base = getattr(getattr(model, "base_model", None), "get_audio_features", None)
    for owner in (model, getattr(model, "base_model", None)):
        features = getattr(owner, "get_audio_features", None)
        if callable(features) and _named(features):
            # what it passes on to its base model's too (Moss's raw samples' padding_mask)
            passed = _named(base) if callable(base) and owner is model else []
            return features, [*_named(features), *passed]
    towers = [module for name, module in model.named_modules() if name.endswith("audio_tower")]
    if not towers:
        raise TypeError("it has no get_audio_features and no audio_tower to count by")
    return towers[0], _named(towers[0].forward)


def audio_inputs(spec: AudioTokens, count: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``count`` clips, as the class takes them (module docstring)."""
    import torch

    if spec.layout is AudioLayout.SAMPLES:  # (n, 1, samples): a channel of raw audio
        inputs = {"input_values": torch.randn(count, 1, spec.length).to(dtype)}
    elif spec.layout is AudioLayout.MEL:  # (n, mel bins, frames), as Whisper's extractor
        inputs = {"input_features": torch.randn(count, spec.width, spec.length).to(dtype)}
    else:  # (n, frames, features)
        inputs = {"input_features": torch.randn(count, spec.length, spec.width).to(dtype)}
    for mask in spec.masks:  # padding_mask marks raw samples, whatever the layout
        length = SAMPLE_RATE * CLIP_SECONDS if mask == "padding_mask" else spec.length
        inputs[mask] = torch.ones(count, length, dtype=torch.long)
    return inputs


def _counted(model_class: Any, config: Any, spec: AudioTokens, dtype: torch.dtype) -> int:
    """Audio tokens a clip: the features the class gives one clip, run on fake tensors."""
    from planner.measure.fake import call_on_fake_tensors

    def features(model: Any, **inputs: Any) -> Any:
        model.eval()  # no layer drop (OmniASR's draws a number to compare): a count only
        encode, accepts = _audio_features(model)
        kwargs = {name: value for name, value in inputs.items() if name in accepts}
        return encode(**kwargs, return_dict=True)

    output = call_on_fake_tensors(
        lambda: model_class._from_config(config, dtype=dtype),
        features,
        audio_inputs(spec, 1, dtype),
    )
    return features_counted(output)  # an audio tower's (Qwen2-Audio's): a feature a position


def audio_tokens(path: Path, config: Any, model_class: Any, dtype: torch.dtype) -> AudioTokens:
    """How ``model_class``'s sequences hold a clip (module docstring); raises
    :class:`ModelFileError` for a class whose audio inputs --hf cannot build."""
    name = model_class.__name__
    way_on = "write a model file whose sample_batch() gives its audio"
    forward = inspect.signature(model_class.forward).parameters
    encoder = _encoder_config(config)
    audio_token = int_field((config, config.get_text_config()), _AUDIO_FIELDS)
    if audio_token is None:
        raise ModelFileError(
            f"--hf {path}: the config names no audio_token_id, the token a clip's features "
            f"replace; add it, or {way_on}"
        )
    # Granite Speech's encoder names its stacked frames' width (and its mel bins: half that)
    stacked = int_field((encoder,), ("input_dim",))
    mel = int_field((encoder,), ("num_mel_bins",))
    if "input_features" in forward and stacked:
        layout, width = AudioLayout.FRAMES, stacked
        length = STACKED_FRAMES_PER_SECOND * CLIP_SECONDS
    elif "input_features" in forward and mel:
        layout, width, length = AudioLayout.MEL, mel, FRAMES_PER_SECOND * CLIP_SECONDS
    elif "input_values" in forward:
        layout, width, length = AudioLayout.SAMPLES, 1, SAMPLE_RATE * CLIP_SECONDS
    else:
        raise ModelFileError(
            f"--hf {path}: {name} takes input_features, and its config names no feature "
            f"width (num_mel_bins, input_dim); add it, or {way_on}"
        )
    # the masks of a clip's real frames or samples (Moss Transcribe-Diarize takes both);
    # Granite Speech's input_features_mask marks its projected features, not frames, and is
    # left out (all of them real)
    masks = tuple(name for name in _MASKS if name in forward and layout is not AudioLayout.FRAMES)
    if "feature_attention_mask" in masks:  # Qwen2-Audio's name for the frames' mask
        masks = tuple(name for name in masks if name != "input_features_mask")
    spec = AudioTokens(
        layout=layout,
        width=width,
        length=length,
        tokens=0,
        audio_token=audio_token,
        start=int_field((config,), _START_FIELDS),
        end=int_field((config,), _END_FIELDS),
        reserved=named_ids(config),
        masks=masks,
    )
    try:
        tokens = _counted(model_class, config, spec, dtype)
    except Exception as error:  # the model's own, said in one line
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ModelFileError(
            f"--hf {path}: counting {name}'s audio tokens on fake tensors failed "
            f"({type(error).__name__}: {first[:160]}); {way_on}"
        ) from error
    return dataclasses.replace(spec, tokens=tokens)


def audio_batch(
    spec: AudioTokens,
    clips: int,
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """A speech language model's batch: ``clips`` clips a sequence, then text to
    ``seq_len`` tokens (module docstring)."""
    one = [spec.start, *[spec.audio_token] * spec.tokens, spec.end]
    tokens = placeholder_tokens(one, clips, (batch_size, seq_len), vocab_size, spec.reserved)
    return {**tokens, **audio_inputs(spec, batch_size * clips, dtype)}
