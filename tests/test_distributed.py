"""Plans for one rank of a torchrun job (issue #12): the layout record, simulated ranks, the
world-size rule of apply_plan, bad options, and (slow) the check on 2 real gloo ranks."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from typer.testing import CliRunner

from planner.apply import apply_plan
from planner.cli.main import app
from planner.core.errors import (
    ModelFileError,
    ParallelLayoutError,
    PlanMismatchError,
    PlannerError,
)
from planner.core.loop import PLAIN_LOOP, LoopShape
from planner.core.parallel import (
    ParallelLayout,
    ParallelStrategy,
    parallel_from_dict,
    parallel_to_dict,
)
from planner.core.records import NoteTopic, StorageKind
from planner.measure.ddp import DdpOptions, ddp_bucket_bytes, ddp_options
from planner.measure.distributed import device_mesh, record_rank_memory, simulated_ranks
from planner.measure.fake import build_fake_workload
from planner.measure.profiler import record_memory
from planner.measure.step import StepMeasurement
from planner.measure.workload import load_model_file
from planner.plan.memory_model import MemoryModel
from planner.plan.plan_file import load_plan, plan_from_dict, save_plan
from planner.solve.planning import plan_for_budget
from planner.solve.solver import lowest_peak
from tests.hf_configs import TINY_EAGER_MIXTRAL

DATA = Path(__file__).parent / "data"
SMALL_GPT = DATA / "small_gpt.py"


@pytest.fixture(scope="module")
def single_profile():  # type: ignore[no-untyped-def]
    workload, session = build_fake_workload(load_model_file(SMALL_GPT))
    return record_memory(workload, session=session)


@pytest.fixture(scope="module")
def fsdp2_profiles():  # type: ignore[no-untyped-def]
    model_file = load_model_file(SMALL_GPT)
    return {size: record_rank_memory(model_file, ParallelLayout(size, "fsdp2")) for size in (2, 4)}


# -- the layout record ---------------------------------------------------------------------
def test_layout_defaults_to_a_one_dimensional_mesh_and_round_trips() -> None:
    layout = ParallelLayout(8, "fsdp2")  # type: ignore[arg-type]
    assert layout.strategy is ParallelStrategy.FSDP2
    assert layout.mesh_shape == (8,)
    assert parallel_from_dict(json.loads(json.dumps(parallel_to_dict(layout)))) == layout
    assert parallel_from_dict(None) is None


@pytest.mark.parametrize(
    ("world_size", "strategy", "mesh", "fragment"),
    [
        (0, "ddp", (), "whole number of ranks >= 1"),
        (2, "foo", (), "one of ddp, fsdp2"),
        (8, "fsdp2", (2, 2), "does not multiply"),
    ],
)
def test_bad_layouts_are_one_line_errors(
    world_size: int, strategy: str, mesh: tuple[int, ...], fragment: str
) -> None:
    with pytest.raises(ParallelLayoutError, match=fragment):
        ParallelLayout(world_size, strategy, mesh)  # type: ignore[arg-type]


def test_plans_record_the_layout_and_old_plans_load_as_one_process(
    fsdp2_profiles, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    profile = fsdp2_profiles[2]
    plan, _ = plan_for_budget(profile, profile.measured_peak_bytes)
    assert plan.parallel == ParallelLayout(2, "fsdp2")  # type: ignore[arg-type]
    path = save_plan(plan, tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert data["parallel"] == {"world_size": 2, "strategy": "fsdp2", "mesh_shape": [2]}
    assert load_plan(path) == plan
    del data["parallel"]  # a plan written before the field existed
    assert plan_from_dict(data).parallel is None


# -- simulated ranks -----------------------------------------------------------------------
def test_fsdp2_shards_static_memory_over_the_ranks(single_profile, fsdp2_profiles) -> None:  # type: ignore[no-untyped-def]
    single = single_profile.parameter_bytes
    for size, profile in fsdp2_profiles.items():
        # 1/N of every parameter, up to the padding of each shard to a whole row
        assert single / size <= profile.parameter_bytes <= single / size * 1.05
        assert profile.optimizer_state_bytes == pytest.approx(
            single_profile.optimizer_state_bytes / size, rel=0.05
        )
        assert profile.parallel == ParallelLayout(size, "fsdp2")  # type: ignore[arg-type]
        # fully_shard's classes (FSDPBlock) are shown as the model's own
        assert all(not m.module_type.startswith("FSDP") for m in profile.modules)
    assert fsdp2_profiles[4].static_bytes < fsdp2_profiles[2].static_bytes


def test_hsdp_shards_over_the_mesh_s_shard_dimension(fsdp2_profiles) -> None:  # type: ignore[no-untyped-def]
    """A 2-D mesh (replicate, shard) is HSDP: a rank holds 1/shard of each parameter,
    whatever the number of replicas; the tensor of ranks that finds a rank's row stays real
    on fake tensors (it failed there before)."""
    model_file = load_model_file(SMALL_GPT)
    hsdp = record_rank_memory(model_file, ParallelLayout(8, "fsdp2", (2, 4)))  # type: ignore[arg-type]
    assert hsdp.parallel == ParallelLayout(8, "fsdp2", (2, 4))  # type: ignore[arg-type]
    assert hsdp.parameter_bytes == fsdp2_profiles[4].parameter_bytes
    assert hsdp.static_bytes == fsdp2_profiles[4].static_bytes
    assert hsdp.measured_peak_bytes == fsdp2_profiles[4].measured_peak_bytes


def test_fsdp2_gathers_each_block_around_its_forward(single_profile, fsdp2_profiles) -> None:  # type: ignore[no-untyped-def]
    """The unsharded parameters of a block are allocated (gathered) and freed (resized to
    nothing) inside the step: the step's peak holds more than the static shards, and the
    replayed unplanned timeline is the recorded peak (checked when the profile is built)."""
    profile = fsdp2_profiles[2]
    activation = [s for s in profile.timeline.storages if str(s.kind) == "activation"]
    block_bytes = next(m for m in single_profile.modules if m.module_name == "blocks.0")
    gathered = [s for s in activation if s.size_bytes == block_bytes.parameter_bytes]
    assert gathered, "no storage the size of a whole block's parameters was gathered"
    assert MemoryModel(profile.timeline).peak_bytes() == profile.measured_peak_bytes


def test_ddp_rank_is_the_step_plus_its_gradient_buckets(single_profile) -> None:  # type: ignore[no-untyped-def]
    profile = record_rank_memory(load_model_file(SMALL_GPT), ParallelLayout(2, "ddp"))  # type: ignore[arg-type]
    buckets = single_profile.parameter_bytes  # every parameter of small_gpt is trained
    assert profile.measured_peak_bytes == single_profile.measured_peak_bytes + buckets
    assert profile.gradient_bytes == single_profile.gradient_bytes + buckets


def test_a_model_files_ddp_options_are_read_without_building_it() -> None:
    """parallelize() is stopped at DistributedDataParallel's constructor (it cannot be built
    on fake tensors); what it would have built it with is read, and a layout ckpt-plan does
    not plan for DDP is a one-line error that says what to do."""
    layout = ParallelLayout(2, "ddp")  # type: ignore[arg-type]
    with simulated_ranks(layout):
        mesh = device_mesh(layout, "cpu")

        def options(name: str) -> DdpOptions:
            model_file = load_model_file(DATA / name)
            return ddp_options(model_file, model_file.build_model(), mesh)

        assert options("small_gpt.py") == DdpOptions()
        assert options("ddp_gpt.py") == DdpOptions(
            gradient_as_bucket_view=True, from_model_file=True
        )
        with pytest.raises(ModelFileError, match="wraps a part of the model"):
            options("ddp_part.py")
        with pytest.raises(ModelFileError, match="replicate"):
            options("replicated_gpt.py")
        with pytest.raises(ModelFileError, match="builds no DistributedDataParallel"):
            options("parallelized_gpt.py")  # fully_shard: a parallelize for --parallel fsdp2
    assert torch.nn.parallel.DistributedDataParallel.__init__.__name__ == "__init__"
    # replicate() builds DDP lazily on fake tensors: the profile's path says so too
    with pytest.raises(ModelFileError, match="replicate"):
        record_rank_memory(load_model_file(DATA / "replicated_gpt.py"), layout)
    # and the other way round: a DDP parallelize under --parallel fsdp2
    with pytest.raises(ModelFileError, match=r"builds DistributedDataParallel.*--parallel ddp"):
        record_rank_memory(load_model_file(DATA / "ddp_gpt.py"), ParallelLayout(2, "fsdp2"))  # type: ignore[arg-type]


def test_gradients_as_bucket_views_leave_only_the_buckets(single_profile) -> None:  # type: ignore[no-untyped-def]
    """With gradient_as_bucket_view the gradients live in DDP's buckets: the rank ends its
    step holding one copy of them (the buckets), not two as with DDP's defaults."""
    layout = ParallelLayout(2, "ddp")  # type: ignore[arg-type]
    default = record_rank_memory(load_model_file(SMALL_GPT), layout)
    views = record_rank_memory(load_model_file(DATA / "ddp_gpt.py"), layout)
    buckets = single_profile.parameter_bytes
    assert default.gradient_bytes == single_profile.gradient_bytes + buckets
    assert views.gradient_bytes == buckets
    assert "gradients as views of the buckets" in views.assumptions[-1].text

    # each gradient the backward makes is copied into its bucket and dropped: none stays
    def made_in_step(profile):  # type: ignore[no-untyped-def]
        return [
            s for s in profile.timeline.storages if str(s.kind) == "gradient" and s.alloc_event >= 0
        ]

    assert made_in_step(default) and not made_in_step(views)


