"""FlexAttention (``torch.nn.attention.flex_attention``): its higher-order operators pass
through every dispatch mode of the recording and the plan check as one op each
(:mod:`planner.dispatch`), recorded on fake tensors as the real step runs them, planned
for CUDA from this CPU, and saved by the attention policies.

torch 2.13 refuses FlexAttention's backward on CPU tensors (a check of the device, before
its operator runs; CUDA trains it). The tests that run the step for real here lift that
refusal (``cpu_backward``): the operator's CPU implementation then trains, and the fake
step, the plan's prediction and the real step are compared to the byte."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from planner.core.records import Unit
from planner.measure.fake import build_fake_workload
from planner.measure.profiler import profile_workload, record_memory
from planner.measure.tracking import allocated_bytes
from planner.measure.workload import build_workload, load_model_file
from tests.models import memory_profile

DATA = Path(__file__).resolve().parent / "data"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MODEL = DATA / "flex_blocks.py"


@pytest.fixture
def cpu_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lift torch's refusal of FlexAttention's backward on CPU tensors (see above)."""
    import torch.nn.attention.flex_attention as flex

    monkeypatch.setattr(flex, "_validate_device", lambda query, key, value: None)


def _constants() -> object:
    spec = importlib.util.spec_from_file_location("flex_blocks_constants", MODEL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fake_step_records_the_real_one_exactly(cpu_backward: None) -> None:
    source = load_model_file(MODEL)
    workload, session = build_fake_workload(source, "cpu")
    fake = record_memory(workload, session=session)
    real = profile_workload(build_workload(source, seed=0), timing_passes=1)
    assert fake.measured_peak_bytes == real.measured_peak_bytes
    assert fake.timeline.storages == real.timeline.storages
    assert fake.timeline.calls == real.timeline.calls
    assert [(m.module_name, m.saved_bytes, m.forward_flops) for m in fake.modules] == [
        (m.module_name, m.saved_bytes, m.forward_flops) for m in real.modules
    ]
    # One op each way, its FLOPs from torch's formula for it (dense: a block mask's
    # skipped blocks are counted).
    ops = {cost.op for cost in fake.timeline.op_costs}
    assert {"flex_attention", "flex_attention_backward"} <= ops
    c = _constants()
    attention = 4 * c.BATCH * c.HEADS * c.TOKENS**2 * (c.WIDTH // c.HEADS)  # type: ignore[attr-defined]
    linears = 2 * c.BATCH * c.TOKENS * (3 * c.WIDTH * c.WIDTH + c.WIDTH * c.WIDTH)  # type: ignore[attr-defined]
    assert fake.module("blocks.0.attn").forward_flops == attention + linears


@pytest.fixture(scope="module")
def flex_profile():  # type: ignore[no-untyped-def]
    import torch.nn.attention.flex_attention as flex

    with pytest.MonkeyPatch.context() as patch:  # cpu_backward, for the module's fixture
        patch.setattr(flex, "_validate_device", lambda query, key, value: None)
        return memory_profile(MODEL)


@pytest.mark.parametrize("option", [None, "save-attention", "torchtitan"])
def test_plans_over_flex_attention_are_predicted_to_the_byte_and_train_identically(
    flex_profile,  # type: ignore[no-untyped-def]
    cpu_backward: None,
    option: str | None,
) -> None:
    from planner.check.compare import CheckReference, check_plan
    from planner.plan.memory_model import MemoryModel
    from planner.solve.planning import build_plan

    memory = MemoryModel.for_profile(flex_profile)
    units = [Unit(name, option=option) for name in flex_profile.block_names]
    plan = build_plan(flex_profile, units, 0, strategy="test", memory=memory)
    if option is not None:
        # The attention policies find FlexAttention's operator among each block's ops.
        assert all("flex_attention" in decision.saved_ops for decision in plan.modules)
    plan = dataclasses.replace(plan, budget_bytes=plan.predicted_peak_bytes)
    check = check_plan(MODEL, plan)
    assert check.measured_peak_bytes == plan.predicted_peak_bytes
    assert check.loss_equal and check.gradients_equal and check.buffers_equal
    assert plan.predicted_peak_bytes < flex_profile.measured_peak_bytes
    recomputation = check_plan(MODEL, plan, reference=CheckReference.RECOMPUTATION)
    assert recomputation.recomputation_equal and recomputation.recomputed_ops > 0


def test_on_cpu_the_error_says_to_plan_for_the_gpu_with_a_target(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, ["profile", str(MODEL), "--budget", "1MiB", "--out", str(out)])
    assert result.exit_code == 4, result.output
    message = " ".join(result.output.split())
    assert "FlexAttention does not support backward on CPU" in message
    assert "Plan for the GPU you train on with --target" in message
    assert "Traceback" not in result.output and not out.parent.joinpath("profile.json").exists()


def test_planned_for_cuda_on_this_cpu_it_saves_what_the_real_step_saves(
    flex_profile,  # type: ignore[no-untyped-def]
) -> None:
    """Emulated CUDA (no refusal to lift: the tensors stand for CUDA ones) records each
    attention call's saved tensors as the CPU step saves them (the fake CPU step is the
    real one, above), each charged in CUDA's 512-byte blocks: the query, key and value,
    the output, its log-sum-exp and row maxima (float32, one per query and head), and the
    block mask's tensors."""
    if torch.cuda.is_available():
        pytest.skip("emulation is used where CUDA is not available")
    workload, session = build_fake_workload(load_model_file(MODEL), "cuda")
    assert session.emulated
    emulated = record_memory(workload, session=session)
    assert any("flex_attention" in line for line in session.assumptions)

    def saved_sizes(profile, device: str) -> list[int]:  # type: ignore[no-untyped-def]
        timeline = profile.timeline
        call = next(c for c in timeline.calls if c.module_name == "blocks.0.attn")
        return sorted(
            allocated_bytes(timeline.storages[index].size_bytes, device)
            for index in call.saved_storages
        )

    sizes = saved_sizes(emulated, "cuda")
    assert sizes == saved_sizes(flex_profile, "cuda")
    c = _constants()
    rows = c.BATCH * c.HEADS * c.TOKENS * 4  # type: ignore[attr-defined]
    head_width = c.WIDTH // c.HEADS  # type: ignore[attr-defined]
    assert sizes.count(rows) == 2  # log-sum-exp and row maxima
    assert sizes.count(rows * head_width) >= 1  # the output


@pytest.mark.hf
def test_a_hugging_face_config_with_flex_attention_is_planned_for_cuda(tmp_path: Path) -> None:
    """``attn_implementation: flex_attention`` in a config, as users set it: Hugging Face
    compiles FlexAttention and makes its block mask compiled too; recorded as on CUDA, each
    layer's attention runs FlexAttention's operator and saves its float32 statistics."""
    import json

    from planner.measure.hf import hf_workload, load_hf_model_file

    if torch.cuda.is_available():
        pytest.skip("emulation is used where CUDA is not available")
    config = json.loads((EXAMPLES / "configs" / "tiny-llama.json").read_text())
    config["attn_implementation"] = "flex_attention"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    batch, tokens = 2, 128
    workload, session = build_fake_workload(
        load_hf_model_file(hf_workload(path, batch, tokens)), "cuda"
    )
    profile = record_memory(workload, session=session)
    ops = [cost.op for cost in profile.timeline.op_costs]
    layers = config["num_hidden_layers"]
    assert ops.count("flex_attention") == ops.count("flex_attention_backward") == layers
    assert any("flex_attention" in line for line in session.assumptions)
    timeline = profile.timeline
    call = next(c for c in timeline.calls if c.module_name == "model.layers.0.self_attn")
    sizes = [timeline.storages[index].size_bytes for index in call.saved_storages]
    rows = batch * config["num_attention_heads"] * tokens * 4
    assert sizes.count(rows) == 2  # log-sum-exp and row maxima, in CUDA's 512-byte blocks


def test_flex_attention_is_as_torch_left_it_once_the_last_mode_exits() -> None:
    import torch.nn.attention.flex_attention as flex

    # The module, not the operator its package names alike.
    operator = importlib.import_module("torch._higher_order_ops.flex_attention")

    from planner.dispatch import DispatchWatcher

    class Mode(DispatchWatcher):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **(kwargs or {}))

    trace = operator.create_fw_bw_graph
    assert flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG is False
    with Mode():
        with Mode():
            assert flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG is True
        assert operator.create_fw_bw_graph is not trace  # still inside the outer mode
    assert flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG is False
    assert operator.create_fw_bw_graph is trace


def test_a_score_mod_capturing_a_trainable_tensor_is_refused_with_its_name(
    tmp_path: Path,
) -> None:
    """Recorded uncompiled, FlexAttention takes a tensor its score_mod captures as a
    constant: one that trains (learned ALiBi slopes) would get no gradient, so the step is
    refused rather than planned as another step (planner/dispatch.py)."""
    from typer.testing import CliRunner

    from cli.main import app

    source = MODEL.read_text()
    buffer = 'self.register_buffer("slopes", 2.0 ** -torch.arange(1.0, HEADS + 1))'
    assert buffer in source
    learned = tmp_path / "learned_slopes.py"
    learned.write_text(
        source.replace(buffer, "self.slopes = nn.Parameter(2.0 ** -torch.arange(1.0, HEADS + 1))")
    )
    result = CliRunner().invoke(
        app, ["profile", str(learned), "--budget", "80MiB", "--target", "h100-80gb"]
    )
    assert result.exit_code == 4, result.output
    message = " ".join(result.output.split())
    assert "score_mod captures 'slopes', a tensor that requires grad" in message
    assert "Traceback" not in result.output
