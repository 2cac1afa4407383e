"""`ckpt-plan verify`, and every bad input to `profile`, `verify` and `apply_plan`.

Each bad input must give one line on stderr naming the cause and what to do, the README's
exit code, no traceback without --verbose, and no file written. The table of the same cases
with their actual messages is docs/bad_inputs.md (benchmarks/bad_inputs.py writes it).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from planner.apply import apply_plan, is_wrapped, model_fingerprint
from planner.apply.tensors import describe_batch
from planner.cli.main import app
from planner.core.errors import PlanFileError, PlanMismatchError
from planner.core.records import Unit
from planner.measure.profiler import profile_workload
from planner.measure.workload import build_workload, load_model_file
from planner.plan.plan_file import Plan, plan_to_dict, save_plan
from planner.solve.planning import build_plan

DATA = Path(__file__).resolve().parent / "data"
SMALL_CNN = DATA / "small_cnn.py"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def cnn_plan() -> Plan:
    """A plan for small_cnn.py wrapping both conv-BatchNorm blocks (restoring their running
    statistics after recomputation), with the unplanned peak as its budget."""
    profile = profile_workload(build_workload(load_model_file(SMALL_CNN)), timing_passes=1)
    plan = build_plan(profile, [Unit("0"), Unit("1")], profile.measured_peak_bytes, strategy="test")
    assert all(decision.restore_buffers for decision in plan.modules)
    return plan


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _error_line(result, *fragments: str) -> str:  # type: ignore[no-untyped-def]
    """The one error line on stderr (warnings allowed), with no traceback anywhere."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert lines[-1] == errors[0], result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def _verify(runner: CliRunner, model: Path, plan: Path, *options: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["verify", str(model), str(plan), *options])


# -- verify: the report and its exit code ------------------------------------------------------
def test_verify_help_lists_its_options(runner: CliRunner) -> None:
    result = runner.invoke(app, ["verify", "--help"])
    assert result.exit_code == 0
    for option in ("MODEL.py", "PLAN", "--device", "--seed", "--debug", "--verbose"):
        assert option in result.stdout


def test_verify_a_good_plan_reports_equal_and_exits_0(
    runner: CliRunner, workdir: Path, cnn_plan: Plan
) -> None:
    plan_path = save_plan(cnn_plan, workdir / "plan.json")
    result = _verify(runner, SMALL_CNN, plan_path)
    assert result.exit_code == 0, result.output
    assert "error" not in result.stderr and "warning" not in result.stderr
    report = result.stdout
    for row in ("loss", "gradients", "buffers", "state_dict keys"):
        line = next(line for line in report.splitlines() if line.startswith(row))
        assert "equal" in line or "unchanged" in line, line
    assert "max difference 0" in report
    assert "<= budget" in report and "peak with plan (predicted)" in report
    assert "verified: the plan fits its budget and leaves the training step unchanged" in report
    assert _files(workdir) == {"plan.json"}


def test_verify_lists_what_differs_and_exits_5(
    runner: CliRunner, workdir: Path, cnn_plan: Plan
) -> None:
    # Without restoring BatchNorm's running statistics, recomputation updates them twice;
    # and a budget below the measured peak.
    careless = dataclasses.replace(
        cnn_plan,
        budget_bytes=1000,
        modules=tuple(dataclasses.replace(d, restore_buffers=()) for d in cnn_plan.modules),
    )
    plan_path = save_plan(careless, workdir / "plan.json")
    result = _verify(runner, SMALL_CNN, plan_path)
    assert result.exit_code == 5, result.output
    assert "DIFFERENT" in result.stdout and "OVER budget" in result.stdout
    _error_line(
        result,
        "the plan failed verification",
        "buffers differ: 0.1.running_mean",
        "over the budget 1000 B",
    )
    assert _files(workdir) == {"plan.json"}


