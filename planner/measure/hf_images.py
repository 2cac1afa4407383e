"""Images in a vision-language model's batch under ``--hf`` (an image-text-to-text class:
LLaVA, Qwen2-VL, Gemma 3, InternVL, SmolVLM, ...).

Such a model trains on sequences whose image placeholder tokens its vision tower's features
replace. Planned on token ids alone, its vision tower never runs and its activations are
not counted: the plan would go over on the first real batch. Here each sequence holds
``images`` images (one by default), laid out as the model's processor lays them out, and
``--seq-len`` counts every token the language model sees, the images' included:

* **The images** are square, of the vision tower's ``image_size`` (448 x 448 where it names
  none: a model of dynamic resolution, Qwen2-VL's kin, and MiniCPM-V's slices, whose
  ``image_size`` is its position grid's; Gemma 4's and LFM2-VL's, the largest their
  processors' token budgets allow: :data:`SOFT_TOKEN_BUDGET`, :data:`NAFLEX_TOKEN_BUDGET`;
  set ``image_size`` in the config's ``vision_config`` to plan another), ``num_channels``
  deep (3), normal like a processor's normalized pixels, in the parameters' dtype. Their
  tensors are what the class's ``get_image_features`` takes, in one of nine layouts
  (:class:`ImageLayout`);
  Mllama's, one token an image and its tiles read by cross-attention layers, are built as
  its processor builds them (:func:`_cross_attention_tiles`).
* **The sequence** is, per image, its start token where the config names one
  (``vision_start_token_id``, ``boi_token_index``, ...), as many image tokens as the vision
  tower gives features, its end token where named; then text tokens to ``--seq-len``,
  uniform below ``vocab_size`` and none of the ids the config names (so the image tokens
  are exactly the images'). ``labels`` are the tokens, with the images' positions -100, as
  vision-language collators mask them; ``attention_mask`` all ones; where the class takes
  them, the token types its processor gives: ``mm_token_type_ids`` (Qwen2-VL's multimodal
  rotary positions need them) or Gemma 3's ``token_type_ids``, 1 at image tokens (an
  image's tokens attend to each other both ways), PaliGemma's 1 after its prefix.
* **How many tokens an image is** is the model's own answer: its ``get_image_features``
  run once on one image on fake tensors (no memory, any size; the small index tensors, a
  grid of patches or the images' sizes, keep their values), its features counted (its
  ``pooler_output``, or where that is None, Llama 4's, its ``last_hidden_state``). The
  model checks the count on every step ("Image features and image tokens do not match"),
  so a wrong count cannot pass unseen.

A class whose image inputs are none of the nine (a Q-Former's prompt, high-resolution
pixels, ...), or whose features cannot be counted on fake tensors, is an error naming what
it takes and the two ways on: ``--images 0`` (text alone, as when fine-tuning a
vision-language checkpoint on text) or a model file.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.core.errors import ModelFileError

if TYPE_CHECKING:
    import torch

__all__ = [
    "ImageLayout",
    "ImageTokens",
    "features_counted",
    "image_batch",
    "image_token_id",
    "image_tokens",
    "int_field",
    "named_ids",
    "placeholder_tokens",
    "takes_images",
    "text_tokens",
]

DYNAMIC_IMAGE_SIZE = 448
"""The side of the images of a model of dynamic resolution, whose config names no size:
Qwen2-VL's processor resizes within a pixel budget; 448 x 448 is 1024 patches of 14, 256
tokens after its 2 x 2 merge."""
SOFT_TOKEN_BUDGET = 280
"""Gemma 4's processor's default ``max_soft_tokens``: it resizes an image to the largest
whose patches, pooled ``pooling_kernel_size`` x ``pooling_kernel_size``, are at most this
many tokens, sides a multiple of the pooling window (a square one: 768 x 768 with patches of
16 pooled 3 x 3, 256 tokens), and pads its patches to the budget's (280 x 9 = 2520) whatever
the image's size (``image_size`` in the config's ``vision_config`` plans a smaller one)."""

NAFLEX_TOKEN_BUDGET = 256
"""LFM2-VL's processor's default ``max_image_tokens``: an image is resized to at most this
many tokens' patches (each token ``downsample_factor`` x ``downsample_factor`` patches: 1024
of 16 x 16, a 512 x 512 image, the processor's tile) and its patches padded to as many, with
their grid (``spatial_shapes``) and a mask of the real ones (``pixel_attention_mask``)."""

_START_FIELDS = ("vision_start_token_id", "image_start_token_id", "boi_token_id", "boi_token_index")
_END_FIELDS = ("vision_end_token_id", "image_end_token_id", "eoi_token_id", "eoi_token_index")
_IMAGE_FIELDS = ("image_token_id", "image_token_index")
_TOKEN_TYPES = ("mm_token_type_ids", "token_type_ids")
"""The inputs by which a processor marks each token's kind, as the class takes them: Qwen2-VL's
(its multimodal rotary positions), Gemma 3's and PaliGemma's (an image's tokens, or
PaliGemma's prefix, attend to each other both ways)."""


class ImageLayout(enum.Enum):
    """The tensors a class's ``get_image_features`` takes; the value is said in messages."""

    IMAGES = "images"  # pixel_values (n, C, H, W): LLaVA, InternVL, Gemma 3, PaliGemma
    SIZES = "images with their sizes"  # and image_sizes (n, 2): Mistral 3 (Pixtral)
    TILES_BY_SIZE = "tiles by size"  # (n, tiles, C, H, W) and image_sizes: LLaVA-NeXT
    PATCHES = "patches"  # flat patches (PaddleOCR-VL: each C x p x p), image_grid_thw: Qwen2-VL
    TILES = "tiles"  # (B, tiles, C, H, W), pixel_attention_mask (Granite Docling: a tile's)
    POSITIONED = "patches with positions"  # (n, padded, C x patch^2), image_position_ids: Gemma 4
    CROSS = "tiles for cross-attention"  # (B, images, tiles, C, H, W), aspect ratios: Mllama
    SHAPED = "patches with their shapes"  # (n, padded, C x patch^2), spatial_shapes: LFM2-VL
    PACKED = "packed patches"  # (1, C, patch, all patches x patch), target_sizes: MiniCPM-V


@dataclass(frozen=True)
class ImageTokens:
    """How a vision-language model's sequences hold an image (module docstring)."""

    layout: ImageLayout
    channels: int
    size: int  # the side of a square image, in pixels
    tokens: int  # image tokens per image
    image_token: int
    start: int | None  # the token before each image's, where the config names one
    end: int | None  # the token after them
    reserved: tuple[int, ...]  # every id the config names: text tokens are none of them
    patch: int = 0  # PATCHES: the vision tower's patch side
    tiles: int = 1  # TILES_BY_SIZE: tiles an image is cut into, the whole image's included
    temporal: int = 1  # PATCHES: frames per patch (an image is repeated to fill them)
    token_types: str | None = None  # the input marking the image tokens, where it takes one
    types_mark_text: bool = False  # PaliGemma's: 1 marks the text after its prefix (the image)
    padded: int = 0  # POSITIONED: the patches each image is padded to (its soft-token budget's)
    grid: int = 1  # CROSS: tiles a side of the image (square: grid x grid of tiles)
    aspect_ratio: int = 0  # CROSS: the id of that grid (1 + its index in the supported ones)
    max_tiles: int = 1  # CROSS: the tiles every image is padded to
    unflattened: bool = False  # PATCHES: each patch (C, patch, patch), not flat (PaddleOCR-VL)
    tile_mask: bool = False  # TILES: a mask of the real tiles, not pixels (Granite Docling)

    @property
    def per_image(self) -> int:
        """Tokens one image takes in a sequence, its start and end tokens included."""
        return self.tokens + (self.start is not None) + (self.end is not None)

    def said(self, images: int, token_labels: bool = True) -> str:
        """The images, as a workload's assumptions say them (``token_labels``: the batch's
        labels are its tokens, -100 at the images; a classifier's are its head's)."""
        side = self.size * self.grid
        each = f"{self.channels} x {side} x {side}"
        plural = "image" if images == 1 else "images"
        masked = ", labels -100 there" if token_labels else ""
        return (
            f"{images} random {each} {plural} a sequence ({self.layout.value}; "
            f"{self.tokens} image token{'s' * (self.tokens != 1)} each{masked})"
        )


_IMAGE_INPUTS = ("pixel_values", "image_patches", "flattened_patches")


def takes_images(model_class: Any) -> bool:
    """Whether ``model_class`` is a vision-language model: its forward takes images
    (``pixel_values``; Fuyu's ``image_patches``, Kosmos-2.5's ``flattened_patches``) besides
    token ids."""
    forward = inspect.signature(model_class.forward).parameters
    return any(name in forward for name in _IMAGE_INPUTS)


def _features_class(model_class: Any, config: Any) -> Any | None:
    """The class whose ``get_image_features`` gives an image's features: ``model_class``,
    or where it has none, or one passing ``(*args, **kwargs)`` on (Janus, DeepSeek-VL,
    MiniCPM-V), its base model's."""
    if _named_parameters(model_class):
        return model_class
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    base = getattr(transformers, str(MODEL_MAPPING_NAMES.get(config.model_type, "")), None)
    if _named_parameters(base):
        return base
    return model_class if callable(getattr(model_class, "get_image_features", None)) else None


def _named_parameters(owner: Any) -> list[str]:
    """The named parameters of ``owner.get_image_features`` (none where it has none)."""
    features = getattr(owner, "get_image_features", None)
    if not callable(features):
        return []
    return [
        name
        for name, parameter in inspect.signature(features).parameters.items()
        if name != "self"
        and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)
    ]


