"""`--hf CONFIG`: plan a Hugging Face model from its config.json, with no model file.

End to end through the CLI on tiny GPT-2 and Llama configs (profile, plan, the check in a
separate process, solve and verify rebuilding the same workload from what the profile and
plan record), and every bad input: one line, the README's exit code, nothing written.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("transformers")

from planner.cli.main import app
from planner.core.errors import ModelFileError
from planner.measure.fake import build_fake_workload
from planner.measure.hf import hf_workload, load_hf_model_file
from planner.measure.profiler import record_memory
from planner.measure.source import WorkloadSource
from planner.measure.workload import build_workload, load_model_file, run_training_step
from planner.plan.plan_file import Plan, load_plan, plan_to_dict
from planner.plan.profile_file import load_profile
from planner.solve.planning import baseline_every_block
from tests.models import profile_halfway

pytestmark = pytest.mark.hf

CONFIGS = Path(__file__).resolve().parent.parent / "examples" / "configs"
TINY_GPT2 = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": 32,
    "n_head": 2,
    "n_layer": 2,
    "n_positions": 64,
    "vocab_size": 256,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 88,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
    "vocab_size": 256,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder as the working directory: default outputs land there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write(path: Path, config: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _error_line(result, *fragments: str) -> str:  # type: ignore[no-untyped-def]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _mid_budget(source: WorkloadSource) -> int:
    """Halfway between every block checkpointed and no checkpointing, from a fake step."""
    workload, session = build_fake_workload(load_model_file(source))
    profile = record_memory(workload, session=session)
    low = baseline_every_block(profile).predicted_peak_bytes
    assert low < profile.measured_peak_bytes
    return (low + profile.measured_peak_bytes) // 2


# -- the workload -----------------------------------------------------------------------------
def test_a_workload_travels_as_one_string_and_builds_the_same_step(tmp_path: Path) -> None:
    config = _write(tmp_path / "tiny-llama" / "config.json", TINY_LLAMA)
    workload = hf_workload(config.parent, batch_size=2, seq_len=16)
    # A folder means its config.json; the dtype is the config's; the name is the folder's.
    assert workload == WorkloadSource.hugging_face(config.resolve(), 2, 16, "bfloat16")
    assert workload.name == "tiny-llama"
    text = str(workload)
    assert text.startswith("hf:") and WorkloadSource.parse(text) == workload
    model_file = load_model_file(text)
    assert model_file.source == workload and model_file.name == "tiny-llama"
    losses = []
    for _ in range(2):
        built = build_workload(model_file, seed=0)
        assert type(built.model).__name__ == "LlamaForCausalLM"
        assert {p.dtype for p in built.model.parameters()} == {torch.bfloat16}
        assert not built.model.config.use_cache
        assert {k: tuple(v.shape) for k, v in built.batch.items()} == {
            "input_ids": (2, 16),
            "attention_mask": (2, 16),
            "labels": (2, 16),
        }
        assert int(built.batch["input_ids"].max()) < TINY_LLAMA["vocab_size"]
        assert built.notes and "synthetic batch of 2 x 16" in built.notes[0].text
        losses.append(run_training_step(built, seed=0))
    assert losses[0].equal(losses[1])  # seeded: the same weights, batch and loss


@pytest.mark.parametrize(
    ("name", "model_class", "dtype"),
    [
        ("gpt2.json", "GPT2LMHeadModel", "float32"),
        ("llama-3-8b.json", "LlamaForCausalLM", "bfloat16"),
        ("mistral-7b.json", "MistralForCausalLM", "bfloat16"),
        ("tiny-llama.json", "LlamaForCausalLM", "float32"),
    ],
)
def test_the_shipped_configs_name_classes_transformers_builds(
    name: str, model_class: str, dtype: str
) -> None:
    model_file = load_hf_model_file(hf_workload(CONFIGS / name, 1, 256))
    assert model_file.name == name.removesuffix(".json")
    assert model_file.source.dtype == dtype  # the config's own
    assert model_file.assumptions[0].startswith(f"Hugging Face {model_class} from ")


def test_the_shipped_vision_language_config_trains_on_an_image_a_sequence() -> None:
    """Qwen2.5-VL-7B's config as the Hub ships it (flat text fields, rope_scaling): one
    448 x 448 image of 1024 patches, 256 tokens after its 2 x 2 merge, between its
    vision start and end tokens."""
    model_file = load_hf_model_file(hf_workload(CONFIGS / "qwen2.5-vl-7b.json", 1, 1024))
    assert model_file.source.dtype == "bfloat16"
    said = model_file.assumptions[0]
    assert said.startswith("Hugging Face Qwen2_5_VLForConditionalGeneration from ")
    assert "1 random 3 x 448 x 448 image a sequence (patches; 256 image tokens each" in said


def test_the_shipped_clip_config_trains_on_image_caption_pairs() -> None:
    """CLIP ViT-L/14's config as the Hub ships it: 224 x 224 images and 77-token captions,
    each ending in its text config's eos token (2), its own contrastive loss."""
    model_file = load_hf_model_file(hf_workload(CONFIGS / "clip-vit-large-patch14.json", 2, 77))
    assert model_file.source.dtype == "float32"
    said = model_file.assumptions[0]
    assert said.startswith("Hugging Face CLIPModel from ")
    assert "2 random 3 x 224 x 224 images (pixel_values) and their captions of 77 token ids" in (
        said
    )
    assert "each ending in the eos token 2" in said and "return_loss=True" in said
    with pytest.raises(ModelFileError, match="the 77 positions"):
        load_hf_model_file(hf_workload(CONFIGS / "clip-vit-large-patch14.json", 2, 78))


