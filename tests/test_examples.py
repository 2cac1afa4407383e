"""The bundled model files follow the contract, and `ckpt-plan profile` works end to end."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from planner.cli.main import app
from planner.core.loop import LoopShape, ZeroGrad
from planner.core.records import NoteTopic
from planner.core.units import parse_bytes
from planner.measure.workload import build_workload, load_model_file, run_training_step
from planner.plan.plan_file import load_plan
from planner.plan.profile_file import load_profile

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HF = ["hf_gpt2", "hf_llama", "hf_vit", "hf_t5"]
ALL = ["gpt", "mlp", "cnn", "resnet", "functional_blocks", *HF]
DATA = Path(__file__).resolve().parent / "data"


def _marks(name: str) -> list[pytest.MarkDecorator]:
    """Hugging Face examples need transformers; they and resnet take seconds each."""
    if name in HF:
        return [pytest.mark.hf, pytest.mark.slow]
    return [pytest.mark.slow] if name == "resnet" else []


@pytest.mark.parametrize("name", [pytest.param(name, marks=_marks(name)) for name in ALL])
def test_example_follows_the_contract_and_is_deterministic(name: str) -> None:
    model_file = load_model_file(EXAMPLES / f"{name}.py")
    losses = []
    for _ in range(2):
        workload = build_workload(model_file, seed=0)
        losses.append(run_training_step(workload, seed=0))
    assert torch.isfinite(losses[0])
    assert torch.equal(losses[0], losses[1])


@pytest.mark.parametrize(
    ("name", "blocks"),
    [
        ("cnn", [f"stages.{stage}.{index}" for stage in (0, 1, 2) for index in (0, 1)]),
        ("resnet", [f"layer{stage}.{index}" for stage in (1, 2, 3, 4) for index in (0, 1)]),
    ],
)
@pytest.mark.slow
def test_every_block_on_a_cnn_wraps_the_residual_blocks(name: str, blocks: list[str]) -> None:
    """The baseline users compare with is what they would checkpoint by hand, and it saves
    what it should: predicted (fake step) and measured (real step) far below unplanned."""
    from planner.apply import apply_plan
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from planner.measure.step import measure_step
    from planner.solve.planning import baseline_every_block

    model_file = load_model_file(EXAMPLES / f"{name}.py")
    workload, session = build_fake_workload(model_file)
    profile = record_memory(workload, session=session)
    every = baseline_every_block(profile)
    assert [decision.module_name for decision in every.modules] == blocks
    real = build_workload(model_file, seed=0)
    apply_plan(real.model, every)
    measured = measure_step(real, seed=0).peak_bytes
    assert measured == every.predicted_peak_bytes
    assert measured < 0.8 * profile.measured_peak_bytes


@pytest.mark.child_process
@pytest.mark.slow
def test_profile_writes_a_checked_plan_that_fits(tmp_path: Path) -> None:
    budget = "64MiB"
    out = tmp_path / "plans" / "plan.json"
    result = CliRunner().invoke(
        app,
        [
            "profile",
            str(EXAMPLES / "gpt.py"),
            "--budget",
            budget,
            "--out",
            str(out),
            "--report-dir",
            str(tmp_path / "charts"),
        ],
    )
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    assert plan.budget_bytes == parse_bytes(budget)
    assert plan.modules, "64 MiB needs checkpointing for the GPT example (unplanned ~112 MiB)"
    assert plan.measured_peak_bytes is not None
    assert plan.measured_peak_bytes <= plan.budget_bytes < plan.baseline_peak_bytes
    assert (
        abs(plan.predicted_peak_bytes - plan.measured_peak_bytes) <= 0.02 * plan.measured_peak_bytes
    )
    # Modules with dropout replay the RNG when recomputed; the others skip the stash.
    profile = load_profile(out.parent / "profile.json")
    for decision in plan.modules:
        assert decision.preserve_rng_state == profile.module(decision.module_name).uses_rng
    assert any(decision.preserve_rng_state for decision in plan.modules)
    chart = tmp_path / "charts" / "memory_timeline.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out.parent / "profile.csv").read_text().splitlines()
    assert table[0].startswith("module_name,") and len(table) > 10
    assert profile.model_name == "gpt"
    assert "checkpointed modules of gpt" in result.stdout
    assert f"wrote {out}" in result.stdout


@pytest.mark.slow
def test_profile_with_a_budget_too_small_exits_3_and_keeps_the_profile(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(
        app,
        [
            "profile",
            str(EXAMPLES / "mlp.py"),
            "--budget",
            "20MiB",
            "--out",
            str(out),
            "--report-dir",
            str(tmp_path / "charts"),
        ],
    )
    assert result.exit_code == 3, result.output
    message = result.stderr.strip()
    assert "smallest budget that fits is" in message
    assert len(message.splitlines()) == 1 and "Traceback" not in result.output
    smallest = message.split("smallest budget that fits is ")[1].split(" (")[1].split(" bytes")[0]
    # No plan and no report, but the profile (memory only) and how to re-solve it.
    assert not out.exists() and not (tmp_path / "charts").exists()
    saved = tmp_path / "profile.json"
    assert load_profile(saved).cost_source.value == "none"
    assert f"wrote {saved}" in result.stdout
    hint = next(line for line in result.stdout.splitlines() if "ckpt-plan solve" in line)
    command = shlex.split(hint.split("ckpt-plan ", 1)[1])
    assert command == [
        "solve",
        str(saved),
        "--budget",
        smallest,
        "--check",
        str(EXAMPLES / "mlp.py"),
    ]
    # tradeoff times it once, under the smallest budget that fits, saves the times and
    # draws the curve (the user who just learned the budget is too small needs it).
    drawn = CliRunner().invoke(app, ["tradeoff", str(saved), "--points", "4"])
    assert drawn.exit_code == 0, drawn.output
    assert "measured times" in drawn.stderr
    assert len([line for line in drawn.stdout.splitlines() if "optimal" in line]) == 4
    timed = load_profile(saved)
    assert timed.cost_source.value == "measured" and timed.step_ms > 0
    # The printed command re-solves without profiling again, at exactly the smallest budget.
    solved = CliRunner().invoke(app, command)
    assert solved.exit_code == 0, solved.output
    plan = load_plan(out)
    assert plan.predicted_peak_bytes == int(smallest) == plan.budget_bytes
    assert plan.checked and plan.measured_peak_bytes == int(smallest)
    assert load_profile(saved).cost_source.value == "measured"  # timed once, kept
    # Not a terminal: rows are written whole, not wrapped at 80 columns.
    figures = next(line for line in solved.stdout.splitlines() if line.startswith("figures from"))
    assert figures.rstrip().endswith("times measured here"), solved.stdout
    frontier = CliRunner().invoke(app, ["tradeoff", str(saved), "--points", "3"])
    assert frontier.exit_code == 0, frontier.output
    header = next(line for line in frontier.stdout.splitlines() if "strategy" in line)
    for column in ("budget_mib", "predicted_peak_mib", "recompute_ms", "overhead_pct", "units"):
        assert f" {column} " in header, frontier.stdout


def test_profile_for_a_target_device_writes_an_unchecked_plan(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    arguments = ["profile", str(DATA / "small_gpt.py"), "--out", str(out)]
    arguments += ["--report-dir", str(tmp_path / "charts"), "--target", "h100-80gb"]
    result = CliRunner().invoke(app, [*arguments, "--budget", "1GB"])
    assert result.exit_code == 0, result.output
    assert "not run: made for h100-80gb" in result.stdout
    assert "roofline" in result.stdout
    plan = load_plan(out)
    assert plan.target == "h100-80gb" and not plan.checked and plan.device == "cuda"
    summary = (tmp_path / "charts" / "summary.md").read_text()
    assert "estimated for h100-80gb" in summary and "fake tensors" in summary


@pytest.mark.parametrize(
    ("target", "budget", "message"),
    [
        ("h100", "1GB", "is not a built-in device"),
        ("l4", "30GB", "more than l4's memory"),
    ],
)
def test_a_bad_target_exits_2_and_writes_nothing(
    tmp_path: Path, target: str, budget: str, message: str
) -> None:
    out = tmp_path / "plan.json"
    arguments = ["profile", str(DATA / "small_gpt.py"), "--out", str(out), "--target", target]
    result = CliRunner().invoke(app, [*arguments, "--budget", budget])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def _checked_plan(tmp_path: Path, model: Path, budget: str, *options: str):  # type: ignore[no-untyped-def]
    """`ckpt-plan profile` of ``model`` into ``tmp_path`` (with more ``options``): the result
    and its plan, which must be checked, wrap something, and be measured at its prediction
    within the budget."""
    out = tmp_path / "plan.json"
    arguments = ["profile", str(model), "--budget", budget, "--out", str(out), *options]
    result = CliRunner().invoke(app, [*arguments, "--report-dir", str(tmp_path / "charts")])
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    assert plan.modules and plan.checked
    assert plan.measured_peak_bytes == plan.predicted_peak_bytes <= plan.budget_bytes
    return result, plan


@pytest.mark.slow
def test_a_nanogpt_style_file_with_build_optimizer_of_the_model(tmp_path: Path) -> None:
    """build_optimizer(model) with weight-decay groups by module type (nanoGPT's
    configure_optimizers): planned and checked like any optimizer, its state counted. The
    model's own print (its parameter count) goes to stderr, not into the results."""
    result, _ = _checked_plan(tmp_path, DATA / "nanogpt_optimizer.py", "965000")
    assert "number of parameters" not in result.stdout
    assert "number of parameters: 0.03M" in result.stderr
    assert result.stdout.startswith("checkpointed modules of nanogpt_optimizer")
    profile = load_profile(tmp_path / "profile.json")
    # AdamW keeps two tensors and a float32 step per parameter, in both groups (the tied
    # embedding counted once).
    tensors = len(list(load_model_file(DATA / "nanogpt_optimizer.py").build_model().parameters()))
    assert profile.optimizer_state_bytes == 2 * profile.parameter_bytes + 4 * tensors


