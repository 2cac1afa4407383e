"""apply_plan on a tiny live model: what gets wrapped, that training is unchanged, that the
recomputation really happens, and that a mismatched plan leaves the model untouched."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from planner.apply import apply_plan, model_fingerprint, remove_plan, wrapped_modules
from planner.core.errors import PlanFileError, PlanMismatchError
from planner.plan.plan_file import CheckpointMethod, ModuleDecision, Plan, save_plan

WIDTH = 8


class Block(nn.Module):
    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )
        self.dropout = nn.Dropout(0.5)
        self.forward_calls = 0  # counts runs of this forward, recomputations included

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forward_calls += 1
        return x + self.dropout(self.mlp(x))


class TinyModel(nn.Module):
    def __init__(self, width: int = WIDTH, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).pow(2).mean()


def build_model(seed: int = 0, width: int = WIDTH) -> TinyModel:
    torch.manual_seed(seed)
    return TinyModel(width)


def batch() -> torch.Tensor:
    return torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(123))


def make_plan(model: nn.Module, *decisions: ModuleDecision) -> Plan:
    return Plan(
        budget_bytes=10**6,
        predicted_peak_bytes=10**6,
        baseline_peak_bytes=2 * 10**6,
        predicted_overhead=0.1,
        recompute_ms=1.0,
        step_ms=10.0,
        static_bytes=1000,
        modules=decisions,
        fingerprint=model_fingerprint(model),
        batch={},
        device="cpu",
        torch_version=torch.__version__,
        model_name="tiny",
    )


def decision(name: str, **options: object) -> ModuleDecision:
    return ModuleDecision(module_name=name, **options)  # type: ignore[arg-type]


def train_step(model: nn.Module, seed: int = 7) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward + backward with a fixed RNG state; the loss and every gradient."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = model(batch())
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_untouched(model: nn.Module) -> None:
    assert wrapped_modules(model) == {}
    for name, module in model.named_modules():
        assert "forward" not in vars(module), f"{name or 'root'} has an instance forward"


def forward_calls(model: TinyModel) -> list[int]:
    return [block.forward_calls for block in model.blocks]


def reset_calls(model: TinyModel) -> None:
    for block in model.blocks:
        block.forward_calls = 0


# -- what gets wrapped ------------------------------------------------------------------
def test_apply_plan_wraps_the_named_modules() -> None:
    model = build_model()
    plan = make_plan(model, decision("blocks.0"), decision("blocks.2", preserve_rng_state=False))
    assert apply_plan(model, plan) is model
    wrapped = wrapped_modules(model)
    assert sorted(wrapped) == ["blocks.0", "blocks.2"]
    assert wrapped["blocks.2"] == plan.modules[1]
    assert wrapped["blocks.2"].preserve_rng_state is False


def test_state_dict_keys_and_values_unchanged() -> None:
    model = build_model()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    apply_plan(model, make_plan(model, decision("blocks.0"), decision("blocks.1.mlp")))
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[key], before[key]) for key in before)
    # A state dict saved before applying loads into the wrapped model (strict).
    model.load_state_dict(before)


def test_apply_twice_is_the_same_as_once() -> None:
    model = build_model()
    plan = make_plan(model, decision("blocks.1"))
    apply_plan(model, plan)
    forward_once = vars(model.blocks[1])["forward"]
    apply_plan(model, plan)
    assert wrapped_modules(model) == {"blocks.1": plan.modules[0]}
    assert vars(model.blocks[1])["forward"] is forward_once
    # Still one recomputation, not a checkpoint inside a checkpoint.
    reset_calls(model)
    train_step(model)
    assert forward_calls(model) == [1, 2, 1]


def test_apply_a_different_plan_leaves_exactly_the_new_set() -> None:
    model = build_model()
    apply_plan(model, make_plan(model, decision("blocks.0"), decision("blocks.1")))
    new_plan = make_plan(
        model, decision("blocks.1", preserve_rng_state=False), decision("blocks.2")
    )
    apply_plan(model, new_plan)
    wrapped = wrapped_modules(model)
    assert sorted(wrapped) == ["blocks.1", "blocks.2"]
    assert wrapped["blocks.1"].preserve_rng_state is False  # re-wrapped with the new options
    assert "forward" not in vars(model.blocks[0])
    reset_calls(model)
    train_step(model)
    assert forward_calls(model) == [1, 2, 2]


def test_apply_an_empty_plan_unwraps_everything() -> None:
    model = build_model()
    apply_plan(model, make_plan(model, decision("blocks.0")))
    apply_plan(model, make_plan(model))
    assert_untouched(model)


def test_remove_plan_restores_the_model() -> None:
    reference = build_model()
    model = build_model()
    apply_plan(
        model,
        make_plan(
            model,
            decision("blocks.0"),
            decision("blocks.1.mlp", method=CheckpointMethod.CHECKPOINT_SEQUENTIAL, segments=2),
        ),
    )
    remove_plan(model)
    assert_untouched(model)
    reset_calls(model)
    loss, gradients = train_step(model)
    assert forward_calls(model) == [1, 1, 1]
    reference_loss, reference_gradients = train_step(reference)
    assert torch.equal(loss, reference_loss)
    assert all(torch.equal(gradients[n], reference_gradients[n]) for n in gradients)


def test_apply_plan_keeps_a_forward_the_user_set_on_the_instance() -> None:
    model = build_model()
    block = model.blocks[0]
    seen: list[int] = []

    def traced_forward(x: torch.Tensor) -> torch.Tensor:
        seen.append(1)
        return Block.forward(block, x)

    block.forward = traced_forward  # type: ignore[method-assign]
    apply_plan(model, make_plan(model, decision("blocks.0")))
    train_step(model)
    assert len(seen) == 2  # the user's forward is what gets checkpointed and recomputed
    remove_plan(model)
    assert vars(block)["forward"] is traced_forward


# -- training is unchanged ------------------------------------------------------------
@pytest.mark.parametrize(
    "decisions",
    [
        [decision("blocks.0")],
        [decision("blocks.0"), decision("blocks.1"), decision("blocks.2")],
        [decision("blocks.1.mlp", preserve_rng_state=False), decision("blocks.2")],
        [decision("blocks")],
        [
            decision(
                "blocks.0.mlp",
                method=CheckpointMethod.CHECKPOINT_SEQUENTIAL,
                segments=2,
                preserve_rng_state=False,
            ),
            decision("blocks.1"),
        ],
    ],
    ids=["one-block", "every-block", "mlp-and-block", "module-list", "sequential"],
)
def test_loss_and_gradients_equal_the_unwrapped_model(decisions: list[ModuleDecision]) -> None:
    reference = build_model()
    model = build_model()
    apply_plan(model, make_plan(model, *decisions))
    loss, gradients = train_step(model)
    after_wrapped = torch.rand(3)  # the global RNG ends where it would have
    reference_loss, reference_gradients = train_step(reference)
    after_reference = torch.rand(3)
    assert torch.equal(loss, reference_loss)
    assert gradients.keys() == reference_gradients.keys()
    for name in gradients:
        assert torch.equal(gradients[name], reference_gradients[name]), name
    assert torch.equal(after_wrapped, after_reference)


def test_dropout_without_rng_replay_changes_gradients() -> None:
    # The plan's preserve_rng_state reaches torch.utils.checkpoint: without the RNG stash the
    # recomputed dropout mask differs, so the gradients do (which is why plans keep it on
    # for modules with random ops).
    reference = build_model()
    model = build_model()
    apply_plan(model, make_plan(model, decision("blocks.0", preserve_rng_state=False)))
    loss, gradients = train_step(model)
    reference_loss, reference_gradients = train_step(reference)
    assert torch.equal(loss, reference_loss)  # the forward itself is the same
    assert not torch.equal(
        gradients["blocks.0.mlp.0.weight"], reference_gradients["blocks.0.mlp.0.weight"]
    )


# -- recomputation really happens ----------------------------------------------------------
def test_wrapped_block_runs_forward_twice_per_step() -> None:
    model = build_model()
    apply_plan(model, make_plan(model, decision("blocks.0"), decision("blocks.2")))
    reset_calls(model)
    train_step(model)
    assert forward_calls(model) == [2, 1, 2]


def test_the_recomputation_observer_sees_each_checkpointed_function_by_its_region() -> None:
    """A module's forward is its name; a checkpoint_sequential segment, its children's span
    (the last segment runs plainly, unobserved): each runs in the forward and again in
    backward."""
    from planner.apply import Region, observing_recomputation

    class Observer:
        def __init__(self) -> None:
            self.runs: list[Region] = []

        def region(self, region: Region, function: Any, cached_ops: frozenset[str]) -> Any:
            def run(*args: Any, **kwargs: Any) -> Any:
                self.runs.append(region)
                return function(*args, **kwargs)

            return run

    model = build_model()
    sequential = decision("blocks.1.mlp", method=CheckpointMethod.CHECKPOINT_SEQUENTIAL, segments=3)
    apply_plan(model, make_plan(model, decision("blocks.0"), sequential))
    observer = Observer()
    with observing_recomputation(observer):
        train_step(model)
    first, second = Region("blocks.1.mlp", 0, 1), Region("blocks.1.mlp", 1, 2)
    assert sorted(observer.runs, key=str) == sorted(
        [Region("blocks.0"), first, second] * 2, key=str
    )
    assert [str(first), str(Region("blocks.0"))] == ["blocks.1.mlp[0:1]", "blocks.0"]


def test_wrapped_block_runs_once_under_no_grad() -> None:
    model = build_model()
    apply_plan(model, make_plan(model, decision("blocks.0"), decision("blocks.2")))
    reset_calls(model)
    with torch.no_grad():
        model.eval()
        model(batch())
    assert forward_calls(model) == [1, 1, 1]


def test_wrapping_a_block_recomputes_its_children() -> None:
    model = build_model()
    mlp_calls = []
    model.blocks[0].mlp.register_forward_pre_hook(lambda module, args: mlp_calls.append(1))
    apply_plan(model, make_plan(model, decision("blocks.0")))
    train_step(model)
    assert len(mlp_calls) == 2


def test_wrapping_a_module_list_changes_nothing() -> None:
    # A ModuleList is never called (it has no forward); wrapping it recomputes nothing.
    model = build_model()
    apply_plan(model, make_plan(model, decision("blocks")))
    reset_calls(model)
    train_step(model)
    assert forward_calls(model) == [1, 1, 1]


def test_checkpointed_block_keeps_fewer_saved_tensors() -> None:
    # Count the tensors autograd keeps for backward: wrapping a block keeps only its input.
    def saved_count(model: nn.Module) -> int:
        count = 0

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal count
            count += 1
            return tensor

        torch.manual_seed(0)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(batch())
        return count

    unwrapped = saved_count(build_model())
    model = build_model()
    apply_plan(model, make_plan(model, decision("blocks.0")))
    assert saved_count(model) < unwrapped


# -- plans from files ------------------------------------------------------------------
def test_apply_plan_from_a_json_path(tmp_path: Path) -> None:
    model = build_model()
    path = save_plan(make_plan(model, decision("blocks.1")), tmp_path / "plan.json")
    apply_plan(model, path)
    assert sorted(wrapped_modules(model)) == ["blocks.1"]
    remove_plan(model)
    apply_plan(model, str(path))
    assert sorted(wrapped_modules(model)) == ["blocks.1"]


def test_apply_plan_from_a_missing_file_leaves_the_model_untouched(tmp_path: Path) -> None:
    model = build_model()
    with pytest.raises(PlanFileError):
        apply_plan(model, tmp_path / "missing.json")
    assert_untouched(model)


# -- mismatched plans --------------------------------------------------------------------
def _assert_forward_unchanged(model: TinyModel) -> None:
    assert_untouched(model)
    reset_calls(model)
    loss, _ = train_step(model)
    assert forward_calls(model) == [1, 1, 1]
    reference_loss, _ = train_step(build_model())
    assert torch.equal(loss, reference_loss)


def test_plan_naming_a_missing_module_is_refused() -> None:
    model = build_model()
    plan = make_plan(model, decision("blocks.0"), decision("blocks.7"))
    with pytest.raises(PlanMismatchError, match=r"blocks\.7"):
        apply_plan(model, plan)
    _assert_forward_unchanged(model)


def test_plan_naming_the_root_is_refused() -> None:
    model = build_model()
    with pytest.raises(PlanMismatchError):
        apply_plan(model, make_plan(model, decision("")))
    _assert_forward_unchanged(model)


def test_plan_for_another_model_is_refused() -> None:
    model = build_model()
    other = build_model(width=WIDTH * 2)
    plan = make_plan(other, decision("blocks.0"))
    with pytest.raises(PlanMismatchError) as raised:
        apply_plan(model, plan)
    message = str(raised.value)
    assert "another model" in message
    assert "blocks.0.mlp.0.weight" in message  # names a parameter whose shape differs
    assert "ckpt-plan profile" in message
    _assert_forward_unchanged(model)


def test_plan_with_a_wrong_digest_is_refused() -> None:
    model = build_model()
    plan = make_plan(model, decision("blocks.0"))
    plan = dataclasses.replace(plan, fingerprint={**plan.fingerprint, "digest": "0" * 64})
    with pytest.raises(PlanMismatchError):
        apply_plan(model, plan)
    _assert_forward_unchanged(model)


def test_a_refused_plan_keeps_the_previous_plan() -> None:
    model = build_model()
    good = make_plan(model, decision("blocks.0"))
    apply_plan(model, good)
    with pytest.raises(PlanMismatchError):
        apply_plan(model, make_plan(model, decision("blocks.1"), decision("nope")))
    assert wrapped_modules(model) == {"blocks.0": good.modules[0]}


def test_checkpoint_sequential_on_a_non_sequential_is_refused() -> None:
    model = build_model()
    plan = make_plan(
        model,
        decision("blocks.1"),
        decision("blocks.0", method=CheckpointMethod.CHECKPOINT_SEQUENTIAL, segments=2),
    )
    with pytest.raises(PlanMismatchError, match=r"not an nn\.Sequential"):
        apply_plan(model, plan)
    _assert_forward_unchanged(model)


@pytest.mark.parametrize("segments", [None, 0, -1])
def test_checkpoint_sequential_needs_segments(segments: int | None) -> None:
    model = build_model()
    plan = make_plan(
        model,
        decision("blocks.0.mlp", method=CheckpointMethod.CHECKPOINT_SEQUENTIAL, segments=segments),
    )
    with pytest.raises(PlanMismatchError, match="segments"):
        apply_plan(model, plan)
    _assert_forward_unchanged(model)


# -- copies ----------------------------------------------------------------------------
def test_model_pickles_after_apply_plan() -> None:
    model = build_model()
    apply_plan(model, make_plan(model, decision("blocks.0"), decision("blocks.2")))
    restored = pickle.loads(pickle.dumps(model))
    assert wrapped_modules(restored) == wrapped_modules(model)
    reset_calls(restored)
    loss, _ = train_step(restored)
    assert forward_calls(restored) == [2, 1, 2]
    reference_loss, _ = train_step(build_model())
    assert torch.equal(loss, reference_loss)


def test_deepcopy_of_a_wrapped_model_recomputes_its_own_modules() -> None:
    model = build_model()
    apply_plan(model, make_plan(model, decision("blocks.0")))
    duplicate = copy.deepcopy(model)
    reset_calls(model)
    reset_calls(duplicate)
    train_step(duplicate)
    assert forward_calls(duplicate) == [2, 1, 1]
    assert forward_calls(model) == [0, 0, 0]


def test_a_module_nested_in_one_that_does_not_hold_it_is_refused() -> None:
    model = build_model()
    plan = make_plan(model, decision("blocks.0"), decision("blocks.1.mlp", nested_in="blocks.0"))
    with pytest.raises(PlanFileError, match="not a checkpointed module containing it"):
        apply_plan(model, plan)
    assert_untouched(model)


def test_policies_and_nesting_train_as_without_a_plan() -> None:
    """A selective policy (linear outputs saved) and nesting keep loss and gradients."""
    reference_loss, reference_grads = train_step(build_model())
    model = build_model()
    apply_plan(
        model,
        make_plan(
            model,
            decision("blocks.0", policy="save-matmuls", saved_ops=("aten.addmm.default",)),
            decision("blocks.1"),
            decision("blocks.1.mlp", nested_in="blocks.1"),
        ),
        guard=False,
    )
    loss, grads = train_step(model)
    assert torch.equal(loss, reference_loss)
    assert all(torch.equal(grads[name], reference_grads[name]) for name in reference_grads)


def test_a_selective_policy_without_ops_is_refused() -> None:
    model = build_model()
    plan = make_plan(model, decision("blocks.0", policy="save-matmuls"))
    with pytest.raises(PlanFileError, match="names no ops to save"):
        apply_plan(model, plan)
    assert_untouched(model)


# -- the guard on the first training forward -------------------------------------------


class KeywordModel(TinyModel):
    """Called as ``model(**batch)``, like a Hugging Face model."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x)


