"""`--hf CONFIG --lora R`: plan the model peft fine-tunes (planner/measure/hf_lora.py).

A LoRA step is another step than full training (frozen base weights: no gradients, no
optimizer state, a frozen linear layer keeps no input for its weight's gradient), so a plan
for it must be made on it. The configs are the types' defaults as `transformers` ships them,
sizes made small by the sweep (benchmarks/hf_sweep_models.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

import peft
from typer.testing import CliRunner

from benchmarks.hf_sweep_models import write_hf_config
from planner import apply_plan
from planner.check.compare import check_plan
from planner.cli.main import app
from planner.core.errors import ModelFileError, PlanMismatchError
from planner.core.records import Unit
from planner.measure.fake import build_fake_workload
from planner.measure.hf import hf_workload
from planner.measure.profiler import record_memory
from planner.measure.source import WorkloadSource
from planner.measure.workload import build_workload, load_model_file, run_training_step
from planner.pipeline import profile_model_file
from planner.solve.planning import baseline_every_block, build_plan, plan_for_budget
from tests.models import profile_halfway
from tests.test_hf_config import _error_line

pytestmark = pytest.mark.hf


def _source(folder: Path, lora: str, model_type: str = "llama", task: str = "causal-lm") -> str:
    written = WorkloadSource.parse(write_hf_config(task, model_type, folder))
    return str(hf_workload(written.path, 2, written.seq_len, "float32", lora=lora))


def _trained(model: torch.nn.Module) -> set[str]:
    return {name for name, parameter in model.named_parameters() if parameter.requires_grad}


def test_a_rank_trains_adapters_on_every_linear_layer_and_nothing_else(tmp_path: Path) -> None:
    built = build_workload(load_model_file(_source(tmp_path, "4")), seed=0)
    model = built.model
    assert type(model).__name__ == "PeftModelForCausalLM"  # task type CAUSAL_LM, as users set
    trained = _trained(model)
    assert trained and all(".lora_A." in name or ".lora_B." in name for name in trained)
    adapted = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in trained}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert not any("lm_head" in name for name in trained)  # all-linear leaves the head
    said = built.notes[-1].text
    assert "rank 4 on every linear layer but the output head" in said
    assert "base weights frozen" in said
    loss = run_training_step(built, seed=0)
    assert loss.isfinite()
    frozen = [p for n, p in model.named_parameters() if n not in trained]
    assert all(parameter.grad is None for parameter in frozen)  # no gradients, no state


def test_the_fake_step_of_a_lora_model_is_the_real_one(tmp_path: Path) -> None:
    """The fake step (which plans an 8B model on a laptop) records the real step's peak,
    and the LoRA step is not full training's."""
    lora = load_model_file(_source(tmp_path, "4"))
    real = record_memory(build_workload(lora, seed=0))
    workload, session = build_fake_workload(lora)
    assert record_memory(workload, session=session).measured_peak_bytes == real.measured_peak_bytes
    full = load_model_file(dataclasses.replace(lora.source, lora=None))
    full_peak = record_memory(build_workload(full, seed=0)).measured_peak_bytes
    assert full_peak > real.measured_peak_bytes


@pytest.mark.slow
def test_a_lora_plan_is_predicted_to_the_byte_and_trains_identically(tmp_path: Path) -> None:
    source = _source(tmp_path, "4")
    profile = profile_model_file(load_model_file(source))
    low = baseline_every_block(profile).predicted_peak_bytes
    assert low < profile.measured_peak_bytes
    plan, _ = plan_for_budget(profile, low)  # every block's peak; the CLI test: the mid one
    assert plan.modules
    assert all(module.module_name.startswith("base_model.model.") for module in plan.modules)
    check = check_plan(source, plan)
    assert check.passed, check.differences  # bit-identical loss, gradients, buffers
    assert check.measured_peak_bytes == plan.predicted_peak_bytes <= low