@pytest.mark.parametrize(
    ("name", "budget", "said"),
    [
        ("timm_flag", "3.9MB", "switched off to plan as if it were not there"),
        ("own_checkpoint", "3.0MiB", "cannot be switched off here, so the plan counts it"),
    ],
)
@pytest.mark.slow
def test_profile_names_checkpointing_the_model_does_itself(
    tmp_path: Path, name: str, budget: str, said: str
) -> None:
    result, plan = _checked_plan(tmp_path, DATA / f"{name}.py", budget)
    warnings = [line for line in result.stderr.splitlines() if "checkpoints" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and said in warnings[0]
    assert any(  # recorded in the plan too
        note.topic is NoteTopic.OWN_CHECKPOINTING and said in note.text for note in plan.assumptions
    )


@pytest.mark.slow
def test_profile_plans_and_checks_the_training_loop_it_is_given(tmp_path: Path) -> None:
    """The step profiled, timed and checked is the last micro-batch of a Lightning loop
    accumulating two; plan, profile and summary record the loop, and `solve` and `verify`
    use what they recorded."""
    model = DATA / "small_gpt.py"
    options = ["--zero-grad", "after-forward", "--grad-accum", "2"]
    result, plan = _checked_plan(tmp_path, model, "1.1MB", *options)
    loop = LoopShape(zero_grad=ZeroGrad.AFTER_FORWARD, grad_accum=2)
    assert plan.loop == loop and load_profile(tmp_path / "profile.json").loop == loop
    said = next(line for line in result.stdout.splitlines() if line.startswith("training loop"))
    assert "gradient accumulation over 2 micro-batches" in said
    summary = (tmp_path / "charts" / "summary.md").read_text()
    assert "| training loop | gradient accumulation over 2 micro-batches" in summary

    solved_path = tmp_path / "solved.json"
    solved = CliRunner().invoke(
        app, ["solve", str(tmp_path / "profile.json"), "--budget", "1.2MB", "-o", str(solved_path)]
    )
    assert solved.exit_code == 0, solved.output
    assert load_plan(solved_path).loop == loop

    verified = CliRunner().invoke(app, ["verify", str(model), str(tmp_path / "plan.json")])
    assert verified.exit_code == 0, verified.output
    row = next(line for line in verified.stdout.splitlines() if line.startswith("training loop"))
    assert "as the plan records it: gradient accumulation over 2" in row


@pytest.mark.hf
@pytest.mark.slow
def test_every_block_on_t5_wraps_both_stacks_and_every_2nd_block_each(tmp_path: Path) -> None:
    """T5's blocks are its encoder's and its decoder's, as Hugging Face's gradient
    checkpointing wraps both; every 2nd block starts again at each stack's block 0 (3 + 3
    blocks: 0 and 2 of each, not 0, 2 and the decoder's 1). Every block's prediction is the
    real step's peak."""
    from planner.apply import apply_plan
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from planner.measure.step import measure_step
    from planner.plan.profile_file import load_profile, save_profile
    from planner.solve.planning import baseline_plans

    model_file = load_model_file(EXAMPLES / "hf_t5.py")
    workload, session = build_fake_workload(model_file)
    profile = record_memory(workload, session=session)
    encoder = [f"encoder.block.{index}" for index in range(3)]
    decoder = [f"decoder.block.{index}" for index in range(3)]
    assert profile.block_names == (*encoder, *decoder)
    assert profile.block_stacks == (3, 3)
    candidates = {name for name in profile.block_names if profile.module(name).is_candidate}
    plans = baseline_plans(profile)
    every = plans["every-block"]
    assert set(every.module_names) == candidates
    assert any(name.startswith("encoder.") for name in candidates)
    every_2nd = [
        name
        for stack in (encoder, decoder)
        for name in [block for block in stack if block in candidates][::2]
    ]
    assert sorted(plans["every-2nd-block"].module_names) == sorted(every_2nd)
    assert "sqrt-n-segments" not in plans
    saved = save_profile(profile, tmp_path / "t5.json")
    assert load_profile(saved).block_stacks == (3, 3)
    assert baseline_plans(load_profile(saved))["every-2nd-block"].module_names == (
        plans["every-2nd-block"].module_names
    )
    real = build_workload(model_file, seed=0)
    apply_plan(real.model, every)
    assert measure_step(real, seed=0).peak_bytes == every.predicted_peak_bytes