def _image_features(model: Any) -> Any:
    """The built model's ``get_image_features``, or its base model's."""
    features = getattr(model, "get_image_features", None)
    return features if callable(features) else model.base_model.get_image_features


def int_field(owners: tuple[Any, ...], fields: tuple[str, ...]) -> int | None:
    """The first of ``fields`` that one of ``owners`` (configs, in order) holds as a whole
    number (not negative, not a bool), or None."""
    for owner in owners:
        for field in fields:
            value = getattr(owner, field, None)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
    return None


def named_ids(config: Any) -> tuple[int, ...]:
    """Every token id the config (or its text config) names."""
    ids: set[int] = set()
    for owner in (config, config.get_text_config()):
        for field, value in owner.to_dict().items():
            if not isinstance(field, str) or not field.endswith(("token_id", "token_index")):
                continue
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                    ids.add(item)
    return tuple(sorted(ids))


def image_token_id(config: Any) -> int | None:
    """The token an image's features replace, as the config (or its text config) names it;
    None where it names none."""
    return int_field((config, config.get_text_config()), _IMAGE_FIELDS)


def vision_config(config: Any) -> Any:
    """The config's vision tower's config: its ``vision_config``, else the one a part of it
    holds (T5Gemma 2's encoder's), else None."""
    vision = getattr(config, "vision_config", None)
    if vision is not None:
        return vision
    for name in getattr(config, "sub_configs", None) or {}:
        vision = getattr(getattr(config, name, None), "vision_config", None)
        if vision is not None:
            return vision
    return None


