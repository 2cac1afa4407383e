"""`--hf` on a speech language model: its sequences hold a clip, whose tokens its audio
encoder's features replace (planner/measure/hf_audio.py).

Before, such a config (Voxtral, Qwen2-Audio, Granite Speech, ...) was refused: planned on
text alone, its audio encoder would be left out. The configs are the types' defaults as
`transformers` ships them, sizes made small by the sweep (benchmarks/hf_sweep_models.py).
"""

from __future__ import annotations

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

pytestmark = pytest.mark.hf

TASK = "audio-text-to-text"


def _source(folder: Path, model_type: str, seq_len: int | None = None) -> str:
    """The sweep's source: 2 sequences of the clip's tokens and 64 of text, or ``seq_len``."""
    written = WorkloadSource.parse(write_hf_config(TASK, model_type, folder))
    length = written.seq_len if seq_len is None else seq_len
    return str(WorkloadSource.hugging_face(written.path, 2, length, "float32"))


@pytest.mark.parametrize(
    ("model_type", "audio", "masks", "tokens"),
    [
        # Whisper's encoder: 128 mel bins x 3000 frames, its projector 4 frames a token
        ("glmasr", (2, 128, 3000), {"input_features_mask": 3000}, 375),
        # no get_audio_features: its audio tower's 750 positions, counted
        ("qwen2_audio", (2, 128, 3000), {"feature_attention_mask": 3000}, 750),
        ("voxtral", (2, 128, 3000), {}, 750),  # (the small config's projector: 2 a token)
        # a mask of the frames, and one of the raw samples its get_audio_features asks for
        (
            "moss_transcribe_diarize",
            (2, 80, 3000),
            {"input_features_mask": 3000, "padding_mask": 480000},
            375,
        ),
        # its conformer takes two mel frames stacked, 50 a second; no mask of frames
        ("granite_speech", (2, 1500, 160), {}, 300),
        # 30 s of raw 16 kHz audio, a channel; its convolutions' 1499 frames, as wav2vec 2.0's
        ("omniasr", (2, 1, 480000), {"padding_mask": 480000}, 1499),
    ],
)
def test_a_speech_language_batch_holds_a_clips_tokens(
    tmp_path: Path, model_type: str, audio: tuple[int, ...], masks: dict[str, int], tokens: int
) -> None:
    """Each sequence: a clip's tokens (as many as its encoder gives features: the model
    checks that on every step), then text naming none of the config's ids; labels -100 at
    the clip."""
    built = build_workload(load_model_file(_source(tmp_path, model_type)), seed=0)
    batch = built.batch
    main = "input_values" if model_type == "omniasr" else "input_features"
    assert set(batch) == {"input_ids", "attention_mask", main, "labels", *masks}
    assert tuple(batch[main].shape) == audio
    for mask, length in masks.items():  # every frame, or sample, real
        assert batch[mask].shape == (2, length) and bool(batch[mask].all())
    audio_token = built.model.config.audio_token_id
    counts = (batch["input_ids"] == audio_token).sum(dim=1)
    assert counts.tolist() == [tokens, tokens]
    masked = batch["labels"] == -100  # the clip's positions, first: a prefix of each row
    prefix = int(masked[0].sum())
    assert masked[:, :prefix].all() and not masked[:, prefix:].any()
    assert batch["input_ids"].shape[1] == prefix + 64
    assert (batch["labels"][:, prefix:] == batch["input_ids"][:, prefix:]).all()
    assert f"{tokens} audio tokens each, labels -100 there" in built.notes[0].text
    assert run_training_step(built, seed=0).isfinite()  # the model's own count check passes