@pytest.mark.slow
def test_verify_a_plan_whose_recomputation_differs_exits_5_and_debug_traces_it(
    runner: CliRunner, workdir: Path
) -> None:
    model = DATA / "cache_decoder.py"
    profile = profile_workload(build_workload(load_model_file(model)), timing_passes=1)
    plan = build_plan(profile, [Unit("decoder.layers.0.cross")], 10**9, strategy="test")
    plan_path = save_plan(plan, workdir / "plan.json")

    result = _verify(runner, model, plan_path)
    assert result.exit_code == 5, result.output
    _error_line(result, "the planned step fails where the unplanned one runs", "CheckpointError")
    assert "--debug" in result.stderr

    traced = _verify(runner, model, plan_path, "--debug")
    assert traced.exit_code == 5
    _error_line(traced, "CheckpointError")
    assert "Stack traces of the operators that ran in the original forward" in traced.stderr
    assert _files(workdir) == {"plan.json"}


@pytest.mark.slow
def test_verify_warns_when_the_batch_shape_differs(
    runner: CliRunner, workdir: Path, cnn_plan: Plan
) -> None:
    plan_path = save_plan(cnn_plan, workdir / "plan.json")
    result = _verify(runner, DATA / "small_cnn_batch4.py", plan_path)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, result.stderr
    assert "0=[8, 3, 16, 16] float32" in warnings[0]  # the plan's batch
    assert "0=[4, 3, 16, 16] float32" in warnings[0]  # the model file's
    assert "re-run `ckpt-plan profile`" in warnings[0]
    assert result.exit_code == 0, result.output  # half the batch: same model, fits, equal


# -- verify: bad input -------------------------------------------------------------------
def _write_plan_file(folder: Path, kind: str, plan: Plan) -> Path:
    path = folder / "plan.json"
    data = plan_to_dict(plan)
    if kind == "empty":
        path.write_text("")
    elif kind == "corrupt":
        path.write_text(json.dumps(data)[:200])
    elif kind == "not a plan":
        path.write_text("[1, 2, 3]\n")
    elif kind == "future version":
        path.write_text(json.dumps({**data, "schema_version": 99}))
    elif kind != "missing":
        raise AssertionError(kind)
    return path


@pytest.mark.parametrize(
    ("kind", "fragments"),
    [
        ("missing", ("does not exist", "ckpt-plan profile")),
        ("empty", ("is empty", "re-create it")),
        ("corrupt", ("is not valid JSON", "re-create it")),
        ("not a plan", ("is not a ckpt-plan plan",)),
        ("future version", ("plan schema 99", "upgrade ckpt-plan or re-create the plan")),
    ],
)
def test_verify_an_unreadable_plan_file_exits_6(
    runner: CliRunner, workdir: Path, cnn_plan: Plan, kind: str, fragments: tuple[str, ...]
) -> None:
    path = _write_plan_file(workdir, kind, cnn_plan)
    before = _files(workdir)
    result = _verify(runner, SMALL_CNN, path)
    assert result.exit_code == 6, result.output
    _error_line(result, "plan file", *fragments)
    assert result.stdout == ""
    assert _files(workdir) == before


def test_verify_a_plan_for_another_model_exits_6(
    runner: CliRunner, workdir: Path, cnn_plan: Plan
) -> None:
    plan_path = save_plan(cnn_plan, workdir / "plan.json")
    result = _verify(runner, DATA / "cache_decoder.py", plan_path)
    assert result.exit_code == 6, result.output
    _error_line(result, "made for another model (small_cnn)", "re-run `ckpt-plan profile`")
    assert _files(workdir) == {"plan.json"}


BROKEN_MODEL_FILES = {
    "syntax error": (
        "import torch\n\ndef build_model(:\n    pass\n",
        ("model.py:3", "SyntaxError"),
    ),
    "no build_model": (
        "import torch\n\ndef sample_batch():\n    return torch.zeros(2, 3)\n",
        ("must define build_model()", "'Model file' section"),
    ),
}