def _batch_plan(model: nn.Module, batch: dict[str, object]) -> Plan:
    return dataclasses.replace(make_plan(model, decision("blocks.1")), batch=batch)


def _guard_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("ckpt-plan: ")]


def test_the_first_training_forward_warns_once_per_difference_then_the_guard_is_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    model = KeywordModel()
    planned = {"x": {"shape": [4, WIDTH], "dtype": "float32"}}
    apply_plan(model, _batch_plan(model, planned))
    with torch.no_grad():
        model(x=torch.randn(8, WIDTH))  # evaluation: not the step the plan is for
    assert not _guard_warnings(caplog) and len(model._forward_pre_hooks) == 1
    model.gradient_checkpointing = True  # as Hugging Face's gradient_checkpointing_enable()
    model.double()
    model(x=torch.randn(8, WIDTH, dtype=torch.float64)).backward()
    warnings = _guard_warnings(caplog)
    assert len(warnings) == 3, warnings
    assert "x is [8, 8] float64, the plan's was [4, 8] float32" in warnings[0]
    assert "float32 -> float64" in warnings[1]
    assert "gradient_checkpointing" in warnings[2]
    assert not model._forward_pre_hooks  # no cost on later steps
    model(x=torch.randn(8, WIDTH, dtype=torch.float64)).backward()
    assert len(_guard_warnings(caplog)) == 3


