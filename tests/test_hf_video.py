"""`--hf` on a video classifier (VideoMAE, TimeSformer, ViViT, V-JEPA 2) and on a masked
autoencoder pretraining on images (ViT-MAE). Before, both were refused: "takes
pixel_values, and --hf builds batches of token ids, images for an image classifier ...".
The configs are the types' defaults, sizes made small by the sweep
(benchmarks/hf_sweep_models.py, task "video-classification": 8 frames of 64 x 64).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.hf_sweep_models import make_config, write_hf_config
from planner.core.errors import ModelFileError
from planner.measure.fake import build_fake_workload
from planner.measure.profiler import record_memory
from planner.measure.source import WorkloadSource
from planner.measure.workload import build_workload, load_model_file, run_training_step
from tests.models import profile_halfway

pytestmark = pytest.mark.hf


def _video_source(folder: Path, model_type: str) -> str:
    written = WorkloadSource.parse(write_hf_config("video-classification", model_type, folder))
    return str(WorkloadSource.hugging_face(written.path, 2, None, "float32"))


@pytest.mark.parametrize(
    ("model_type", "main_input"),
    [
        ("videomae", "pixel_values"),
        ("vivit", "pixel_values"),
        ("vjepa2", "pixel_values_videos"),  # its name, and frames_per_clip for num_frames
    ],
)
def test_a_video_classifier_trains_on_videos_of_its_frames(
    tmp_path: Path, model_type: str, main_input: str
) -> None:
    model_file = load_model_file(_video_source(tmp_path, model_type))
    workload = build_workload(model_file, seed=0)
    assert set(workload.batch) == {main_input, "labels"}
    assert tuple(workload.batch[main_input].shape) == (2, 8, 3, 64, 64)  # (B, T, C, H, W)
    assert workload.batch["labels"].shape == (2,)
    assert (
        f"2 random videos of 8 frames of 3 x 64 x 64 ({main_input})" in (model_file.assumptions[0])
    )
    assert "a label per video" in model_file.assumptions[0]
    assert torch.isfinite(run_training_step(workload))


def test_a_config_transformers_rejects_is_one_line(tmp_path: Path) -> None:
    """transformers' validators answer on several lines: the error is one."""
    path = Path(WorkloadSource.parse(_video_source(tmp_path, "videomae")).path)
    config = json.loads(path.read_text())
    config["num_frames"] = None
    path.write_text(json.dumps(config))
    with pytest.raises(ModelFileError) as caught:
        load_model_file(str(WorkloadSource.hugging_face(path, 2, None, "float32")))
    message = str(caught.value)
    assert "transformers rejects the config" in message and "num_frames" in message
    assert message.endswith("; fix that field") and "\n" not in message


def _pretraining_config(folder: Path, model_type: str, model_class: str) -> Path:
    config = make_config("image", model_type)
    config.architectures = [model_class]
    config.image_size = 64  # 4 x 4 patches of 16
    if model_type in ("vit_mae", "videomae"):  # its decoder as small as its encoder
        config.decoder_num_hidden_layers, config.decoder_num_attention_heads = 2, 4
        config.decoder_hidden_size, config.decoder_intermediate_size = 64, 128
    path = folder / model_type / "config.json"
    path.parent.mkdir(parents=True)
    config.to_json_file(str(path), use_diff=False)
    return path


@pytest.mark.slow
def test_a_masked_autoencoder_plan_is_exact_and_replays_its_mask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ViT-MAE draws the patches it masks inside its forward (torch.rand): images alone, its
    own loss; a plan halfway down recomputes the draw with the RNG state replayed, checked
    bit-identical in its own process and predicted to the byte."""
    monkeypatch.chdir(tmp_path)
    path = _pretraining_config(tmp_path, "vit_mae", "ViTMAEForPreTraining")
    source = WorkloadSource.hugging_face(path, 16, None, "float32")
    model_file = load_model_file(str(source))
    assert set(model_file.sample_batch()) == {"pixel_values"}
    assert "its own loss, reconstructing the patches it masks" in model_file.assumptions[0]
    workload, session = build_fake_workload(model_file)
    profile = record_memory(workload, session=session)
    real = record_memory(build_workload(load_model_file(str(source)), seed=0))
    assert real.measured_peak_bytes == profile.measured_peak_bytes
    plan = profile_halfway(source, profile, tmp_path)
    assert any(module.preserve_rng_state for module in plan.modules)


@pytest.mark.parametrize(
    ("model_type", "model_class", "pixels", "masked"),
    [
        # 8 tubelets of 2 frames x 4 x 4 patches, 90% masked (VideoMAE's tube masking)
        ("videomae", "VideoMAEForPreTraining", (2, 16, 3, 64, 64), (128, 115)),
        # SimMIM: 4 x 4 patches of 16, 60% masked (run_mim.py's mask_ratio)
        ("vit", "ViTForMaskedImageModeling", (2, 3, 64, 64), (16, 9)),
    ],
)
def test_a_masked_image_model_trains_on_images_and_a_mask_of_their_patches(
    tmp_path: Path,
    model_type: str,
    model_class: str,
    pixels: tuple[int, ...],
    masked: tuple[int, int],
) -> None:
    """The mask is an input: as many patches masked in each image (VideoMAE keeps the
    visible ones as one tensor per batch), drawn uniformly; the loss is the model's."""
    path = _pretraining_config(tmp_path, model_type, model_class)
    model_file = load_model_file(str(WorkloadSource.hugging_face(path, 2, None, "float32")))
    workload = build_workload(model_file, seed=0)
    assert set(workload.batch) == {"pixel_values", "bool_masked_pos"}
    assert tuple(workload.batch["pixel_values"].shape) == pixels
    patches, hidden = masked
    assert workload.batch["bool_masked_pos"].shape == (2, patches)
    assert workload.batch["bool_masked_pos"].sum(dim=1).tolist() == [hidden, hidden]
    assert (
        f"bool_masked_pos masking {hidden} of their {patches} patches"
        in (model_file.assumptions[0])
    )
    assert torch.isfinite(run_training_step(workload))