def test_the_plan_applies_to_the_users_own_peft_model(tmp_path: Path) -> None:
    """In train.py: get_peft_model with the same config, then apply_plan; the plan's
    fingerprint holds the adapters, so the base model alone (or other adapters) is refused."""
    source = _source(tmp_path, "4")
    workload, session = build_fake_workload(load_model_file(source))
    profile = record_memory(workload, session=session)  # the modules, no times
    units = [Unit(block) for block in profile.block_names]
    plan = build_plan(profile, units, profile.measured_peak_bytes, strategy="test")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(WorkloadSource.parse(source).path.parent)
    config.use_cache = False

    def users_model(rank: int) -> torch.nn.Module:
        torch.manual_seed(0)
        base = transformers.LlamaForCausalLM(config)
        lora = peft.LoraConfig(r=rank, target_modules="all-linear", task_type="CAUSAL_LM")
        return peft.get_peft_model(base, lora)

    model = users_model(4)
    apply_plan(model, plan)
    assert any("base_model.model.model.layers" in module.module_name for module in plan.modules)
    with pytest.raises(
        PlanMismatchError, match=r"this peft model's adapters .* are not the plan's"
    ):
        apply_plan(users_model(8), plan)
    with pytest.raises(PlanMismatchError, match="the plan is for LoRA fine-tuning"):
        apply_plan(transformers.LlamaForCausalLM(config), plan)


def test_peft_s_own_config_file_is_planned_as_written(tmp_path: Path) -> None:
    """An adapter's config from the Hub says inference_mode true and may initialize from
    the weights (PiSSA): the adapters train, and are made as peft's default (same shapes)."""
    folder = tmp_path / "adapter"
    written = peft.LoraConfig(
        r=2, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
    )
    written.save_pretrained(str(folder))
    data = json.loads((folder / "adapter_config.json").read_text())
    data.update(inference_mode=True, init_lora_weights="pissa", base_model_name_or_path="x/y")
    (folder / "adapter_config.json").write_text(json.dumps(data))
    source = WorkloadSource.parse(_source(tmp_path, str(folder)))
    assert source.lora == str((folder / "adapter_config.json").resolve())  # the folder's file
    built = build_workload(load_model_file(str(source)), seed=0)
    trained = _trained(built.model)
    assert {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in trained} == {"q_proj", "v_proj"}
    said = built.notes[-1].text
    assert "rank 2 on q_proj, v_proj, dropout 0.1" in said
    assert "initialized as peft's default (its 'pissa': same shapes)" in said
    assert run_training_step(built, seed=0).isfinite()
    # dropout keeps a mask and the dropped input of every adapted layer: more than without
    without = dict(data, lora_dropout=0.0)
    (folder / "adapter_config.json").write_text(json.dumps(without))
    plain = build_workload(load_model_file(str(source)), seed=0)
    dropped = record_memory(built).measured_peak_bytes
    assert dropped > record_memory(plain).measured_peak_bytes


@pytest.mark.parametrize(
    ("lora", "said"),
    [
        ("0", "--lora 0: a LoRA rank is 1 or more"),
        ("-3", "--lora -3: a LoRA rank is 1 or more"),
        ("nowhere.json", "--lora nowhere.json: not a rank or a file"),
        ("+-5", "--lora +-5: not a rank or a file"),  # a ValueError out of int() before
    ],
)
def test_a_bad_rank_or_path_is_one_line(tmp_path: Path, lora: str, said: str) -> None:
    config = WorkloadSource.parse(write_hf_config("causal-lm", "llama", tmp_path)).path
    with pytest.raises(ModelFileError) as caught:
        hf_workload(config, 2, 64, "float32", lora=lora)
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{not json", "cannot read it as JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"peft_type": "IA3"}', "peft_type is 'IA3'; --lora plans LoRA adapters"),
        ('{"peft_type": "LORA", "r": "big"}', "its rank r is 'big'; a rank is 1 or more"),
        ('{"r": 2, "layers_pattern": "h"}', "peft refuses this config: ValueError: When"),
    ],
)
def test_a_bad_adapter_config_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "adapter_config.json"
    path.write_text(text)
    config = WorkloadSource.parse(write_hf_config("causal-lm", "llama", tmp_path)).path
    with pytest.raises(ModelFileError) as caught:
        load_model_file(str(hf_workload(config, 2, 64, "float32", lora=str(path))))
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_targets_the_model_does_not_have_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps({"peft_type": "LORA", "r": 2, "target_modules": ["c_attn"]}))
    model_file = load_model_file(_source(tmp_path, str(path)))
    with pytest.raises(ModelFileError) as caught:
        model_file.build_model()
    message = str(caught.value)
    assert "peft could not put the adapters on LlamaForCausalLM" in message
    assert f"name layers the model has in target_modules in {path}" in message
    assert "\n" not in message


