"""`--hf` on a vision-language model: its sequences hold images, as its processor lays them
out (planner/measure/hf_images.py).

Before, such a config was planned on token ids alone: its vision tower never ran. The
configs are the types' defaults as `transformers` ships them, sizes made small by the sweep
(benchmarks/hf_sweep_models.py: 4 x 4 patches an image).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.hf_sweep_models import write_hf_config
from planner.core.errors import ModelFileError
from planner.measure.fake import build_fake_workload
from planner.measure.hf import min_seq_len
from planner.measure.profiler import record_memory
from planner.measure.source import WorkloadSource
from planner.measure.workload import build_workload, load_model_file, run_training_step
from tests.models import profile_halfway

pytestmark = pytest.mark.hf

TASK = "image-text-to-text"
_CROSS = "cross_attention_mask"


def _source(folder: Path, model_type: str, seq_len: int = 64, images: int | None = None) -> str:
    written = WorkloadSource.parse(write_hf_config(TASK, model_type, folder))
    return str(WorkloadSource.hugging_face(written.path, 2, seq_len, "float32", images))


@pytest.mark.parametrize(
    ("model_type", "pixels", "extra"),
    [
        ("llava", (2, 3, 128, 128), set()),  # CLIP: 4 x 4 patches of 32, a token each
        ("qwen2_vl", (2 * 16, 3 * 2 * 14 * 14), {"image_grid_thw", "mm_token_type_ids"}),
        # the same, each patch (C, patch, patch): its vision tower takes them so
        ("paddleocr_vl", (2 * 16, 3, 14, 14), {"image_grid_thw", "mm_token_type_ids"}),
        ("smolvlm", (2, 1, 3, 128, 128), {"pixel_attention_mask"}),
        ("granite_docling", (2, 1, 3, 64, 64), {"pixel_attention_mask"}),  # a tile's mask
        ("gemma3", (2, 3, 64, 64), {"token_type_ids"}),  # 1 at an image's tokens
        ("llava_next", (2, 3, 3, 128, 128), {"image_sizes"}),  # the image and 2 tiles
        # patches of 16 padded to the 280-token budget's 2520, each with its (x, y) or -1
        ("gemma4", (2, 2520, 3 * 16 * 16), {"image_position_ids", "mm_token_type_ids"}),
        # 4 x 4 patches of 16 padded to the 256-token budget's 1024, their grid and mask
        ("lfm2_vl", (2, 1024, 3 * 16 * 16), {"spatial_shapes", "pixel_attention_mask"}),
        # every image's 28 x 28 patches of 16 (a 448 x 448 slice) in one row, and their grid
        ("minicpmv4_6", (1, 3, 16, 2 * 28 * 28 * 16), {"target_sizes"}),
        # a token an image, its 2 x 2 tiles (of 4 at most) read by cross-attention layers
        ("mllama", (2, 1, 4, 3, 56, 56), {"aspect_ratio_ids", "aspect_ratio_mask", _CROSS}),
    ],
)
def test_a_vision_language_batch_holds_its_images_tokens(
    tmp_path: Path, model_type: str, pixels: tuple[int, ...], extra: set[str]
) -> None:
    """Each sequence: an image's tokens (as many as its vision tower gives features: the
    model checks that on every step), then text that names none of the config's ids;
    labels -100 at the image."""
    built = build_workload(load_model_file(_source(tmp_path, model_type)), seed=0)
    batch = built.batch
    assert set(batch) == {"input_ids", "attention_mask", "pixel_values", "labels", *extra}
    assert tuple(batch["pixel_values"].shape) == pixels
    model = built.model
    image_token = model.config.image_token_id
    tokens = (batch["input_ids"] == image_token).sum(dim=1)
    assert tokens.min() == tokens.max() > 0
    masked = batch["labels"] == -100  # the image's positions, first: a prefix of each row
    prefix = int(masked[0].sum())
    assert masked[:, :prefix].all() and not masked[:, prefix:].any()
    assert (batch["input_ids"][:, prefix:] == image_token).sum() == 0
    assert (batch["labels"][:, prefix:] == batch["input_ids"][:, prefix:]).all()
    if "pixel_attention_mask" in batch:  # the real pixels, tiles (Granite) or patches (LFM2)
        real = batch["pixel_attention_mask"]
        shape = {"granite_docling": (2, 1), "lfm2_vl": (2, 1024)}.get(model_type)
        assert tuple(real.shape) == (shape or (2, 1, *pixels[-2:]))
        assert int(real.sum()) == (2 * 4 * 4 if model_type == "lfm2_vl" else real.numel())
    for name in {"mm_token_type_ids", "token_type_ids"} & set(batch):  # as processors give
        assert torch.equal(batch[name].bool(), batch["input_ids"] == image_token)
    if _CROSS in batch:  # every token from the image's on reads its 4 tiles, as processors give
        assert batch[_CROSS][:, 0].sum() == 2 * 4 and batch[_CROSS].sum() == 2 * 4 * 64
        assert batch["aspect_ratio_ids"].tolist() == [[6], [6]]  # (2, 2) among 8 grids
    assert " each, labels -100 there" in built.notes[0].text
    assert run_training_step(built, seed=0).isfinite()  # the model's own count check passes


def _gemma4_config(folder: Path, vision: bool) -> Path:
    """The sweep's small Gemma 4 config: with its vision tower at the size its processor
    picks (no image_size), or as its defaults have it, without one (a text model)."""
    path = WorkloadSource.parse(write_hf_config(TASK, "gemma4", folder)).path
    config = json.loads(path.read_text())
    if vision:
        del config["vision_config"]["image_size"]
    else:
        config["vision_config"] = None
    path.write_text(json.dumps(config))
    return path


def test_gemma4_images_are_the_squares_its_soft_token_budget_allows(tmp_path: Path) -> None:
    """768 x 768: 48 x 48 patches of 16, pooled 3 x 3 to 256 tokens, padded to 2520 patches
    (280 tokens' worth) as its processor pads them; the fake step, whose pooling selects the
    tokens by a mask made from the positions, records the real step's peak."""
    path = _gemma4_config(tmp_path, vision=True)
    source = WorkloadSource.hugging_face(path, 2, 256 + 2 + 8, "float32")
    model_file = load_model_file(source)
    built = build_workload(model_file, seed=0)
    positions = built.batch["image_position_ids"]
    assert tuple(positions.shape) == (2, 2520, 2)
    assert positions[0, 48 * 48 - 1].tolist() == [47, 47] and positions[0, 1].tolist() == [1, 0]
    assert (positions[:, 48 * 48 :] == -1).all()
    assert int((built.batch["input_ids"][0] == built.model.config.image_token_id).sum()) == 256
    assert "3 x 768 x 768 image" in built.notes[0].text
    real = record_memory(built)
    workload, session = build_fake_workload(model_file)
    assert record_memory(workload, session=session).measured_peak_bytes == real.measured_peak_bytes


def test_a_vision_tower_in_the_encoders_config_takes_images(tmp_path: Path) -> None:
    """T5Gemma 2 keeps its vision_config in its encoder's config: --hf looked at the top
    level only and refused ("its vision_config names no image_size"). The sweep's small
    config (made consistent as a checkpoint's is: a 256 x 256 image of 16 x 16 patches of
    16, pooled to its 256 tokens) trains on an image a sequence; the fake step records the
    real step's peak."""
    path = WorkloadSource.parse(write_hf_config(TASK, "t5gemma2", tmp_path)).path
    config = json.loads(path.read_text())
    assert "vision_config" not in config and config["encoder"]["mm_tokens_per_image"] == 256
    model_file = load_model_file(WorkloadSource.hugging_face(path, 2, 300, "float32"))
    built = build_workload(model_file, seed=0)
    assert tuple(built.batch["pixel_values"].shape) == (2, 3, 256, 256)
    image_token = built.model.config.encoder.image_token_index
    assert int((built.batch["input_ids"] == image_token).sum()) == 2 * 256
    real = record_memory(built)
    workload, session = build_fake_workload(model_file)
    assert record_memory(workload, session=session).measured_peak_bytes == real.measured_peak_bytes


def test_a_config_without_its_vision_tower_is_text_alone(tmp_path: Path) -> None:
    path = _gemma4_config(tmp_path, vision=False)
    built = build_workload(load_model_file(WorkloadSource.hugging_face(path, 2, 32, "float32")))
    assert set(built.batch) == {"input_ids", "attention_mask", "labels"}
    assert "no vision_config: text alone" in built.notes[0].text
    with pytest.raises(ModelFileError, match="has no vision_config, so Gemma4For"):
        load_model_file(WorkloadSource.hugging_face(path, 2, 32, "float32", 1))


def test_images_zero_is_text_alone_and_two_is_two_images(tmp_path: Path) -> None:
    text = build_workload(load_model_file(_source(tmp_path, "llava", images=0)), seed=0)
    assert set(text.batch) == {"input_ids", "attention_mask", "labels"}
    assert "--images 0: text alone" in text.notes[0].text
    two = load_model_file(_source(tmp_path, "llava", images=2))
    one = load_model_file(_source(tmp_path, "llava"))
    assert min_seq_len(two.source) - 1 == 2 * (min_seq_len(one.source) - 1)
    built = build_workload(two, seed=0)
    assert built.batch["pixel_values"].shape[0] == 4
    assert run_training_step(built, seed=0).isfinite()


@pytest.mark.parametrize(
    ("model_type", "seq_len", "images", "fragments"),
    [
        ("llava", 16, None, ("--seq-len 16 leaves no text", "pass --seq-len 17 or more")),
        ("deepseek_vl_hybrid", 64, None, ("high_res_pixel_values", "--images 0", "model file")),
        ("aria", 64, None, ("counting AriaFor", "--images 0", "model file")),
    ],
)
def test_a_batch_it_cannot_build_is_one_line_naming_the_way_on(
    tmp_path: Path, model_type: str, seq_len: int, images: int | None, fragments: tuple[str, ...]
) -> None:
    with pytest.raises(ModelFileError) as caught:
        load_model_file(_source(tmp_path, model_type, seq_len, images))
    for fragment in fragments:
        assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)
    # it trains on text alone where asked
    if model_type == "aria":
        text = load_model_file(_source(tmp_path, model_type, seq_len, images=0))
        assert "pixel_values" not in build_workload(text, seed=0).batch


