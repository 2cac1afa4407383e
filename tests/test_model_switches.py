"""Switches a plan assumes in the model (planner.core.switches, planner.model_switches):
Hugging Face caches turned off for training, and the mixture-of-experts routing planned for.
The Hugging Face models here are built from tiny configs with their shipped defaults."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from planner.core.switches import StepSwitches, switches_from_dict, switches_to_dict
from planner.model_switches import (
    RoutingAsPlanned,
    RoutingWatcher,
    assumed_routing,
    busiest_expert_load,
)


@pytest.mark.parametrize(
    ("tokens", "experts", "k", "load"),
    [(256, 8, 2, 1.0), (256, 8, 2, 1.5), (100, 4, 1, 2.0), (64, 4, 4, 3.0)],
)
def test_assumed_routing_gives_the_busiest_expert_its_load_and_distinct_picks(
    tokens: int, experts: int, k: int, load: float
) -> None:
    routing = assumed_routing((tokens,), experts, k, load)
    assert routing.shape == (tokens, k) and routing.dtype == torch.int64
    assert all(len(set(row.tolist())) == k for row in routing)  # k distinct experts per token
    assert int(routing.min()) >= 0 and int(routing.max()) < experts
    # k == experts: every token picks every expert, so no skew is possible
    expected = 1.0 if k == experts else load
    assert busiest_expert_load(routing, experts) == pytest.approx(expected, abs=experts / tokens)


def test_switches_round_trip_and_absent_means_none() -> None:
    switches = StepSwitches(
        caches_off=("", "model.decoder"), expert_load=1.5, layerdrop_off=("encoder.layerdrop",)
    )
    assert switches_from_dict(switches_to_dict(switches)) == switches
    assert switches_from_dict(None) == StepSwitches()
    assert switches_from_dict({"caches_off": [""]}).layerdrop_off == ()  # older files
    assert len(switches.describe()) == 3 and StepSwitches().describe() == ()


def test_routing_as_planned_routes_a_real_topk_and_keeps_values_consistent() -> None:
    scores = torch.randn(32, 8, requires_grad=True)
    with RoutingAsPlanned(1.0):
        values, indices = torch.topk(scores.softmax(-1), 2, dim=-1)
    assert torch.equal(indices, assumed_routing((32,), 8, 2))
    assert torch.equal(values, scores.softmax(-1).gather(-1, indices))
    values.sum().backward()  # topk's backward scatters by the (overwritten) indices
    assert scores.grad is not None


def test_topk_routed_as_planned_routes_only_topk_and_puts_it_back() -> None:
    """For timed steps: both ways a router calls topk route as the mode does, gradients
    and all, no mode is entered for other ops, and torch is as it was after."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from planner.measure.tracking import PeakMemoryTracker
    from planner.model_switches import TopkRoutedAsPlanned

    function, method = torch.topk, torch.Tensor.topk
    scores = torch.randn(32, 8, requires_grad=True)
    expected = assumed_routing((32,), 8, 2, 2.0)
    with TopkRoutedAsPlanned(2.0) as routing:
        assert _get_current_dispatch_mode_stack() == []
        _, by_function = torch.topk(scores.softmax(-1), 2, dim=-1)
        values, by_method = scores.softmax(-1).topk(2)
        _, not_a_router = torch.topk(scores.detach(), 2, dim=0)  # not over the experts
    assert torch.equal(by_function, expected) and torch.equal(by_method, expected)
    assert torch.equal(not_a_router, torch.topk(scores.detach(), 2, dim=0)[1])
    assert routing.routed == 2
    values.sum().backward()
    assert torch.equal(
        scores.grad, torch.autograd.grad(scores.softmax(-1).gather(-1, expected).sum(), scores)[0]
    )  # type: ignore[arg-type]
    assert torch.topk is function and torch.Tensor.topk is method
    assert "topk" not in torch.Tensor.__dict__
    with TopkRoutedAsPlanned(None) as nothing:  # no routing assumed: torch untouched
        assert torch.topk is function and nothing.routed == 0
    # A tracker entered first sees the pick's outputs, not what routing them takes.
    tracker = PeakMemoryTracker(torch.device("cpu"), {})
    probs = torch.randn(1000, 8)
    with tracker, TopkRoutedAsPlanned(1.0):
        torch.topk(probs, 2)
    assert tracker.peak_bytes == 1000 * 2 * (4 + 8)  # float values, int64 indices


