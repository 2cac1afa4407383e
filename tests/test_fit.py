"""``ckpt-plan fit``: the largest batch size that fits a budget under some plan, checked by
running its plan, with the next size shown not to fit by the solver's lowest peak."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli.main import app
from planner.core.errors import InfeasibleBudgetError, ModelFileError
from planner.core.records import NoteTopic
from planner.fit import fit_largest
from planner.measure.workload import load_model_file, with_batch_size
from planner.plan.plan_file import load_plan
from tests.hf_configs import TINY_EAGER_MIXTRAL

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MIB = 2**20


def _assert_largest(result, budget_bytes: int) -> None:  # type: ignore[no-untyped-def]
    """The answer fits when measured, and the next size does not fit under any plan."""
    largest = result.point(result.largest)
    assert largest.lowest_peak_bytes <= budget_bytes
    assert result.point(result.largest + 1).lowest_peak_bytes > budget_bytes
    check = result.planned.check
    assert check is not None and check.training_unchanged
    assert result.planned.plan.checked
    assert result.planned.plan.measured_peak_bytes <= budget_bytes
    assert result.planned.plan.batch == result.planned.profile.batch
    sizes = [point.size for point in result.points]
    assert sizes == sorted(sizes)
    fitting = [p for p in result.points if p.lowest_peak_bytes <= budget_bytes]
    assert max(p.size for p in fitting) == result.largest
    # Peaks grow with the batch: the search's premise.
    lowest = [p.lowest_peak_bytes for p in result.points]
    assert lowest == sorted(lowest)
    timed = [p for p in result.points if p.steps_per_second is not None]
    assert result.largest in [p.size for p in timed]
    throughput = {p.size: p.size * (p.steps_per_second or 0.0) for p in timed}
    assert throughput[result.fastest] == max(throughput.values())


@pytest.mark.slow
def test_fit_on_the_gpt_example() -> None:
    budget = 23 * MIB  # largest 2, its neighbour 3 shown not to fit
    result = fit_largest(load_model_file(EXAMPLES / "gpt.py"), budget, timing_steps=1)
    _assert_largest(result, budget)
    assert result.largest > 1 and not result.capped
    assert str(result.source).endswith(f"gpt.py?batch_size={result.largest}")
    assert result.planned.profile.batch["input_ids"]["shape"][0] == result.largest  # type: ignore[index]


@pytest.mark.hf
@pytest.mark.slow
def test_fit_on_the_hf_llama_example() -> None:
    budget = 17 * MIB  # largest 2
    result = fit_largest(load_model_file(EXAMPLES / "hf_llama.py"), budget, timing_steps=1)
    _assert_largest(result, budget)


def test_a_budget_below_batch_size_one_names_the_smallest_that_fits() -> None:
    model_file = load_model_file(EXAMPLES / "mlp.py")
    with pytest.raises(InfeasibleBudgetError, match="even batch size 1 needs") as raised:
        fit_largest(model_file, 1 * MIB, check=False)
    assert raised.value.min_budget_bytes > 1 * MIB


def test_a_model_file_without_a_batch_size_is_told_how_to_add_one(tmp_path: Path) -> None:
    fixed = tmp_path / "fixed.py"
    fixed.write_text(
        "import torch\n"
        "def build_model():\n    return torch.nn.Linear(4, 1)\n"
        "def sample_batch():\n    return torch.randn(8, 4)\n"
        "def loss_fn(output, batch):\n    return output.pow(2).mean()\n"
    )
    with pytest.raises(ModelFileError, match=r"sample_batch\(batch_size=\.\.\.\)"):
        with_batch_size(load_model_file(fixed), 4)
    result = CliRunner().invoke(app, ["fit", str(fixed), "--budget", "64MiB"])
    assert result.exit_code != 0
    assert "sample_batch(batch_size=...)" in result.output
    assert "Traceback" not in result.output


def test_the_batch_size_travels_with_the_model_file(tmp_path: Path) -> None:
    """``PATH?batch_size=N`` is what the check process and the plan carry."""
    sized = with_batch_size(load_model_file(EXAMPLES / "mlp.py"), 3)
    again = load_model_file(sized.source)
    assert again.source == sized.source
    x, y = again.sample_batch()
    assert x.shape[0] == 3 and y.shape[0] == 3
    result = CliRunner().invoke(
        app, ["profile", str(EXAMPLES / "mlp.py"), "--batch-size", "0", "--budget", "1GiB"]
    )
    assert result.exit_code == 2


@pytest.mark.slow
def test_fit_cli_writes_the_plan_for_the_largest(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app, ["fit", str(EXAMPLES / "functional_blocks.py"), "--budget", "6MiB"]
    )
    assert result.exit_code == 0, result.output
    assert "largest batch size that fits 6.00 MiB:" in result.output
    assert "fastest: batch size" in result.output
    written = list((tmp_path / "profiles" / "functional_blocks").glob("plan-batch*.json"))
    assert len(written) == 1
    plan = load_plan(written[0])
    assert plan.checked and plan.measured_peak_bytes is not None
    assert plan.measured_peak_bytes <= 6 * MIB
    assert plan.model_file is not None and "?batch_size=" in plan.model_file


@pytest.mark.hf
@pytest.mark.slow
def test_fit_the_sequence_length_of_a_hf_config(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With --hf and --batch-size, fit grows the sequence length instead, capped by the
    config's positions; the plan for the longest is checked by running it."""
    monkeypatch.chdir(tmp_path)
    config = EXAMPLES / "configs" / "tiny-llama.json"
    arguments = ["fit", "--hf", str(config), "--batch-size", "2", "--budget", "6MiB"]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    assert "largest seq len that fits 6.00 MiB:" in result.output
    written = list((tmp_path / "profiles").glob("*/plan-seq*.json"))
    assert len(written) == 1
    plan = load_plan(written[0])
    assert plan.checked and plan.measured_peak_bytes is not None
    assert plan.measured_peak_bytes <= 6 * MIB
    longest = int(written[0].stem.removeprefix("plan-seq"))
    assert plan.batch["input_ids"]["shape"] == [2, longest]  # type: ignore[index]
    both = CliRunner().invoke(app, [*arguments, "--seq-len", "8"])
    assert both.exit_code == 2 and "give one of --seq-len" in both.output