def test_the_shipped_whisper_config_trains_on_its_30_second_windows() -> None:
    model_file = load_hf_model_file(hf_workload(CONFIGS / "whisper-large-v3.json", 2, 3000))
    assert model_file.source.dtype == "float16"
    said = model_file.assumptions[0]
    assert said.startswith("Hugging Face WhisperForConditionalGeneration from ")
    assert "2 x 128 x 3000 random feature frames (mel bins first)" in said
    assert "a transcript of 375 tokens per clip" in said


# -- the heads fine-tuning puts on a text model ------------------------------------------------
TINY_BERT = {
    "model_type": "bert",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 256,
    "max_position_embeddings": 64,
}


TINY_BART = {
    "model_type": "bart",
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "vocab_size": 100,
    "max_position_embeddings": 64,
}


def _labels(count: int) -> dict[str, object]:
    return {
        "id2label": {str(i): f"L{i}" for i in range(count)},
        "label2id": {f"L{i}": i for i in range(count)},
    }


@pytest.mark.parametrize(
    ("config", "targets"),
    [
        (  # sentiment: two classes, one label per sequence
            {**TINY_BERT, "architectures": ["BertForSequenceClassification"], **_labels(2)},
            {"labels": ((3,), torch.int64, 2)},
        ),
        (  # one output: regression, a float per sequence
            {**TINY_BERT, "architectures": ["BertForSequenceClassification"], "num_labels": 1},
            {"labels": ((3,), torch.float32, None)},
        ),
        (
            {
                **TINY_BERT,
                "architectures": ["BertForSequenceClassification"],
                "problem_type": "multi_label_classification",
                **_labels(5),
            },
            {"labels": ((3, 5), torch.float32, 2)},
        ),
        (  # named entities: a label per token
            {**TINY_BERT, "architectures": ["BertForTokenClassification"], **_labels(9)},
            {"labels": ((3, 16), torch.int64, 9)},
        ),
        (  # extractive question answering: where the answer starts and ends
            {**TINY_BERT, "architectures": ["BertForQuestionAnswering"]},
            {
                "start_positions": ((3,), torch.int64, 16),
                "end_positions": ((3,), torch.int64, 16),
            },
        ),
        (  # a decoder-only classifier whose config names no pad token (Llama's do not)
            {**TINY_LLAMA, "architectures": ["LlamaForSequenceClassification"], **_labels(3)},
            {"labels": ((3,), torch.int64, 3)},
        ),
        (  # an encoder-decoder classifier pools at the eos its tokenizer appends
            {**TINY_BART, "architectures": ["BartForSequenceClassification"], **_labels(2)},
            {"labels": ((3,), torch.int64, 2)},
        ),
    ],
)
def test_a_heads_batch_holds_the_targets_its_loss_takes(
    tmp_path: Path, config: dict[str, object], targets: dict[str, tuple]
) -> None:
    """Before, every class got labels = input_ids: a sequence classifier's step raised
    (batch 3 against 48 targets), a token classifier's indexed past its classes."""
    path = _write(tmp_path / "config.json", config)
    model_file = load_hf_model_file(hf_workload(path, batch_size=3, seq_len=16))
    built = build_workload(model_file, seed=0)
    batch = built.batch
    assert set(batch) == {"input_ids", "attention_mask", *targets}
    for name, (shape, dtype, below) in targets.items():
        tensor = batch[name]
        assert (tuple(tensor.shape), tensor.dtype) == (shape, dtype), name
        if below is not None:
            assert int(tensor.min()) >= 0 and int(tensor.max()) < below, name
    loss = run_training_step(built, seed=0)
    assert loss.isfinite()
    if config["model_type"] == "bart":  # one eos a sequence, last (BART raises otherwise)
        eos = built.model.config.eos_token_id
        assert built.model.config.pad_token_id == 1 != eos  # its own pad, kept
        assert (batch["input_ids"] == eos).sum(dim=1).tolist() == [1, 1, 1]
        assert (batch["input_ids"][:, -1] == eos).all()
    if config["model_type"] == "llama":
        assert built.model.config.pad_token_id == TINY_LLAMA["eos_token_id"]
        assert "pad_token_id set to the eos_token_id 0" in built.notes[0].text


