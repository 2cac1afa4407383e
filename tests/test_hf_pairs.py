"""`--hf` on a dual encoder: CLIP, SigLIP and their kin train on image-caption pairs with
their own contrastive loss (planner/measure/hf_pairs.py).

Before, `--hf` took CLIP's config for a vision-language model's and stopped: "the config
names no image_token_id, the token an image's features replace". The configs are the types'
defaults as `transformers` ships them, sizes made small by the sweep
(benchmarks/hf_sweep_models.py, task "contrastive": 4 x 4 patches an image).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("transformers")

from benchmarks.hf_sweep_models import write_hf_config
from planner.cli.main import app
from planner.core.errors import ModelFileError
from planner.measure.fake import build_fake_workload
from planner.measure.hf import InputKind, input_kind
from planner.measure.profiler import record_memory
from planner.measure.source import WorkloadSource
from planner.measure.workload import build_workload, load_model_file, run_training_step
from tests.models import profile_halfway

pytestmark = pytest.mark.hf

TASK = "contrastive"


def _source(folder: Path, model_type: str, batch_size: int = 2, seq_len: int = 16) -> str:
    written = WorkloadSource.parse(write_hf_config(TASK, model_type, folder))
    return str(WorkloadSource.hugging_face(written.path, batch_size, seq_len, "float32"))


def _small_config(folder: Path, config: object, name: str) -> Path:
    path = folder / name / "config.json"
    path.parent.mkdir(parents=True)
    config.to_json_file(str(path), use_diff=False)  # type: ignore[attr-defined]
    return path


@pytest.mark.parametrize(
    ("model_type", "pixels", "extra"),
    [
        ("clip", (2, 3, 128, 128), set()),  # 4 x 4 patches of 32
        ("siglip", (2, 3, 64, 64), set()),
        # NaFlex: 4 x 4 patches of 3 x 16 x 16, flattened, with their grid and mask
        ("siglip2", (2, 16, 3 * 16 * 16), {"pixel_attention_mask", "spatial_shapes"}),
        ("align", (2, 3, 32, 32), set()),  # EfficientNet: no patches
    ],
)
def test_a_dual_encoder_trains_on_images_and_their_captions(
    tmp_path: Path, model_type: str, pixels: tuple[int, ...], extra: set[str]
) -> None:
    """The batch a contrastive collator gives, and the model's own loss over it."""
    source = _source(tmp_path, model_type)
    assert input_kind(WorkloadSource.parse(source)) is InputKind.IMAGE_CAPTIONS
    model_file = load_model_file(source)
    workload = build_workload(model_file, seed=0)
    batch = workload.batch
    expected = {"input_ids", "attention_mask", "pixel_values", "return_loss"} | extra
    assert set(batch) == expected
    assert batch["return_loss"] is True and "labels" not in batch
    assert tuple(batch["pixel_values"].shape) == pixels
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, 16)
    config = json.loads(Path(WorkloadSource.parse(source).path).read_text())
    eos = config["text_config"].get("eos_token_id")
    if isinstance(eos, int) and eos < 1000:  # one eos a caption, last, where the ids hold it
        assert (batch["input_ids"][:, -1] == eos).all()
        assert ((batch["input_ids"] == eos).sum(dim=1) == 1).all()
    if model_type == "siglip2":  # a square grid of 4 x 4 patches, none padding
        assert batch["spatial_shapes"].tolist() == [[4, 4], [4, 4]]
        assert batch["pixel_attention_mask"].all()
    assert "and their captions of 16 token ids" in model_file.assumptions[0]
    assert "return_loss=True" in model_file.assumptions[0]
    loss = run_training_step(workload)
    assert loss.dim() == 0 and torch.isfinite(loss)
    trained = [p for p in workload.model.parameters() if p.grad is not None]
    text = [n for n, p in workload.model.named_parameters() if "text" in n and p.grad is not None]
    assert trained and text  # both towers learn


def test_a_video_dual_encoder_takes_its_frames(tmp_path: Path) -> None:
    """X-CLIP embeds a video of its vision tower's num_frames against a caption."""
    import transformers

    small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1}
    config = transformers.XCLIPConfig(
        text_config={**small, "num_attention_heads": 4, "vocab_size": 100},
        vision_config={
            **small,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 16,
            "num_frames": 3,
            "mit_hidden_size": 64,
            "mit_intermediate_size": 128,
            "mit_num_hidden_layers": 1,
        },
        projection_dim=64,
        prompt_layers=1,
        architectures=["XCLIPModel"],
    )
    path = _small_config(tmp_path, config, "xclip")
    workload = build_workload(
        load_model_file(str(WorkloadSource.hugging_face(path, 2, 8, "float32"))), seed=0
    )
    assert tuple(workload.batch["pixel_values"].shape) == (2, 3, 3, 32, 32)
    assert torch.isfinite(run_training_step(workload))


def test_a_dual_encoder_of_another_medium_is_one_line_naming_the_way_on(
    tmp_path: Path,
) -> None:
    """CLAP pairs audio with text: --hf builds no audio for it, and says so."""
    import transformers

    path = _small_config(tmp_path, transformers.ClapConfig(architectures=["ClapModel"]), "clap")
    with pytest.raises(ModelFileError) as caught:
        load_model_file(str(WorkloadSource.hugging_face(path, 2, 8, "float32")))
    message = str(caught.value)
    assert "ClapModel is a dual encoder of text and input_features" in message
    assert "write a model file" in message and "\n" not in message


def test_choices_on_a_dual_encoder_is_an_error(tmp_path: Path) -> None:
    written = WorkloadSource.parse(_source(tmp_path, "clip"))
    source = WorkloadSource.hugging_face(written.path, 2, 16, "float32", choices=4)
    with pytest.raises(ModelFileError, match="CLIPModel is no multiple-choice head"):
        load_model_file(str(source))


def test_a_caption_longer_than_the_text_towers_positions_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="the 77 positions the text tower of"):
        load_model_file(_source(tmp_path, "clip", seq_len=78))


def test_fit_says_a_dual_encoder_needs_its_captions_length(tmp_path: Path) -> None:
    path = WorkloadSource.parse(_source(tmp_path, "clip")).path
    result = CliRunner().invoke(app, ["fit", "--hf", str(path), "--budget", "1GB"])
    assert result.exit_code == 2
    assert "the model takes images and their captions" in result.output
    assert "give --seq-len, the tokens of each caption" in result.output


@pytest.mark.slow
def test_profile_a_clip_config_its_plan_exact_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLIP through `ckpt-plan profile --hf`: the fake step is the real one, storage for
    storage, and a plan halfway down is checked in its own process and predicted to the
    byte. (Every type's plan: `benchmarks/hf_sweep.py --task contrastive`.)"""
    monkeypatch.chdir(tmp_path)
    source = WorkloadSource.parse(_source(tmp_path, "clip", batch_size=8))
    workload, session = build_fake_workload(load_model_file(source))
    profile = record_memory(workload, session=session)
    real = record_memory(build_workload(load_model_file(source), seed=0))
    assert real.measured_peak_bytes == profile.measured_peak_bytes
    # both towers' layers are candidates: the image's and the caption's
    assert any("vision_model" in name for name in profile.block_names)
    assert any("text_model" in name for name in profile.block_names)
    plan = profile_halfway(source, profile, tmp_path)
    assert "pixel_values" in plan.batch
