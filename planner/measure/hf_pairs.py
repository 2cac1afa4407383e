"""Image-caption pairs, the batch of a dual encoder under ``--hf`` (CLIP, SigLIP, SigLIP 2,
ALIGN, AltCLIP, Chinese-CLIP, MetaCLIP 2, BLIP's ``BlipModel``, GroupViT, OWL-ViT,
``VisionTextDualEncoderModel``, ...).

Such a model embeds an image and a text apart and trains on the contrastive loss between
the two over the batch: every image against every caption. Its class takes both
``input_ids`` and ``pixel_values`` and a ``return_loss`` flag, and has no ``labels``. It is
no vision-language model (:mod:`planner.measure.hf_images`), whose sequences hold an image's
tokens: here the caption is text alone, of ``--seq-len`` tokens, and the image goes through
its own tower. Without this, ``--hf`` took CLIP's config for a vision-language model's and
asked for an ``image_token_id`` it has no use for.

The batch, as a contrastive data collator gives it (transformers' ``run_clip.py``):

* **The images**: ``batch_size`` of them, normal like a processor's normalized pixels, in
  the parameters' dtype, at the vision tower's ``image_size`` and ``num_channels``
  (:class:`PairImages`). X-CLIP's are videos of its ``num_frames`` frames. SigLIP 2's
  (NaFlex) are flattened patches: its ``num_patches``, each ``num_channels`` x
  ``patch_size`` x ``patch_size`` values, of a square image (``spatial_shapes``: as many
  rows as columns of patches, the rest of the patches padding, ``pixel_attention_mask``
  zero there).
* **The captions**: ``input_ids`` uniform below the text tower's ``vocab_size`` and none of
  the ids the config names, each ending in the text config's ``eos_token_id`` where the
  vocabulary holds it, as the tokenizer appends it (CLIP pools the text at its eos; with
  the older configs' ``eos_token_id`` 2 at each caption's highest id, wherever the random
  ids put it: a gather of the same size);
  ``attention_mask`` all ones.
* **The loss**: ``return_loss=True``; the output's ``loss`` is the model's own contrastive
  loss over the batch (CLIP's symmetric cross-entropy, SigLIP's sigmoid loss).

Dual encoders of other media (CLAP's audio, PE Video's clips, VideoPrism) are refused with
the way on: a model file.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import TYPE_CHECKING, Any

from planner.core.errors import ModelFileError

if TYPE_CHECKING:
    import torch

__all__ = ["PairImages", "is_dual_encoder", "pair_batch", "pair_images"]

_PAIRED = frozenset({"input_ids", "pixel_values", "return_loss"})
"""What a dual encoder's forward takes: a caption, an image, and the flag asking for its
contrastive loss."""

_OTHER_MEDIA = ("input_features", "input_values", "pixel_values_videos")
"""The inputs of a dual encoder of other media (CLAP, PE Audio, PE Video, VideoPrism)."""


def _forward(model_class: Any) -> set[str]:
    return set(inspect.signature(model_class.forward).parameters)


def is_dual_encoder(model_class: Any) -> bool:
    """Whether ``model_class`` trains on pairs of a text and another medium with its own
    contrastive loss (``return_loss``): an image's (:func:`pair_images`) or another's."""
    forward = _forward(model_class)
    labelled = any(name.endswith("labels") for name in forward)  # FLAVA's pretraining heads
    return {"return_loss", "input_ids"} <= forward and not labelled


@dataclasses.dataclass(frozen=True)
class PairImages:
    """The images of a dual encoder's batch (module docstring)."""

    channels: int
    height: int
    width: int
    frames: int | None = None  # a video's (X-CLIP), else None
    patches: int | None = None  # NaFlex's flattened patches (SigLIP 2), else None
    patch_size: int | None = None

    def shape(self, batch_size: int) -> tuple[int, ...]:
        """``pixel_values``' shape for ``batch_size`` images."""
        if self.patches is not None:
            assert self.patch_size is not None
            return (batch_size, self.patches, self.channels * self.patch_size**2)
        frames = () if self.frames is None else (self.frames,)
        return (batch_size, *frames, self.channels, self.height, self.width)

    def said(self, batch_size: int) -> str:
        """The images, in words (the workload's assumptions)."""
        if self.patches is not None:
            side = math.isqrt(self.patches)
            return (
                f"{batch_size} random images of {side} x {side} patches of {self.channels} x "
                f"{self.patch_size} x {self.patch_size} (pixel_values, NaFlex: "
                "pixel_attention_mask, spatial_shapes)"
            )
        video = f"videos of {self.frames} frames of " if self.frames is not None else ""
        return (
            f"{batch_size} random {video}{self.channels} x {self.height} x {self.width} "
            "images (pixel_values)"
        )


def pair_images(
    path: Any, model_class: Any, config: Any, image_shape: tuple[int, ...]
) -> PairImages:
    """How a dual encoder's images are laid out: ``image_shape`` (channels, height, width:
    the vision tower's size), as videos of its ``num_frames`` (X-CLIP), or as NaFlex's
    patches where the class takes ``spatial_shapes`` (SigLIP 2). A dual encoder of another
    medium is a :class:`ModelFileError` naming it."""
    name = model_class.__name__
    forward = _forward(model_class)
    others = [medium for medium in _OTHER_MEDIA if medium in forward]
    if "pixel_values" not in forward or others:
        takes = others[0] if others else "no pixel_values"
        raise ModelFileError(
            f"--hf {path}: {name} is a dual encoder of text and {takes}, and --hf builds "
            "pairs of images and captions only; write a model file whose sample_batch() "
            f"gives {takes} and return_loss=True"
        )
    channels, height, width = image_shape
    vision = getattr(config, "vision_config", None)
    if "spatial_shapes" in forward:  # NaFlex: flattened patches of an image of any shape
        patches = getattr(vision, "num_patches", None)
        patch_size = getattr(vision, "patch_size", None)
        if not (isinstance(patches, int) and isinstance(patch_size, int) and patches > 0):
            raise ModelFileError(
                f"--hf {path}: {name} takes images as patches (NaFlex), and its "
                "vision_config names no num_patches and patch_size; add them"
            )
        return PairImages(channels, height, width, patches=patches, patch_size=patch_size)
    frames = getattr(vision, "num_frames", None)
    if isinstance(frames, int) and frames > 0:  # X-CLIP: (B, frames, C, H, W)
        return PairImages(channels, height, width, frames=frames)
    return PairImages(channels, height, width)


def pair_batch(
    images: PairImages,
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    reserved: tuple[int, ...],
    eos: int | None,
    dtype: torch.dtype,
) -> dict[str, Any]:
    """One batch of ``batch_size`` images and their captions of ``seq_len`` tokens
    (module docstring), from the seeded global RNG."""
    import torch

    from planner.measure.hf_images import text_tokens

    pixel_values = torch.randn(images.shape(batch_size)).to(dtype)
    input_ids = text_tokens((batch_size, seq_len), vocab_size, reserved)
    if eos is not None and 0 <= eos < vocab_size:  # one eos, last, as the tokenizer appends it
        input_ids[:, -1] = eos
    batch: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values": pixel_values,
    }
    if images.patches is not None:  # a square image's patches first, then padding
        side = math.isqrt(images.patches)
        mask = torch.zeros(batch_size, images.patches, dtype=torch.long)
        mask[:, : side * side] = 1
        batch["pixel_attention_mask"] = mask
        batch["spatial_shapes"] = torch.tensor([[side, side]] * batch_size)
    batch["return_loss"] = True
    return batch