def _side(value: Any) -> int | None:
    if isinstance(value, list | tuple) and value:
        value = value[0]
    return value if isinstance(value, int) and value > 0 else None


def _layout(features_class: Any, config: Any) -> tuple[ImageLayout | None, list[str]]:
    """The image layout ``get_image_features`` takes, or None and the inputs it needs."""
    parameters = inspect.signature(features_class.get_image_features).parameters
    if "image_grid_thw" in parameters:
        return ImageLayout.PATCHES, []
    if "image_position_ids" in parameters:
        return ImageLayout.POSITIONED, []
    if "spatial_shapes" in parameters and "pixel_attention_mask" in parameters:
        return ImageLayout.SHAPED, []
    if "target_sizes" in parameters:
        return ImageLayout.PACKED, []
    if "pixel_attention_mask" in parameters:
        return ImageLayout.TILES, []
    needed = [
        name
        for name, parameter in parameters.items()
        if name not in ("self", "pixel_values")
        and parameter.default is inspect.Parameter.empty
        and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)
    ]
    if needed == ["image_sizes"]:  # LLaVA-NeXT's kin cut an image into tiles by its size
        tiled = getattr(config, "image_grid_pinpoints", None)
        return (ImageLayout.TILES_BY_SIZE if tiled else ImageLayout.SIZES), []
    return (None, needed) if needed else (ImageLayout.IMAGES, [])


