"""Plans for one rank of a job with tensor parallelism (issue #30): the layout record, TP
simulated on a fake process group (DTensors on fake tensors), the first-forward guard, bad
options, and (slow) the check on real gloo ranks: TP 2 on 2 ranks, FSDP 2 x TP 2 on 4."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.apply import apply_plan
from planner.cli.main import app
from planner.core.errors import ModelFileError, ParallelLayoutError, PlanMismatchError
from planner.core.parallel import (
    ParallelLayout,
    ParallelStrategy,
    parallel_from_dict,
    parallel_to_dict,
)
from planner.measure.distributed import device_mesh, record_rank_memory, simulated_ranks
from planner.measure.workload import load_model_file
from planner.plan.memory_model import MemoryModel
from planner.plan.plan_file import load_plan
from planner.solve.planning import plan_for_budget

DATA = Path(__file__).parent / "data"
TP_GPT = DATA / "tp_gpt.py"

TP2 = ParallelLayout(2, ParallelStrategy.TP)
FSDP2_TP2 = ParallelLayout(4, ParallelStrategy.FSDP2, tp=2)


@pytest.fixture(scope="module")
def tp_profiles():  # type: ignore[no-untyped-def]
    model_file = load_model_file(TP_GPT)
    return {layout: record_rank_memory(model_file, layout) for layout in (TP2, FSDP2_TP2)}


# -- the layout record ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("layout", "mesh", "names", "options"),
    [
        (TP2, (2,), ("tp",), "--tp 2"),
        (FSDP2_TP2, (2, 2), ("dp", "tp"), "--world-size 4 --parallel fsdp2 --tp 2"),
        (
            ParallelLayout(16, ParallelStrategy.FSDP2, (2, 2, 4), tp=4),
            (2, 2, 4),
            ("replicate", "shard", "tp"),
            "--world-size 16 --parallel fsdp2 --mesh 2x2 --tp 4",
        ),
        (
            ParallelLayout(8, ParallelStrategy.FSDP2),
            (8,),
            ("dp",),
            "--world-size 8 --parallel fsdp2",
        ),
    ],
)
def test_a_tp_layout_has_its_mesh_names_and_round_trips(
    layout: ParallelLayout, mesh: tuple[int, ...], names: tuple[str, ...], options: str
) -> None:
    assert layout.mesh_shape == mesh
    assert layout.mesh_dim_names == names
    assert layout.command_options() == options
    data = json.loads(json.dumps(parallel_to_dict(layout)))
    assert ("tp" in data) == (layout.tp > 1)  # plans without TP are written as before
    assert parallel_from_dict(data) == layout


def test_a_layout_written_before_tp_reads_as_tp_1() -> None:
    layout = parallel_from_dict({"world_size": 4, "strategy": "fsdp2", "mesh_shape": [2, 2]})
    assert layout == ParallelLayout(4, ParallelStrategy.FSDP2, (2, 2))
    assert layout is not None and layout.tp == 1 and layout.mesh_dim_names == ("replicate", "shard")


@pytest.mark.parametrize(
    ("world_size", "strategy", "mesh", "tp", "fragment"),
    [
        (4, "ddp", (), 2, "not under ddp"),
        (6, "fsdp2", (), 4, "does not divide the world size"),
        (8, "fsdp2", (4, 2), 4, "does not end in the tensor-parallel degree 4"),
        (4, "tp", (), 2, "not the world size 4"),
        (4, "fsdp2", (), 0, "whole number >= 1"),
        (16, "fsdp2", (2, 2, 2, 2), 2, "not planned for fsdp2"),
    ],
)
def test_bad_tp_layouts_are_one_line_errors(
    world_size: int, strategy: str, mesh: tuple[int, ...], tp: int, fragment: str
) -> None:
    with pytest.raises(ParallelLayoutError, match=fragment):
        ParallelLayout(world_size, strategy, mesh, tp)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--tp", "2", "--world-size", "4"], "--tp 2 alone is one group of 2 ranks"),
        (["--tp", "2", "--world-size", "4", "--parallel", "ddp"], "not under ddp"),
        (["--tp", "3", "--world-size", "4", "--parallel", "fsdp2"], "does not divide"),
        (["--tp", "2", "--mesh", "2x2"], "--tp 2 alone"),
    ],
)
def test_bad_tp_options_are_one_line_errors(
    options: list[str], fragment: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        app, ["profile", str(TP_GPT), "--budget", "8MiB", "-o", str(tmp_path / "p.json"), *options]
    )
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], lines
    assert not (tmp_path / "p.json").exists()


# -- simulated ranks -----------------------------------------------------------------------
def _shard_bytes(layout: ParallelLayout) -> int:
    """A rank's parameter bytes by the closed form of tp_gpt's layout: every weight matrix
    split over the TP ranks (column- or row-wise) and over the data-parallel shards, the
    norms' weights replicated over TP and split over the data-parallel shards only."""
    model = load_model_file(TP_GPT).build_model()
    dp = layout.world_size // layout.tp
    return sum(
        p.numel() * p.element_size() // (dp if p.dim() == 1 else dp * layout.tp)
        for p in model.parameters()
    )