def _llama_file(tmp_path: Path) -> Path:
    """A Llama built as users ship it: use_cache left at its default (on)."""
    path = tmp_path / "llama_defaults.py"
    path.write_text(
        "import torch\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "def build_model():\n"
        "    return LlamaForCausalLM(LlamaConfig(vocab_size=500, hidden_size=64,\n"
        "        intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,\n"
        "        num_key_value_heads=2, max_position_embeddings=128))\n"
        "def sample_batch():\n"
        "    ids = torch.randint(0, 500, (2, 64))\n"
        "    return {'input_ids': ids, 'labels': ids}\n"
    )
    return path


def _moe_file(tmp_path: Path, experts: str) -> Path:
    """A tiny Mixtral as shipped (use_cache on), with the given experts implementation."""
    path = tmp_path / f"mixtral_{experts}.py"
    path.write_text(
        "import torch\n"
        "from transformers import MixtralConfig, MixtralForCausalLM\n"
        "def build_model():\n"
        "    return MixtralForCausalLM(MixtralConfig(vocab_size=256, hidden_size=64,\n"
        "        intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,\n"
        "        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,\n"
        f"        max_position_embeddings=128, experts_implementation={experts!r}))\n"
        "def sample_batch():\n"
        "    ids = torch.randint(0, 256, (2, 64))\n"
        "    return {'input_ids': ids, 'labels': ids}\n"
    )
    return path


@pytest.mark.hf
@pytest.mark.slow
def test_a_default_config_model_plans_every_block_with_the_cache_off(tmp_path: Path) -> None:
    """use_cache on (the default) made every block refused; planned with it off, as Hugging
    Face's own checkpointing trains, every block is a candidate and the plan at every
    block's peak runs within it, measured as predicted, training unchanged."""
    from planner.check.compare import check_plan
    from planner.measure.workload import load_model_file
    from planner.pipeline import profile_model_file
    from planner.solve.planning import baseline_every_block, plan_for_budget

    path = _llama_file(tmp_path)
    profile = profile_model_file(load_model_file(path), timing_steps=1)
    assert profile.switches.caches_off == ("",)
    assert all(profile.module(name).is_candidate for name in profile.block_names)
    budget = baseline_every_block(profile).predicted_peak_bytes
    plan, _ = plan_for_budget(profile, budget)
    assert plan.switches.caches_off == ("",)
    check = check_plan(path, plan)
    assert check.passed, check.differences
    assert check.measured_peak_bytes == plan.predicted_peak_bytes <= budget


@pytest.mark.hf
@pytest.mark.slow
def test_apply_plan_turns_the_cache_off_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from planner.apply import apply_plan
    from planner.measure.workload import load_model_file
    from planner.pipeline import profile_model_file
    from planner.solve.planning import plan_for_budget

    model_file = load_model_file(_llama_file(tmp_path))
    plan, _ = plan_for_budget(profile_model_file(model_file, timing_steps=1), 1 << 40)
    model = model_file.build_model()
    assert model.config.use_cache is True
    with caplog.at_level(logging.WARNING, logger="planner.apply"):
        apply_plan(model, plan)
    assert model.config.use_cache is False
    assert [r.message for r in caplog.records if "use_cache" in r.message] != []
    assert len([r for r in caplog.records if "use_cache" in r.message]) == 1


