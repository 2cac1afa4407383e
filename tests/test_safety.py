"""Checkpointing hazards on real modules: random ops, side effects, recomputation that differs
from the forward, tensors on another device. For each: the profiler or the recomputation
probe (planner.check.safety) finds it, and the plan the tool writes trains exactly as unplanned.

The tiny model files in tests/data/ isolate one hazard each; the examples at full size
(dropout GPT, BatchNorm CNN, Hugging Face T5) show the written plan trains (about 5-8 s each
on 2 CPU cores: a profile, a probe step and a plan check in a separate process).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointError

from planner.apply import apply_plan
from planner.check.compare import CheckReference, check_plan, run_check
from planner.check.safety import exclude_modules, find_recompute_mismatches
from planner.core.errors import PlanCheckError, ProfilingError
from planner.core.records import Profile, Unit
from planner.measure.model_file import ModelFile
from planner.measure.profiler import profile_workload
from planner.measure.workload import (
    Workload,
    build_workload,
    load_model_file,
    run_training_step,
)
from planner.pipeline import plan_checked, profile_model_file
from planner.plan.memory_model import MemoryModel
from planner.plan.plan_file import Plan
from planner.solve import Solver
from planner.solve.planning import baseline_plans, build_plan, plan_for_budget
from tests.models import model_file

DATA = Path(__file__).resolve().parent / "data"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CACHE_DECODER = DATA / "cache_decoder.py"
# What the probe must find in cache_decoder.py: each decoder layer and its cross-attention.
CACHED_LAYERS = {
    "decoder.layers.0",
    "decoder.layers.0.cross",
    "decoder.layers.1",
    "decoder.layers.1.cross",
}


def _profile(source: ModelFile | Path, **options: int) -> tuple[Profile, Workload]:
    model = source if isinstance(source, ModelFile) else load_model_file(source)
    workload = build_workload(model, seed=0)
    return profile_workload(workload, timing_passes=1, seed=0, **options), workload


def _probed_profile(path: Path) -> Profile:
    """Profile, then exclude what the probe finds: what the profiler does once it is wired."""
    profile, workload = _profile(path)
    names = [record.module_name for record in profile.candidates]
    return exclude_modules(profile, find_recompute_mismatches(workload, names))


def _as_if_undetected(profile: Profile) -> Profile:
    """``profile`` as if the profiler had not seen modules store tensors into an argument
    (it excludes them up front): the probe, the second line of defence for side effects
    the profiler cannot see (a cache kept on a module attribute), must still find them."""
    return dataclasses.replace(
        profile,
        modules=tuple(
            dataclasses.replace(record, excluded_reason="")
            if "stores tensors into" in record.excluded_reason
            else record
            for record in profile.modules
        ),
    )


@functools.cache
def _profile_of(path: Path) -> Profile:
    return _profile(path)[0]


def _planned_loss(path: Path, names: list[str]) -> torch.Tensor:
    """One training step of the model file with ``names`` checkpointed (in this process);
    an error in the step is raised as itself, not as the ProfilingError that reports it."""
    profile = _profile_of(path)
    units = [Unit(name) for name in names]
    plan = build_plan(profile, units, profile.measured_peak_bytes, strategy="test")
    workload = build_workload(load_model_file(path), seed=0)
    apply_plan(workload.model, plan)
    try:
        return run_training_step(workload, seed=0)
    except ProfilingError as error:
        assert error.__cause__ is not None
        raise error.__cause__ from None


# -- recomputation that differs from the forward ---------------------------------------------
def test_the_probe_finds_layers_that_read_a_cache_their_forward_filled() -> None:
    profile, workload = _profile(CACHE_DECODER)
    for name in CACHED_LAYERS:  # the profiler saw them fill the cache they are passed
        assert "stores tensors into cache (dict)" in profile.module(name).excluded_reason
    profile = _as_if_undetected(profile)
    candidates = {record.module_name for record in profile.candidates}
    assert candidates >= CACHED_LAYERS
    mismatches = find_recompute_mismatches(workload, candidates)
    assert set(mismatches) == CACHED_LAYERS
    assert "decoder.layers.0.cross" in mismatches
    reason = mismatches["decoder.layers.0.cross"]
    assert "CheckpointError" in reason and "saves 6 tensors" in reason and "saved 10" in reason


def test_the_probe_re_runs_a_call_in_the_autocast_regions_it_ran_in() -> None:
    """A step under torch.autocast: each block's forward, re-run outside it, would save
    float32 tensors where the forward saved bf16 (or hand a float32 layer a bf16 input),
    and every block was excluded as differing. checkpoint re-enters the regions; so does
    the probe."""
    from tests.models import amp_file

    workload = build_workload(amp_file(), seed=0)
    names = [name for name, _ in workload.model.named_modules() if name]
    assert find_recompute_mismatches(workload, names) == {}


def test_what_the_probe_finds_really_fails_when_checkpointed_and_the_rest_does_not() -> None:
    # Ground truth for the probe: torch.utils.checkpoint on a flagged module raises ...
    with pytest.raises(CheckpointError, match="different number of tensors"):
        _planned_loss(CACHE_DECODER, ["decoder.layers.0.cross"])
    # ... and on the module that owns the cache (a fresh cache when recomputed) it does not.
    workload = build_workload(load_model_file(CACHE_DECODER), seed=0)
    unplanned = run_training_step(workload, seed=0)
    assert torch.equal(_planned_loss(CACHE_DECODER, ["decoder", "encoder"]), unplanned)


def test_excluded_modules_keep_their_reason_and_the_solver_avoids_them() -> None:
    profile = _probed_profile(CACHE_DECODER)
    for name in CACHED_LAYERS:
        assert not profile.module(name).is_candidate
        assert "stores tensors into cache" in profile.module(name).excluded_reason
    assert profile.module("decoder").is_candidate
    units, lowest = Solver(profile, MemoryModel(profile.timeline)).lowest_peak()
    assert not {unit.module for unit in units} & CACHED_LAYERS
    plan, _ = plan_for_budget(profile, lowest)
    assert plan.modules and not set(plan.module_names) & CACHED_LAYERS


@pytest.mark.slow
def test_the_written_plan_for_the_cache_model_trains_identically() -> None:
    profile = _probed_profile(CACHE_DECODER)
    _, lowest = Solver(profile).lowest_peak()
    budget = (lowest + profile.measured_peak_bytes) // 2
    result = plan_checked(profile, budget, model_path=CACHE_DECODER)
    assert result.plan.modules
    assert result.check is not None and result.check.passed, result.check


class _Counter(nn.Module):
    """Scales by how often it has run: a forward side effect that changes the values."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.runs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        return torch.tanh(self.linear(x) * self.runs)


