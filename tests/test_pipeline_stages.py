"""Plans for pipeline stages (issue #30): the layout record, a stage made from the model,
one plan file holding every stage's, each stage simulated in its schedule on a fake process
group, bad options, and (slow) the check on 2 real gloo ranks, 1F1B, GPipe and interleaved
1F1B (2 chunks a rank)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from planner.apply import apply_plan, is_wrapped
from planner.cli.main import app
from planner.core.errors import ParallelLayoutError, PlanMismatchError
from planner.core.parallel import (
    ParallelLayout,
    ParallelStrategy,
    PipelineLayout,
    parallel_from_dict,
    parallel_to_dict,
)
from planner.measure.distributed import record_rank_memory
from planner.measure.stage_split import chunk_modules, make_stage, stage_blocks
from planner.measure.workload import load_model_file
from planner.pipeline_stages import combined_plan
from planner.plan.plan_file import (
    STAGES_SCHEMA_VERSION,
    load_plan,
    plan_from_dict,
    plan_to_dict,
)
from planner.solve.planning import plan_for_budget

DATA = Path(__file__).parent / "data"
TP_GPT = DATA / "tp_gpt.py"  # a small Llama: 2 blocks, batch 4
TP_GPT4 = DATA / "tp_gpt4.py"  # the same with 4 blocks: 2 ranks x 2 chunks


def _layout(schedule: str = "1f1b", stage: int | None = None) -> ParallelLayout:
    return ParallelLayout(2, ParallelStrategy.PP, pipeline=PipelineLayout(2, 4, schedule, stage))


@pytest.fixture(scope="module")
def stage_profiles():  # type: ignore[no-untyped-def]
    """Both stages of 2, 4 micro-batches, 1F1B and GPipe, simulated (fake tensors)."""
    model_file = load_model_file(TP_GPT)
    return {
        (schedule, stage): record_rank_memory(model_file, _layout(schedule, stage))
        for schedule in ("1f1b", "gpipe")
        for stage in (0, 1)
    }


# -- the layout record ---------------------------------------------------------------------
def test_a_pipeline_layout_counts_in_flight_micro_batches_and_round_trips() -> None:
    assert [PipelineLayout(4, 8).in_flight(stage) for stage in range(4)] == [4, 3, 2, 1]
    assert [PipelineLayout(4, 2, "gpipe").in_flight(stage) for stage in range(4)] == [2] * 4
    assert [PipelineLayout(4, 8, "gpipe").in_flight(stage) for stage in range(4)] == [8] * 4
    layout = _layout("gpipe", 1)
    assert layout.mesh_shape == (2,) and layout.mesh_dim_names == ("pp",)
    assert layout.command_options() == "--pp 2 --microbatches 4 --schedule gpipe"
    data = parallel_to_dict(layout)
    assert data is not None and data["pipeline"] == {
        "stages": 2,
        "microbatches": 4,
        "schedule": "gpipe",
        "stage": 1,
    }
    assert parallel_from_dict(json.loads(json.dumps(data))) == layout
    assert "pipeline" not in (parallel_to_dict(ParallelLayout(2, ParallelStrategy.FSDP2)) or {})


def test_an_interleaved_layout_puts_two_chunks_on_each_rank() -> None:
    """Rank s holds chunks s and s + S of 2S; in flight (chunk micro-batches): torch's
    interleaved warm-up, (V - 1) * M / rounds + 2 * (S - 1 - s), and one."""
    pipeline = PipelineLayout(2, 4, "interleaved-1f1b")
    assert pipeline.virtual_stages == 2 and pipeline.chunks == 4
    assert [pipeline.chunks_of(stage) for stage in (0, 1)] == [(0, 2), (1, 3)]
    assert [pipeline.in_flight(stage) for stage in (0, 1)] == [5, 3]
    assert [PipelineLayout(4, 8, "interleaved-1f1b").in_flight(s) for s in range(4)] == [
        11,
        9,
        7,
        5,
    ]
    assert PipelineLayout(4, 2, "interleaved-1f1b").in_flight(0) == 4  # all 2 x 2
    assert PipelineLayout(2, 4).chunks_of(1) == (1,)
    layout = _layout("interleaved-1f1b", 1)
    assert "--schedule interleaved-1f1b" in layout.command_options()
    data = parallel_to_dict(layout)
    assert parallel_from_dict(json.loads(json.dumps(data))) == layout


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: PipelineLayout(2, 4, "zero-bubble"), "one of 1f1b, gpipe, interleaved-1f1b"),
        (lambda: PipelineLayout(2, 5, "interleaved-1f1b"), "not a multiple of its 2 rounds"),
        (
            lambda: ParallelLayout(
                4, ParallelStrategy.FSDP2, pipeline=PipelineLayout(2, 4, "interleaved-1f1b")
            ),
            "not yet with --parallel fsdp2",
        ),
        (lambda: PipelineLayout(1, 4), "at least 2 stages"),
        (lambda: PipelineLayout(2, 0), "microbatches must be a whole number"),
        (lambda: PipelineLayout(4, 2), "--microbatches 2 is fewer than --pp 4"),
        (lambda: PipelineLayout(2, 4, stage=2), "not one of the pipeline's 2 stages"),
        (lambda: ParallelLayout(4, ParallelStrategy.PP, pipeline=PipelineLayout(2, 4)), "one"),
        (lambda: ParallelLayout(2, ParallelStrategy.PP), "strategy pp needs a pipeline"),
        (
            lambda: ParallelLayout(6, ParallelStrategy.FSDP2, pipeline=PipelineLayout(4, 4)),
            "do not divide the world size 6",
        ),
        (
            lambda: ParallelLayout(4, ParallelStrategy.DDP, pipeline=PipelineLayout(2, 4)),
            "not with ddp",
        ),
    ],
)
def test_bad_pipeline_layouts_are_one_line_errors(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParallelLayoutError, match=message) as error:
        make()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--pp", "2", "--schedule", "interleaved"], "one of 1f1b, gpipe, interleaved-1f1b"),
        (
            ["--pp", "2", "--microbatches", "5", "--schedule", "interleaved-1f1b"],
            "not a multiple of its 2 rounds",
        ),
        (
            [
                *("--pp", "2", "--schedule", "interleaved-1f1b"),
                *("--world-size", "4", "--parallel", "fsdp2"),
            ],
            "not yet with --parallel fsdp2",
        ),
        (["--pp", "2", "--schedule", "interleaved-1f1b"], "need at least 4 blocks"),
        (["--microbatches", "2"], "--microbatches needs --pp"),
        (["--pp", "2", "--parallel", "ddp", "--world-size", "4"], "planned alone"),
        (["--pp", "2", "--world-size", "4"], "needs --world-size N --parallel fsdp2"),
        (["--pp", "3"], "need at least 3 blocks"),
        (["--pp", "2", "--microbatches", "3"], "splits into 3 equal micro-batches"),
    ],
)
def test_bad_pipeline_options_are_one_line_errors(
    options: list[str], message: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        app, ["profile", str(TP_GPT), "--budget", "1MB", "-o", str(tmp_path / "p.json"), *options]
    )
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


# -- a stage made from the model -----------------------------------------------------------
def _model():  # type: ignore[no-untyped-def]
    model_file = load_model_file(TP_GPT)
    torch.manual_seed(0)
    return model_file, model_file.build_model()


def test_stages_split_the_blocks_and_the_first_and_last_hold_the_rest() -> None:
    model_file, model = _model()
    assert stage_blocks(model, 2) == ("layers", (("layers.0",), ("layers.1",)))
    first = make_stage(_model()[1], model_file, PipelineLayout(2, 4), 0)
    last = make_stage(_model()[1], model_file, PipelineLayout(2, 4), 1)
    first_names = {name.split(".")[0] for name, _ in first.named_parameters()}
    assert first_names == {"tok_embeddings", "layers"}
    assert all(not name.startswith("layers.1") for name, _ in first.named_parameters())
    assert {name.split(".")[0] for name, _ in last.named_parameters()} == {
        "layers",
        "norm",
        "output",
    }
    assert all(not name.startswith("layers.0") for name, _ in last.named_parameters())


def test_the_stages_chained_compute_the_whole_models_loss() -> None:
    """Stage 0's output fed to stage 1 gives the unsplit model's loss, bit for bit, and
    gradients reach both stages (the same weights: each stage built from the same seed)."""
    model_file, model = _model()
    torch.manual_seed(1)
    batch = model_file.sample_batch()
    expected = model(**batch)
    first = make_stage(_model()[1], model_file, PipelineLayout(2, 4), 0)
    last = make_stage(_model()[1], model_file, PipelineLayout(2, 4), 1)
    hidden = first(**batch)
    assert hidden.shape == (4, 32, 32)
    loss = last(hidden.detach().requires_grad_(), **batch)
    assert torch.equal(loss, expected)
    loss.backward()
    assert last.get_submodule("layers.1.attention.wq").weight.grad is not None


def test_interleaved_chunks_chained_compute_the_whole_models_loss() -> None:
    """Under interleaved 1F1B rank 0 holds the embeddings and blocks 0 and 2, rank 1 blocks 1
    and 3, the norm and the head, names the model's; each rank's chunks hold their own
    parameters alone, and the four chunks chained (0, 1, 2, 3) give the unsplit model's
    loss, bit for bit."""
    model_file = load_model_file(TP_GPT4)
    pipeline = PipelineLayout(2, 4, "interleaved-1f1b")

    def built():  # type: ignore[no-untyped-def]
        torch.manual_seed(0)
        return model_file.build_model()

    torch.manual_seed(1)
    batch = model_file.sample_batch()
    expected = built()(**batch)
    ranks = [make_stage(built(), model_file, pipeline, stage) for stage in (0, 1)]
    owners = [{name.rsplit(".", 2)[0] for name, _ in rank.named_parameters()} for rank in ranks]
    assert {"tok_embeddings", "layers.0", "layers.2"} <= owners[0]
    assert not any(name.startswith(("layers.1", "layers.3", "norm")) for name in owners[0])
    assert {"layers.1", "layers.3", "norm", "output"} <= owners[1]
    views = [chunk_modules(rank, pipeline) for rank in ranks]
    for rank, chunks in zip(ranks, views, strict=True):
        held = [{id(p) for p in chunk.parameters()} for chunk in chunks]
        assert not held[0] & held[1]
        assert held[0] | held[1] == {id(p) for p in rank.parameters()}
    hidden = views[0][0](**batch)  # chunk 0
    for chunk in (views[1][0], views[0][1]):  # chunks 1 and 2
        hidden = chunk(hidden.detach(), **batch)
        assert hidden.shape == (4, 32, 32)
    loss = views[1][1](hidden.detach().requires_grad_(), **batch)  # chunk 3: the loss
    assert torch.equal(loss, expected)
    names = {name for name, _ in built().named_modules()}
    assert all({name for name, _ in rank.named_modules()} <= names for rank in ranks)


def test_one_plan_holds_every_stage_and_apply_plan_picks_a_stage_by_its_modules(
    stage_profiles,  # type: ignore[no-untyped-def]
) -> None:
    plans = []
    for stage in (0, 1):
        profile = stage_profiles[("1f1b", stage)]
        plan, _ = plan_for_budget(profile, profile.measured_peak_bytes - 8_000)
        plans.append(plan)
    plan = combined_plan(tuple(plans), _layout())
    assert plan.schema_version == STAGES_SCHEMA_VERSION and not plan.modules
    assert plan.predicted_peak_bytes == max(p.predicted_peak_bytes for p in plans)
    data = plan_to_dict(plan)
    assert [s["parallel"]["pipeline"]["stage"] for s in data["stages"]] == [0, 1]
    assert plan_from_dict(json.loads(json.dumps(data))) == plan
    # a plan without stages is written as before: no "stages", schema 1
    assert "stages" not in plan_to_dict(plans[0]) and plans[0].schema_version == 1

    model_file, _ = _model()
    for stage in (0, 1):
        module = make_stage(_model()[1], model_file, PipelineLayout(2, 4), stage)
        apply_plan(module, plan)
        wrapped = {name for name, sub in module.named_modules() if is_wrapped(sub)}
        assert wrapped == {d.module_name for d in plans[stage].modules if d.nested_in is None}
    with pytest.raises(PlanMismatchError, match="none of the plan's 2 pipeline stages"):
        apply_plan(_model()[1], plan)  # the whole model is no stage


def test_the_first_forward_guard_compares_a_stage_with_one_micro_batch(
    stage_profiles,  # type: ignore[no-untyped-def]
) -> None:
    """A stage's forward gets one micro-batch (the plan records the whole step's batch,
    4 x 32 over 4 micro-batches): that is no difference; the whole batch, fed to a stage, is
    one, and the sentence names the micro-batch's shape."""
    from planner.apply.guard import step_differences

    profile = stage_profiles[("1f1b", 0)]
    plan, _ = plan_for_budget(profile, profile.measured_peak_bytes)
    model_file, _ = _model()
    stage = make_stage(_model()[1], model_file, PipelineLayout(2, 4), 0)
    whole = model_file.sample_batch()
    assert whole["input_ids"].shape[0] == 4
    micro = {key: value[:1] for key, value in whole.items()}
    assert step_differences(stage, plan, (), micro) == []
    (difference,) = step_differences(stage, plan, (), whole)
    assert "input_ids is [4, 32] int64, the plan's was [1, 32] int64" in difference