def test_a_device_mesh_a_module_keeps_is_not_the_step_s_memory() -> None:
    """DDP built with device_mesh= keeps the mesh, whose table of ranks is a tensor: the
    process group's bookkeeping, which a simulated DDP rank (no DDP built) never sees. A real
    rank counted it as a module attribute: 8 bytes above every prediction for the model file
    that builds its DDP so (tests/data/ddp_gpt.py)."""
    from planner.measure.tracking import workload_tensors

    with simulated_ranks(ParallelLayout(2, "ddp")):  # type: ignore[arg-type]
        model = torch.nn.Linear(2, 2)
        model.mesh = device_mesh(ParallelLayout(2, "ddp"), "cpu")  # type: ignore[arg-type]
        model.table = torch.zeros(3)  # any other tensor attribute still counts
        other = workload_tensors(model, None, None)[StorageKind.OTHER]
    assert [tensor.shape for tensor in other] == [torch.Size([3])]


def test_ddp_bucket_bytes_leaves_out_frozen_parameters() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)
    assert ddp_bucket_bytes(model) == (4 + 4 * 2 + 2) * 4


def test_simulated_ranks_refuse_a_running_process_group() -> None:
    layout = ParallelLayout(2, "ddp")  # type: ignore[arg-type]
    with (
        simulated_ranks(layout),
        pytest.raises(ParallelLayoutError, match="already running"),
        simulated_ranks(layout),
    ):
        pass
    assert not dist.is_initialized()