@pytest.mark.parametrize("model_type", ["qwen2_audio", "omniasr"])
def test_the_fake_step_of_a_speech_language_model_is_the_real_one(
    tmp_path: Path, model_type: str
) -> None:
    """Qwen2-Audio masks its features by lengths computed from the mask's values; OmniASR's
    encoder draws for LayerDrop before looking at its probability (switched off): the fake
    step (which plans an 8B model on a laptop) records the real step's peak."""
    model_file = load_model_file(_source(tmp_path, model_type))
    real = record_memory(build_workload(model_file, seed=0))
    workload, session = build_fake_workload(model_file)
    assert record_memory(workload, session=session).measured_peak_bytes == real.measured_peak_bytes


def test_a_sequence_too_short_for_the_clip_says_the_least(tmp_path: Path) -> None:
    least = min_seq_len(WorkloadSource.parse(_source(tmp_path, "glmasr")))
    assert least == 375 + 1
    with pytest.raises(ModelFileError) as caught:
        load_model_file(_source(tmp_path, "glmasr", seq_len=300))
    assert f"pass --seq-len {least} or more" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_images_on_a_speech_language_model_is_an_error(tmp_path: Path) -> None:
    written = WorkloadSource.parse(_source(tmp_path, "glmasr"))
    source = WorkloadSource.hugging_face(written.path, 2, 440, "float32", 1)
    with pytest.raises(ModelFileError, match="takes no images besides its token ids"):
        load_model_file(str(source))


def test_audio_codes_are_refused_with_the_way_on(tmp_path: Path) -> None:
    """Kyutai's speech-to-text trains on codes of its own audio codec, which --hf does not
    build: one line asking for a model file, not a plan of its text alone."""
    written = WorkloadSource.parse(
        write_hf_config("speech-seq2seq", "kyutai_speech_to_text", tmp_path)
    )
    with pytest.raises(ModelFileError, match="trains on audio codes besides token ids"):
        load_model_file(str(WorkloadSource.hugging_face(written.path, 2, 64, "float32")))


def test_clips_zero_is_text_alone_and_two_is_two_clips(tmp_path: Path) -> None:
    written = WorkloadSource.parse(_source(tmp_path, "glmasr"))

    def source(seq_len: int, clips: int) -> WorkloadSource:
        return WorkloadSource.hugging_face(written.path, 2, seq_len, "float32", clips=clips)

    # Voxtral's class is in the speech-seq2seq mapping: text alone, its labels are its tokens
    voxtral = WorkloadSource.parse(_source(tmp_path, "voxtral")).path
    alone = WorkloadSource.hugging_face(voxtral, 2, 64, "float32", clips=0)
    text = build_workload(load_model_file(alone), seed=0)
    assert set(text.batch) == {"input_ids", "attention_mask", "labels"}
    assert torch.equal(text.batch["labels"], text.batch["input_ids"])
    assert "--clips 0: text alone" in text.notes[0].text
    assert run_training_step(text, seed=0).isfinite()
    assert min_seq_len(source(64, 2)) == 2 * 375 + 1
    built = build_workload(load_model_file(source(2 * 375 + 8, 2)), seed=0)
    assert built.batch["input_features"].shape[0] == 4  # two clips for each of 2 sequences
    assert (built.batch["input_ids"] == built.model.config.audio_token_id).sum() == 4 * 375
    assert "2 random 30 s clips a sequence" in built.notes[0].text
    assert run_training_step(built, seed=0).isfinite()


def test_clips_on_a_model_without_audio_is_an_error(tmp_path: Path) -> None:
    written = WorkloadSource.parse(write_hf_config("causal-lm", "llama", tmp_path))
    with pytest.raises(ModelFileError, match="takes no audio besides its token ids"):
        load_model_file(str(WorkloadSource.hugging_face(written.path, 2, 64, "float32", clips=1)))


def test_a_source_carries_its_clips() -> None:
    source = WorkloadSource.hugging_face("/c/config.json", 2, 64, "bfloat16", clips=0)
    assert str(source).endswith("&clips=0")
    assert WorkloadSource.parse(str(source)) == source
    assert source.command_arguments()[-2:] == ["--clips", "0"]