def test_a_stage_under_fsdp2_that_fits_no_plan_names_its_gathered_weights() -> None:
    """Under a pipeline with FSDP2 torch keeps a stage's weights gathered and gradients
    unsharded across micro-batches: the one-line error for a budget below the floor says
    how much that is (the rank's shards times the 2 shards) and that more stages lower it;
    the same stage alone (one rank, no sharding) says nothing of it."""
    from planner.core.errors import InfeasibleBudgetError
    from planner.core.units import format_bytes

    model_file = load_model_file(TP_GPT)
    sharded = ParallelLayout(
        4, ParallelStrategy.FSDP2, pipeline=PipelineLayout(2, 4, "1f1b", stage=0)
    )
    profile = record_rank_memory(model_file, sharded)
    with pytest.raises(InfeasibleBudgetError) as raised:
        plan_for_budget(profile, profile.static_bytes)
    message = str(raised.value)
    assert f"parameters gathered (about {format_bytes(2 * profile.parameter_bytes)})" in message
    assert f"gradients unsharded (about {format_bytes(2 * profile.gradient_bytes)})" in message
    assert "more pipeline stages (--pp)" in message
    alone = record_rank_memory(model_file, _layout("1f1b", 0))
    with pytest.raises(InfeasibleBudgetError) as raised:
        plan_for_budget(alone, alone.static_bytes)
    assert "gathered" not in str(raised.value)