def test_a_tp_rank_holds_its_shards_and_no_copy_of_a_waited_collective(tp_profiles) -> None:  # type: ignore[no-untyped-def]
    """The rank's parameters are its DTensor shards (the closed form); its collectives'
    outputs are one storage each, as on a real rank: waiting on one returns it (on fake
    tensors wait_tensor's own kernel made a copy of every one, 24 KiB above a real rank's
    peak); the replayed unplanned timeline is the recorded peak."""
    for layout, profile in tp_profiles.items():
        assert profile.parallel == layout
        assert profile.parameter_bytes == _shard_bytes(layout)
        # AdamW: two moments of each shard, and a 4-byte step counter per parameter
        steps = 4 * sum(1 for _ in load_model_file(TP_GPT).build_model().parameters())
        assert profile.optimizer_state_bytes == 2 * _shard_bytes(layout) + steps
        ops = {s.alloc_op for s in profile.timeline.storages}
        assert "_c10d_functional.all_gather_into_tensor.default" in ops
        assert "_c10d_functional.reduce_scatter_tensor.default" in ops
        assert not any("wait_tensor" in op for op in ops)
        assert MemoryModel(profile.timeline).peak_bytes() == profile.measured_peak_bytes
        assert all(not m.module_type.startswith("FSDP") for m in profile.modules)


def test_tp_sequence_parallel_saves_the_gathered_block_inputs(tp_profiles) -> None:  # type: ignore[no-untyped-def]
    """With sequence parallelism a block takes the rank's 1/T of the sequence, and its
    attention the whole sequence, all-gathered (by PrepareModuleInput's hook, before the
    attention's forward: outside what checkpointing the attention recomputes) and saved for
    the backward of the column-wise projections; checkpointing the block frees it."""
    profile = tp_profiles[TP2]
    timeline = profile.timeline

    def first_input(name: str) -> int:
        call = next(c for c in timeline.calls if c.module_name == name)
        return call.input_storages[0]

    block, attention = first_input("layers.0"), first_input("layers.0.attention")
    assert timeline.storages[attention].size_bytes == 2 * timeline.storages[block].size_bytes
    assert attention in {t.storage for t in timeline.saved_tensors}
    calls = {c.module_name: i for i, c in reversed(list(enumerate(timeline.calls)))}
    assert timeline.storages[attention].alloc_call == calls["layers.0"]
    record = next(m for m in profile.modules if m.module_name == "layers.0")
    assert record.checkpoint_saving_bytes >= timeline.storages[attention].size_bytes


def test_a_parallelize_that_ignores_the_tp_dimension_is_a_one_line_error() -> None:
    """parallelized_gpt.py's parallelize gives fully_shard the whole mesh: on ("dp", "tp")
    that is HSDP over tp, not tensor parallelism, and small_gpt.py has no parallelize."""
    with pytest.raises(ModelFileError, match=r"shards no parameter over the mesh's \"tp\""):
        record_rank_memory(load_model_file(DATA / "parallelized_gpt.py"), FSDP2_TP2)
    with pytest.raises(ModelFileError, match=r"defines no parallelize\(model, mesh\).*--tp 2"):
        record_rank_memory(load_model_file(DATA / "small_gpt.py"), TP2)