def test_the_planned_step_passes_the_guard_silently(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = KeywordModel()
    apply_plan(model, _batch_plan(model, {"x": {"shape": [4, WIDTH], "dtype": "float32"}}))
    model(x=torch.randn(4, WIDTH), labels=torch.zeros(4)).backward()
    assert not _guard_warnings(caplog) and not model._forward_pre_hooks


def test_the_guard_checks_a_compiled_model_eagerly_and_the_step_still_compiles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under torch.compile the guard's check runs outside the graph (it is disabled for
    TorchDynamo where it is called, not when this module is imported: importing planner.apply
    loads no TorchDynamo, ``test_importing_apply_plan_loads_no_compiler``)."""
    import torch._dynamo.utils

    torch.manual_seed(0)
    model = KeywordModel()
    apply_plan(model, _batch_plan(model, {"x": {"shape": [4, WIDTH], "dtype": "float32"}}))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = torch.compile(model, backend="eager")
    compiled(x=torch.randn(8, WIDTH)).backward()
    warnings = _guard_warnings(caplog)
    assert len(warnings) == 1 and "x is [8, 8] float32" in warnings[0], warnings
    assert not model._forward_pre_hooks
    compiled(x=torch.randn(8, WIDTH)).backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs
    assert len(_guard_warnings(caplog)) == 1


def test_importing_apply_plan_loads_no_compiler() -> None:
    """A training script's ``from planner import apply_plan`` (and each rank and check
    process) loads no TorchDynamo: 1.1 s of every process's start when it did."""
    code = "import sys, planner.apply; sys.exit('torch._dynamo' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_a_guarded_model_pickles_and_removing_the_plan_removes_the_guard() -> None:
    model = build_model()
    plan = _batch_plan(model, {"0": {"shape": [4, WIDTH], "dtype": "float32"}})
    apply_plan(model, plan)
    apply_plan(model, plan)  # again: still one guard
    assert len(model._forward_pre_hooks) == 1
    copy_ = pickle.loads(pickle.dumps(model))
    assert len(copy_._forward_pre_hooks) == 1
    remove_plan(model)
    assert not model._forward_pre_hooks
    apply_plan(model, plan, guard=False)
    assert not model._forward_pre_hooks and wrapped_modules(model)