@pytest.mark.hf
@pytest.mark.parametrize(
    ("config", "shape", "fragment"),
    [
        ("tiny-llama", [], "with --hf give one of --seq-len"),  # token ids need one
        ("vit", ["--batch-size", "2"], "takes images, and fit fits its batch size only"),
        ("wav2vec2", [], "takes audio, and fit fits its batch size only; leave out"),
        ("trocr", [], "takes images and their text, and fit fits its batch size only; leave"),
    ],
)
def test_fit_with_hf_fits_the_one_size_the_batch_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str, shape: list[str], fragment: str
) -> None:
    """An image classifier's batch has no sequence length: fit takes neither option and fits
    its batch size; a token model's needs one of them; a speech model's clips need a length,
    and so does an image-to-text model's text: fit fits its batch size at it."""
    import json

    monkeypatch.chdir(tmp_path)
    vit = {"model_type": "vit", "architectures": ["ViTForImageClassification"]}
    (tmp_path / "vit.json").write_text(json.dumps(vit), encoding="utf-8")
    asr = {"model_type": "wav2vec2", "architectures": ["Wav2Vec2ForCTC"]}
    (tmp_path / "wav2vec2.json").write_text(json.dumps(asr), encoding="utf-8")
    trocr = {  # an image encoder and a text decoder (VisionEncoderDecoderModel)
        "model_type": "vision-encoder-decoder",
        "architectures": ["VisionEncoderDecoderModel"],
        "encoder": {"model_type": "vit"},
        "decoder": {"model_type": "bert", "is_decoder": True, "add_cross_attention": True},
        "decoder_start_token_id": 2,
        "pad_token_id": 0,
    }
    (tmp_path / "trocr.json").write_text(json.dumps(trocr), encoding="utf-8")
    path = EXAMPLES / "configs" / "tiny-llama.json" if config == "tiny-llama" else f"{config}.json"
    result = CliRunner().invoke(app, ["fit", "--hf", str(path), *shape, "--budget", "1GB"])
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trocr.json", "vit.json", "wav2vec2.json"]
    if config in ("vit", "wav2vec2"):
        from planner.measure.hf import hf_workload

        length = None if config == "vit" else 16000  # images have none; clips need one
        workload = load_model_file(hf_workload(tmp_path / f"{config}.json", 2, length))
        with pytest.raises(ModelFileError, match="fits the sequence length of token ids only"):
            fit_largest(workload, 2**30, dimension="seq_len")


@pytest.mark.slow
def test_fit_for_a_target_device_leaves_its_plan_unchecked_and_says_so() -> None:
    """A plan for a device that is not here is not run, and is marked so, as `profile`'s."""
    from planner.plan.targets import load_spec

    model_file = load_model_file(EXAMPLES / "mlp.py")
    result = fit_largest(model_file, 200 * MIB, target=load_spec("h100-80gb"), max_size=4)
    assert result.planned.check is None and not result.planned.plan.checked
    assert any(
        note.topic is NoteTopic.UNCHECKED
        and note.text.startswith("made for h100-80gb")
        and "--batch-size" in note.text
        for note in result.planned.plan.notes
    )
    assert result.source == result.point(result.largest).source


@pytest.mark.hf
@pytest.mark.slow
def test_fit_plans_eager_experts_for_the_expert_load_it_is_given(tmp_path: Path) -> None:
    """--expert-load reaches fit's search, its plan and its check: at the budget where
    batch size 1 fits unplanned under balanced routing, a busiest expert at twice its share
    needs a plan; each plan records its load and measured its prediction under it."""
    import json

    from planner.measure.hf import hf_workload
    from planner.solve import Solver
    from tests.models import memory_profile

    config = tmp_path / "mixtral-eager.json"
    config.write_text(json.dumps(TINY_EAGER_MIXTRAL), encoding="utf-8")
    one = load_model_file(hf_workload(config, 1, 16, None))
    balanced, busier = (memory_profile(one, expert_load=load) for load in (1.0, 2.0))
    budget = balanced.measured_peak_bytes
    assert Solver(busier).lowest_peak()[1] <= budget < busier.measured_peak_bytes
    plans = {}
    for load in ("1", "2"):
        plan_path = tmp_path / f"plan-{load}.json"
        arguments = ["fit", "--hf", str(config), "--seq-len", "16", "--budget", str(budget)]
        arguments += ["--max-size", "1", "--expert-load", load, "-o", str(plan_path)]
        result = CliRunner().invoke(app, arguments)
        assert result.exit_code == 0, result.output
        assert (f"--budget {budget} --expert-load 2" in result.stdout) == (load == "2")
        plans[load] = plan = load_plan(plan_path)
        assert plan.switches.expert_load == float(load)
        assert plan.checked and plan.measured_peak_bytes == plan.predicted_peak_bytes <= budget
    assert plans["1"].modules == () and plans["1"].predicted_peak_bytes == budget
    assert plans["2"].modules and plans["2"].predicted_peak_bytes != budget