@pytest.mark.hf
@pytest.mark.slow
def test_grouped_experts_run_on_fake_tensors_with_no_routing_assumed(tmp_path: Path) -> None:
    """grouped_mm's fake kernel takes bf16 only; the real CPU kernel runs fp32. The fake
    step runs it as the device does, its peak equals the real step's, and since no shape
    depends on routing the plan assumes none. Outside the session torch's rule is back."""
    from planner.core.records import MemorySource
    from planner.measure.workload import load_model_file
    from planner.pipeline import profile_model_file

    model_file = load_model_file(_moe_file(tmp_path, "grouped_mm"))
    fake = profile_model_file(model_file, timing_steps=1)
    real = profile_model_file(model_file, memory=MemorySource.REAL, timing_steps=1)
    assert fake.measured_peak_bytes == real.measured_peak_bytes
    assert fake.switches.expert_load is None
    assert any("no routing was assumed" in note.text for note in fake.assumptions)
    assert any("grouped_mm in torch.float32" in note.text for note in fake.assumptions)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with pytest.raises(RuntimeError, match="BF16"), FakeTensorMode():
        torch._grouped_mm(
            torch.randn(8, 16),
            torch.randn(4, 16, 8),
            offs=torch.tensor([2, 4, 6, 8], dtype=torch.int32),
        )


@pytest.mark.hf
@pytest.mark.parametrize("expert_load", [1.0, 2.0])
@pytest.mark.slow
def test_eager_experts_plan_for_the_assumed_routing_and_measure_as_predicted(
    tmp_path: Path, expert_load: float
) -> None:
    """Eager experts size their activations by routing (nonzero/where per expert): the
    fake step plans for the assumed routing, the plan records it, and its check, run
    under that routing, measures the prediction exactly with training unchanged."""
    from planner.check.compare import check_plan
    from planner.measure.workload import load_model_file
    from planner.pipeline import profile_model_file
    from planner.solve.planning import plan_for_budget

    path = _moe_file(tmp_path, "eager")
    profile = profile_model_file(load_model_file(path), timing_steps=1, expert_load=expert_load)
    assert profile.switches.expert_load == expert_load
    floor = min(record.checkpoint_saving_bytes for record in profile.candidates)
    assert floor > 0
    budget = (profile.measured_peak_bytes + profile.static_bytes) // 2
    budget = max(budget, profile.measured_peak_bytes - 4 * floor)
    plan, _ = plan_for_budget(profile, budget)
    assert plan.modules and plan.switches.expert_load == expert_load
    check = check_plan(path, plan)
    assert check.passed, check.differences
    assert check.measured_peak_bytes == plan.predicted_peak_bytes <= budget


@pytest.mark.hf
@pytest.mark.slow
def test_the_first_training_forward_warns_when_real_routing_is_busier_than_planned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import dataclasses

    from planner.apply import apply_plan
    from planner.measure.workload import load_model_file

    model_file = load_model_file(_moe_file(tmp_path, "eager"))
    torch.manual_seed(0)
    model, batch = model_file.build_model(), model_file.sample_batch()
    with RoutingWatcher() as watcher:  # the real routing of these weights and this batch
        model(**batch)
    assert watcher.picks == 2 and watcher.busiest_load > 1.0  # one router per layer

    from planner.pipeline import profile_model_file
    from planner.solve.planning import plan_for_budget

    planned, _ = plan_for_budget(profile_model_file(model_file, timing_steps=1), 1 << 40)

    def forward_warnings(expert_load: float) -> list[str]:
        plan = dataclasses.replace(planned, switches=StepSwitches(expert_load=expert_load))
        torch.manual_seed(0)
        fresh = model_file.build_model()  # the same weights as `model`
        apply_plan(fresh, plan)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="planner.apply"):
            fresh(**batch)
            fresh(**batch)  # once: the second forward is not watched
        return [r.message for r in caplog.records if "busiest expert" in r.message]

    (warning,) = forward_warnings(1.0)
    assert f"{watcher.busiest_load:.2f}x" in warning and "--expert-load" in warning
    assert forward_warnings(watcher.busiest_load + 0.01) == []