# -- apply_plan under torch.distributed ----------------------------------------------------
def test_apply_plan_refuses_a_plan_for_another_world_size(fsdp2_profiles) -> None:  # type: ignore[no-untyped-def]
    plan, _ = plan_for_budget(fsdp2_profiles[2], fsdp2_profiles[2].measured_peak_bytes)
    model = load_model_file(SMALL_GPT).build_model()
    with simulated_ranks(ParallelLayout(4, "fsdp2")):  # type: ignore[arg-type]
        with pytest.raises(PlanMismatchError, match=r"one rank of 2 .* one rank of 4"):
            apply_plan(model, plan)
        single = dataclasses.replace(plan, parallel=None)
        with pytest.raises(PlanMismatchError, match="--world-size 4"):
            apply_plan(model, single)
    with simulated_ranks(ParallelLayout(2, "fsdp2")):  # type: ignore[arg-type]
        assert apply_plan(model, plan) is model


def test_apply_plan_refuses_a_sharded_model_and_says_to_apply_first(fsdp2_profiles) -> None:  # type: ignore[no-untyped-def]
    from torch.distributed.fsdp import fully_shard

    plan, _ = plan_for_budget(fsdp2_profiles[2], fsdp2_profiles[2].measured_peak_bytes)
    model = load_model_file(SMALL_GPT).build_model()
    with simulated_ranks(ParallelLayout(2, "fsdp2")):  # type: ignore[arg-type]
        fully_shard(model)
        with pytest.raises(PlanMismatchError, match="before sharding"):
            apply_plan(model, plan)


def test_the_first_forward_refuses_a_layout_that_is_not_the_plans(fsdp2_profiles) -> None:  # type: ignore[no-untyped-def]
    """apply_plan runs before sharding and wrapping, so it cannot see the strategy; the first
    training forward can, and a plan for another strategy is a one-line error there: an
    FSDP2 plan on an unsharded model, a sharded model under a plan for DDP, a DDP plan
    outside DDP, a single-process plan inside DDP."""
    from torch.distributed.fsdp import fully_shard

    from planner.apply import layout_mismatch

    fsdp2_plan, _ = plan_for_budget(fsdp2_profiles[2], fsdp2_profiles[2].measured_peak_bytes)
    ddp_plan = dataclasses.replace(fsdp2_plan, parallel=ParallelLayout(2, "ddp"))  # type: ignore[arg-type]
    model_file = load_model_file(SMALL_GPT)
    batch = model_file.sample_batch()
    with simulated_ranks(ParallelLayout(2, "fsdp2")):  # type: ignore[arg-type]
        model = apply_plan(model_file.build_model(), fsdp2_plan)
        with pytest.raises(
            PlanMismatchError,
            match="one rank of an FSDP2 job, but the model runs as a single process",
        ):
            model(**batch)
        model = apply_plan(model_file.build_model(), fsdp2_plan)
        fully_shard(model)
        assert layout_mismatch(model, fsdp2_plan) is None
        model(**batch).backward()  # the guard passes: FSDP2, as planned
        message = layout_mismatch(model, ddp_plan)
        assert message is not None and "--parallel fsdp2" in message
        model = apply_plan(model_file.build_model(), ddp_plan)
        with pytest.raises(PlanMismatchError, match="wrap it in DistributedDataParallel"):
            model(**batch)
        wrapped = torch.nn.parallel.DistributedDataParallel(
            apply_plan(model_file.build_model(), ddp_plan)
        )
        wrapped(**batch)  # the guard passes: DDP, as planned (no backward: the group is fake)
    single_plan = dataclasses.replace(fsdp2_plan, parallel=None)
    with simulated_ranks(ParallelLayout(1, "ddp")):  # type: ignore[arg-type]
        wrapped = torch.nn.parallel.DistributedDataParallel(
            apply_plan(model_file.build_model(), single_plan)
        )
        with pytest.raises(
            PlanMismatchError,
            match=r"single process, but the model runs as one rank of a DDP job.*--parallel ddp",
        ):
            wrapped(**batch)


