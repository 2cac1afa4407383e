"""The Hugging Face sweep (benchmarks/hf_sweep.py): configs as users ship them with only the
sizes made small, one type run end to end, a type that hangs, and a stopped run resumed. The
whole sweep is ``python benchmarks/hf_sweep.py --task TASK``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import hf_sweep
from benchmarks.hf_sweep_models import make_config, model_types, sample_batch, write_hf_config

pytestmark = pytest.mark.hf


def test_the_zoos_types_are_left_out() -> None:
    causal = model_types("causal-lm")
    assert "llama" not in causal and "gpt2" not in causal
    assert "phi" in causal and len(causal) > 100
    assert "bert" not in model_types("masked-lm") and "albert" in model_types("masked-lm")
    # the zoo has no fine-tuning heads: those tasks keep its types
    assert "bert" in model_types("sequence-classification")


def test_a_head_task_is_planned_through_hf_on_the_config(tmp_path: Path) -> None:
    from planner.measure.workload import load_model_file

    source = write_hf_config("token-classification", "bert", tmp_path)
    assert source.startswith("hf:") and source.endswith("batch_size=4&seq_len=64&dtype=float32")
    model_file = load_model_file(source)
    assert type(model_file.build_model()).__name__ == "BertForTokenClassification"
    batch = model_file.sample_batch()
    assert batch["labels"].shape == batch["input_ids"].shape == (4, 64)


def test_a_config_keeps_its_defaults_and_gets_small_sizes() -> None:
    from transformers import AutoConfig

    default = AutoConfig.for_model("phi")
    config = make_config("causal-lm", "phi")
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (2, 64, 1000)
    # What users ship stays: the cache, the attention, the rotary fraction.
    assert config.use_cache == default.use_cache is True
    assert config.rope_parameters == default.rope_parameters
    assert config._attn_implementation == default._attn_implementation


def test_two_layers_keep_every_kind_of_layer_the_model_mixes() -> None:
    from transformers import AutoConfig

    default = AutoConfig.for_model("qwen3_next")
    assert len(set(default.layer_types)) == 2 and default.layer_types[0] == "linear_attention"
    config = make_config("causal-lm", "qwen3_next")
    assert config.layer_types == ["linear_attention", "full_attention"]


def test_the_layers_kept_do_not_depend_on_the_processs_hash_seed() -> None:
    """The profile and its check build the model in separate processes: HY-V4's three
    per-layer lists once chose its 2 layers in set order, so the two could differ."""
    script = (
        "from benchmarks.hf_sweep_models import make_config; "
        "print(make_config('causal-lm', 'hy_v4').to_json_string())"
    )
    root = Path(__file__).resolve().parent.parent
    configs = {
        subprocess.run(
            [sys.executable, "-c", script],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(configs) == 1


def test_token_ids_move_into_the_small_vocabulary() -> None:
    from transformers import AutoConfig

    assert AutoConfig.for_model("phi3").pad_token_id >= 1000  # 32000 by default
    config = make_config("causal-lm", "phi3")
    ids = [config.pad_token_id, config.bos_token_id, config.eos_token_id]
    assert all(token is None or token < 1000 for token in ids)


def test_a_vision_model_keeps_its_stages_with_fewer_layers(tmp_path: Path) -> None:
    config = make_config("image", "resnet")
    assert list(config.depths) == [2, 2, 2, 2]  # from [3, 4, 6, 3]
    assert list(config.hidden_sizes) == [256, 512, 1024, 2048]
    assert config.num_labels == 10
    from planner.measure.workload import load_model_file

    # Planned through --hf: images as large as the config asks (MobileViTv2: 64), the zoo's
    # 32 where it names no size (ResNet); ImageGPT's pixels are token ids, a sequence.
    shapes = {}
    for model_type in ("mobilevitv2", "resnet", "imagegpt"):
        source = write_hf_config("image", model_type, tmp_path)
        batch = load_model_file(source).sample_batch()
        shapes[model_type] = {name: tuple(value.shape) for name, value in batch.items()}
    assert shapes["mobilevitv2"] == {"pixel_values": (4, 3, 64, 64), "labels": (4,)}
    assert shapes["resnet"] == {"pixel_values": (4, 3, 32, 32), "labels": (4,)}
    assert shapes["imagegpt"]["input_ids"] == (4, 64) and shapes["imagegpt"]["labels"] == (4,)


def test_a_speech_recognizer_gets_audio_or_features_as_its_class_takes_them(
    tmp_path: Path,
) -> None:
    from planner.measure.workload import load_model_file

    source = write_hf_config("ctc", "wav2vec2", tmp_path)  # raw audio: input_values
    assert "seq_len=16000&" in source
    audio = load_model_file(source).sample_batch()
    assert tuple(audio["input_values"].shape) == (4, 16_000)
    assert audio["labels"].shape == (4, 8) and int(audio["labels"].min()) >= 1  # 0: blank
    source = write_hf_config("ctc", "parakeet_ctc", tmp_path)  # its encoder's mel bins
    features = load_model_file(source).sample_batch()
    assert tuple(features["input_features"].shape) == (4, 64, 80)
    assert tuple(features["attention_mask"].shape) == (4, 64)
    assert int(features["labels"].max()) < 1024  # its blank is its last id, 1024
    assert make_config("ctc", "wav2vec2-bert").vocab_size == 1000  # its default has none
    with pytest.raises(ValueError, match="through --hf"):
        sample_batch("ctc", "wav2vec2")


@pytest.mark.slow
def test_a_type_is_planned_and_checked(tmp_path: Path) -> None:
    row = hf_sweep.sweep_one("masked-lm", "albert", tmp_path)
    assert row["outcome"] == "ok", row
    assert row["memory_source"] == "fake" and row["bit_identical"] is True
    assert abs(float(row["error_pct"])) <= 0.1  # type: ignore[arg-type]
    assert row["plan_mib"] <= row["budget_mib"] < row["unplanned_mib"]  # type: ignore[operator]


@pytest.mark.slow
def test_a_lora_autocast_sweep_takes_every_type_through_hf_with_adapters(tmp_path: Path) -> None:
    """``--lora R --autocast D``: the zoo's types too (the zoo plans neither), each through
    ``--hf --lora R --autocast D`` (LoRA under Trainer(bf16=True), as it is mostly run): its
    row is the peft model's under autocast, planned and checked as any."""
    assert "llama" in model_types("causal-lm", via_hf=True)
    row = hf_sweep.sweep_one("causal-lm", "llama", tmp_path, lora="4", autocast="bfloat16")
    assert row["outcome"] == "ok", row
    assert row["bit_identical"] is True and float(row["error_pct"]) == 0.0  # type: ignore[arg-type]
    assert row["plan_mib"] <= row["budget_mib"] < row["unplanned_mib"]  # type: ignore[operator]
    report = hf_sweep.report("causal-lm", pd.DataFrame([row]), "4", "bfloat16")
    assert "LoRA rank 4, autocast bfloat16" in report
    assert "--lora 4 --autocast bfloat16" in report