def test_a_plan_for_an_unknown_stage_is_refused(stage_profiles) -> None:  # type: ignore[no-untyped-def]
    profile = stage_profiles[("1f1b", 0)]
    plan, _ = plan_for_budget(profile, profile.measured_peak_bytes)
    only_first = combined_plan((plan,), _layout())
    model_file, _ = _model()
    last = make_stage(_model()[1], model_file, PipelineLayout(2, 4), 1)
    with pytest.raises(PlanMismatchError, match="none of the plan's 1 pipeline stages"):
        apply_plan(last, only_first)


# -- each stage simulated in its schedule --------------------------------------------------
def test_a_stage_holds_the_micro_batches_its_schedule_keeps_in_flight(
    stage_profiles,  # type: ignore[no-untyped-def]
) -> None:
    """1F1B keeps 2 micro-batches in flight on stage 0 of 2 and 1 on stage 1; GPipe keeps
    all 4 on both: the activations each stage holds above its static memory grow with it."""
    held = {key: p.measured_peak_bytes - p.static_bytes for key, p in stage_profiles.items()}
    assert held[("gpipe", 0)] > held[("1f1b", 0)] > held[("1f1b", 1)]
    assert held[("gpipe", 1)] > held[("1f1b", 1)]
    for (_, stage), profile in stage_profiles.items():
        assert profile.parallel is not None and profile.parallel.pipeline is not None
        assert profile.parallel.pipeline.stage == stage
        blocks = {record.module_name for record in profile.candidates}
        assert f"layers.{stage}" in blocks and f"layers.{1 - stage}" not in blocks