@pytest.mark.parametrize("kind", ["missing", *BROKEN_MODEL_FILES, "forward raises"])
def test_verify_a_broken_model_file_exits_4(
    runner: CliRunner, workdir: Path, cnn_plan: Plan, kind: str
) -> None:
    plan_path = save_plan(cnn_plan, workdir / "plan.json")
    if kind == "missing":
        model, fragments = workdir / "model.py", ("model.py does not exist",)
    elif kind == "forward raises":
        model = DATA / "raising_forward.py"
        fragments = ("the training step raised RuntimeError", "raising_forward.py:13")
        # A plan that matches this model (it cannot be profiled): no modules wrapped.
        broken = load_model_file(model)
        plan_path = save_plan(
            dataclasses.replace(
                cnn_plan,
                modules=(),
                fingerprint=model_fingerprint(broken.build_model()),
                batch=describe_batch(broken.sample_batch()),
            ),
            plan_path,
        )
    else:
        source, fragments = BROKEN_MODEL_FILES[kind]
        model = workdir / "model.py"
        model.write_text(source)
    before = _files(workdir)
    result = _verify(runner, model, plan_path)
    assert result.exit_code == 4, result.output
    _error_line(result, *fragments)
    assert _files(workdir) == before


def test_verify_verbose_shows_the_traceback(runner: CliRunner, workdir: Path) -> None:
    result = _verify(runner, SMALL_CNN, workdir / "missing.json", "--verbose")
    assert result.exit_code == 6
    assert "Traceback" in result.stderr and "error: " in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_verify_on_cuda_without_a_gpu_exits_2(
    runner: CliRunner, workdir: Path, cnn_plan: Plan
) -> None:
    plan_path = save_plan(cnn_plan, workdir / "plan.json")
    result = _verify(runner, SMALL_CNN, plan_path, "--device", "cuda")
    assert result.exit_code == 2
    _error_line(result, "no CUDA device")


# -- profile: bad input not covered by test_cli.py --------------------------------------------
def _profile(runner: CliRunner, model: Path, budget: str = "1GB"):  # type: ignore[no-untyped-def]
    return runner.invoke(
        app, ["profile", str(model), "--budget", budget, "-o", "out/plan.json", "--report-dir", "r"]
    )


def test_profile_a_forward_that_raises_exits_4(runner: CliRunner, workdir: Path) -> None:
    result = _profile(runner, DATA / "raising_forward.py")
    assert result.exit_code == 4, result.output
    _error_line(result, "raised RuntimeError", "raising_forward.py:13", "mat1 and mat2")
    assert _files(workdir) == set()


def test_profile_a_budget_too_small_for_any_plan_exits_3(runner: CliRunner, workdir: Path) -> None:
    result = _profile(runner, SMALL_CNN, "100KiB")
    assert result.exit_code == 3, result.output
    _error_line(result, "no checkpointing plan fits 100.00 KiB", "the smallest budget that fits is")
    assert _files(workdir) == {"out", "out/profile.json"}  # the profile, to re-solve; no plan


def test_ctrl_c_while_profiling_exits_130_and_writes_nothing(
    runner: CliRunner, workdir: Path
) -> None:
    result = _profile(runner, DATA / "interrupted.py")
    assert result.exit_code == 130, result.output
    _error_line(result, "interrupted; no plan was written")
    assert _files(workdir) == set()


def test_ctrl_c_while_the_plan_is_checked_exits_130_and_writes_nothing(
    runner: CliRunner, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("planner.check.child.subprocess.run", interrupted)
    result = _profile(runner, SMALL_CNN, "360KiB")
    assert result.exit_code == 130, result.output
    _error_line(result, "interrupted")
    assert _files(workdir) == set()


# -- apply_plan in Python: typed errors, model untouched -------------------------------------
@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("missing", PlanFileError),
        ("empty", PlanFileError),
        ("corrupt", PlanFileError),
        ("not a plan", PlanFileError),
        ("future version", PlanFileError),
        ("another model", PlanMismatchError),
    ],
)
def test_apply_plan_raises_a_typed_error_and_leaves_the_model_untouched(
    tmp_path: Path, cnn_plan: Plan, kind: str, error: type[Exception]
) -> None:
    if kind == "another model":
        path = save_plan(cnn_plan, tmp_path / "plan.json")
        model = load_model_file(DATA / "cache_decoder.py").build_model()
    else:
        path = _write_plan_file(tmp_path, kind, cnn_plan)
        model = load_model_file(SMALL_CNN).build_model()
    state = {name: value.clone() for name, value in model.state_dict().items()}
    with pytest.raises(error):
        apply_plan(model, path)
    assert not any(is_wrapped(module) for module in model.modules())
    assert not any("forward" in vars(module) for module in model.modules())
    assert model.state_dict().keys() == state.keys()
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), name