def test_a_tuple_batch_is_compared_by_position(caplog: pytest.LogCaptureFixture) -> None:
    """A training_step's ``model(batch[0])`` for a tuple batch: the first tensor compared."""
    model = build_model()
    planned = {
        "0": {"shape": [4, WIDTH], "dtype": "float32"},
        "1": {"shape": [4], "dtype": "int64"},
    }
    apply_plan(model, _batch_plan(model, planned))
    model(torch.randn(6, WIDTH)).backward()
    warnings = _guard_warnings(caplog)
    assert len(warnings) == 1
    assert "0 is [6, 8] float32, the plan's was [4, 8] float32" in warnings[0]


VOCAB = 50
SEQ = 16


class CausalModel(TinyModel):
    """Called as a Hugging Face causal LM is: ``input_ids`` first, the rest keywords."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, WIDTH)

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: object = None,
        past_key_value: object = None,
        cache_params: object = None,
        cache: object = None,
    ) -> torch.Tensor:
        return super().forward(self.embedding(input_ids))


class BatchDictModel(CausalModel):
    """Takes the whole batch dict as its one argument."""

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        return super().forward(batch["input_ids"])


def _causal_plan(model: nn.Module) -> Plan:
    """The plan of ``--batch-size 4 --seq-len 16``: input_ids, attention_mask and labels."""
    tensor = {"shape": [4, SEQ], "dtype": "int64"}
    return _batch_plan(model, {"input_ids": tensor, "attention_mask": tensor, "labels": tensor})


def _causal_batch(batch_size: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


CALLS = {
    "every key by keyword": (CausalModel, lambda m, b: m(**b)),
    "keywords without the mask": (
        CausalModel,
        lambda m, b: m(input_ids=b["input_ids"], labels=b["labels"]),
    ),
    "positional": (CausalModel, lambda m, b: m(b["input_ids"], b["attention_mask"])),
    "positional and keywords": (CausalModel, lambda m, b: m(b["input_ids"], labels=b["labels"])),
    "a dict with extra keys": (
        CausalModel,
        lambda m, b: m(**b, use_cache=False, past_key_values=None),
    ),
    "the dict passed whole, with an extra key": (
        BatchDictModel,
        lambda m, b: m({**b, "position_ids": torch.arange(SEQ).expand_as(b["input_ids"])}),
    ),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_each_form_of_call_is_compared_with_the_plans_batch(
    call: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever subset of the batch the forward is passed, by keyword or by position, a
    batch of 8 warns once for a plan made at 4; the planned batch passes silently."""
    kind, forward = CALLS[call]
    torch.manual_seed(0)
    model = kind()
    apply_plan(model, _causal_plan(model))
    forward(model, _causal_batch(4)).backward()
    assert not _guard_warnings(caplog) and not model._forward_pre_hooks
    apply_plan(model, _causal_plan(model))
    forward(model, _causal_batch(8)).backward()
    forward(model, _causal_batch(8)).backward()
    warnings = _guard_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "input_ids is [8, 16] int64, the plan's was [4, 16] int64" in warnings[0]
    assert "re-run `ckpt-plan profile`" in warnings[0]