@pytest.mark.parametrize(("choices", "expected"), [(None, 4), (2, 2)])
def test_a_multiple_choice_batch_holds_its_choices(
    tmp_path: Path, choices: int | None, expected: int
) -> None:
    """Each example is its choices, each a sequence of --seq-len tokens, and the index of the
    right one (SWAG's 4 by default). Before, --hf refused the head."""
    path = _write(
        tmp_path / "config.json", {**TINY_BERT, "architectures": ["BertForMultipleChoice"]}
    )
    source = hf_workload(path, batch_size=3, seq_len=16, choices=choices)
    assert WorkloadSource.parse(str(source)) == source
    assert ("--choices" in source.command_arguments()) is (choices is not None)
    model_file = load_hf_model_file(source)
    built = build_workload(model_file, seed=0)
    assert built.batch["input_ids"].shape == built.batch["attention_mask"].shape
    assert tuple(built.batch["input_ids"].shape) == (3, expected, 16)
    labels = built.batch["labels"]
    assert labels.shape == (3,) and int(labels.min()) >= 0 and int(labels.max()) < expected
    assert f"3 examples of {expected} choices of 16 random token ids" in model_file.assumptions[0]
    assert run_training_step(built, seed=0).isfinite()


@pytest.mark.slow
def test_profile_a_multiple_choice_config_its_plan_exact_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--choices 5` travels with the workload: the plan checked in its own process (which
    rebuilds the batch from the source) is predicted to the byte."""
    monkeypatch.chdir(tmp_path)
    config = {**TINY_BERT, "architectures": ["BertForMultipleChoice"]}
    source = hf_workload(_write(tmp_path / "config.json", config), 4, 32, choices=5)
    workload, session = build_fake_workload(load_hf_model_file(source))
    profile = record_memory(workload, session=session)
    plan = profile_halfway(source, profile, tmp_path)
    assert plan.model_file is not None and plan.model_file.endswith("&choices=5")
    assert tuple(plan.batch["input_ids"]["shape"]) == (4, 5, 32)


# -- image classifiers -------------------------------------------------------------------------
TINY_VIT = {
    "model_type": "vit",
    "architectures": ["ViTForImageClassification"],
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    **_labels(10),
}
TINY_RESNET = {  # ResNet's config names no image size: 224, what it is trained at
    "model_type": "resnet",
    "architectures": ["ResNetForImageClassification"],
    "embedding_size": 8,
    "hidden_sizes": [8, 16],
    "depths": [1, 1],
    "num_labels": 4,
}
TINY_SEGFORMER = {  # semantic segmentation: a class map per image
    "model_type": "segformer",
    "architectures": ["SegformerForSemanticSegmentation"],
    "image_size": 32,
    "num_encoder_blocks": 2,
    "depths": [1, 1],
    "sr_ratios": [2, 1],
    "hidden_sizes": [8, 16],
    "patch_sizes": [7, 3],
    "strides": [4, 2],
    "num_attention_heads": [1, 2],
    "mlp_ratios": [2, 2],
    "decoder_hidden_size": 16,
    "num_labels": 5,
}
TINY_CLIP = {  # a composite config: the images are its vision tower's
    "model_type": "clip",
    "architectures": ["CLIPForImageClassification"],
    "vision_config": {
        "image_size": 48,
        "patch_size": 16,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
    },
    "text_config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2},
    "num_labels": 3,
}


@pytest.mark.parametrize(
    ("config", "dtype", "pixels", "labels"),
    [
        (TINY_VIT, None, (3, 3, 32, 32), ((3,), torch.int64, 10)),
        (TINY_VIT, "bfloat16", (3, 3, 32, 32), ((3,), torch.int64, 10)),
        ({**TINY_VIT, "num_channels": 1}, None, (3, 1, 32, 32), ((3,), torch.int64, 10)),
        ({**TINY_VIT, "image_size": [32, 48]}, None, (3, 3, 32, 48), ((3,), torch.int64, 10)),
        (  # one output: regression, a float per image
            {**TINY_VIT, "id2label": None, "label2id": None, "num_labels": 1},
            None,
            (3, 3, 32, 32),
            ((3,), torch.float32, None),
        ),
        (TINY_RESNET, None, (3, 3, 224, 224), ((3,), torch.int64, 4)),
        (TINY_CLIP, None, (3, 3, 48, 48), ((3,), torch.int64, 3)),
        (TINY_SEGFORMER, None, (3, 3, 32, 32), ((3, 32, 32), torch.int64, 5)),  # per pixel
    ],
)
def test_an_image_classifiers_batch_is_images_of_its_configs_size(
    tmp_path: Path,
    config: dict[str, object],
    dtype: str | None,
    pixels: tuple[int, ...],
    labels: tuple,
) -> None:
    """Before, --hf refused every class whose main input is pixel_values."""
    config = {k: v for k, v in config.items() if v is not None}
    path = _write(tmp_path / "config.json", config)
    source = hf_workload(path, batch_size=3, seq_len=None, dtype=dtype)
    assert source.seq_len is None and "seq_len" not in str(source)
    built = build_workload(load_model_file(str(source)), seed=0)
    batch = built.batch
    assert set(batch) == {"pixel_values", "labels"}
    pixel_dtype = getattr(torch, dtype or "float32")
    assert (tuple(batch["pixel_values"].shape), batch["pixel_values"].dtype) == (
        pixels,
        pixel_dtype,
    )
    shape, label_dtype, below = labels
    label = batch["labels"]
    assert (tuple(label.shape), label.dtype) == (shape, label_dtype)
    if below is not None:
        assert int(label.min()) >= 0 and int(label.max()) < below
    assert "{} random {} x {} x {} images (pixel_values)".format(*pixels) in built.notes[0].text
    assert run_training_step(built, seed=0).isfinite()


@pytest.mark.slow
def test_profile_a_tiny_image_classifier_config(workdir: Path) -> None:
    """The plan records the images' source (no sequence length), and its check runs the
    images' step. (fit takes the same source, resized in its batch size as any --hf one:
    tests/test_fit.py has its options.)"""
    _write(workdir / "vit" / "config.json", TINY_VIT)
    source = hf_workload(workdir / "vit", 8, None)
    budget = _mid_budget(source)
    runner = CliRunner()
    result = runner.invoke(
        app, ["profile", "--hf", "vit", "--batch-size", "8", "--budget", str(budget)]
    )
    assert result.exit_code == 0, result.output
    plan = load_plan(workdir / "profiles" / "vit" / "plan.json")
    assert plan.model_file == str(source) and plan.modules and plan.checked
    assert plan.batch["pixel_values"]["shape"] == [8, 3, 32, 32]  # type: ignore[index]
    assert plan.measured_peak_bytes == plan.predicted_peak_bytes <= budget


# -- speech recognizers and audio classifiers -------------------------------------------------
TINY_WAV2VEC2 = {
    "model_type": "wav2vec2",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "conv_dim": [16, 16],  # a feature encoder of 2 layers, 1/20 of the samples
    "conv_stride": [5, 4],
    "conv_kernel": [10, 8],
    "num_conv_pos_embeddings": 16,
    "vocab_size": 32,
}
TINY_SEW_D = {  # its 512 positions are frames after the feature encoder: no limit on samples
    **TINY_WAV2VEC2,
    "model_type": "sew-d",
    "architectures": ["SEWDForCTC"],
    "max_position_embeddings": 512,
    "conv_dim": [16] * 13,  # its default feature encoder's 13 layers
    "conv_stride": [5, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1],
    "conv_kernel": [10, 3, 1, 3, 1, 3, 1, 3, 1, 2, 1, 2, 1],
}
TINY_PARAKEET = {  # takes feature frames: its encoder's 80 mel bins; its blank is its last id
    "model_type": "parakeet_ctc",
    "architectures": ["ParakeetForCTC"],
    "vocab_size": 33,
    "pad_token_id": 32,
    "encoder_config": {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
    },
}


_SEQ2SEQ_SIZES = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "vocab_size": 100,
}
TINY_WHISPER = {
    "model_type": "whisper",
    "architectures": ["WhisperForConditionalGeneration"],
    **_SEQ2SEQ_SIZES,
    "num_mel_bins": 16,
    "max_source_positions": 32,  # a window of 64 frames
    "max_target_positions": 16,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "decoder_start_token_id": 1,
    "eos_token_id": 2,
}
TINY_SPEECH2TEXT = {
    "model_type": "speech_to_text",
    "architectures": ["Speech2TextForConditionalGeneration"],
    **_SEQ2SEQ_SIZES,
    "input_feat_per_channel": 16,
    "conv_channels": 32,
    "max_source_positions": 64,
    "max_target_positions": 32,
}


@pytest.mark.parametrize(
    ("config", "seq_len", "inputs", "labels", "compared"),
    [
        (  # speech recognition: raw audio, a transcript of a label per 2000 samples
            {**TINY_WAV2VEC2, "architectures": ["Wav2Vec2ForCTC"]},
            4000,
            {"input_values": ((3, 4000), torch.float32)},
            ((3, 2), torch.int64, 32),
            True,
        ),
        (
            TINY_SEW_D,
            16000,
            {"input_values": ((3, 16000), torch.float32)},
            ((3, 8), torch.int64, 32),
            False,
        ),
        (  # feature frames and their mask; a label per 8 frames, below the blank
            TINY_PARAKEET,
            64,
            {
                "input_features": ((3, 64, 80), torch.float32),
                "attention_mask": ((3, 64), torch.int64),
            },
            ((3, 8), torch.int64, 32),
            True,
        ),
        (  # Whisper: one window of mel bins x frames, no mask; a transcript of tokens
            TINY_WHISPER,
            64,
            {"input_features": ((3, 16, 64), torch.float32)},
            ((3, 8), torch.int64, 100),
            True,
        ),
        (  # Speech2Text: frames x features of any length, masked
            TINY_SPEECH2TEXT,
            64,
            {
                "input_features": ((3, 64, 16), torch.float32),
                "attention_mask": ((3, 64), torch.int64),
            },
            ((3, 8), torch.int64, 100),
            False,
        ),
        (  # keyword spotting: a label per clip
            {
                **TINY_WAV2VEC2,
                "architectures": ["Wav2Vec2ForSequenceClassification"],
                **_labels(12),
            },
            4000,
            {"input_values": ((3, 4000), torch.float32)},
            ((3,), torch.int64, 12),
            False,
        ),
    ],
)
def test_an_audio_models_batch_is_clips_of_seq_len(
    tmp_path: Path,
    config: dict[str, object],
    seq_len: int,
    inputs: dict[str, tuple],
    labels: tuple,
    compared: bool,
) -> None:
    """Before, --hf refused every class whose main input is audio (input_values or
    input_features); --seq-len is the clip's length in its main input's steps. The step
    recorded on fake tensors is the real one, storage for storage (what plans rest on)."""
    path = _write(tmp_path / "config.json", config)
    model_file = load_model_file(str(hf_workload(path, 3, seq_len)))
    # Raw audio and features: the fake step is the real one (SEW-D and the classifier take
    # the raw-audio path again, not compared twice).
    if compared:
        numpy = pytest.importorskip("numpy")
        numpy.random.seed(0)  # SpecAugment draws the frames it masks from NumPy: alike in both
        fake_workload, session = build_fake_workload(model_file)
        fake = record_memory(fake_workload, session=session)
        numpy.random.seed(0)
        real = record_memory(build_workload(model_file, seed=0))
        assert fake.timeline.storages == real.timeline.storages
        assert fake.measured_peak_bytes == real.measured_peak_bytes
    built = build_workload(model_file, seed=0)
    batch = built.batch
    assert set(batch) == {*inputs, "labels"}
    for name, (shape, dtype) in inputs.items():
        assert (tuple(batch[name].shape), batch[name].dtype) == (shape, dtype), name
    shape, dtype, below = labels
    assert (tuple(batch["labels"].shape), batch["labels"].dtype) == (shape, dtype)
    blank = 0 if config["model_type"] != "parakeet_ctc" else below
    if "ForCTC" in str(config["architectures"]):  # a transcript: no blank in it
        assert not (batch["labels"] == blank).any() and int(batch["labels"].max()) <= below
    else:
        assert int(batch["labels"].min()) >= 0 and int(batch["labels"].max()) < below
    if config is TINY_WHISPER:  # a transcript: none of the pad, start and end tokens
        assert not torch.isin(batch["labels"], torch.tensor([0, 1, 2])).any()
    assert run_training_step(built, seed=0).isfinite()


def test_whisper_takes_its_one_window_and_is_told_its_length(tmp_path: Path) -> None:
    path = _write(tmp_path / "config.json", TINY_WHISPER)
    with pytest.raises(ModelFileError, match="takes windows of 64 feature frames") as caught:
        load_model_file(str(hf_workload(path, 3, 100)))
    assert "pass --seq-len 64" in str(caught.value)
    with pytest.raises(ModelFileError, match="takes audio; pass --seq-len, its window, 64"):
        load_model_file(str(hf_workload(path, 3, None)))


def test_a_decoder_classifier_with_no_pad_or_eos_token_is_told_to_set_one(workdir: Path) -> None:
    """Qwen2's defaults name neither (its checkpoints name an eos, which --hf then uses)."""
    config = {
        **TINY_LLAMA,
        "model_type": "qwen2",
        "architectures": ["Qwen2ForSequenceClassification"],
    }
    del config["bos_token_id"], config["eos_token_id"]
    _write(workdir / "qwen2-cls.json", config)
    before = _files(workdir)
    result = CliRunner().invoke(
        app, [*PROFILE, "--hf", "qwen2-cls.json", "--batch-size", "2", "--seq-len", "8"]
    )
    assert result.exit_code == 4, result.output
    _error_line(result, "no padding token is defined", "set pad_token_id in the model's config")
    assert _files(workdir) == before


@pytest.mark.slow
def test_profile_a_tiny_sequence_classifier_config(workdir: Path) -> None:
    """A fine-tuned classifier's config, as its folder ships it: planned, checked, its
    prediction the measured peak to the byte."""
    config = {**TINY_BERT, "architectures": ["BertForSequenceClassification"], **_labels(2)}
    folder = _write(workdir / "bert-sst2" / "config.json", config).parent
    source = hf_workload(folder, 4, 32)
    budget = _mid_budget(source)
    shape = ["--batch-size", "4", "--seq-len", "32", "--budget", str(budget)]
    result = CliRunner().invoke(app, ["profile", "--hf", str(folder), *shape])
    assert result.exit_code == 0, result.output
    plan = load_plan(workdir / "profiles" / "bert-sst2" / "plan.json")
    assert plan.modules and plan.checked
    assert plan.measured_peak_bytes == plan.predicted_peak_bytes <= budget
    assert plan.batch["labels"] == {"shape": [4], "dtype": "int64"}
    assert any("a label per sequence" in note.text for note in plan.assumptions)


# -- end to end through the CLI -------------------------------------------------------------
@pytest.mark.slow
def test_profile_a_tiny_gpt2_config_then_verify_it_with_hf(workdir: Path) -> None:
    folder = _write(workdir / "gpt2-tiny" / "config.json", TINY_GPT2).parent
    shape = ["--batch-size", "2", "--seq-len", "32"]
    source = hf_workload(folder, 2, 32)
    budget = _mid_budget(source)
    runner = CliRunner()
    result = runner.invoke(app, ["profile", "--hf", str(folder), *shape, "--budget", str(budget)])
    assert result.exit_code == 0, result.output
    plan = load_plan(workdir / "profiles" / "gpt2-tiny" / "plan.json")
    assert plan.modules and plan.checked
    assert plan.measured_peak_bytes is not None
    assert plan.measured_peak_bytes <= plan.budget_bytes == budget < plan.baseline_peak_bytes
    assert plan.model_file == str(source) and plan.model_name == "gpt2-tiny"
    assert set(plan.batch) == {"input_ids", "attention_mask", "labels"}
    assert plan.batch["input_ids"] == {"shape": [2, 32], "dtype": "int64"}
    assert any("GPT2LMHeadModel" in note.text for note in plan.assumptions)
    assert load_profile(workdir / "profiles" / "gpt2-tiny" / "profile.json").model_file == str(
        source
    )
    # verify takes the config again; the batch shape and dtype default to the plan's.
    plan_path = str(workdir / "profiles" / "gpt2-tiny" / "plan.json")
    verified = runner.invoke(app, ["verify", "--hf", str(folder), plan_path])
    assert verified.exit_code == 0, verified.output
    assert "verified: the plan fits its budget" in verified.stdout
    assert "warning" not in verified.stderr


@pytest.mark.slow
def test_a_tiny_llama_config_too_small_a_budget_then_solve_and_verify(workdir: Path) -> None:
    """An infeasible budget keeps the profile and prints a `solve` command naming the same
    workload; that command times it, plans and checks; `verify PLAN` rebuilds it from the
    plan alone."""
    config = _write(workdir / "tiny-llama.json", TINY_LLAMA)
    shape = ["--batch-size", "2", "--seq-len", "32"]
    runner = CliRunner()
    result = runner.invoke(app, ["profile", "--hf", str(config), *shape, "--budget", "300000"])
    assert result.exit_code == 3, result.output
    hint = next(line for line in result.stdout.splitlines() if "ckpt-plan solve" in line)
    command = shlex.split(hint.split("ckpt-plan ", 1)[1])
    assert command[command.index("--hf") :] == [
        "--hf",
        str(config.resolve()),
        *shape,
        "--dtype",
        "bfloat16",
    ]
    budget = _mid_budget(hf_workload(config, 2, 32))
    command[command.index("--budget") + 1] = str(budget)
    solved = runner.invoke(app, command)
    assert solved.exit_code == 0, solved.output
    plan_path = workdir / "profiles" / "tiny-llama" / "plan.json"
    plan = load_plan(plan_path)
    assert plan.modules and plan.checked
    assert plan.measured_peak_bytes is not None and plan.measured_peak_bytes <= budget
    assert plan.fingerprint["parameters"]
    verified = runner.invoke(app, ["verify", str(plan_path)])
    assert verified.exit_code == 0, verified.output
    assert "verified" in verified.stdout


# -- bad inputs -------------------------------------------------------------------------------
PROFILE = ["profile", "--budget", "1GB"]
SHAPE = ["--batch-size", "1", "--seq-len", "8"]


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        (
            ["--hf", "missing.json", *SHAPE],
            ["missing.json does not exist", "nothing is downloaded"],
        ),
        (["--hf", "empty-folder", *SHAPE], ["holds no config.json"]),
        (["--hf", "no-type.json", *SHAPE], ['no "model_type"', '"model_type": "llama"']),
        (["--hf", "unknown.json", *SHAPE], ["does not know model_type 'not-a-model'"]),
        (["--hf", "not-json.json", *SHAPE], ["not a readable JSON config"]),
        (["--hf", "vit.json", *SHAPE], ["no causal language model", "write a model file"]),
        (
            ["--hf", "vit-classifier.json", *SHAPE],
            ["ViTForImageClassification takes images (3 x 224 x 224", "leave out --seq-len"],
        ),
        (
            ["--hf", "depth.json", *SHAPE],
            ["DPTForDepthEstimation takes pixel_values", "write a model file"],
        ),
        (  # before: "takes pixel_values, and --hf builds batches of token ids, images ..."
            ["--hf", "detr.json", "--batch-size", "1"],
            ["DetrForObjectDetection is an object detector", "write a model file"],
        ),
        (
            ["--hf", "gpt2.json", "--batch-size", "1"],
            ["GPT2LMHeadModel takes token ids; pass --seq-len"],
        ),
        (
            ["--hf", "gpt2.json", *SHAPE, "--choices", "3"],
            ["--choices 3: GPT2LMHeadModel is no multiple-choice head; leave out --choices"],
        ),
        (
            ["--hf", "wav2vec2.json", "--batch-size", "1"],
            ["Wav2Vec2ForCTC takes audio; pass --seq-len, the audio samples per clip"],
        ),
        (  # a spectrogram of one fixed length, laid out as its feature extractor gives it
            ["--hf", "ast.json", *SHAPE],
            ["ASTForAudioClassification takes input_values, a spectrogram of one length"],
        ),
        (["--hf", "gpt2.json", "--batch-size", "1", "--seq-len", "65"], ["--seq-len 64 or less"]),
        (  # a diffusers model's config (unet/config.json of a pipeline's folder)
            ["--hf", "diffusers-unet", *SHAPE],
            ["a diffusers config (UNet2DConditionModel)", "write a model file"],
        ),
        (  # MusicGen's: a text encoder and a decoder, neither named the text model
            ["--hf", "musicgen.json", *SHAPE],
            [
                "cannot tell which part of this config is the text model",
                "'text_encoder', 'decoder'",
            ],
        ),
    ],
)
def test_a_config_that_cannot_be_used_exits_4_and_writes_nothing(
    workdir: Path, arguments: list[str], fragments: list[str]
) -> None:
    (workdir / "empty-folder").mkdir()
    _write(workdir / "no-type.json", {k: v for k, v in TINY_LLAMA.items() if k != "model_type"})
    _write(workdir / "unknown.json", {**TINY_LLAMA, "model_type": "not-a-model"})
    (workdir / "not-json.json").write_text("{", encoding="utf-8")
    _write(workdir / "vit.json", {"model_type": "vit", "hidden_size": 32, "num_attention_heads": 2})
    _write(workdir / "gpt2.json", TINY_GPT2)
    vit = {"model_type": "vit", "hidden_size": 32, "num_attention_heads": 2}
    _write(workdir / "vit-classifier.json", {**vit, "architectures": ["ViTForImageClassification"]})
    _write(
        workdir / "depth.json", {"model_type": "dpt", "architectures": ["DPTForDepthEstimation"]}
    )
    _write(
        workdir / "detr.json", {"model_type": "detr", "architectures": ["DetrForObjectDetection"]}
    )
    speech = {"model_type": "wav2vec2", "vocab_size": 32, "architectures": ["Wav2Vec2ForCTC"]}
    _write(workdir / "wav2vec2.json", speech)
    ast = {"model_type": "audio-spectrogram-transformer"}
    _write(workdir / "ast.json", {**ast, "architectures": ["ASTForAudioClassification"]})
    _write(workdir / "musicgen.json", {"model_type": "musicgen"})
    (workdir / "diffusers-unet").mkdir()
    unet = {"_class_name": "UNet2DConditionModel", "_diffusers_version": "0.42.1"}
    _write(workdir / "diffusers-unet" / "config.json", {**unet, "sample_size": 64})
    before = _files(workdir)
    result = CliRunner().invoke(app, [*PROFILE, *arguments])
    assert result.exit_code == 4, result.output
    _error_line(result, *fragments)
    assert _files(workdir) == before


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (["model.py", "--hf", "tiny.json", *SHAPE], "either MODEL.py or --hf CONFIG, not both"),
        ([], "pass a model file (MODEL.py) or --hf CONFIG"),
        (["--hf", "tiny.json", "--seq-len", "8"], "--hf needs --batch-size"),
        (["model.py", *SHAPE], "go with --hf CONFIG"),
        (["model.py", "--choices", "3"], "--autocast and --choices go with --hf CONFIG"),
    ],
)
def test_model_file_and_hf_are_exclusive_and_one_is_required(
    workdir: Path, arguments: list[str], fragment: str
) -> None:
    (workdir / "model.py").write_text("def build_model(): ...\n", encoding="utf-8")
    _write(workdir / "tiny.json", TINY_LLAMA)
    before = _files(workdir)
    result = CliRunner().invoke(app, [*PROFILE, *arguments])
    assert result.exit_code == 2, result.output
    _error_line(result, fragment)
    assert _files(workdir) == before


@pytest.mark.parametrize("arguments", [[], ["model.py"]])
def test_verify_without_a_plan_is_a_usage_error(workdir: Path, arguments: list[str]) -> None:
    result = CliRunner().invoke(app, ["verify", *arguments])
    assert result.exit_code == 2, result.output
    _error_line(result, "pass the plan: ckpt-plan verify [MODEL.py] PLAN")


def test_a_plan_from_before_the_model_file_was_recorded_asks_for_it(workdir: Path) -> None:
    old = Plan(
        budget_bytes=10**6,
        predicted_peak_bytes=10**6,
        baseline_peak_bytes=10**6,
        predicted_overhead=0.0,
        recompute_ms=0.0,
        step_ms=1.0,
        static_bytes=0,
        modules=(),
        fingerprint={},
        batch={},
        device="cpu",
        torch_version="2.13",
        model_name="old",
    )
    data = plan_to_dict(old)
    del data["model_file"]  # as plans were written before the field
    (workdir / "plan.json").write_text(json.dumps(data), encoding="utf-8")
    result = CliRunner().invoke(app, ["verify", "plan.json"])
    assert result.exit_code == 4, result.output
    _error_line(result, "does not record its model file", "ckpt-plan verify MODEL.py PLAN")


def test_a_bad_source_string_is_a_model_file_error() -> None:
    with pytest.raises(ModelFileError, match="not a Hugging Face workload source"):
        load_model_file("hf:/some/config.json?batch_size=two")


def test_a_config_saved_with_special_floats_builds(tmp_path: Path) -> None:
    """transformers 5 writes an infinite float as {"__float__": "Infinity"} (Bamba's,
    Falcon-H1's, Granite 4's time_step_limit): read back as transformers reads it. Before,
    such a config, saved as the docs say (save_pretrained), was rejected by its own class."""
    from benchmarks.hf_sweep_models import write_hf_config

    source = WorkloadSource.parse(write_hf_config("causal-lm", "bamba", tmp_path))
    written = json.loads(source.path.read_text(encoding="utf-8"))
    assert written["time_step_limit"] == [0.0, {"__float__": "Infinity"}]
    built = build_workload(load_model_file(source), seed=0)
    assert tuple(built.model.config.time_step_limit) == (0.0, float("inf"))
    assert run_training_step(built, seed=0).isfinite()


@pytest.mark.parametrize(
    ("model_type", "model_class"),
    [("qwen3_5", "Qwen3_5ForCausalLM"), ("llama4", "Llama4ForCausalLM")],
)
def test_a_vision_language_config_naming_its_causal_lm_builds_it_on_its_text_config(
    tmp_path: Path, model_type: str, model_class: str
) -> None:
    """Qwen3.5's and Llama 4's configs hold a text_config and a vision_config; one naming
    the causal LM (as a Qwen3.5 checkpoint loaded by AutoModelForCausalLM and saved again
    does) builds it on the text part, as AutoModelForCausalLM does: before, the causal LM
    was given the whole config, and building it failed ('Qwen3_5Config' object has no
    attribute 'vocab_size'). The fake step records the real step's peak."""
    from benchmarks.hf_sweep_models import write_hf_config

    written = WorkloadSource.parse(write_hf_config("causal-lm", model_type, tmp_path))
    data = json.loads(written.path.read_text())
    assert data["architectures"] == [model_class] and "text_config" in data
    model_file = load_model_file(str(written))
    model = model_file.build_model()
    assert type(model).__name__ == model_class
    assert model.config.model_type == f"{model_type}_text" and not model.config.use_cache
    real = record_memory(build_workload(model_file, seed=0))
    workload, session = build_fake_workload(model_file)
    fake = record_memory(workload, session=session)
    session.release()
    assert fake.measured_peak_bytes == real.measured_peak_bytes