def _padded_patches(
    spec: ImageTokens, count: int, grid: int, draw: Callable[..., torch.Tensor]
) -> torch.Tensor:
    """``count`` images' ``grid`` x ``grid`` flat patches drawn by ``draw``, each image's
    padded with zeros to ``spec.padded`` patches (POSITIONED, SHAPED)."""
    import torch

    width = spec.channels * spec.patch**2
    patches = torch.zeros(count, spec.padded, width)
    patches[:, : grid * grid] = draw(count, grid * grid, width)
    return patches


def _image_inputs(
    spec: ImageTokens, batch_size: int, images: int, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """``images`` images for each of ``batch_size`` sequences, as the class takes them."""
    import torch

    count, side, channels = batch_size * images, spec.size, spec.channels
    if spec.layout is ImageLayout.PATCHES:  # (patches, C x frames x patch x patch)
        grid = side // spec.patch
        shape: tuple[int, ...] = (channels * spec.temporal * spec.patch**2,)
        if spec.unflattened:
            shape = (channels, spec.patch, spec.patch)
        return {
            "pixel_values": torch.randn(count * grid * grid, *shape).to(dtype),
            "image_grid_thw": torch.tensor([[1, grid, grid]] * count),
        }
    if spec.layout is ImageLayout.CROSS:  # (B, images, max tiles, C, H, W): grid x grid used
        used = spec.grid**2
        tiles = torch.zeros(batch_size, images, spec.max_tiles, channels, side, side)
        tiles[:, :, :used] = torch.randn(batch_size, images, used, channels, side, side)
        mask = torch.zeros(batch_size, images, spec.max_tiles, dtype=torch.long)
        mask[:, :, :used] = 1
        return {
            "pixel_values": tiles.to(dtype),
            "aspect_ratio_ids": torch.full((batch_size, images), spec.aspect_ratio),
            "aspect_ratio_mask": mask,
        }
    if spec.layout is ImageLayout.POSITIONED:  # (n, padded, C x patch^2), (x, y) or -1 each
        grid = side // spec.patch
        ys, xs = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
        positions = torch.full((spec.padded, 2), -1, dtype=torch.long)
        positions[: grid * grid] = torch.stack([xs, ys], dim=-1).reshape(-1, 2)
        return {
            "pixel_values": _padded_patches(spec, count, grid, torch.rand).to(dtype),
            "image_position_ids": positions.expand(count, -1, -1).contiguous(),
        }
    if spec.layout is ImageLayout.PACKED:  # every image's patches in one row, NaViT-like
        grid = side // spec.patch
        packed = torch.randn(1, channels, spec.patch, count * grid * grid * spec.patch)
        sizes = torch.tensor([[grid, grid]] * count, dtype=torch.int32)
        return {"pixel_values": packed.to(dtype), "target_sizes": sizes}
    if spec.layout is ImageLayout.SHAPED:  # (n, padded, C x patch^2), its grid, its mask
        grid = side // spec.patch
        real = torch.zeros(count, spec.padded, dtype=torch.long)
        real[:, : grid * grid] = 1
        return {
            "pixel_values": _padded_patches(spec, count, grid, torch.randn).to(dtype),
            "spatial_shapes": torch.tensor([[grid, grid]] * count),
            "pixel_attention_mask": real,
        }
    if spec.layout is ImageLayout.TILES:  # (B, images, C, H, W), every pixel real
        mask = torch.ones(batch_size, images, *(() if spec.tile_mask else (side, side)))
        mask = mask.bool()
        return {
            "pixel_values": torch.randn(batch_size, images, channels, side, side).to(dtype),
            "pixel_attention_mask": mask,
        }
    if spec.layout is ImageLayout.TILES_BY_SIZE:  # (n, tiles, C, H, W): the image, its tiles
        tiles = torch.randn(count, spec.tiles, channels, side, side).to(dtype)
        return {"pixel_values": tiles, "image_sizes": torch.tensor([[side, side]] * count)}
    pixels = {"pixel_values": torch.randn(count, channels, side, side).to(dtype)}  # (n, C, H, W)
    if spec.layout is ImageLayout.SIZES:
        return {**pixels, "image_sizes": torch.tensor([[side, side]] * count)}
    return pixels


def _counted(model_class: Any, config: Any, spec: ImageTokens, dtype: torch.dtype) -> int:
    """Image tokens per image: the features the class's ``get_image_features`` gives one
    image, run on fake tensors."""
    from planner.measure.fake import call_on_fake_tensors

    def features(model: Any, **inputs: Any) -> Any:
        return _image_features(model)(**inputs, return_dict=True)

    output = call_on_fake_tensors(
        lambda: model_class._from_config(config, dtype=dtype),
        features,
        _image_inputs(spec, 1, 1, dtype),
    )
    return features_counted(output)


def features_counted(output: Any) -> int:
    """How many features (tokens) a ``get_image_features`` or ``get_audio_features`` output
    holds: its ``pooler_output`` (one tensor, or one per image), or where that is None its
    ``last_hidden_state`` (Llama 4's vision model; Qwen2-Audio's audio tower), every
    dimension but the features' own."""
    pooled = getattr(output, "pooler_output", None)
    if pooled is None:
        pooled = getattr(output, "last_hidden_state", output)
    parts = pooled if isinstance(pooled, list | tuple) else [pooled]
    return sum(math.prod(part.shape[:-1]) for part in parts)


_PATCH_LAYOUTS = (
    ImageLayout.POSITIONED,
    ImageLayout.SHAPED,
    ImageLayout.PACKED,
    ImageLayout.PATCHES,
)
"""The layouts built from the vision tower's ``patch_size``."""


def _budget_square(budget: int, factor: int, patch: int, size: int | None) -> tuple[int, int]:
    """The patches an image is padded to, for a processor allowing ``budget`` tokens of
    ``factor`` x ``factor`` patches each, and the side of the square image it makes: the
    largest within the budget, sides a multiple of a token's window (``size``, the config's
    ``image_size``, where smaller)."""
    padded = budget * factor**2
    window = factor * patch  # its sides are multiples of a token's window, in pixels
    largest = math.isqrt(padded) // factor * window
    return padded, max(window, min(largest, (size or largest) // window * window))


def image_tokens(path: Path, config: Any, model_class: Any, dtype: torch.dtype) -> ImageTokens:
    """How ``model_class``'s sequences hold an image of its config's size (module
    docstring); raises :class:`ModelFileError` for a class whose image inputs --hf cannot
    build."""
    name = model_class.__name__
    way_on = "pass --images 0 to train it on text alone, or write a model file"
    forward = inspect.signature(model_class.forward).parameters
    if {"cross_attention_mask", "aspect_ratio_ids"} <= set(forward):
        return _cross_attention_tiles(path, config, way_on)
    features_class = _features_class(model_class, config)
    if features_class is None:
        raise ModelFileError(
            f"--hf {path}: {name} takes images but has no get_image_features to "
            f"count an image's tokens by; {way_on}"
        )
    layout, needed = _layout(features_class, config)
    takes = _named_parameters(features_class)
    if takes and "pixel_values" not in takes:  # its images are another input (Kosmos-2.5)
        needed, layout = takes[:1], None
    if layout is None:
        raise ModelFileError(
            f"--hf {path}: {name} takes {', '.join(needed)} with its images, which --hf "
            f"does not build; {way_on}"
        )
    vision = vision_config(config)
    owners = tuple(owner for owner in (vision, config) if owner is not None)
    image_token = image_token_id(config)
    if image_token is None:
        raise ModelFileError(
            f"--hf {path}: the config names no image_token_id, the token an image's features "
            f"replace; add it, or {way_on}"
        )
    patch = _side(getattr(vision, "patch_size", None)) or 0
    size = _side(getattr(vision, "image_size", None))
    temporal, padded = 1, 0
    if layout in _PATCH_LAYOUTS and not patch:
        raise ModelFileError(f"--hf {path}: its vision_config names no patch_size; {way_on}")
    if layout is ImageLayout.POSITIONED:  # the largest square the soft-token budget allows
        pool = int_field(owners, ("pooling_kernel_size",)) or 1
        padded, size = _budget_square(SOFT_TOKEN_BUDGET, pool, patch, size)
    elif layout is ImageLayout.SHAPED:  # the largest square the token budget allows
        factor = int_field(owners, ("downsample_factor",)) or 1
        padded, size = _budget_square(NAFLEX_TOKEN_BUDGET, factor, patch, size)
    elif layout is ImageLayout.PACKED:  # its merger halves the grid twice: 4 x 4 a token
        # its vision_config's image_size is its position grid's (224), not the processor's
        # slices' (448, MiniCPM-V's scale_resolution): a slice of 448 x 448
        unit = 4 * patch
        size = max(unit, round(DYNAMIC_IMAGE_SIZE / unit) * unit)
    elif layout is ImageLayout.PATCHES:
        unit = patch * (int_field(owners, ("spatial_merge_size",)) or 1)
        size = max(unit, round((size or DYNAMIC_IMAGE_SIZE) / unit) * unit)
        temporal = int_field(owners, ("temporal_patch_size",)) or 1
    elif size is None:
        raise ModelFileError(f"--hf {path}: its vision_config names no image_size; {way_on}")
    spec = ImageTokens(
        layout=layout,
        channels=int_field(owners, ("num_channels", "in_channels", "in_chans")) or 3,
        size=size,
        tokens=0,
        image_token=image_token,
        start=int_field((config,), _START_FIELDS),
        end=int_field((config,), _END_FIELDS),
        reserved=named_ids(config),
        patch=patch,
        temporal=temporal,
        token_types=next((n for n in _TOKEN_TYPES if n in forward), None),
        types_mark_text=config.model_type == "paligemma",
        padded=padded,
    )
    if layout is ImageLayout.TILES_BY_SIZE:
        try:  # the whole image and the tiles of the grid its size picks, as its processor
            from transformers.models.llava_next.modeling_llava_next import (
                image_size_to_num_patches,
            )

            tiles = image_size_to_num_patches((size, size), config.image_grid_pinpoints, size)
        except Exception as error:  # a grid it cannot read
            raise ModelFileError(
                f"--hf {path}: {name}'s image_grid_pinpoints ({error}) give no tiles for a "
                f"{size} x {size} image; {way_on}"
            ) from error
        spec = dataclasses.replace(spec, tiles=int(tiles))
    try:
        tokens = _counted(model_class, config, spec, dtype)
    except Exception as error:  # the model's own, said in one line
        other = _OTHER_FORM.get(layout) if temporal == 1 else None
        if other is not None:  # the layout's other form, the model again the judge
            again = dataclasses.replace(
                spec, unflattened=other == "unflattened", tile_mask=other == "tile_mask"
            )
            try:
                tokens = _counted(model_class, config, again, dtype)
            except Exception:
                pass
            else:
                return dataclasses.replace(again, tokens=tokens)
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ModelFileError(
            f"--hf {path}: counting {name}'s image tokens on fake tensors failed "
            f"({type(error).__name__}: {first[:160]}); {way_on}"
        ) from error
    return dataclasses.replace(spec, tokens=tokens)


_OTHER_FORM = {ImageLayout.PATCHES: "unflattened", ImageLayout.TILES: "tile_mask"}
"""A layout's other form, tried where its image's tokens cannot be counted in the first:
patches each (C, patch, patch) (PaddleOCR-VL), a mask of tiles (Granite Docling)."""


def _cross_attention_tiles(path: Path, config: Any, way_on: str) -> ImageTokens:
    """Mllama's images: each one token in the sequence, its tiles read by the language
    model's cross-attention layers. A square image large enough to be cut into the largest
    square grid of tiles its ``supported_aspect_ratios`` hold (2 x 2 of 560 x 560: 1120 x
    1120), padded to ``max_num_tiles``, as its processor cuts and pads it."""
    vision = config.vision_config
    image_token = image_token_id(config)
    size = _side(getattr(vision, "image_size", None))
    ratios = [tuple(ratio) for ratio in getattr(vision, "supported_aspect_ratios", None) or []]
    squares = [ratio for ratio in ratios if len(ratio) == 2 and ratio[0] == ratio[1]]
    if image_token is None or size is None or not squares:
        raise ModelFileError(
            f"--hf {path}: the config names no image token, image_size or square aspect "
            f"ratio for its tiles; {way_on}"
        )
    grid = max(squares)[0]
    return ImageTokens(
        layout=ImageLayout.CROSS,
        channels=int_field((vision,), ("num_channels",)) or 3,
        size=size,
        tokens=1,
        image_token=image_token,
        start=None,
        end=None,
        reserved=named_ids(config),
        grid=grid,
        aspect_ratio=ratios.index(max(squares)) + 1,
        max_tiles=int_field((vision,), ("max_num_tiles",)) or grid**2,
    )


def text_tokens(shape: tuple[int, int], vocab_size: int, reserved: tuple[int, ...]) -> Any:
    """Token ids uniform below ``vocab_size`` and none of ``reserved`` (sorted)."""
    import torch

    skipped = [token for token in reserved if token < vocab_size]
    tokens = torch.randint(0, vocab_size - len(skipped), shape)
    for token in skipped:  # ascending: each shift keeps the ids past the ones skipped
        tokens[tokens >= token] += 1
    return tokens


def placeholder_tokens(
    one: list[int | None],
    count: int,
    shape: tuple[int, int],
    vocab_size: int,
    reserved: tuple[int, ...],
) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` (all ones) and ``labels`` of ``shape`` (batch,
    tokens): ``count`` times ``one`` (an image's or a clip's placeholder tokens, its start
    and end where not None), then text to the sequence's end (:func:`text_tokens`); labels
    the tokens, -100 at the placeholders."""
    import torch

    prefix = [token for token in one if token is not None] * count
    batch_size, seq_len = shape
    text = text_tokens((batch_size, seq_len - len(prefix)), vocab_size, reserved)
    head = torch.tensor(prefix, dtype=torch.long).expand(batch_size, -1)
    input_ids = torch.cat([head, text], dim=1)  # (B, T)
    labels = input_ids.clone()
    labels[:, : len(prefix)] = -100
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def image_batch(
    spec: ImageTokens,
    images: int,
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """A vision-language batch: ``images`` images a sequence, then text to ``seq_len``
    tokens (module docstring)."""
    import torch

    one = [spec.start, *[spec.image_token] * spec.tokens, spec.end]
    tokens = placeholder_tokens(one, images, (batch_size, seq_len), vocab_size, spec.reserved)
    input_ids = tokens["input_ids"]
    batch = {**tokens, **_image_inputs(spec, batch_size, images, dtype)}
    if spec.layout is ImageLayout.CROSS:  # each image's tiles, to the text from its token on
        attends = torch.zeros(batch_size, seq_len, images, spec.max_tiles, dtype=torch.long)
        for image in range(images):
            attends[:, image:, image, : spec.grid**2] = 1
        batch["cross_attention_mask"] = attends
    if spec.token_types is not None:  # as the processor gives them (module docstring)
        marked = input_ids == spec.image_token
        marked = ~marked if spec.types_mark_text else marked
        dtype_of = torch.int32 if spec.token_types == "mm_token_type_ids" else torch.long
        batch[spec.token_types] = marked.to(dtype_of)
    return batch