def test_a_call_that_cannot_be_matched_to_the_batch_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A forward taking ``*inputs`` called positionally with a dict batch's tensors: no name
    to match them by, so one line says they were not compared."""

    class Unnamed(CausalModel):
        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return super().forward(inputs[0])

    torch.manual_seed(0)
    model = Unnamed()
    apply_plan(model, _causal_plan(model))
    batch = _causal_batch(8)
    model(batch["input_ids"], batch["labels"]).backward()
    model(batch["input_ids"], batch["labels"]).backward()
    warnings = _guard_warnings(caplog)
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert (
        "could not be matched to the plan's batch (input_ids, attention_mask, labels)"
        in (warnings[0])
    )


class Cache:
    """Stands for transformers' ``Cache``, recognized by its name."""


class DynamicCache(Cache):
    pass


@pytest.mark.parametrize(
    ("cache", "warned"),
    [
        ({"use_cache": True}, "use_cache=True"),
        ({"past_key_values": ((torch.zeros(1),),)}, "past_key_values"),
        ({"past_key_value": object()}, "past_key_value"),
        ({"cache_params": object()}, "cache_params"),
        ({"cache": DynamicCache()}, "cache"),  # transformers 5's name for past_key_values
        ({"use_cache": False, "past_key_values": None, "cache": None}, None),
        ({"cache": "a name too plain to trust alone"}, None),
    ],
)
def test_a_cache_asked_for_in_a_training_forward_warns(
    cache: dict[str, object], warned: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = CausalModel()
    apply_plan(model, _causal_plan(model))
    model(**_causal_batch(4), **cache).backward()
    warnings = _guard_warnings(caplog)
    if warned is None:
        assert not warnings
        return
    assert len(warnings) == 1, warnings
    assert f"asks for a Hugging Face cache ({warned})" in warnings[0]
    assert "made without one" in warnings[0] and "through the backward" in warnings[0]
    assert "drop the argument" in warnings[0]


# -- through wrappers --------------------------------------------------------------------
# A plan made for a model applies to a wrapper holding it as a submodule (found by its
# fingerprint): torch.compile's OptimizedModule, DDP, a peft model, a LightningModule.


def _assert_trains_like_the_unplanned_model(wrapper: nn.Module, inner: TinyModel) -> None:
    """One step through ``wrapper``: the planned blocks of ``inner`` (0 and 2) recompute,
    and loss and gradients equal those of the model without a plan."""
    reset_calls(inner)
    loss, _ = train_step(wrapper)
    assert forward_calls(inner) == [2, 1, 2]
    reference_loss, reference_gradients = train_step(build_model())
    assert torch.equal(loss, reference_loss)
    inner_gradients = {name: p.grad for name, p in inner.named_parameters()}
    for name, gradient in reference_gradients.items():
        assert torch.equal(inner_gradients[name], gradient), name


def _blocks_0_and_2(model: nn.Module) -> Plan:
    return make_plan(model, decision("blocks.0"), decision("blocks.2"))


def test_a_plan_applies_to_the_model_inside_torch_compile() -> None:
    model = build_model()
    plan = _blocks_0_and_2(model)
    compiled = torch.compile(model, backend="eager")
    assert apply_plan(compiled, plan) is compiled
    assert wrapped_modules(model) == {d.module_name: d for d in plan.modules}
    assert apply_plan(compiled, plan) is compiled  # idempotent through the wrapper too
    assert wrapped_modules(compiled) == {f"_orig_mod.{d.module_name}": d for d in plan.modules}
    loss, _ = train_step(compiled)
    reference_loss, _ = train_step(build_model())
    assert torch.equal(loss, reference_loss)


@pytest.fixture
def one_rank_process_group(tmp_path: Path) -> Iterator[None]:
    """A gloo process group of one rank in this process (what DDP needs to be built)."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank_process_group")
def test_a_plan_applies_to_the_model_inside_ddp() -> None:
    from torch.nn.parallel import DistributedDataParallel

    from planner.core.parallel import ParallelLayout

    model = build_model()
    ddp = DistributedDataParallel(model)
    plan = dataclasses.replace(_blocks_0_and_2(model), parallel=ParallelLayout(1, "ddp"))  # type: ignore[arg-type]
    apply_plan(ddp, plan)
    assert sorted(wrapped_modules(model)) == ["blocks.0", "blocks.2"]
    _assert_trains_like_the_unplanned_model(ddp, model)
    # a plan made for a single process is refused at DDP's first forward (no buckets in it)
    model = build_model()
    ddp = DistributedDataParallel(model)
    apply_plan(ddp, _blocks_0_and_2(model))
    with pytest.raises(PlanMismatchError, match="runs as one rank of a DDP job"):
        train_step(ddp)


@pytest.mark.usefixtures("one_rank_process_group")
def test_a_model_sharded_by_fsdp_is_refused_with_the_fix() -> None:
    from torch.distributed.fsdp import fully_shard

    model = build_model()
    plan = _blocks_0_and_2(model)
    fully_shard(model.blocks[0])
    fully_shard(model)
    with pytest.raises(PlanMismatchError, match=r"FSDP .*blocks\.0.*before sharding"):
        apply_plan(model, plan)
    assert wrapped_modules(model) == {}


def _peft_model(model: nn.Module) -> nn.Module:
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=2, target_modules=["mlp.0"], init_lora_weights=False)
    return peft.get_peft_model(model, config)


def _adapter_step(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One step of a peft model: the loss and the adapters' gradients (the rest is frozen)."""
    torch.manual_seed(7)
    loss = model(batch())
    loss.backward()
    trained = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), {name: gradient.clone() for name, gradient in trained.items()}