# -- the check on real ranks ---------------------------------------------------------------
@pytest.mark.ranks
@pytest.mark.parametrize(
    ("schedule", "budget", "data_parallel"),
    [  # 1F1B on its own: the recipe test below runs it on real ranks
        ("gpipe", "430000", []),
        ("1f1b", "300000", ["fsdp2"]),
        ("interleaved-1f1b", "560000", []),
    ],
)
def test_profile_checks_each_stages_plan_on_real_ranks(
    schedule: str, budget: str, data_parallel: list[str], tmp_path: Path
) -> None:
    """Each stage's plan is made on its simulated rank and checked by profile on 2 real gloo
    ranks, 4 micro-batches: every stage within the budget, its loss, gradients and buffers
    bit-identical to the unplanned pipeline's, its measured peak the predicted one to the
    byte; under 1F1B the first stage (2 in flight) recomputes more than the last (1): with
    FSDP2, 4 ranks as a (pp, dp) mesh of 2 x 2. Interleaved: the 4-block model, each
    rank running its 2 chunks (5 and 3 chunk micro-batches in flight), one plan a rank."""
    plan_path = tmp_path / "plan.json"
    options = ["--pp", "2", "--microbatches", "4", "--schedule", schedule]
    ranks = 2
    if data_parallel:
        ranks = 4
        options += ["--world-size", "4", "--parallel", "fsdp2"]
    outputs = ["-o", str(plan_path), "--report-dir", str(tmp_path / "r")]
    model = TP_GPT4 if schedule == "interleaved-1f1b" else TP_GPT
    result = CliRunner().invoke(
        app, ["profile", str(model), "--budget", budget, *options, *outputs]
    )
    assert result.exit_code == 0, result.output
    assert f"checked by running it on {ranks} real ranks" in result.stdout
    assert "pipeline stages, each planned for its own rank" in result.stdout
    plan = load_plan(plan_path)
    assert plan.checked and len(plan.stages) == 2
    assert json.loads(plan_path.read_text())["schema_version"] == STAGES_SCHEMA_VERSION
    for stage in plan.stages:
        assert stage.checked and stage.modules
        assert stage.measured_peak_bytes == stage.predicted_peak_bytes <= stage.budget_bytes
        assert stage.predicted_peak_bytes < stage.baseline_peak_bytes
    first, last = plan.stages
    if schedule != "gpipe":
        assert first.recompute_ms > last.recompute_ms
        assert first.baseline_peak_bytes > last.baseline_peak_bytes
    assert (tmp_path / "r" / "stages.png").is_file()
    assert "| 1 |" in (tmp_path / "r" / "stages.md").read_text()