class _Once(nn.Module):
    """Refuses to run twice in a step, as code that asserts on its own state might."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.ran = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ran:
            raise RuntimeError("already ran in this step")
        self.ran = True
        return torch.tanh(self.linear(x))


class _Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(x)).sum()


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.counter = _Wrapper(_Counter())
        self.once = _Wrapper(_Once())
        self.plain = _Wrapper(nn.Sequential(nn.Linear(8, 8), nn.Tanh()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part in (self.counter, self.once, self.plain):
            part.inner.ran = False  # type: ignore[assignment]  # a new step
        return self.counter(x) + self.once(x) + self.plain(x)


def test_the_probe_names_a_changed_value_and_a_raising_recomputation() -> None:
    workload = build_workload(model_file(_Model, lambda: torch.randn(16, 8)), seed=0)
    names = ["counter", "counter.inner", "once", "once.inner", "plain", "plain.inner"]
    mismatches = find_recompute_mismatches(workload, names)
    assert set(mismatches) == {"counter", "counter.inner", "once", "once.inner"}
    assert "different values" in mismatches["counter.inner"]
    assert "would change the gradients" in mismatches["counter.inner"]
    assert mismatches["once.inner"] == (
        "recomputing it raises RuntimeError: already ran in this step"
    )


class _ChangesStateOnRerun(nn.Module):
    """When run a second time, changes in place a tensor its caller saved for backward:
    adds to it, or (``resize``) grows it, which breaks the caller's backward outright."""

    def __init__(self, state: torch.Tensor, resize: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.state = state  # the parent's buffer, not this module's: nothing restores it
        self.resize = resize
        self.ran = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ran:
            self.state.resize_(16) if self.resize else self.state.add_(1.0)
        self.ran = True
        return torch.tanh(self.linear(x))


class _SavesStateFirst(nn.Module):
    def __init__(self, resize: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.register_buffer("state", torch.ones(8))
        self.bumps = _ChangesStateOnRerun(self.state, resize)
        self.plain = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.bumps.ran = False
        h = self.embed(x) * self.state  # saves state for backward, before bumps runs
        return self.plain(self.bumps(h)).sum()


def _step_with(model: type[nn.Module], names: list[str], **options: bool) -> None:
    """One training step with ``names`` checkpointed for real (torch.utils.checkpoint)."""
    source = model_file(lambda: model(**options), lambda: torch.randn(16, 8))
    profile, _ = _profile(source)
    workload = build_workload(source, seed=0)
    units = [Unit(name) for name in names]
    apply_plan(workload.model, build_plan(profile, units, 10**9, strategy="test"))
    try:
        run_training_step(workload, seed=0)
    except ProfilingError as error:
        assert error.__cause__ is not None
        raise error.__cause__ from None


@pytest.mark.parametrize("resize", [False, True], ids=["add_", "resize_"])
def test_a_rerun_that_changes_a_tensor_in_place_is_excluded(resize: bool) -> None:
    workload = build_workload(
        model_file(lambda: _SavesStateFirst(resize), lambda: torch.randn(16, 8)), seed=0
    )
    # The probe undoes the change (so the probe step's backward goes on), and reports it.
    mismatches = find_recompute_mismatches(workload, ["bumps", "plain"])
    assert mismatches == {
        "bumps": "recomputing it changes in place a tensor it did not make ([8] float32 on "
        "cpu): a side effect that would happen twice"
    }
    # Ground truth: checkpointed for real, the step fails; the other module is fine.
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation|must match"):
        _step_with(_SavesStateFirst, ["bumps"], resize=resize)
    _step_with(_SavesStateFirst, ["plain"], resize=resize)


class _TracksItsRange(nn.Module):
    """I-BERT's ``QuantAct`` in small: a running range of its activations, kept by binding a
    new tensor to the buffer each forward (``self.x_max = ...``, no in-place write); or, with
    ``as_attribute``, a plain tensor attribute (RecurrentGemma's recurrent state)."""

    def __init__(self, as_attribute: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        if as_attribute:
            self.x_max = torch.zeros(1)
        else:
            self.register_buffer("x_max", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        observed = x.detach().abs().amax().reshape(1)
        self.x_max = 0.9 * self.x_max + 0.1 * observed  # twice per step if recomputed
        return torch.tanh(self.linear(x))


class _RangedStack(nn.Module):
    def __init__(self, as_attribute: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), _TracksItsRange(as_attribute))
        self.plain = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.plain(self.block(self.embed(x))).sum()


@pytest.mark.parametrize("as_attribute", [False, True], ids=["buffer", "attribute"])
def test_a_module_that_rebinds_its_state_is_excluded(as_attribute: bool) -> None:
    source = model_file(lambda: _RangedStack(as_attribute), lambda: torch.randn(16, 8))
    workload = build_workload(source, seed=0)
    mismatches = find_recompute_mismatches(workload, ["block", "block.1", "plain"])
    assert set(mismatches) == {"block", "block.1"}
    assert mismatches["block"].startswith(
        "recomputing it replaces the tensor block.1.x_max holds (its forward replaced it too)"
    )
    # The probe put back what the forward bound: the step's state is an unplanned step's.
    unplanned = build_workload(source, seed=0)
    run_training_step(unplanned, seed=0)
    before_step = build_workload(source, seed=0).model.block[1].x_max
    probed = workload.model.block[1].x_max
    assert torch.equal(probed, unplanned.model.block[1].x_max)
    assert not torch.equal(probed, before_step)
    # Ground truth: checkpointed for real, the range moves twice in one step.
    checkpointed = build_workload(source, seed=0)
    apply_plan(
        checkpointed.model, build_plan(_profile(source)[0], [Unit("block")], 10**9, strategy="test")
    )
    run_training_step(checkpointed, seed=0)
    assert not torch.equal(checkpointed.model.block[1].x_max, probed)


def test_a_recomputation_that_differs_only_in_values_is_excluded_by_the_unplanned_check() -> None:
    """Fake tensors cannot see a scan restart from the state its forward left (same ops and
    shapes); the plan's check against the unplanned step sees the loss differ, and each
    recomputation compared with its forward names the scan: it is excluded and the plan
    made again, not reported as the tool's bug."""
    path = DATA / "recurrent_state.py"
    profile = profile_model_file(load_model_file(path))
    # The scans made the cheapest to recompute (measured, an MLP can be as cheap: on two
    # threads it was, and the solver picked it instead), so the solver picks one.
    profile = dataclasses.replace(
        profile,
        modules=tuple(
            module
            if module.module_name.endswith("scan")
            else dataclasses.replace(
                module,
                forward_ms=100 * module.forward_ms,
                options=tuple(
                    dataclasses.replace(option, recompute_ms=100 * option.recompute_ms)
                    for option in module.options
                ),
            )
            for module in profile.modules
        ),
    )
    memory = MemoryModel.for_profile(profile)
    budget = memory.peak_bytes([Unit("blocks.0.scan")])  # the cheapest: the solver's pick
    assert Solver(profile).solve(budget).units == (Unit("blocks.0.scan"),)
    result = plan_checked(profile, budget, model_path=path, reference=CheckReference.UNPLANNED)
    assert result.check is not None
    assert result.check.loss_equal and result.check.gradients_equal
    chosen = {decision.module_name for decision in result.plan.modules}
    assert chosen and not any(name.endswith("scan") for name in chosen)
    reason = result.profile.module("blocks.0.scan").excluded_reason
    assert reason.startswith("recomputation of blocks.0.scan differs from its forward at op 0")
    # Its block, which resets the state first, the probe caught on fake tensors already.
    assert (
        "replaces the tensor blocks.0.scan.state"
        in result.profile.module("blocks.0").excluded_reason
    )


class _CountsCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.tanh(self.linear(x))


class _BackwardReadsTheCount(nn.Module):
    """A gradient hook that relies on the counter: a second run of ``counted`` breaks the
    rest of backward (state that no tensor comparison can see)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.counted = _CountsCalls()
        self.plain = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    def _check(self, grad: torch.Tensor) -> None:
        if self.counted.calls != 1:
            raise RuntimeError("counted ran twice in one step")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.counted.calls = 0
        h = self.embed(x)
        h.register_hook(self._check)  # runs after counted's backward
        return self.plain(self.counted(h)).sum()


def test_a_rerun_that_breaks_the_rest_of_backward_is_excluded_and_the_rest_probed() -> None:
    workload = build_workload(model_file(_BackwardReadsTheCount, lambda: torch.randn(16, 8)))
    # The first probe step fails in backward after re-running "counted"; the second runs
    # without it and probes "plain".
    mismatches = find_recompute_mismatches(workload, ["counted", "plain"])
    assert mismatches == {
        "counted": "recomputing it makes the rest of backward fail with RuntimeError: "
        "counted ran twice in one step"
    }
    with pytest.raises(RuntimeError, match="counted ran twice"):
        _step_with(_BackwardReadsTheCount, ["counted"])
    _step_with(_BackwardReadsTheCount, ["plain"])


class _ReluOfInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.relu_(x))  # changes its input in place


class _InPlaceInputModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.block = _ReluOfInput()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.embed(x) * 1.0).sum()


def test_a_module_that_changes_its_input_in_place_is_excluded() -> None:
    workload = build_workload(model_file(_InPlaceInputModel, lambda: torch.randn(16, 8)), seed=0)
    mismatches = find_recompute_mismatches(workload, ["block"])
    assert mismatches["block"].startswith("its input ([16, 8] float32 on cpu) is changed in place")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _step_with(_InPlaceInputModel, ["block"])


def test_the_probe_step_changes_no_weights_and_leaves_no_gradients() -> None:
    workload = build_workload(load_model_file(CACHE_DECODER), seed=0)
    before = {name: p.detach().clone() for name, p in workload.model.named_parameters()}
    rng_before = torch.get_rng_state()
    find_recompute_mismatches(workload, [*CACHED_LAYERS, "decoder"])
    for name, parameter in workload.model.named_parameters():
        assert torch.equal(parameter, before[name]), name
        assert parameter.grad is None
    assert not torch.equal(torch.get_rng_state(), rng_before)  # the step drew from the RNG


# -- random ops (dropout) and forward side effects (BatchNorm) -----------------------------
@pytest.mark.parametrize("name", ["small_gpt", "small_cnn"])
def test_the_probe_accepts_dropout_and_batchnorm_which_plans_handle(name: str) -> None:
    # Replaying the RNG and restoring buffers makes these recompute exactly: no false alarm.
    profile, workload = _profile(DATA / f"{name}.py")
    names = [record.module_name for record in profile.candidates]
    assert names
    assert find_recompute_mismatches(workload, names) == {}


@pytest.mark.slow
def test_a_dropout_plan_replays_the_rng_and_trains_identically() -> None:
    path = DATA / "small_gpt.py"
    profile, _ = _profile(path)
    blocks = list(profile.block_names)
    assert all(profile.module(name).uses_rng for name in blocks)
    units = [Unit(name) for name in blocks]
    plan = build_plan(profile, units, profile.measured_peak_bytes, strategy="test")
    assert all(decision.preserve_rng_state for decision in plan.modules)
    assert run_check(path, plan).passed
    # The hazard is real: without the RNG replay the recomputed dropout masks differ.
    careless = dataclasses.replace(
        plan,
        modules=tuple(
            dataclasses.replace(decision, preserve_rng_state=False) for decision in plan.modules
        ),
    )
    check = run_check(path, careless)
    assert not check.gradients_equal  # (and the loss, after the check's warm-up step)


def test_the_lowest_budget_plan_for_a_batchnorm_model_keeps_buffers() -> None:
    path = DATA / "small_cnn.py"
    profile, _ = _profile(path)
    _, lowest = Solver(profile).lowest_peak()
    plan, _ = plan_for_budget(profile, lowest)
    check = run_check(path, plan)
    assert check.buffers_equal, (plan.units, check.differences)


# -- tensors on another device -----------------------------------------------------------
@pytest.mark.slow
def test_a_module_reaching_another_device_is_excluded_and_the_plan_trains() -> None:
    # On CPU the "meta" device stands in for a second device (see tests/data/cross_device.py).
    path = DATA / "cross_device.py"
    profile, _ = _profile(path)
    reason = profile.module("blocks.1").excluded_reason
    assert reason == "its forward moves tensors across devices (cpu, meta)"
    assert profile.module("blocks.0").is_candidate and profile.module("blocks.2").is_candidate
    units, lowest = Solver(profile).lowest_peak()
    assert "blocks.1" not in {unit.module for unit in units}
    result = plan_checked(profile, lowest, model_path=path)
    assert "blocks.1" not in result.plan.module_names
    assert result.check is not None and result.check.passed


# -- the debug plumbing -----------------------------------------------------------------
def test_a_plan_that_breaks_the_step_is_a_plan_check_error_with_a_trace_under_debug() -> None:
    profile = _profile_of(CACHE_DECODER)
    plan = build_plan(profile, [Unit("decoder.layers.1.cross")], 10**9, strategy="test")
    with pytest.raises(PlanCheckError) as plain:
        run_check(CACHE_DECODER, plan)
    message = str(plain.value)
    assert "\n" not in message
    assert "the planned step fails where the unplanned one runs" in message
    assert "CheckpointError" in message and "Number of tensors saved during forward: 11" in message
    with pytest.raises(PlanCheckError) as traced:
        run_check(CACHE_DECODER, plan, debug=True)
    summary, trace = str(traced.value), traced.value.trace
    assert "CheckpointError" in summary and "\n" not in summary
    assert "original forward" in trace and "recomputation" in trace


@pytest.mark.child_process
def test_check_plan_keeps_the_error_type_across_the_process_boundary() -> None:
    profile = _profile_of(CACHE_DECODER)
    plan = build_plan(profile, [Unit("decoder.layers.0")], 10**9, strategy="test")
    with pytest.raises(PlanCheckError, match="CheckpointError"):
        check_plan(CACHE_DECODER, plan)


# -- the examples at full size -------------------------------------------------------------
def _mid_budget_plan_trains(path: Path, profile: Profile) -> Plan:
    """Plan halfway between the lowest feasible and the unplanned peak; check it by running."""
    _, lowest = Solver(profile).lowest_peak()
    budget = (lowest + profile.measured_peak_bytes) // 2
    result = plan_checked(profile, budget, model_path=path)
    check = result.check
    assert check is not None and check.passed, check
    assert check.reference == "recomputation" and check.recomputation_equal
    assert check.measured_peak_bytes <= budget < profile.measured_peak_bytes
    # The unplanned step agrees, bit for bit.
    unplanned = check_plan(path, result.plan, reference=CheckReference.UNPLANNED)
    assert unplanned.loss_equal and unplanned.gradients_equal and unplanned.buffers_equal
    assert unplanned.measured_peak_bytes == check.measured_peak_bytes
    return result.plan


@pytest.mark.slow
def test_the_dropout_gpt_example_plan_trains_identically() -> None:
    path = EXAMPLES / "gpt.py"
    profile = _probed_profile(path)
    assert all(profile.module(name).is_candidate for name in profile.block_names)
    plan = _mid_budget_plan_trains(path, profile)
    assert any(decision.preserve_rng_state for decision in plan.modules)


@pytest.mark.slow
def test_the_batchnorm_cnn_example_plan_trains_identically() -> None:
    path = EXAMPLES / "cnn.py"
    profile = _probed_profile(path)
    plan = _mid_budget_plan_trains(path, profile)
    assert any(decision.restore_buffers for decision in plan.modules)


@pytest.mark.hf
@pytest.mark.slow
def test_the_t5_example_plan_trains_identically_once_cached_attention_is_excluded() -> None:
    path = DATA / "t5_cache_in_call.py"  # the cache asked for in the call: not planned off
    profile, workload = _profile(path)
    # The profiler excludes the decoder's cache fillers up front; the probe agrees.
    up_front = {
        m.module_name for m in profile.modules if "stores tensors into" in m.excluded_reason
    }
    assert {f"decoder.block.{i}.layer.0.SelfAttention" for i in range(3)} <= up_front
    assert not any(name.startswith("encoder") for name in up_front)
    # The blocks are both stacks'; the decoder's are the excluded ones, and every block
    # checkpoints the encoder's.
    assert profile.excluded_blocks_note().startswith(
        "3 of 6 blocks cannot be checkpointed (decoder.block.0, decoder.block.1, decoder.block.2)"
    )
    every = baseline_plans(profile)["every-block"]
    assert set(every.module_names) == {f"encoder.block.{i}" for i in range(3)}
    profile = _as_if_undetected(profile)
    mismatches = find_recompute_mismatches(
        workload, [record.module_name for record in profile.candidates]
    )
    # Every decoder self-attention (the cache grows) and cross-attention (the cache is read
    # back), and every module holding one; nothing in the encoder, not the decoder itself.
    flagged_layers = {name.rsplit(".", 1)[0] for name in mismatches if name.endswith("Attention")}
    assert flagged_layers == {f"decoder.block.{i}.layer.{j}" for i in range(3) for j in (0, 1)}
    assert not any(name.startswith("encoder") for name in mismatches)
    assert "decoder" not in mismatches
    assert "CheckpointError" in mismatches["decoder.block.0.layer.1.EncDecAttention"]
    plan = _mid_budget_plan_trains(path, exclude_modules(profile, mismatches))
    assert not set(plan.module_names) & set(mismatches)


@pytest.mark.hf
@pytest.mark.slow
def test_t5_cross_attention_with_a_cache_raises_checkpoint_error_when_checkpointed() -> None:
    with pytest.raises(CheckpointError, match="different number of tensors"):
        _planned_loss(DATA / "t5_cache_in_call.py", ["decoder.block.0.layer.1"])


def test_profile_excludes_cache_filling_modules_it_chose_and_the_plan_trains() -> None:
    """The pipeline tries the chosen modules' recomputation before running the plan: the
    decoder modules that fill a cache are excluded (with the reason) and re-solved around."""
    path = DATA / "cache_decoder.py"
    profile = _as_if_undetected(_profile(path)[0])
    cache_fillers = {
        "decoder.layers.0",
        "decoder.layers.1",
        "decoder.layers.0.cross",
        "decoder.layers.1.cross",
    }
    # Timings are measured, so make the choice deterministic: the cache fillers look cheap.
    profile = dataclasses.replace(
        profile,
        modules=tuple(
            dataclasses.replace(m, forward_ms=0.01 if m.module_name in cache_fillers else 10.0)
            for m in profile.modules
        ),
    )
    _, lowest = Solver(exclude_modules(profile, dict.fromkeys(cache_fillers, "x"))).lowest_peak()
    budget = (lowest + profile.measured_peak_bytes) // 2
    assert cache_fillers & set(Solver(profile).solve(budget).module_names)
    result = plan_checked(profile, budget, model_path=path)
    assert result.check is not None and result.check.passed
    excluded = {
        m.module_name for m in result.profile.modules if "CheckpointError" in m.excluded_reason
    }
    assert excluded and excluded <= cache_fillers
    assert not excluded & set(result.plan.module_names)