@pytest.mark.hf  # peft needs transformers
def test_a_plan_for_the_model_with_its_adapters_applies_to_the_peft_model() -> None:
    torch.manual_seed(0)
    peft_model = _peft_model(TinyModel())
    base = peft_model.get_base_model()
    apply_plan(peft_model, _blocks_0_and_2(base))  # made for the model peft returns
    assert sorted(wrapped_modules(base)) == ["blocks.0", "blocks.2"]
    reset_calls(base)
    loss, gradients = _adapter_step(peft_model)
    assert forward_calls(base) == [2, 1, 2]
    torch.manual_seed(0)
    reference_loss, reference_gradients = _adapter_step(_peft_model(TinyModel()))
    assert torch.equal(loss, reference_loss)
    assert gradients.keys() == reference_gradients.keys() and gradients
    assert all(torch.equal(gradients[name], reference_gradients[name]) for name in gradients)
    # A plan made for the PeftModel itself (its own module names) applies as it is.
    names = ["base_model.model.blocks.1"]
    apply_plan(peft_model, make_plan(peft_model, *(decision(name) for name in names)))
    assert sorted(wrapped_modules(peft_model)) == names


@pytest.mark.hf  # peft needs transformers
def test_a_plan_without_the_adapters_is_refused_for_a_peft_model_with_the_fix() -> None:
    plain = build_model()
    peft_model = _peft_model(build_model())
    with pytest.raises(PlanMismatchError) as raised:
        apply_plan(peft_model, _blocks_0_and_2(plain))
    message = str(raised.value)
    assert "blocks.0.mlp.0.base_layer is not in the plan's model" in message
    assert "get_peft_model(model, config)" in message
    assert wrapped_modules(peft_model) == {}


def test_a_plan_applies_to_the_model_a_lightning_module_holds() -> None:
    lightning = pytest.importorskip("lightning")

    class Holder(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build_model()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x)

    holder = Holder()
    apply_plan(holder, _blocks_0_and_2(holder.model))
    assert sorted(wrapped_modules(holder)) == ["model.blocks.0", "model.blocks.2"]
    _assert_trains_like_the_unplanned_model(holder, holder.model)


def test_a_model_held_twice_is_refused_with_the_fix() -> None:
    class Distillation(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.teacher = build_model()
            self.student = build_model()

    pair = Distillation()
    with pytest.raises(PlanMismatchError, match=r"2 times \(teacher, student\).*model\.teacher"):
        apply_plan(pair, _blocks_0_and_2(pair.student))
    assert wrapped_modules(pair) == {}
