"""Hugging Face transformers models (small configs, random weights): a plan made by
ckpt-plan, run in a separate process after apply_plan, fits and leaves training unchanged.
The full three-budget sweep over all models is benchmarks/check_plans.py."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from planner.check.compare import check_plan
from planner.core.records import NoteTopic, Profile
from planner.measure.workload import load_model_file
from planner.pipeline import profile_model_file
from planner.solve.planning import baseline_every_block, plan_for_budget

pytestmark = pytest.mark.hf

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@functools.cache
def _example_profile(name: str) -> Profile:
    """The profile of ``examples/<name>.py``, made once for the tests that share it."""
    return profile_model_file(load_model_file(EXAMPLES / f"{name}.py"))


@pytest.mark.parametrize("name", ["hf_gpt2", "hf_llama"])
@pytest.mark.slow
def test_a_mid_budget_plan_fits_and_trains_identically(name: str) -> None:
    path = EXAMPLES / f"{name}.py"
    profile = _example_profile(name)
    low = baseline_every_block(profile).predicted_peak_bytes
    assert low < profile.measured_peak_bytes
    budget = (low + profile.measured_peak_bytes) // 2
    plan, _ = plan_for_budget(profile, budget)
    assert plan.modules
    check = check_plan(path, plan)
    assert check.passed, check.differences
    assert check.measured_peak_bytes <= budget
    assert (
        abs(check.measured_peak_bytes - plan.predicted_peak_bytes)
        <= 0.02 * check.measured_peak_bytes
    )


@pytest.mark.slow
def test_the_tree_program_takes_llamas_shared_rotary_inputs() -> None:
    """Every Llama layer takes the same rotary tables: under a plan they live while any
    checkpointed layer holds them. The tree program tracks that with a flag (no integer
    program needed) and agrees with the integer program at budgets across the range."""
    from planner.solve import Solver

    profile = _example_profile("hf_llama")
    # Nesting is not of prefix form (the integer program takes it, below the floor of
    # plans without it): the tree program's own search, without it. Its own answer, too:
    # the comparison with module-only plans may swap in one that recomputes fewer FLOPs
    # (not proven cheapest), depending on this CPU's measured times.
    solver = Solver(profile, nesting=False, exhaustive_evaluations=0, against_module_only=False)
    _, lowest = solver.lowest_peak()
    program = solver.tree_program()
    assert program.classes  # the shared inputs were found
    for fraction in (0.0, 0.2, 0.5, 0.8):
        budget = int(lowest + fraction * (profile.measured_peak_bytes - lowest))
        solution = solver.solve(budget)
        assert solution.proven_optimal and solution.predicted_peak_bytes <= budget
        other, proven = (
            Solver(profile, solver.memory, nesting=False).integer_program().solve(budget)
        )
        assert proven and other is not None
        assert program.quanta(solution.units) <= program.quanta(other)
    assert not solver.integer_program_used
    assert any(row is not None and row.shared.any() for row in program.rows.values())


@pytest.mark.parametrize("index", range(6))
@pytest.mark.slow
def test_predicted_peak_equals_measured_on_random_small_configs(tmp_path: Path, index: int) -> None:
    """Property test (issue 17): random small GPT-2, Llama and GPT-NeoX configs (layers,
    widths, heads and KV heads, batch and sequence, tied embeddings, dropout, use_cache,
    eager or SDPA attention), plans from the fake profile at budgets from the smallest
    feasible to the unplanned peak, each measured on a real step after apply_plan. The
    larger run is ``benchmarks/check_plans.py --hf-configs N``."""
    from tests.hf_configs import draw_configs, predicted_and_measured

    config = draw_configs(6, seed=0)[index]
    rows = predicted_and_measured(config.write(tmp_path, index), (0.0, 0.03, 0.1, 0.4, 0.8))
    for row in rows:
        assert abs(float(row["error_pct"])) <= 0.1, (config.description, row)
        assert int(row["measured_bytes"]) <= int(row["budget_bytes"]), (config.description, row)
    if "use_cache=True" in config.description:
        assert rows[0]["modules"]  # planned around the layers the cache rules out


def test_hugging_face_gradient_checkpointing_is_switched_off_and_said() -> None:
    from planner.measure.workload import switch_off_own_checkpointing

    model = load_model_file(EXAMPLES / "hf_gpt2.py").build_model()
    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing
    (note,) = switch_off_own_checkpointing(model)
    assert not model.is_gradient_checkpointing
    assert note.topic is NoteTopic.OWN_CHECKPOINTING
    assert "checkpoints itself (transformer.gradient_checkpointing, transformer.h.0." in str(note)
    assert "with model.gradient_checkpointing_disable()" in note.text


@pytest.mark.slow
def test_the_guard_names_a_bigger_batch_and_hugging_faces_own_checkpointing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As under HF Trainer with per_device_train_batch_size 8 and gradient_checkpointing=True
    on a plan made for batch 4: one warning line each, on the first step only."""
    import torch

    from planner.apply import apply_plan
    from planner.measure.workload import build_workload

    path = EXAMPLES / "hf_gpt2.py"
    model_file = load_model_file(path)
    profile = _example_profile("hf_gpt2")
    plan = baseline_every_block(profile, budget_bytes=profile.measured_peak_bytes)
    workload = build_workload(model_file, seed=0)
    model = apply_plan(workload.model, plan)
    model.gradient_checkpointing_enable()
    batch = {key: torch.cat([value, value]) for key, value in workload.batch.items()}
    model(**batch).loss.backward()
    model(**batch).loss.backward()
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ckpt-plan")]
    assert len(warnings) == 2, warnings
    assert "input_ids is [8, 128] int64, the plan's was [4, 128] int64" in warnings[0]
    assert "gradient_checkpointing" in warnings[1]