# -- apply_plan and the first forward ------------------------------------------------------
def test_apply_plan_goes_on_before_tp_and_the_first_forward_checks_the_layout(
    tp_profiles,  # type: ignore[no-untyped-def]
) -> None:
    """apply_plan refuses a model TP has laid out (apply first); the first forward of a TP
    plan refuses a model that is not tensor-parallel, and a plan without TP refuses one that
    is; the layout the plan was made for passes."""
    from planner.apply import layout_mismatch

    profile = tp_profiles[TP2]
    plan, _ = plan_for_budget(profile, profile.measured_peak_bytes)
    model_file = load_model_file(TP_GPT)
    batch = model_file.sample_batch()
    with simulated_ranks(TP2):
        mesh = device_mesh(TP2, "cpu")
        laid_out = model_file.parallelize(model_file.build_model(), mesh)
        with pytest.raises(PlanMismatchError, match="before laying the model out"):
            apply_plan(laid_out, plan)
        model = model_file.parallelize(apply_plan(model_file.build_model(), plan), mesh)
        assert layout_mismatch(model, plan) is None
        unlaid = apply_plan(model_file.build_model(), plan)
        with pytest.raises(PlanMismatchError, match="one rank of a tensor-parallel job, but"):
            unlaid(**batch)
    fsdp_plan, _ = plan_for_budget(
        tp_profiles[FSDP2_TP2], tp_profiles[FSDP2_TP2].measured_peak_bytes
    )
    with simulated_ranks(FSDP2_TP2):
        from torch.distributed.fsdp import fully_shard

        model = apply_plan(model_file.build_model(), fsdp_plan)
        fully_shard(model, mesh=device_mesh(FSDP2_TP2, "cpu")["dp"])  # FSDP without TP
        message = layout_mismatch(model, fsdp_plan)
        assert message is not None and "tensor parallelism of degree 2" in message
        assert "mesh of shape 2" in message
        model = model_file.parallelize(
            apply_plan(model_file.build_model(), fsdp_plan), device_mesh(FSDP2_TP2, "cpu")
        )
        assert layout_mismatch(model, fsdp_plan) is None
        # a plan without TP: FSDP2 with TP is refused, HSDP on the same 2 x 2 mesh is not
        hsdp = ParallelLayout(4, ParallelStrategy.FSDP2, (2, 2))
        no_tp = dataclasses.replace(fsdp_plan, parallel=ParallelLayout(4, ParallelStrategy.FSDP2))
        message = layout_mismatch(model, no_tp)
        assert message is not None and "(no tensor parallelism)" in message
        hsdp_model = apply_plan(model_file.build_model(), no_tp)
        fully_shard(hsdp_model, mesh=device_mesh(hsdp, "cpu"))
        assert layout_mismatch(hsdp_model, no_tp) is None


