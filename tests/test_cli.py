"""The CLI boundary through CliRunner: help, exit codes, one-line errors, nothing written.

No successful profile here (the end-to-end test runs one); every case fails before the
model is measured. Click >= 8.2 keeps stderr apart: ``result.stdout``/``result.stderr``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli.main import app


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder so default output paths (profiles/, reports/) land there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _assert_one_line_error(result, *fragments: str) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith("error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in line
    assert result.stdout == ""
    return line


def test_help(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "profile" in result.stdout
    assert "memory budget" in result.stdout


def test_no_arguments_shows_help(runner: CliRunner) -> None:
    result = runner.invoke(app, [])
    assert "Usage" in result.output
    assert "profile" in result.output


def test_profile_help(runner: CliRunner) -> None:
    result = runner.invoke(app, ["profile", "--help"])
    assert result.exit_code == 0
    for option in (
        "--budget",
        "--out",
        "--report-dir",
        "--device",
        "--seed",
        "--target",
        "--memory",
        "--zero-grad",
        "--grad-accum",
        "--verbose",
    ):
        assert option in result.stdout
    assert "GiB" in result.stdout  # the unit rule is explained where the budget is asked for


def test_profile_without_a_budget_is_a_usage_error(runner: CliRunner, workdir: Path) -> None:
    (workdir / "model.py").write_text("def build_model(): ...\n")
    result = runner.invoke(app, ["profile", "model.py"])
    assert result.exit_code == 2
    assert "--budget" in result.stderr
    assert _files(workdir) == {"model.py"}


@pytest.mark.parametrize(
    ("budget", "fragment"),
    [("12XB", "unknown unit 'XB'"), ("-3GB", "positive"), ("0", "positive"), ("abc", "12GB")],
)
@pytest.mark.parametrize("form", ["separate", "equals", "short"])
def test_profile_with_a_bad_budget_exits_2(
    runner: CliRunner, workdir: Path, budget: str, fragment: str, form: str
) -> None:
    (workdir / "model.py").write_text("def build_model(): ...\n")
    arguments = {
        "separate": ["--budget", budget],
        "equals": [f"--budget={budget}"],
        "short": ["-b", budget],
    }[form]
    result = runner.invoke(app, ["profile", "model.py", *arguments])
    assert result.exit_code == 2
    _assert_one_line_error(result, "--budget", fragment)
    assert _files(workdir) == {"model.py"}


@pytest.mark.parametrize(
    ("option", "value"),
    [("--grad-accum", "0"), ("--grad-accum", "two"), ("--zero-grad", "sideways")],
)
def test_profile_with_a_bad_loop_shape_exits_2(
    runner: CliRunner, workdir: Path, option: str, value: str
) -> None:
    (workdir / "model.py").write_text("def build_model(): ...\n")
    result = runner.invoke(app, ["profile", "model.py", "--budget", "1GB", option, value])
    assert result.exit_code == 2
    assert option in result.stderr and "Traceback" not in result.output
    assert _files(workdir) == {"model.py"}


def _profile(runner: CliRunner, folder: Path, model: Path):
    return runner.invoke(
        app,
        [
            "profile",
            str(model),
            "--budget",
            "1GB",
            "--out",
            str(folder / "plan.json"),
            "--report-dir",
            str(folder / "r"),
        ],
    )


def test_missing_model_file_exits_4(runner: CliRunner, workdir: Path) -> None:
    result = _profile(runner, workdir, workdir / "no_such_model.py")
    assert result.exit_code == 4
    _assert_one_line_error(result, "no_such_model.py", "does not exist")
    assert _files(workdir) == set()


def test_model_file_with_a_syntax_error_exits_4(runner: CliRunner, workdir: Path) -> None:
    model = workdir / "broken.py"
    model.write_text("import torch\n\ndef build_model(:\n    pass\n")
    result = _profile(runner, workdir, model)
    assert result.exit_code == 4
    # Names the file and line, and the kind of problem.
    _assert_one_line_error(result, "broken.py:3", "SyntaxError")
    assert _files(workdir) == {"broken.py"}


def test_model_file_raising_on_import_exits_4(runner: CliRunner, workdir: Path) -> None:
    model = workdir / "raises.py"
    model.write_text("x = 1\nraise RuntimeError('no GPU here')\n")
    result = _profile(runner, workdir, model)
    assert result.exit_code == 4
    _assert_one_line_error(result, "raises.py:2", "RuntimeError", "no GPU here")
    assert _files(workdir) == {"raises.py"}


def test_model_file_without_build_model_exits_4(runner: CliRunner, workdir: Path) -> None:
    model = workdir / "incomplete.py"
    model.write_text("import torch\n\ndef sample_batch():\n    return torch.zeros(2, 3)\n")
    result = _profile(runner, workdir, model)
    assert result.exit_code == 4
    _assert_one_line_error(result, "incomplete.py", "build_model()")
    assert _files(workdir) == {"incomplete.py"}


def test_model_file_without_sample_batch_exits_4(runner: CliRunner, workdir: Path) -> None:
    model = workdir / "no_batch.py"
    model.write_text("import torch\n\ndef build_model():\n    return torch.nn.Linear(2, 2)\n")
    result = _profile(runner, workdir, model)
    assert result.exit_code == 4
    _assert_one_line_error(result, "no_batch.py", "sample_batch()")
    assert _files(workdir) == {"no_batch.py"}


def test_verbose_shows_the_traceback(runner: CliRunner, workdir: Path) -> None:
    result = runner.invoke(
        app, ["profile", str(workdir / "missing.py"), "--budget", "1GB", "--verbose"]
    )
    assert result.exit_code == 4
    assert "Traceback" in result.stderr
    assert "error: " in result.stderr


def test_an_unexpected_exception_is_one_line_with_a_hint(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (an exception that is not a PlannerError) is one `error:` line, exit 1, and a
    hint to re-run with --verbose, which shows the traceback."""
    import planner.plan.profile_file

    def broken(path: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(planner.plan.profile_file, "load_profile", broken)
    (tmp_path / "profile.json").write_text("{}")
    result = runner.invoke(app, ["solve", str(tmp_path / "profile.json"), "--budget", "1GB"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: unexpected ZeroDivisionError")
    assert "--verbose" in lines[0] and "Traceback" not in result.output
    verbose = runner.invoke(
        app, ["solve", str(tmp_path / "profile.json"), "--budget", "1GB", "--verbose"]
    )
    assert verbose.exit_code == 1 and "Traceback" in verbose.output


def test_offload_options_are_offered_and_a_bad_host_budget_is_a_one_line_error(
    runner: CliRunner, workdir: Path
) -> None:
    for command in ("profile", "solve"):
        help_text = runner.invoke(app, [command, "--help"]).stdout
        for option in ("--offload", "--no-offload", "--host-budget"):
            assert option in help_text, (command, option)
    (workdir / "model.py").write_text("def build_model(): ...\n")
    result = runner.invoke(
        app, ["profile", "model.py", "--budget", "1GB", "--no-offload", "--host-budget", "1GB"]
    )
    assert result.exit_code == 2
    _assert_one_line_error(result, "--host-budget goes with --offload")
    result = runner.invoke(app, ["profile", "model.py", "--budget", "1GB", "--host-budget", "lots"])
    assert result.exit_code != 0
    _assert_one_line_error(result, "--host-budget")
    assert _files(workdir) == {"model.py"}


def test_calibrate_out_without_cuda_is_a_one_line_error_and_writes_nothing(
    runner: CliRunner, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU machine
    help_text = runner.invoke(app, ["calibrate", "--help"]).stdout
    for option in ("--out", "--name", "--device", "--spec", "--size", "--copies"):
        assert option in help_text, option
    result = runner.invoke(app, ["calibrate", "--device", "cuda", "-o", "my-gpu.json"])
    assert result.exit_code == 4
    _assert_one_line_error(result, "no CUDA device is available here", "--target SPEC.json")
    result = runner.invoke(app, ["calibrate", "--device", "cpu", "-o", "my-gpu.json"])
    assert result.exit_code == 4
    _assert_one_line_error(result, "needs a CUDA device, not cpu")
    # Usage errors, before anything is measured.
    for arguments, said in (
        (["-o", "my-gpu.txt"], "ending in .json"),
        (["-o", "my-gpu.json", "--spec", "other.json"], "pass one of them"),
        (["--name", "mine"], "--name goes with --out"),
    ):
        result = runner.invoke(app, ["calibrate", *arguments])
        assert result.exit_code == 2, arguments
        _assert_one_line_error(result, said)
    assert _files(workdir) == set()