def _zoo_profile(name: str) -> Profile:
    """The memory half of the profile of the zoo's ``name`` (benchmarks/zoo_models.py), on
    fake tensors: what ``ckpt-plan profile`` records."""
    from benchmarks.zoo_models import ZOO
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from tests.models import model_file

    zoo_model = ZOO[name]
    file = model_file(zoo_model.build_model, zoo_model.sample_batch, name=f"zoo_{name}")
    workload, session = build_fake_workload(file)
    return record_memory(workload, session=session)


@pytest.mark.slow
def test_a_hybrid_models_blocks_are_its_layers_as_hugging_face_checkpoints_them() -> None:
    """Jamba's decoder layers are of two classes (Mamba, attention): its blocks are the
    entries of its layer list, the modules Hugging Face's gradient checkpointing wraps, and
    the every-block baseline checkpoints both (on this tiny config it lowers no peak: the
    step peaks outside the layers)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from benchmarks.zoo_models import ZOO

    profile = _zoo_profile("jamba")
    assert profile.block_names == ("model.layers.0", "model.layers.1")
    assert len({profile.module(name).module_type for name in profile.block_names}) == 2
    model = ZOO["jamba"].build_model()
    wrapped = tuple(
        name
        for name, module in model.named_modules()
        if isinstance(module, GradientCheckpointingLayer)
    )
    assert profile.block_names == wrapped
    assert baseline_every_block(profile).module_names == profile.block_names


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "encoder", "decoder"),
    [
        ("t5", "encoder.block", "decoder.block"),
        ("bart", "model.encoder.layers", "model.decoder.layers"),
    ],
)
def test_an_encoder_decoders_blocks_are_both_stacks_as_hugging_face_checkpoints_them(
    name: str, encoder: str, decoder: str
) -> None:
    """T5's and BART's blocks are the encoder's and the decoder's layers, two stacks (BART's
    of two classes): the modules Hugging Face's gradient checkpointing wraps."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from benchmarks.zoo_models import ZOO

    profile = _zoo_profile(name)
    assert profile.block_names == (f"{encoder}.0", f"{encoder}.1", f"{decoder}.0", f"{decoder}.1")
    assert profile.block_stacks == (2, 2)
    wrapped = tuple(
        module_name
        for module_name, module in ZOO[name].build_model().named_modules()
        if isinstance(module, GradientCheckpointingLayer)
    )
    assert profile.block_names == wrapped


@pytest.mark.slow
def test_convnexts_blocks_are_its_layers_not_its_stages() -> None:
    """Hugging Face's ConvNeXt keeps each stage's layers in a ModuleList: the blocks are those
    layers (as timm checkpoints its ConvNeXt, and as every residual block of a CNN is), and
    checkpointing them all gives a lower peak than checkpointing every stage."""
    from planner.core.records import Unit
    from planner.plan.memory_model import MemoryModel

    profile = _zoo_profile("convnext")
    stages = [f"convnext.encoder.stages.{stage}" for stage in range(4)]
    assert profile.block_names == tuple(f"{stage}.layers.{i}" for stage in stages for i in (0, 1))
    every_layer = baseline_every_block(profile).predicted_peak_bytes
    every_stage = MemoryModel.for_profile(profile).peak_bytes(Unit(stage) for stage in stages)
    assert every_layer < every_stage < profile.measured_peak_bytes