def test_a_rank_peft_cannot_put_on_every_linear_layer_says_how_to_name_them(
    tmp_path: Path,
) -> None:
    """peft refuses its own "all-linear" on Mamba-family models (out_proj): one line saying
    to name the layers in an adapter config, as users then do."""
    model_file = load_model_file(_source(tmp_path, "4", model_type="mamba"))
    with pytest.raises(ModelFileError) as caught:
        model_file.build_model()
    message = str(caught.value)
    assert "peft could not put the adapters on MambaForCausalLM" in message
    assert "out_proj" in message and "\n" not in message
    assert message.endswith(
        "give --lora peft's adapter_config.json naming the layers to adapt instead: "
        "LoraConfig(r=4, target_modules=[...]).save_pretrained(FOLDER), then --lora FOLDER"
    )


def test_a_sequence_classifier_trains_its_head_too(tmp_path: Path) -> None:
    """peft's SEQ_CLS task type trains the new classifier head whole (modules_to_save),
    as users' fine-tuning does."""
    source = _source(tmp_path, "2", task="sequence-classification")
    built = build_workload(load_model_file(source), seed=0)
    assert type(built.model).__name__ == "PeftModelForSequenceClassification"
    assert any("modules_to_save" in name for name in _trained(built.model))
    assert run_training_step(built, seed=0).isfinite()


def test_a_source_carries_its_adapters(tmp_path: Path) -> None:
    source = WorkloadSource.hugging_face("/c/config.json", 2, 64, "bfloat16", lora="16")
    assert str(source).endswith("&lora=16")
    assert WorkloadSource.parse(str(source)) == source
    assert source.command_arguments()[-2:] == ["--lora", "16"]
    path = tmp_path / "a b?" / "adapter_config.json"
    on_disk = WorkloadSource.hugging_face("/c/config.json", 2, 64, "bfloat16", lora=str(path))
    assert WorkloadSource.parse(str(on_disk)) == on_disk  # spaces and '?' survive
    with pytest.raises(ValueError):
        WorkloadSource(WorkloadSource.parse("/m/model.py").kind, Path("/m/model.py"), lora="4")


# -- through the CLI ----------------------------------------------------------------------------
@pytest.mark.slow
def test_profile_with_lora_then_verify_from_the_plan_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    written = WorkloadSource.parse(write_hf_config("causal-lm", "llama", tmp_path))
    source = hf_workload(written.path, 2, written.seq_len, "float32", lora="4")
    workload, session = build_fake_workload(load_model_file(source))
    profile = record_memory(workload, session=session)  # no times: the budget only
    assert source.command_arguments()[-2:] == ["--lora", "4"]
    plan = profile_halfway(source, profile, tmp_path)
    assert plan.model_file == str(source) and plan.model_file.endswith("&lora=4")
    assert any("rank 4 on every linear layer" in note.text for note in plan.assumptions)
    plan_path = tmp_path / "profiles" / "llama" / "plan.json"
    verified = CliRunner().invoke(app, ["verify", str(plan_path)])  # the adapters from the plan
    assert verified.exit_code == 0, verified.output
    assert "verified" in verified.stdout


@pytest.mark.parametrize(
    ("arguments", "code", "said"),
    [
        (["--lora", "0"], 4, "--lora 0: a LoRA rank is 1 or more"),
        (["--lora", "missing.json"], 4, "--lora missing.json: not a rank or a file"),
    ],
)
def test_a_bad_lora_exits_with_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arguments: list[str], code: int, said: str
) -> None:
    written = WorkloadSource.parse(write_hf_config("causal-lm", "llama", tmp_path))
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    shape = ["--batch-size", "2", "--seq-len", "16", "--budget", "1GB"]
    result = CliRunner().invoke(app, ["profile", "--hf", str(written.path), *shape, *arguments])
    assert result.exit_code == code, result.output
    _error_line(result, said)  # the one line on stderr, no traceback
    assert sorted(tmp_path.rglob("*")) == before


def test_lora_with_a_model_file_is_a_usage_error(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text("")
    result = CliRunner().invoke(app, ["profile", str(model), "--budget", "1GB", "--lora", "4"])
    assert result.exit_code == 2, result.output
    assert "--autocast and --choices go with --hf CONFIG" in result.output  # --lora among them