# -- the command line ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--world-size", "0", "--parallel", "ddp"], "whole number of ranks"),
        (["--world-size", "2", "--parallel", "foo"], "one of ddp, fsdp2"),
        (["--world-size", "2"], "--world-size needs --parallel"),
        (["--parallel", "fsdp2"], "needs --world-size"),
        (["--world-size", "8", "--parallel", "fsdp2", "--mesh", "3x4"], "does not multiply"),
        (["--world-size", "8", "--parallel", "fsdp2", "--mesh", "2*4"], "REPLICATExSHARD"),
        (["--world-size", "8", "--parallel", "ddp", "--mesh", "2x4"], "ddp takes one dimension"),
        (["--mesh", "2x4"], "--mesh needs --world-size"),
    ],
)
def test_bad_parallel_options_are_one_line_errors(
    options: list[str], fragment: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        app,
        ["profile", str(SMALL_GPT), "--budget", "8MiB", "-o", str(tmp_path / "p.json"), *options],
    )
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("options", [[], ["--world-size", "2", "--parallel", "fsdp2"]])
def test_a_model_file_that_shards_itself_is_a_one_line_error(
    options: list[str], tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        app,
        [
            "profile",
            str(DATA / "self_sharding.py"),
            "--budget",
            "8MiB",
            "-o",
            str(tmp_path / "p.json"),
            *options,
        ],
    )
    assert result.exit_code == 4
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "parallelize(model, mesh)" in lines[0], result.stderr


def _measured(peak_bytes: int, *, held: bool) -> StepMeasurement:
    return StepMeasurement(
        peak_bytes=peak_bytes,
        start_bytes=0,
        step_ms=0.0,
        loss=0.0,
        loss_tensor=torch.zeros(()),
        gradients={},
        buffers={},
        peak_held_by_other_threads=held,
    )


