"""`--hf CONFIG --autocast bfloat16`: plan the step `Trainer(bf16=True)` runs.

accelerate (which the Trainer trains through) runs the model's forward under
``torch.autocast`` and casts its outputs' 16-bit tensors to float32: another step than one
in the parameters' dtype alone (16-bit saved activations on float32 weights, autocast's
cache of the weights' casts, a float32 copy of the logits), so a plan for it is made on it.
The configs are the types' defaults as ``transformers`` ships them, sizes made small by the
sweep (benchmarks/hf_sweep_models.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from typer.testing import CliRunner

from benchmarks.hf_sweep_models import write_hf_config
from planner import apply_plan
from planner.cli.main import app
from planner.core.errors import ModelFileError
from planner.core.records import Unit
from planner.measure.fake import build_fake_workload
from planner.measure.hf import hf_workload
from planner.measure.profiler import record_memory
from planner.measure.source import WorkloadSource
from planner.measure.workload import build_workload, load_model_file, run_training_step
from planner.solve.planning import build_plan
from tests.models import profile_halfway

pytestmark = pytest.mark.hf


@contextlib.contextmanager
def _accelerator(mixed_precision: str) -> Iterator[Any]:
    """An accelerate.Accelerator on the CPU, its process-wide state fresh before and after
    (another test in this process may have made one with other settings)."""
    accelerate = pytest.importorskip("accelerate")
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    try:
        yield accelerate.Accelerator(mixed_precision=mixed_precision, cpu=True)
    finally:
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)


def _source(
    folder: Path, model_type: str, task: str = "causal-lm", autocast: str = "bfloat16"
) -> WorkloadSource:
    written = WorkloadSource.parse(write_hf_config(task, model_type, folder))
    return hf_workload(written.path, 2, written.seq_len, "float32", autocast=autocast)


@pytest.mark.parametrize("autocast", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    ("model_type", "task"),
    [("llama", "causal-lm"), ("gpt2", "causal-lm"), ("bert", "masked-lm")],
)
def test_the_fake_step_under_autocast_is_the_real_one(
    tmp_path: Path, model_type: str, task: str, autocast: str
) -> None:
    """The fake step (which plans an 8B model on a laptop) records the real step's peak.
    BERT's LayerNorms are float32 and their inputs 16-bit under autocast: the CPU kernel keeps
    their statistics in float32, the fake kernel in the input's dtype
    (planner/measure/kernel_layouts.py)."""
    model_file = load_model_file(str(_source(tmp_path, model_type, task, autocast)))
    real = record_memory(build_workload(model_file, seed=0))
    workload, session = build_fake_workload(model_file)
    fake = record_memory(workload, session=session)
    session.release()
    assert fake.measured_peak_bytes == real.measured_peak_bytes


def test_the_step_is_the_one_accelerate_runs(tmp_path: Path) -> None:
    """The same loss, bit for bit, and the same peak as the forward accelerate prepares for
    Trainer(bf16=True): autocast around it, its outputs cast to float32 after it."""
    model_file = load_model_file(str(_source(tmp_path, "gpt2")))
    ours = build_workload(model_file, seed=0)
    assert any("Trainer(bf16=True)" in note.text for note in ours.notes)
    ours_loss = run_training_step(ours, seed=0)
    ours_peak = record_memory(build_workload(model_file, seed=0)).measured_peak_bytes

    plain = load_model_file(str(_source(tmp_path, "gpt2")).replace("&autocast=bfloat16", ""))
    theirs = build_workload(plain, seed=0)
    with _accelerator("bf16") as accelerator:
        theirs.model = accelerator.prepare_model(theirs.model)
        theirs_loss = run_training_step(theirs, seed=0)
        again = build_workload(plain, seed=0)
        again.model = accelerator.prepare_model(again.model)
        theirs_peak = record_memory(again).measured_peak_bytes
    assert torch.equal(ours_loss, theirs_loss)
    assert ours_peak == theirs_peak
    unautocast_peak = record_memory(build_workload(plain, seed=0)).measured_peak_bytes
    assert ours_peak != unautocast_peak  # another step: bf16 activations, float32 logits


@pytest.mark.slow
def test_an_autocast_plan_is_predicted_to_the_byte_and_trains_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the CLI at a budget between every block's peak and none, then `verify PLAN`
    from the plan alone (the source carries the autocast)."""
    monkeypatch.chdir(tmp_path)
    source = _source(tmp_path, "gpt2")
    workload, session = build_fake_workload(load_model_file(str(source)))
    profile = record_memory(workload, session=session)  # no times: the budget only
    session.release()
    assert "--autocast" in source.command_arguments()
    # checked by profile: bit-identical loss, gradients and buffers, the peak measured
    plan = profile_halfway(source, profile, tmp_path)
    assert plan.model_file == str(source) and plan.model_file.endswith("&autocast=bfloat16")
    plan_path = tmp_path / "profiles" / "gpt2" / "plan.json"
    verified = CliRunner().invoke(app, ["verify", str(plan_path)])
    assert verified.exit_code == 0, verified.output
    assert "verified" in verified.stdout