@pytest.mark.ranks
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b"])
def test_the_pipeline_recipe_trains_each_stage_as_without_the_plan(
    schedule: str, tmp_path: Path
) -> None:
    """examples/recipes/pipeline_train.py makes each rank's stage, applies the one plan file
    (each stage picks its own decisions), and trains 3 steps of 1F1B (or interleaved 1F1B,
    2 chunks a rank, on the 4-block model): the last stage's losses equal the unplanned
    pipeline's, loss by loss (both runs in one launch, --compare)."""
    from planner.pipeline import profile_and_plan
    from planner.plan.plan_file import save_plan
    from tests.test_distributed import _compared

    layout = _layout(schedule)
    model, budget = (TP_GPT4, 560_000) if schedule == "interleaved-1f1b" else (TP_GPT, 330_000)
    plan = profile_and_plan(model, budget, parallel=layout, check=False).plan
    assert all(stage.modules for stage in plan.stages)
    plan_path = save_plan(plan, tmp_path / "plan.json")
    recipe = Path(__file__).resolve().parent.parent / "examples" / "recipes" / "pipeline_train.py"

    def torchrun(*arguments: str):  # type: ignore[no-untyped-def]
        environment = dict(os.environ, OMP_NUM_THREADS="1")
        root = str(Path(__file__).resolve().parent.parent)
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [root, os.environ.get("PYTHONPATH")])
        )
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc-per-node=2", str(recipe), *arguments]
        return subprocess.run(
            command, capture_output=True, text=True, env=environment, timeout=600, check=False
        )

    # One launch: each rank trains without the plan (laid out as the plan says), then with it.
    launched = torchrun(str(plan_path), "--compare")
    compared = _compared(launched)
    # each stage's first forward gets one micro-batch: the guard does not call it another batch
    assert "not the one the plan was made for" not in launched.stderr
    assert compared[0] == ([], [])  # the first stage computes no loss
    planned, unplanned = compared[1]
    assert len(planned) == 3 and planned == unplanned