# -- real ranks (gloo, under torchrun) -----------------------------------------------------
@pytest.mark.ranks
@pytest.mark.parametrize(
    ("options", "budget", "ranks"),
    [
        (["--tp", "2"], "0.52MB", 2),
        (["--world-size", "4", "--parallel", "fsdp2", "--tp", "2"], "0.48MB", 4),
    ],
)
def test_profile_checks_a_tp_plan_on_real_ranks(
    options: list[str], budget: str, ranks: int, tmp_path: Path
) -> None:
    """The plan is made for one simulated rank and checked by profile on the real ranks:
    every rank within the budget, its loss, gradient shards and buffers bit-identical to the
    unplanned distributed step's, and its measured peak the predicted one to the byte."""
    plan_path = tmp_path / "plan.json"
    result = CliRunner().invoke(
        app,
        [
            "profile",
            str(TP_GPT),
            "--budget",
            budget,
            *options,
            "-o",
            str(plan_path),
            "--report-dir",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"checked by running it on {ranks} real ranks" in result.stdout
    plan = load_plan(plan_path)
    assert plan.checked and plan.modules and plan.parallel is not None
    assert plan.parallel.tp == 2 and plan.parallel.world_size == ranks
    assert json.loads(plan_path.read_text())["parallel"]["tp"] == 2
    assert plan.measured_peak_bytes == plan.predicted_peak_bytes <= plan.budget_bytes
    assert plan.predicted_peak_bytes < plan.baseline_peak_bytes


@pytest.mark.ranks
def test_the_torchrun_recipe_trains_fsdp2_x_tp_ranks_as_without_the_plan(tmp_path: Path) -> None:
    """examples/recipes/torchrun_train.py applies an FSDP2 x TP plan, builds the plan's mesh
    (here 1 x 2: a 4-rank job would take twice as long; profile's check runs 2 x 2) and the
    model file's parallelize lays the model out on it: every rank's losses equal the
    unplanned job's, loss by loss (both runs in one launch, --compare)."""
    from planner.plan.plan_file import save_plan
    from planner.solve.solver import lowest_peak
    from tests.test_distributed import _compared, _torchrun

    layout = ParallelLayout(2, ParallelStrategy.FSDP2, tp=2)
    profile = record_rank_memory(load_model_file(TP_GPT), layout)
    plan, _ = plan_for_budget(profile, (lowest_peak(profile) + profile.measured_peak_bytes) // 2)
    assert plan.modules and plan.parallel == layout and layout.mesh_shape == (1, 2)
    plan_path = save_plan(plan, tmp_path / "plan.json")
    model = ("--model", str(TP_GPT))
    compared = _compared(_torchrun(2, str(plan_path), *model, "--compare"))
    assert set(compared) == {0, 1}
    for planned, unplanned in compared.values():
        assert len(planned) == 3 and planned == unplanned


# -- Hugging Face Llama-family models: the built-in plan ------------------------------------
CONFIGS = Path(__file__).resolve().parent.parent / "examples" / "configs"


def _hf(config: Path, seq_len: int = 64):  # type: ignore[no-untyped-def]
    from planner.measure.hf import hf_workload

    return load_model_file(hf_workload(config, 2, seq_len, None))


@pytest.mark.hf
def test_a_hf_llama_rank_holds_its_shards_by_the_built_in_plan() -> None:
    """Without a model file, --hf Llama takes torchtitan's Llama layout: every projection,
    the embedding and lm_head split over TP, the norms replicated; under FSDP2 all of it
    split over the data-parallel shards too. The rank's parameters are the closed form."""
    model_file = _hf(CONFIGS / "tiny-llama.json")
    model = model_file.build_model()
    for layout in (TP2, FSDP2_TP2):
        profile = record_rank_memory(model_file, layout)
        dp = layout.world_size // layout.tp
        assert profile.parameter_bytes == sum(
            p.numel() * p.element_size() // (dp if p.dim() == 1 else dp * layout.tp)
            for p in model.parameters()
        )
        assert "built-in tensor-parallel plan for Llama" in profile.assumptions[-1].text
        assert MemoryModel(profile.timeline).peak_bytes() == profile.measured_peak_bytes


@pytest.mark.hf
def test_the_built_in_plan_refuses_what_it_cannot_split(tmp_path: Path) -> None:
    """A model not laid out like Llama, tied embeddings, head counts the TP degree does not
    divide, and parameters the plan would not lay out are one-line errors naming the fix."""
    with pytest.raises(ModelFileError, match="not laid out like Llama"):
        record_rank_memory(_hf(CONFIGS / "gpt2.json", 32), TP2)
    with pytest.raises(ModelFileError, match="2 key/value heads, which tensor parallelism of"):
        record_rank_memory(_hf(CONFIGS / "tiny-llama.json"), ParallelLayout(4, "tp"))  # type: ignore[arg-type]
    config = json.loads((CONFIGS / "tiny-llama.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    with pytest.raises(ModelFileError, match="ties its embedding and lm_head"):
        record_rank_memory(_hf(tmp_path / "config.json"), TP2)
    # Qwen3: Llama's modules, and per-head norms the plan would leave unreduced over TP
    qwen3 = {**config, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(qwen3))
    with pytest.raises(ModelFileError, match=r"does not lay out \(model.layers.0.self_attn.q_norm"):
        record_rank_memory(_hf(tmp_path / "config.json"), TP2)


@pytest.mark.hf
@pytest.mark.ranks
def test_profile_checks_a_hf_llama_tp_plan_on_real_ranks(tmp_path: Path) -> None:
    """--hf CONFIG --tp 2: the built-in plan, simulated, then checked on 2 real ranks: both
    within the budget, bit-identical to the unplanned step, predicted to the byte."""
    plan_path = tmp_path / "plan.json"
    result = CliRunner().invoke(
        app,
        [
            "profile",
            "--hf",
            str(CONFIGS / "tiny-llama.json"),
            "--batch-size",
            "2",
            "--seq-len",
            "64",
            "--tp",
            "2",
            "--budget",
            "3.2MB",
            "-o",
            str(plan_path),
            "--report-dir",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 0, result.output
    plan = load_plan(plan_path)
    assert plan.checked and plan.modules and plan.parallel == TP2
    assert plan.measured_peak_bytes == plan.predicted_peak_bytes <= plan.budget_bytes
    assert plan.predicted_peak_bytes < plan.baseline_peak_bytes