def test_a_source_carries_its_autocast() -> None:
    source = WorkloadSource.hugging_face("/c/config.json", 2, 64, "float32", autocast="float16")
    assert str(source).endswith("&autocast=float16")
    assert WorkloadSource.parse(str(source)) == source
    assert source.command_arguments()[-2:] == ["--autocast", "float16"]
    with pytest.raises(ValueError):
        WorkloadSource(
            WorkloadSource.parse("/m/model.py").kind, Path("/m/model.py"), autocast="float16"
        )


def test_a_bad_autocast_dtype_is_one_line(tmp_path: Path) -> None:
    config = WorkloadSource.parse(write_hf_config("causal-lm", "llama", tmp_path)).path
    with pytest.raises(ModelFileError) as caught:
        hf_workload(config, 2, 64, "float32", autocast="float32")
    assert str(caught.value) == "--autocast float32: use one of bfloat16, float16"


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--autocast", "fp8"], "Invalid value for '--autocast'"),
        (["model.py", "--autocast", "bfloat16"], "--autocast and --choices go with --hf CONFIG"),
    ],
)
def test_a_bad_autocast_exits_with_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arguments: list[str], said: str
) -> None:
    written = WorkloadSource.parse(write_hf_config("causal-lm", "llama", tmp_path))
    (tmp_path / "model.py").write_text("")
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    hf = [] if "model.py" in arguments else ["--hf", str(written.path), "--batch-size", "2"]
    result = CliRunner().invoke(app, ["profile", *hf, "--budget", "1GB", *arguments])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert sorted(tmp_path.rglob("*")) == before


def _plan_of(model_file: Any) -> Any:
    workload, session = build_fake_workload(model_file)
    profile = record_memory(workload, session=session)
    session.release()
    units = [Unit(block) for block in profile.block_names]
    return build_plan(profile, units, profile.measured_peak_bytes, strategy="test")


def _guard_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("ckpt-plan: ")]


def test_the_first_training_forward_warns_where_autocast_is_not_the_plans(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The plan records the autocast its forward ran under; the first training forward
    compares it where a submodule is first called, since Trainer(bf16=True) autocasts inside
    the model's forward, after the model's own hooks."""
    with_autocast = load_model_file(str(_source(tmp_path, "gpt2")))
    plan = _plan_of(with_autocast)
    assert plan.switches.autocast == "bfloat16"
    plain = load_model_file(str(_source(tmp_path, "gpt2")).replace("&autocast=bfloat16", ""))
    plain_plan = _plan_of(plain)
    assert plain_plan.switches.autocast == "off"

    def first_step(model_file: Any, chosen: Any, trainer_bf16: bool) -> list[str]:
        caplog.clear()
        built = build_workload(model_file, seed=0)
        apply_plan(built.model, chosen)
        model = built.model
        with _accelerator("bf16" if trainer_bf16 else "no") as accelerator:
            model = accelerator.prepare_model(model)
            with caplog.at_level(logging.WARNING, logger="planner.apply.guard"):
                model(**built.batch).loss.backward()
        return _guard_warnings(caplog)

    assert first_step(plain, plan, trainer_bf16=True) == []  # as planned
    assert first_step(plain, plain_plan, trainer_bf16=False) == []
    (unplanned_autocast,) = first_step(plain, plain_plan, trainer_bf16=True)
    assert "runs under torch.autocast(bfloat16), and the plan was made for one without" in (
        unplanned_autocast
    )
    assert "--autocast bfloat16" in unplanned_autocast
    (missing,) = first_step(plain, plan, trainer_bf16=False)
    assert "made for a forward under torch.autocast(bfloat16), and this one runs without" in (
        missing
    )