def test_a_stopped_run_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = []

    def run_isolated(
        task: str,
        model_type: str,
        timeout_s: float,
        lora: str | None = None,
        autocast: str | None = None,
    ) -> dict[str, object]:
        ran.append(model_type)
        return {"task": task, "model_type": model_type, "outcome": "ok", "seconds": 2.0}

    monkeypatch.setattr(hf_sweep, "run_isolated", run_isolated)
    # A stopped run left one row: resumed, it is kept, and only the other type runs.
    kept = {"task": "masked-lm", "model_type": "camembert", "outcome": "skip", "seconds": 1.0}
    partial = tmp_path / "hf_sweep_masked-lm.partial.jsonl"
    partial.write_text(json.dumps(kept) + "\n")
    arguments = ["--task", "masked-lm", "--only", "albert,camembert", "--resume"]
    assert hf_sweep.main([*arguments, "--out", str(tmp_path)]) == 0
    assert ran == ["albert"]
    frame = pd.read_csv(tmp_path / "hf_sweep_masked-lm.csv")
    assert list(frame["model_type"]) == ["albert", "camembert"]
    assert list(frame["outcome"]) == ["ok", "skip"]
    assert not partial.exists()
    assert "**1 ok**, **1 skip** of 2 types" in (tmp_path / "hf_sweep_masked-lm.md").read_text()
    # Not resumed, the rows of a stopped run are dropped: every type runs again.
    partial.write_text(json.dumps(kept) + "\n")
    assert hf_sweep.main([*arguments[:-1], "--out", str(tmp_path)]) == 0
    assert ran == ["albert", "albert", "camembert"]


def test_a_plan_is_ok_refused_or_failed() -> None:
    planned = {"plan_mib": 5.0, "bit_identical": True, "error_pct": 0.0}
    assert hf_sweep.verdict(planned) == ("ok", "")
    assert hf_sweep.verdict({**planned, "error_pct": 0.5}) == (
        "failed",
        "predicted +0.5% from measured",
    )
    assert hf_sweep.verdict({**planned, "bit_identical": False}) == (
        "failed",
        "the plan changed the training step",
    )
    refusal = "m: the model's modules changed during its training step (a added): build it..."
    assert hf_sweep.verdict({"error": refusal}) == ("refused", refusal)
    no_block = "no checkpointing plan fits 5 MiB: ...; 2 of 2 blocks cannot be checkpointed (a, b)"
    assert hf_sweep.verdict({"error": no_block}) == ("refused", no_block)
    one_block = no_block.replace("2 of 2", "1 of 2")  # the sweep's budget should fit then
    assert hf_sweep.verdict({"error": one_block}) == ("failed", one_block)
    assert hf_sweep.verdict({"error": "raw KeyError: 'x'"}) == ("failed", "raw KeyError: 'x'")
    # Fake tensors could not run it, and the CLI refuses the real step over the budget:
    # refused where the plan --memory real gives is ok, failed where it is not.
    real = {**planned, "profile_error": "a real unplanned step instead needs more"}
    assert hf_sweep.verdict(real) == (
        "refused",
        "a real unplanned step instead needs more (with --memory real: ok)",
    )
    assert hf_sweep.verdict({**real, "bit_identical": False})[0] == "failed"


def test_a_type_that_hangs_is_killed_and_reported() -> None:
    row = hf_sweep.run_isolated("masked-lm", "albert", timeout_s=0.5)
    assert row["outcome"] == "timeout" and row["detail"] == "over 0.5 s"


def test_a_skip_is_a_default_that_fails_without_the_tool(tmp_path: Path) -> None:
    # XMOD needs a language chosen before its forward: its default step fails on its own.
    row = hf_sweep.sweep_one("masked-lm", "xmod", tmp_path)
    assert row["outcome"] == "skip"
    assert "set_default_language" in str(row["detail"])