def test_images_on_a_text_model_is_an_error(tmp_path: Path) -> None:
    written = WorkloadSource.parse(write_hf_config("causal-lm", "llama", tmp_path))
    with pytest.raises(ModelFileError, match="takes no images besides its token ids"):
        load_model_file(str(WorkloadSource.hugging_face(written.path, 2, 64, "float32", 1)))


def test_a_source_carries_its_images() -> None:
    source = WorkloadSource.hugging_face("/c/config.json", 2, 64, "bfloat16", 0)
    assert str(source).endswith("&images=0")
    assert WorkloadSource.parse(str(source)) == source
    assert source.command_arguments()[-2:] == ["--images", "0"]
    assert "images" not in str(WorkloadSource.hugging_face("/c/config.json", 2, 64, "bfloat16"))


@pytest.mark.slow
def test_profile_a_vision_language_config_its_plan_exact_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2-VL: the fake step (its rotary deltas are a torch.tensor of fake tensors, which
    failed before) is the real one; a plan halfway down is checked in its own process and
    predicted to the byte. (Every type's plan: benchmarks/hf_sweep.py.)"""
    monkeypatch.chdir(tmp_path)
    source = WorkloadSource.parse(_source(tmp_path, "qwen2_vl"))
    workload, session = build_fake_workload(load_model_file(source))
    profile = record_memory(workload, session=session)
    # Every block is what gradient_checkpointing_enable() wraps: the vision tower's layers
    # as well as the language model's (before, the language model's alone), two stacks.
    from transformers.modeling_layers import GradientCheckpointingLayer

    model = load_model_file(source).build_model()
    wrapped = [n for n, m in model.named_modules() if isinstance(m, GradientCheckpointingLayer)]
    assert list(profile.block_names) == wrapped
    assert any(".visual." in n for n in wrapped) and any(".language_model." in n for n in wrapped)
    assert len(profile.block_stacks) == 2
    plan = profile_halfway(source, profile, tmp_path)
    assert "pixel_values" in plan.batch
    real = record_memory(build_workload(load_model_file(source), seed=0))
    assert real.measured_peak_bytes == profile.measured_peak_bytes


def test_a_model_taking_images_and_audio_is_planned_on_images_and_says_so(
    tmp_path: Path,
) -> None:
    """Qwen2.5-Omni's thinker takes clips too: `--hf` gives it images, and its assumptions
    say its audio encoder is not run."""
    built = build_workload(load_model_file(_source(tmp_path, "qwen2_5_omni_thinker")), seed=0)
    assert "pixel_values" in built.batch and "input_features" not in built.batch
    assert "(no audio: --hf plans a model taking images and audio on images)" in (
        built.notes[0].text
    )
    assert run_training_step(built, seed=0).isfinite()


def test_a_vision_language_classifier_gets_a_label_per_sequence(tmp_path: Path) -> None:
    """Gemma3ForSequenceClassification takes images: its sequences hold one, and its targets
    are its head's, a label per sequence (they were the language model's token labels, which
    its loss refused: "Expected input batch_size (4) to match target batch_size (280)")."""
    source = WorkloadSource.parse(write_hf_config("sequence-classification", "gemma3", tmp_path))
    built = build_workload(load_model_file(source), seed=0)
    assert "pixel_values" in built.batch
    assert built.batch["labels"].shape == (source.batch_size,)
    assert int(built.batch["labels"].max()) < built.model.config.num_labels
    said = built.notes[0].text
    assert "a label per sequence" in said and "labels -100" not in said
    assert run_training_step(built, seed=0).isfinite()


def _image_to_text_config(folder: Path, ready: bool = True) -> Path:
    """The sweep's small VisionEncoderDecoderModel (ViT and BERT), made as
    ``from_encoder_decoder_pretrained`` and a tokenizer make a TrOCR-style one: its decoder
    a decoder reading the image, its start and pad tokens named; without the start token
    unless ``ready``."""
    path = WorkloadSource.parse(write_hf_config(TASK, "vision-encoder-decoder", folder)).path
    config = json.loads(path.read_text())
    assert config["decoder"]["add_cross_attention"] and config["pad_token_id"] == 0
    if not ready:
        config["decoder_start_token_id"] = None
    path.write_text(json.dumps(config))
    return path


def test_an_image_encoder_and_text_decoder_trains_on_images_and_their_text(
    tmp_path: Path,
) -> None:
    """TrOCR's and Donut's VisionEncoderDecoderModel takes pixel_values and the labels its
    decoder writes, no input_ids: --hf refused it ("takes pixel_values, and --hf builds
    batches of token ids, images for an image classifier..."). Now an image of the
    encoder's size a sequence and --seq-len tokens of text; the fake step records the real
    step's peak, and the loss reads the images (other images, another loss)."""
    path = _image_to_text_config(tmp_path)
    model_file = load_model_file(WorkloadSource.hugging_face(path, 2, 32, "float32"))
    built = build_workload(model_file, seed=0)
    assert set(built.batch) == {"pixel_values", "labels"}
    assert tuple(built.batch["pixel_values"].shape) == (2, 3, 224, 224)
    assert tuple(built.batch["labels"].shape) == (2, 32)
    assert "32 tokens of text an image" in built.notes[0].text
    assert "shifts right behind decoder_start_token_id" in built.notes[0].text
    loss = run_training_step(built, seed=0)
    other = build_workload(model_file, seed=0)
    other.batch["pixel_values"] = other.batch["pixel_values"].flip(-1)
    assert not torch.equal(run_training_step(other, seed=0), loss)
    real = record_memory(build_workload(model_file, seed=0))
    workload, session = build_fake_workload(model_file)
    assert record_memory(workload, session=session).measured_peak_bytes == real.measured_peak_bytes


@pytest.mark.parametrize(
    ("ready", "seq_len", "said"),
    [
        (True, None, "takes images and their text; pass --seq-len, the tokens of each image's"),
        (False, 32, "the config names no decoder_start_token_id, the token its decoder starts"),
        (True, 129, "--seq-len 129 is longer than the 128 positions the decoder of"),
    ],
)
def test_an_image_to_text_config_it_cannot_train_is_one_line(
    tmp_path: Path, ready: bool, seq_len: int | None, said: str
) -> None:
    path = _image_to_text_config(tmp_path, ready)
    with pytest.raises(ModelFileError) as caught:
        load_model_file(WorkloadSource.hugging_face(path, 2, seq_len, "float32"))
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_captioner_trains_on_images_and_their_captions(tmp_path: Path) -> None:
    """BLIP's captioner reads its caption as input_ids (and labels), its text decoder
    cross-attending to the image's features, no image token among the ids: --hf refused it
    ("takes pixel_values, and --hf builds ..."). Now an image of its vision tower's size a
    sequence and --seq-len tokens of caption; the step trains the vision tower (its
    random weights barely move the loss, so this is what shows the images are read), and
    the fake step records the real step's peak."""
    path = WorkloadSource.parse(write_hf_config(TASK, "blip", tmp_path)).path
    model_file = load_model_file(WorkloadSource.hugging_face(path, 2, 16, "float32"))
    built = build_workload(model_file, seed=0)
    batch = built.batch
    assert set(batch) == {"pixel_values", "input_ids", "attention_mask", "labels"}
    assert tuple(batch["input_ids"].shape) == (2, 16)
    assert torch.equal(batch["input_ids"], batch["labels"])
    assert "16 tokens of text an image" in built.notes[0].text
    assert "the caption, which are its input_ids too" in built.notes[0].text
    built.model(**batch).loss.backward()
    patches = built.model.vision_model.embeddings.patch_embedding.weight.grad
    assert patches is not None and bool(patches.abs().sum() > 0)
    real = record_memory(build_workload(model_file, seed=0))
    workload, session = build_fake_workload(model_file)
    assert record_memory(workload, session=session).measured_peak_bytes == real.measured_peak_bytes