@pytest.mark.parametrize(
    ("first_held", "other_rank_held", "again", "expected_peak", "expected_steps"),
    [
        (False, [False], [], 1000, 0),  # no rank's peak was held: the step's own
        # held here: measured again until a peak no thread held, the lowest kept
        (True, [False, False, False], [(1040, True), (1000, False)], 1000, 2),
        # held on the other rank only: this rank measures again with it (collectives)
        (False, [True, False], [(1000, False)], 1000, 1),
        # held every time: REMEASURED_STEPS more steps, the lowest kept
        (True, [False] * 5, [(1032, True), (1040, True), (1032, True), (1036, True)], 1032, 4),
    ],
)
def test_ranks_measure_again_while_a_peak_counted_what_another_thread_held(
    first_held: bool,
    other_rank_held: list[bool],
    again: list[tuple[int, bool]],
    expected_peak: int,
    expected_steps: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gloo worker can hold a collective's buffer past the step's release, for as long as
    the scheduler keeps it waiting (ranks.py's design note): a peak that counted such a
    storage is measured again, on every rank together, and the lowest peak is kept."""
    import planner.measure.step as step
    from planner.check import ranks

    measurements = iter([_measured(peak, held=held) for peak, held in again])
    steps = []

    def measure_step(workload, **options):  # type: ignore[no-untyped-def]
        steps.append(options)
        return next(measurements)

    others = iter(other_rank_held)
    monkeypatch.setattr(step, "measure_step", measure_step)
    monkeypatch.setattr(ranks, "_any_rank", lambda flag: flag or next(others))
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    first = _measured(1000 if not first_held else 1032, held=first_held)
    peak = ranks._own_peak_bytes(None, first, seed=0, resident=[])  # type: ignore[arg-type]
    assert peak == expected_peak
    assert len(steps) == expected_steps == min(len(again), ranks.REMEASURED_STEPS)
    assert all(options["warmup_steps"] == 0 and options["seed"] == 0 for options in steps)


def test_every_step_a_rank_runs_routes_as_the_plan_assumed(
    fsdp2_profiles,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mixture-of-experts plan's routing holds for every step a rank measures: the
    unplanned and planned steps, each step measured again because another thread held a
    storage at its peak, and the allocator's cross-check. A step measured again under the
    real routing, lighter than the plan's, kept its lower peak (ranks.py's design note)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from planner.check import ranks
    from planner.core.switches import StepSwitches
    from planner.measure import step
    from planner.model_switches import RoutingAsPlanned

    plan, _ = plan_for_budget(fsdp2_profiles[2], 1 << 40)
    plan = dataclasses.replace(plan, switches=StepSwitches(expert_load=2.0))
    plan_path = save_plan(plan, tmp_path / "plan.json")
    routed: list[str] = []

    def routing() -> str:
        loads = [
            m.expert_load
            for m in _get_current_dispatch_mode_stack()
            if isinstance(m, RoutingAsPlanned)
        ]
        return f"load {loads[0]}" if loads == [2.0] else f"modes {loads}"

    def measure_step(workload, **options):  # type: ignore[no-untyped-def]
        routed.append(f"step: {routing()}")
        return _measured(1000, held=True)  # held: every step is measured again

    def allocator_peak(*arguments, **options):  # type: ignore[no-untyped-def]
        routed.append(f"allocator: {routing()}")
        return 1000

    model = torch.nn.Linear(2, 2)
    monkeypatch.setattr(ranks, "_laid_out_workload", lambda *a, **k: (None, model, [], 0))
    monkeypatch.setattr(step, "measure_step", measure_step)
    monkeypatch.setattr(ranks, "_any_rank", lambda flag: flag)
    monkeypatch.setattr(ranks, "_allocator_peak", allocator_peak)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    checked = ranks.run_rank("model.py", str(plan_path), cross_check=True)
    assert checked.training_unchanged and checked.allocator_peak_bytes == 1000
    steps = 2 * (1 + ranks.REMEASURED_STEPS)  # unplanned and planned, each measured again
    assert routed == [*["step: load 2.0"] * steps, "allocator: load 2.0"]
    assert _get_current_dispatch_mode_stack() == []


# -- real ranks (gloo, 2 processes under torchrun) -----------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "strategy", "budget", "options", "verify"),
    [
        # `make test`'s one run of real ranks; the rest run in `make test-ranks` (CI)
        ("parallelized_gpt.py", "fsdp2", "0.9MiB", [], True),
        pytest.param("small_gpt.py", "ddp", "1.2MiB", [], True, marks=pytest.mark.ranks),
        # profile's own check on 2 real ranks only (verify runs the same check again):
        # the model file's DDP, gradient views; HSDP; gradients synced each accumulation step
        pytest.param("ddp_gpt.py", "ddp", "1.2MiB", [], False, marks=pytest.mark.ranks),
        pytest.param(
            "small_gpt.py", "fsdp2", "1.1MiB", ["--mesh", "2x1"], False, marks=pytest.mark.ranks
        ),
        pytest.param(
            "small_gpt.py",
            "fsdp2",
            "1.1MiB",
            ["--grad-accum", "2"],
            False,
            marks=pytest.mark.ranks,
        ),
    ],
)
def test_profile_and_verify_on_two_real_ranks(
    model: str, strategy: str, budget: str, options: list[str], verify: bool, tmp_path: Path
) -> None:
    """The plan is made for one simulated rank, checked on 2 real ranks by profile, then by
    verify --nproc 2: every rank within the budget, bit-identical to the unplanned step."""
    plan_path = tmp_path / "plan.json"
    runner = CliRunner()
    profiled = runner.invoke(
        app,
        [
            "profile",
            str(DATA / model),
            "--budget",
            budget,
            "--world-size",
            "2",
            "--parallel",
            strategy,
            *options,
            "-o",
            str(plan_path),
            "--report-dir",
            str(tmp_path / "r"),
        ],
    )
    assert profiled.exit_code == 0, profiled.output
    plan = load_plan(plan_path)
    assert plan.checked and plan.modules
    assert plan.measured_peak_bytes is not None
    assert plan.measured_peak_bytes <= plan.budget_bytes
    # the simulated rank predicts each real rank's peak within 2%
    assert plan.measured_peak_bytes == pytest.approx(plan.predicted_peak_bytes, rel=0.02)
    if not verify:
        return
    verified = runner.invoke(app, ["verify", str(DATA / model), str(plan_path), "--nproc", "2"])
    assert verified.exit_code == 0, verified.output
    assert verified.stdout.count("bit-identical") == 2


@pytest.mark.hf
@pytest.mark.ranks
def test_an_eager_mixture_of_experts_rank_plan_checks_on_two_real_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """profile --hf on a tiny eager Mixtral for one FSDP2 rank of 2, its busiest expert at
    twice its share: checked on 2 real gloo ranks under that routing, each rank measures the
    simulated rank's peaks to the byte (planned and unplanned; balanced routing's would
    differ), within the budget, its loss, gradient shards and buffers as unplanned."""
    from planner.check.ranks import RanksCheck
    from planner.measure.hf import hf_workload
    from planner.pipeline import check_plan_on_ranks

    config = tmp_path / "mixtral-eager.json"
    config.write_text(json.dumps(TINY_EAGER_MIXTRAL), encoding="utf-8")
    layout = ParallelLayout(2, "fsdp2")  # type: ignore[arg-type]
    model_file = load_model_file(hf_workload(config, 2, 32, None))
    busier, balanced = (
        record_rank_memory(model_file, layout, expert_load=load) for load in (2.0, 1.0)
    )
    assert busier.measured_peak_bytes != balanced.measured_peak_bytes
    budget = (lowest_peak(busier) + busier.measured_peak_bytes) // 2
    checks: list[RanksCheck] = []

    def checked_on_ranks(*arguments, **options):  # type: ignore[no-untyped-def]
        checks.append(check_plan_on_ranks(*arguments, **options))
        return checks[-1]

    monkeypatch.setattr("planner.pipeline.check_plan_on_ranks", checked_on_ranks)
    plan_path = tmp_path / "plan.json"
    result = CliRunner().invoke(
        app,
        [
            "profile",
            "--hf",
            str(config),
            "--batch-size",
            "2",
            "--seq-len",
            "32",
            "--budget",
            str(budget),
            "--world-size",
            "2",
            "--parallel",
            "fsdp2",
            "--expert-load",
            "2",
            "-o",
            str(plan_path),
            "--report-dir",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 0, result.output
    plan = load_plan(plan_path)
    assert plan.modules and plan.checked and plan.parallel == layout
    assert plan.switches.expert_load == 2.0
    (check,) = checks  # the first plan measured as predicted: no re-plan
    assert [rank.rank for rank in check.ranks] == [0, 1]
    for rank in check.ranks:
        assert rank.measured_peak_bytes == plan.predicted_peak_bytes <= budget
        # The unplanned reference step is measured once, not re-measured like the plan's: on
        # a loaded machine a gloo thread can still hold an all-gather buffer at its peak
        # (seen: +151,040 B in one fresh-clone `make test`), never less than predicted.
        assert rank.unplanned_peak_bytes >= busier.measured_peak_bytes
        assert rank.training_unchanged, rank.differences


# -- a rank that fails -------------------------------------------------------------------
@pytest.mark.ranks
@pytest.mark.parametrize(
    ("failure", "said"),
    [
        # an exception: the rank writes it, with its traceback, and exits non-zero
        ("raise", "on rank 1 failed: .*rank one cannot build its model"),
        # killed: no word from the rank; torchrun's summary names it and the signal
        ("kill", r"rank 1 exited with code -9 \(Signal 9 \(SIGKILL\)\)"),
    ],
)
def test_a_failing_rank_is_named_with_its_error_and_stops_the_others(
    failure: str,
    said: str,
    fsdp2_profiles,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rank 1 fails as it builds its model; rank 0 is by then waiting for it in a collective.
    The error names rank 1 and what it said, in one line; --verbose (INFO) shows its
    traceback or torchrun's output; rank 0 is stopped, not left to gloo's 30-minute timeout."""
    from planner.check.ranks import check_plan_on_ranks

    plan, _ = plan_for_budget(fsdp2_profiles[2], fsdp2_profiles[2].measured_peak_bytes)
    monkeypatch.setenv("CKPT_PLAN_TEST_RANK_FAILURE", failure)
    caplog.set_level(logging.INFO, logger="planner.check")  # the rank check and its child
    with pytest.raises(PlannerError, match=said) as raised:
        check_plan_on_ranks(DATA / "failing_rank.py", plan, timeout_s=300)
    assert "\n" not in str(raised.value) and "ChildFailedError" not in str(raised.value)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    if failure == "raise":
        assert "rank 1's traceback:" in logged and 'failing_rank.py", line' in logged
    assert "torchrun's output:" in logged


@pytest.mark.parametrize(
    ("stderr", "said"),
    [
        (
            "[default1]:Traceback (most recent call last):\n"
            '[default1]:  File "x.py", line 6, in <module>\n'
            "[default1]:RuntimeError: Connection closed by peer [127.0.0.1]:1234\n"
            "[default0]:ValueError: not the root cause\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "Failures:\n  <NO_OTHER_FAILURES>\n"
            "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n"
            "  exitcode  : 1 (pid: 7468)\n  error_file: <N/A>\n"
            "  traceback : To enable traceback see: https://pytorch.org/docs/elastic/errors\n",
            "rank 1 exited with code 1: RuntimeError: Connection closed by peer [127.0.0.1]:1234",
        ),
        (
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n"
            "  exitcode  : -11 (pid: 7468)  (SIGSEGV)\n  error_file: <N/A>\n"
            "  traceback : Signal 11 (SIGSEGV) received by PID 7468\n",
            "rank 0 exited with code -11 (Signal 11 (SIGSEGV))",
        ),
        ("something went wrong\n\n", "something went wrong"),
        ("", "no output"),
    ],
)
def test_torchrun_failure_is_one_line_naming_the_root_cause(stderr: str, said: str) -> None:
    from planner.check.ranks import torchrun_failure

    assert torchrun_failure(stderr) == said


# -- the torchrun recipe (examples/recipes/torchrun_train.py) -------------------------------
RECIPE = Path(__file__).resolve().parent.parent / "examples" / "recipes" / "torchrun_train.py"


def _torchrun(nproc: int, *arguments: str) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    root = str(Path(__file__).resolve().parent.parent)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={nproc}", str(RECIPE), *arguments]
    return subprocess.run(
        command, capture_output=True, text=True, env=environment, timeout=600, check=False
    )


def _losses(result: subprocess.CompletedProcess[str]) -> dict[int, list[float]]:
    assert result.returncode == 0, result.stderr[-2000:]
    # torchrun merges the ranks' stdout: two lines printed at once can share a line.
    found = re.findall(r'\{"rank": \d+, "losses": \[[^\]]*\]\}', result.stdout)
    lines = [json.loads(text) for text in found]
    return {line["rank"]: line["losses"] for line in lines}


def _compared(
    result: subprocess.CompletedProcess[str],
) -> dict[int, tuple[list[float], list[float]]]:
    """Each rank's losses with the plan and without it, from one `--compare` launch."""
    assert result.returncode == 0, result.stderr[-2000:]
    losses = r"\[[^\]]*\]"
    pattern = rf'\{{"rank": \d+, "unplanned_losses": {losses}, "losses": {losses}, "equal": \w+\}}'
    lines = [json.loads(text) for text in re.findall(pattern, result.stdout)]
    for line in lines:
        assert line["equal"] is (line["losses"] == line["unplanned_losses"])
    return {line["rank"]: (line["losses"], line["unplanned_losses"]) for line in lines}


@pytest.mark.ranks
@pytest.mark.parametrize(
    ("strategy", "loop"),
    [
        ("fsdp2", PLAIN_LOOP),
        ("ddp", PLAIN_LOOP),
        # Hugging Face's Trainer's accumulation: no sync before the last micro-batch
        ("fsdp2", LoopShape(grad_accum=3, no_sync=True)),
    ],
    ids=["fsdp2", "ddp", "fsdp2-no-sync"],
)
def test_the_torchrun_recipe_trains_each_rank_as_without_the_plan(
    strategy: str, loop: LoopShape, tmp_path: Path
) -> None:
    from planner.pipeline import profile_and_plan

    layout = ParallelLayout(2, strategy)  # type: ignore[arg-type]
    probe = record_rank_memory(load_model_file(SMALL_GPT), layout, loop=loop)
    budget = (lowest_peak(probe) + probe.measured_peak_bytes) // 2
    plan = profile_and_plan(SMALL_GPT, budget, parallel=layout, check=False, loop=loop).plan
    assert plan.modules and plan.loop == loop
    plan_path = save_plan(plan, tmp_path / "plan.json")
    model = ("--model", str(SMALL_GPT))
    # One launch: each rank trains without the plan (laid out as the plan says), then with it.
    compared = _compared(_torchrun(2, str(plan_path), *model, "--compare"))
    assert set(compared) == {0, 1}
    for planned, unplanned in compared.values():
        assert len(planned) == 3 and planned == unplanned  # loss by loss, on every rank
    if strategy == "ddp":  # without a plan, laid out as --parallel says: the same losses
        assert _losses(_torchrun(2, *model, "--parallel", strategy)) == {
            rank: unplanned for rank, (_, unplanned) in compared.items()
        }


@pytest.mark.ranks
def test_the_torchrun_recipe_refuses_a_plan_for_another_world_size(
    fsdp2_profiles, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    plan, _ = plan_for_budget(fsdp2_profiles[2], fsdp2_profiles[2].measured_peak_bytes)
    plan_path = save_plan(plan, tmp_path / "plan.json")
    result = _torchrun(1, str(plan_path), "--model", str(SMALL_GPT))
    assert result.returncode != 0
    assert "made for one rank of 2 (fsdp2), but this process is one rank of 1" in result.stderr


@pytest.mark.slow
def test_a_plan_for_more_ranks_than_run_here_is_marked_unchecked() -> None:
    from planner.pipeline import MAX_CHECKED_RANKS, profile_and_plan

    layout = ParallelLayout(MAX_CHECKED_RANKS * 2, "fsdp2")  # type: ignore[arg-type]
    probe = record_rank_memory(load_model_file(SMALL_GPT), layout)
    budget = (lowest_peak(probe) + probe.measured_peak_bytes) // 2
    plan = profile_and_plan(SMALL_GPT, budget, parallel=layout).plan
    assert not plan.checked and plan.measured_peak_bytes is None
    assert plan.parallel == layout
    assert any(
        "--nproc 8" in note.text and note.topic is NoteTopic.UNCHECKED for note in plan.notes
    )


@pytest.mark.slow
def test_a_rank_of_a_job_on_a_target_device_is_emulated_and_timed_by_its_roofline() -> None:
    """--world-size with --target: one rank of an 8-rank FSDP2 job on H100s, its step
    emulated on fake tensors (CUDA's storage blocks, the target's workspaces) and its times
    from the target's roofline; nothing runs, so the plan is unchecked."""
    from planner.core.records import CostSource
    from planner.pipeline import profile_model_file
    from planner.plan.targets import load_spec

    target = load_spec("h100-80gb")
    layout = ParallelLayout(8, "fsdp2")  # type: ignore[arg-type]
    profile = profile_model_file(load_model_file(SMALL_GPT), target=target, parallel=layout)
    on_cpu = record_rank_memory(load_model_file(SMALL_GPT), layout)
    assert profile.cost_source is CostSource.ROOFLINE and profile.target == target.name
    assert profile.parallel == layout and profile.device.startswith("cuda")
    assert profile.workspace_bytes == target.workspace_bytes > 0
    assert profile.measured_peak_bytes > on_cpu.measured_peak_bytes  # + workspaces, blocks


@pytest.mark.slow
def test_profile_says_a_plan_for_more_ranks_than_run_here_was_not_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "profile",
            str(SMALL_GPT),
            "--budget",
            "1MiB",
            "--world-size",
            "8",
            "--parallel",
            "fsdp2",
            "--mesh",
            "2x4",
            "-o",
            str(tmp_path / "plan.json"),
            "--report-dir",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "one rank of 8 (fsdp2, mesh 2x4)" in result.stdout
    assert "not run: made for 8 ranks" in result.stdout
    assert "--nproc 8" in result.stdout
    assert load_plan(tmp_path / "plan.json").parallel == ParallelLayout(8, "fsdp2", (2, 4))  # type: ignore[arg-type]


@pytest.mark.ranks
def test_fit_and_solve_plan_one_rank_and_check_it_on_real_ranks(tmp_path: Path) -> None:
    """fit --world-size/--parallel fits the batch size of one rank (its times estimated from
    the ops, as profile's are for a rank) and checks the plan on the real ranks; solve on a
    rank's profile keeps its layout and checks on ranks too."""
    runner = CliRunner()
    fitted = runner.invoke(
        app,
        [
            "fit",
            "--budget",
            "2MiB",
            str(SMALL_GPT),
            "--world-size",
            "2",
            "--parallel",
            "fsdp2",
            "--max-size",
            "16",
            "-o",
            str(tmp_path / "fit.json"),
        ],
    )
    assert fitted.exit_code == 0, fitted.output
    assert "a rank's step is not timed alone" in fitted.stdout
    assert "--world-size 2 --parallel fsdp2" in fitted.stdout  # the command that plans it
    plan = load_plan(tmp_path / "fit.json")
    assert plan.parallel == ParallelLayout(2, "fsdp2")  # type: ignore[arg-type]
    assert plan.checked and plan.measured_peak_bytes is not None
    assert plan.measured_peak_bytes <= plan.budget_bytes

    layout = ParallelLayout(2, "fsdp2", (2, 1))  # type: ignore[arg-type]
    probe = record_rank_memory(load_model_file(SMALL_GPT), layout)
    profile_path = tmp_path / "profile.json"
    from planner.pipeline import estimated_costs
    from planner.plan.profile_file import save_profile

    save_profile(estimated_costs(probe, "cpu"), profile_path)
    budget = (lowest_peak(probe) + probe.measured_peak_bytes) // 2
    solved = runner.invoke(
        app,
        [
            "solve",
            str(profile_path),
            "--budget",
            str(budget),
            "--check",
            str(SMALL_GPT),
            "-o",
            str(tmp_path / "solved.json"),
        ],
    )
    assert solved.exit_code == 0, solved.output
    plan = load_plan(tmp_path / "solved.json")
    assert plan.parallel == layout and plan.checked
    assert plan.measured_peak_bytes == pytest.approx(plan.predicted_peak_bytes, rel=0.02)
    assert plan.measured_peak_bytes <= budget