@pytest.mark.hf
@pytest.mark.slow
def test_eager_experts_are_timed_under_the_assumed_routing_within_the_budget(
    tmp_path: Path,
) -> None:
    """The timing steps route as the profile assumed, as the check does: this model's own
    routing is busier than balanced, and under it the timing plan's warm-up passed a budget
    an eighth of the way up from the lowest (8.75 MiB reached of 8.69 MiB)."""
    from planner.core.records import CostSource
    from planner.measure.workload import load_model_file
    from planner.pipeline import measure_profile_costs
    from planner.solve import Solver
    from tests.models import memory_profile

    model_file = load_model_file(_moe_file(tmp_path, "eager"))
    torch.manual_seed(0)
    with RoutingWatcher() as watcher:
        model_file.build_model()(**model_file.sample_batch())
    assert watcher.busiest_load > 1.0  # the weights' own routing: busier than planned
    memory = memory_profile(model_file)
    assert memory.switches.expert_load == 1.0
    lowest = Solver(memory).lowest_peak()[1]
    budget = lowest + (memory.measured_peak_bytes - lowest) // 8
    timed = measure_profile_costs(model_file, memory, budget_bytes=budget, timing_steps=1)
    assert timed.cost_source is CostSource.MEASURED


class _LayerDropBody(nn.Module):
    """Hugging Face's LayerDrop: in training, each layer is skipped with probability
    ``layerdrop``, drawn in this forward (``config.encoder_layerdrop`` in M2M-100)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 32)) for _ in range(4)
        )
        self.layerdrop = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.training and self.layerdrop > 0.0 and torch.rand([]) < self.layerdrop:
                continue
            x = x + layer(x)
        return x


class _LayerDropModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = _LayerDropBody()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).pow(2).mean()


def test_layerdrop_is_planned_off_and_recomputations_skip_what_their_forward_skipped() -> None:
    from planner.apply import apply_plan
    from planner.core.records import MemorySource, Unit
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from planner.solve.planning import build_plan
    from tests.models import model_file

    source = model_file(_LayerDropModel, lambda: torch.randn(64, 32), loss_fn=lambda o, b: o)
    workload, session = build_fake_workload(source)
    profile = record_memory(workload, session=session)
    # Planned with every layer run (the most a step holds), on fake tensors: with LayerDrop
    # on, the draw's comparison needs values fake tensors do not have.
    assert profile.memory_source is MemorySource.FAKE
    assert profile.switches.layerdrop_off == ("body.layerdrop",)
    assert all(profile.module(f"body.layers.{i}").call_count == 1 for i in range(4))
    assert any("LayerDrop planned as if no layer" in note.text for note in profile.assumptions)
    units = [Unit("body"), Unit("body.layers.0"), Unit("body.layers.2")]
    plan = build_plan(profile, units, profile.measured_peak_bytes, strategy="test")
    # With LayerDrop off nothing draws, yet every recomputation replays the RNG:
    assert all(decision.preserve_rng_state for decision in plan.modules)
    # Training keeps LayerDrop: planned and unplanned steps from one seed skip the same
    # layers, and the recomputations skip what their forward skipped: bit-identical.
    gradients = []
    for planned in (False, True):
        torch.manual_seed(0)
        model = _LayerDropModel()
        if planned:
            apply_plan(model, plan)
        assert model.body.layerdrop == 0.5
        torch.manual_seed(1)
        batch = torch.randn(64, 32)
        model(batch).backward()
        gradients.append([parameter.grad for parameter in model.parameters()])
    unplanned, planned_gradients = gradients
    skipped = sum(gradient is None for gradient in unplanned)
    assert 0 < skipped < len(unplanned)  # this seed skips some layers, not all
    assert all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
        for a, b in zip(unplanned, planned_gradients, strict=True)
    )


def test_every_layerdrop_field_a_config_names_is_switched_off() -> None:
    """SeamlessM4T's ``speech_encoder_layerdrop`` was left on: its fake step failed at the
    draw, and the real step it fell back to dropped layers at random."""
    from types import SimpleNamespace

    from planner.model_switches import switch_off_layerdrop

    model = torch.nn.Linear(2, 2)
    model.config = SimpleNamespace(  # type: ignore[assignment]
        encoder_layerdrop=0.1, speech_encoder_layerdrop=0.1, layerdrop_note="kept"
    )
    switched = switch_off_layerdrop(model)
    assert switched == ("config.encoder_layerdrop", "config.speech_encoder_layerdrop")
    assert model.config.speech_encoder_layerdrop == 0.0 and model.config.layerdrop_note == "kept"
