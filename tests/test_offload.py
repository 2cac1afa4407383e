"""Offloading saved tensors to host memory (planner.apply.offload), run for real on CPU: the
hooks run, the copies are made and read back, training is bit-identical, and the offloaded
storages really leave the device (measured live storages) while the host holds them."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from planner.apply import apply_plan, model_fingerprint, remove_plan, wrapped_modules
from planner.apply.offload import HOST_MEMORY, OffloadedCall, PrefetchWatch
from planner.core.errors import PlanFileError, PlanMismatchError
from planner.core.records import Profile, Unit
from planner.core.units import format_bytes
from planner.measure.fake import build_fake_workload
from planner.measure.host_link import empty_host_cache
from planner.measure.model_file import ModelFile
from planner.measure.profiler import record_memory
from planner.measure.step import measure_step
from planner.measure.tracking import StorageWatcher, workload_tensors
from planner.measure.workload import build_workload
from planner.plan.memory_model import MemoryModel
from planner.plan.plan_file import (
    OFFLOAD_SCHEMA_VERSION,
    CheckpointMethod,
    ModuleDecision,
    Plan,
    load_plan,
    save_plan,
)
from planner.plan.targets import DeviceSpec, op_time_ms, roofline_costs
from planner.solve import Solver
from planner.solve.planning import build_plan
from tests.models import amp_file, model_file, units_of

WIDTH = 64
ROWS = 1024  # a (ROWS, 4 * WIDTH) fp32 activation is 1 MiB: the default threshold
MIB = 2**20


class Attention(nn.Module):
    """q, k and v are views of one projection's output: one storage, three saved views."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(8, ROWS // 8, 3, 4, WIDTH // 4).unbind(2)
        y = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.out(y.transpose(1, 2).reshape(ROWS, WIDTH))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(WIDTH)
        self.attention = Attention()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm(x))
        return x + self.dropout(self.down(nn.functional.gelu(self.up(x))))


class Model(nn.Module):
    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).pow(2).mean()


def build_model() -> Model:
    torch.manual_seed(0)
    return Model()


def batch() -> torch.Tensor:
    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(1))


def make_plan(model: nn.Module, *decisions: ModuleDecision) -> Plan:
    return Plan(
        budget_bytes=10**9,
        predicted_peak_bytes=10**8,
        baseline_peak_bytes=10**8,
        predicted_overhead=0.0,
        recompute_ms=0.0,
        step_ms=1.0,
        static_bytes=0,
        modules=decisions,
        fingerprint=model_fingerprint(model),
        batch={},
        device="cpu",
        torch_version=torch.__version__,
        model_name="offload-test",
    )


def offload(name: str, min_bytes: int = MIB, prefetch: str | None = None) -> ModuleDecision:
    return ModuleDecision(
        name, method=CheckpointMethod.OFFLOAD, offload_min_bytes=min_bytes, prefetch_module=prefetch
    )


@dataclasses.dataclass
class Step:
    loss: torch.Tensor
    gradients: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    after_forward_bytes: int  # live device storages when the forward has returned
    host_after_forward_bytes: int
    peak_bytes: int
    host_peak_bytes: int


def train_step(model: nn.Module, x: torch.Tensor | None = None) -> Step:
    """One forward and backward with a fixed RNG state, its live storages tracked."""
    x = batch() if x is None else x
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    HOST_MEMORY.reset_peak()
    watcher = StorageWatcher("cpu")
    watcher.add_existing(workload_tensors(model, None, x))
    with watcher:
        loss = model(x)
        after_forward = watcher.current_bytes
        host_after_forward = HOST_MEMORY.current_bytes
        loss.backward()
    watcher.close()
    assert HOST_MEMORY.current_bytes == 0, "host copies left after the backward"
    return Step(
        loss=loss.detach(),
        gradients={name: p.grad.clone() for name, p in model.named_parameters()},
        buffers={name: b.clone() for name, b in model.named_buffers()},
        after_forward_bytes=after_forward,
        host_after_forward_bytes=host_after_forward,
        peak_bytes=watcher.peak_bytes,
        host_peak_bytes=HOST_MEMORY.peak_bytes,
    )


def assert_same_training(reference: Step, planned: Step) -> None:
    assert torch.equal(planned.loss, reference.loss)
    assert planned.gradients.keys() == reference.gradients.keys()
    for name, gradient in reference.gradients.items():
        assert torch.equal(planned.gradients[name], gradient), name
    for name, buffer in reference.buffers.items():
        assert torch.equal(planned.buffers[name], buffer), name


def test_an_offloaded_block_trains_bit_identically_and_its_storages_leave() -> None:
    reference = train_step(build_model())
    model = build_model()
    apply_plan(model, make_plan(model, offload("blocks.1")), guard=False)
    planned = train_step(model)
    assert_same_training(reference, planned)
    # What left the device is what the host held, and it came back for the backward.
    moved = reference.after_forward_bytes - planned.after_forward_bytes
    assert moved == planned.host_after_forward_bytes == planned.host_peak_bytes
    # blocks.1's storages of 1 MiB and more that it saved: the attention projection (its
    # q, k, v views: 0.75 MiB, stays), the MLP's up-projection and GELU outputs (1 MiB each).
    assert moved == 2 * MIB
    assert planned.peak_bytes <= reference.peak_bytes


def test_a_lower_threshold_moves_more_and_every_view_is_rebuilt() -> None:
    reference = train_step(build_model())
    model = build_model()
    apply_plan(model, make_plan(model, offload("blocks.0", 1), offload("blocks.2", 1)), guard=False)
    planned = train_step(model)
    assert_same_training(reference, planned)
    moved = reference.after_forward_bytes - planned.after_forward_bytes
    assert moved == planned.host_peak_bytes > 2 * 2 * MIB


def test_offload_composes_with_checkpointing_elsewhere() -> None:
    unplanned = build_model()
    reference = train_step(unplanned)
    model = build_model()
    plan = make_plan(
        model,
        offload("blocks.0", 1),
        ModuleDecision(
            "blocks.1",
            restore_buffers=("norm.running_mean", "norm.running_var", "norm.num_batches_tracked"),
        ),
        ModuleDecision(
            "blocks.2.attention", policy="save-matmuls", saved_ops=("aten.addmm.default",)
        ),
    )
    apply_plan(model, plan, guard=False)
    assert assert_wrapped(model) == {
        "blocks.0": "offload",
        "blocks.1": "whole",
        "blocks.2.attention": "save-matmuls",
    }
    planned = train_step(model)
    assert_same_training(reference, planned)
    # A second step: nothing of the first is left over (running statistics move on alike).
    assert_same_training(train_step(unplanned), train_step(model))


def host_bytes_at_backward_of(model: Model, plan: Plan) -> dict[str, int]:
    """Host bytes offloaded tensors hold when each block's backward begins (the gradient of
    its output is ready: before any of its saved tensors is read)."""
    apply_plan(model, plan, guard=False)
    seen: dict[str, int] = {}
    for index, block in enumerate(model.blocks):

        def record(_module: nn.Module, _grad: object, name: str = f"blocks.{index}") -> None:
            seen[name] = HOST_MEMORY.current_bytes

        block.register_full_backward_pre_hook(record)
    model(batch()).backward()
    assert HOST_MEMORY.current_bytes == 0
    return seen


def test_the_copy_back_starts_at_the_backward_of_the_next_block() -> None:
    """blocks.0 and blocks.1 offload 2 MiB each. Prefetched, blocks.1's tensors leave the
    host at the first unpack of blocks.2's backward and blocks.0's at blocks.1's; at their
    own backward otherwise. Training stays bit-identical either way."""
    reference = train_step(build_model())
    at_use = host_bytes_at_backward_of(
        build_model(), make_plan(build_model(), offload("blocks.0"), offload("blocks.1"))
    )
    assert at_use == {"blocks.2": 4 * MIB, "blocks.1": 4 * MIB, "blocks.0": 2 * MIB}
    prefetching = make_plan(
        build_model(),
        offload("blocks.0", prefetch="blocks.1"),
        offload("blocks.1", prefetch="blocks.2"),
    )
    early = host_bytes_at_backward_of(build_model(), prefetching)
    assert early == {"blocks.2": 4 * MIB, "blocks.1": 2 * MIB, "blocks.0": 0}
    model = build_model()
    apply_plan(model, prefetching, guard=False)
    assert_same_training(reference, train_step(model))


BN = ("norm.running_mean", "norm.running_var", "norm.num_batches_tracked")


def test_a_checkpointed_or_plain_trigger_starts_the_copy_back_too() -> None:
    """The trigger module's own wrapping does not matter: checkpointed (its recomputation
    fires it), plain with a checkpointed child (the child's recomputation, or the plain
    saves, whichever comes first), or the model's head."""
    reference = train_step(build_model())
    plans = [
        (offload("blocks.0", prefetch="blocks.1"), ModuleDecision("blocks.1", restore_buffers=BN)),
        (offload("blocks.0", prefetch="blocks.1"), ModuleDecision("blocks.1.attention")),
        (offload("blocks.2", prefetch="head"), ModuleDecision("blocks.1.up")),
        # the trigger under a selective policy: its recomputation runs under the policy's
        # dispatch mode, which must not see the copy back
        (
            offload("blocks.0", prefetch="blocks.1.attention"),
            ModuleDecision(
                "blocks.1.attention", policy="save-matmuls", saved_ops=("aten.addmm.default",)
            ),
        ),
    ]
    for decisions in plans:
        early = host_bytes_at_backward_of(build_model(), make_plan(build_model(), *decisions))
        offloaded = decisions[0].module_name
        assert early[offloaded] == 0, decisions
        model = build_model()
        apply_plan(model, make_plan(model, *decisions), guard=False)
        assert_same_training(reference, train_step(model))


def test_a_call_that_fires_a_trigger_queues_its_own_copy_back_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """blocks.1 is blocks.0's trigger and offloaded at its own use: its first unpack
    starts both copies back. Its own go first, so that on CUDA the event it waits for is
    recorded before blocks.0's copies are queued on the same side stream."""
    order: list[str] = []
    prefetch = OffloadedCall.prefetch

    def recorded(call: OffloadedCall) -> None:
        order.append("blocks.0" if call.prefetch_at is not None else "blocks.1")
        prefetch(call)

    monkeypatch.setattr(OffloadedCall, "prefetch", recorded)
    reference = train_step(build_model())
    model = build_model()
    plan = make_plan(model, offload("blocks.0", prefetch="blocks.1"), offload("blocks.1"))
    apply_plan(model, plan, guard=False)
    assert_same_training(reference, train_step(model))
    assert order == ["blocks.1", "blocks.0"]


def test_a_copy_back_fired_by_a_selective_recomputation_runs_outside_its_policy() -> None:
    """A trigger fired when a checkpoint under a selective policy recomputes (its inputs
    saved elsewhere, so the recomputation is the first unpack) starts its copies back
    inside that recomputation, where the policy's dispatch mode refuses any op the forward
    did not run ("aten.empty.memory_format encountered during backward", seen on the
    Llama-3-8B plan of benchmarks/offload.py): the copies run outside it, and the
    checkpointed function's gradient is unchanged."""
    from torch.utils.checkpoint import checkpoint

    from planner.apply import offload as offload_module
    from planner.apply.wrap import selective_contexts

    fired: list[torch.Tensor] = []

    class CopyBack:  # what a PrefetchTrigger does when fired: allocate and copy
        def fire(self) -> None:
            restored = torch.empty(16)
            restored.copy_(torch.ones(16))
            fired.append(restored)

    weight = torch.randn(8, 8, requires_grad=True)

    def function(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.mm(x, weight)).sin()

    decision = ModuleDecision("block", policy="save-matmuls", saved_ops=("aten.mm.default",))
    x = torch.randn(4, 8)
    expected = torch.autograd.grad(function(x).sum(), weight)[0]
    offload_module._active.append(CopyBack())  # type: ignore[arg-type]
    try:
        wrapped = offload_module.fire_at_recomputation(function)
    finally:
        offload_module._active.pop()
    output = checkpoint(
        wrapped,
        x,
        use_reentrant=False,
        context_fn=lambda: selective_contexts(decision),
    )
    assert not fired  # the forward fires nothing
    (gradient,) = torch.autograd.grad(output.sum(), weight)
    assert len(fired) == 1 and torch.equal(fired[0], torch.ones(16))
    assert torch.equal(gradient, expected)


def test_a_prefetch_at_a_module_the_model_lacks_is_refused_and_removal_unhooks() -> None:
    model = build_model()
    with pytest.raises(PlanMismatchError, match=r"at the backward of 'blocks\.9'"):
        apply_plan(model, make_plan(model, offload("blocks.0", prefetch="blocks.9")))
    assert wrapped_modules(model) == {}
    apply_plan(model, make_plan(model, offload("blocks.0", prefetch="blocks.1")), guard=False)
    assert PrefetchWatch.registered(model.blocks[1])
    copied = pickle.loads(pickle.dumps(model))
    assert PrefetchWatch.registered(copied.blocks[1])
    assert_same_training(train_step(build_model()), train_step(copied))
    # Applied again without the prefetch: the watch goes; removed: nothing is left.
    apply_plan(model, make_plan(model, offload("blocks.0")), guard=False)
    assert not PrefetchWatch.registered(model.blocks[1])
    apply_plan(model, make_plan(model, offload("blocks.0", prefetch="blocks.1")), guard=False)
    remove_plan(model)
    assert not PrefetchWatch.registered(model.blocks[1]) and wrapped_modules(model) == {}
    assert not model.blocks[1]._forward_hooks and not model.blocks[1]._forward_pre_hooks


def assert_wrapped(model: nn.Module) -> dict[str, str]:
    return {name: decision.how for name, decision in wrapped_modules(model).items()}


def test_inputs_outputs_and_parameters_stay_on_the_device() -> None:
    """A Linear saves its input (the block's input) and its weight; the block returns the
    output its last op saved: none of them may leave."""

    class Saver(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4 * WIDTH, 4 * WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(self.linear(x))  # sigmoid saves its output

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.saver = Saver()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.saver(x).pow(2).mean()

    torch.manual_seed(0)
    model = Outer()
    x = torch.randn(ROWS, 4 * WIDTH)  # 1 MiB: over the threshold
    apply_plan(model, make_plan(model, offload("saver", 1)), guard=False)
    # Saved inside: x (an input), the weight (a parameter), sigmoid's result (the output).
    assert train_step(model, x).host_peak_bytes == 0


class ConjugateViews(nn.Module):
    """Saves one 2 MiB complex storage twice, through views whose conjugate (``conj``) or
    negative (``conj().imag``) bit differs."""

    def __init__(self, negative: bool) -> None:
        super().__init__()
        self.negative = negative

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * 2
        if self.negative:
            return (a.conj().imag * a.imag).sum()
        return (a.conj() * a).sum().abs()


@pytest.mark.parametrize("negative", [False, True])
def test_a_storage_saved_through_a_conjugate_or_negative_view_stays(negative: bool) -> None:
    """Copied through the view with the bit, the host copy would hold the resolved values
    and the other view would read them: such a storage stays on the device (nothing goes to
    the host) and the gradients are the unplanned step's."""

    def step(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, int]:
        x = torch.randn(512, 512, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
        x.requires_grad_()
        HOST_MEMORY.reset_peak()
        loss = model(x)
        loss.backward()
        assert x.grad is not None
        return loss.detach(), x.grad, HOST_MEMORY.peak_bytes

    reference = step(nn.Sequential(ConjugateViews(negative)))
    model = nn.Sequential(ConjugateViews(negative))
    apply_plan(model, make_plan(model, offload("0")), guard=False)
    loss, gradient, host_bytes = step(model)
    assert torch.equal(loss, reference[0]) and torch.equal(gradient, reference[1])
    assert host_bytes == 0


class NestedSaver(nn.Module):
    """Saves a strided nested tensor of 1 MiB (``sin`` saves its input; so does ``unbind``
    its output), made of two 0.5 MiB pieces (below the threshold)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nested = torch.nested.as_nested_tensor([x[:256] * 2, x[256:] * 3], layout=torch.strided)
        return torch.stack([part.sum() for part in nested.sin().unbind()]).sum()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_saved_nested_tensor_stays_on_the_device() -> None:
    def step(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, int]:
        x = torch.randn(512, 512, generator=torch.Generator().manual_seed(0)).requires_grad_()
        HOST_MEMORY.reset_peak()
        loss = model(x)
        loss.backward()
        assert x.grad is not None
        return loss.detach(), x.grad, HOST_MEMORY.peak_bytes

    reference = step(nn.Sequential(NestedSaver()))
    model = nn.Sequential(NestedSaver())
    apply_plan(model, make_plan(model, offload("0")), guard=False)
    loss, gradient, host_bytes = step(model)
    assert torch.equal(loss, reference[0]) and torch.equal(gradient, reference[1])
    assert host_bytes == 0


class ReusedAddress(nn.Module):
    """Saves a 4 MiB storage that dies inside the forward (the op that saved it is let go
    of), then makes empty tensors (no data to allocate) until one's storage is at the dead
    one's StorageImpl address, if any is, and saves that one."""

    def __init__(self) -> None:
        super().__init__()
        self.reused = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dying = x.repeat(4, 1) * 2
        dying.sin()  # saves ``dying``; the result, its node and the saved tensor go at once
        key = dying.untyped_storage()._cdata
        del dying
        made = []
        for _ in range(1000):
            made.append(torch.empty(0))
            if made[-1].untyped_storage()._cdata == key:
                break
        self.reused = made[-1].untyped_storage()._cdata == key
        empty = made[-1].copy_(x[0, :0])
        return x.sin().sum() + empty.sin().sum()


def test_a_storage_made_where_a_dead_saved_one_was_is_not_taken_for_it() -> None:
    """Storages are found by their StorageImpl's address. Unplanned, the empty storage
    takes the dead 4 MiB one's address (the allocator's next free block of that size: in
    most steps, so each step below is run a few times); in the offloaded forward the dead
    one's record keeps its address, so the empty storage is never taken for a 4 MiB one
    (its copy to the host would read 4 MiB from it: an error)."""

    def step(model: nn.Sequential) -> tuple[torch.Tensor, torch.Tensor, bool]:
        x = torch.randn(1024, 256, generator=torch.Generator().manual_seed(0)).requires_grad_()
        loss = model(x)
        loss.backward()
        assert x.grad is not None
        return loss.detach(), x.grad, model[0].reused

    unplanned = [step(nn.Sequential(ReusedAddress())) for _ in range(5)]
    if not any(reused for _, _, reused in unplanned):
        pytest.skip("this allocator gave no new storage the dead one's address")
    reference = unplanned[0]
    model = nn.Sequential(ReusedAddress())
    apply_plan(model, make_plan(model, offload("0", 1)), guard=False)
    HOST_MEMORY.reset_peak()
    for _ in range(5):
        loss, gradient, reused = step(model)
        assert not reused
        assert torch.equal(loss, reference[0]) and torch.equal(gradient, reference[1])
    assert HOST_MEMORY.peak_bytes == 0


def test_a_forward_whose_graph_is_dropped_lets_go_of_its_host_copies() -> None:
    model = build_model()
    apply_plan(model, make_plan(model, offload("blocks.1")), guard=False)
    loss = model(batch())
    assert HOST_MEMORY.current_bytes == 2 * MIB
    del loss
    assert HOST_MEMORY.current_bytes == 0


def test_under_no_grad_nothing_is_saved_or_moved() -> None:
    model = build_model()
    apply_plan(model, make_plan(model, offload("blocks.1")), guard=False)
    HOST_MEMORY.reset_peak()
    with torch.no_grad():
        model(batch())
    assert HOST_MEMORY.peak_bytes == 0


def test_offload_on_the_path_of_another_decision_is_refused() -> None:
    model = build_model()
    plan = make_plan(model, offload("blocks.1"), ModuleDecision("blocks.1.attention"))
    wraps = r"offloads blocks\.1 and also wraps blocks\.1\.attention"
    with pytest.raises(PlanFileError, match=wraps):
        apply_plan(model, plan)
    assert wrapped_modules(model) == {}


def test_remove_copy_and_pickle_an_offloading_model() -> None:
    model = build_model()
    apply_plan(model, make_plan(model, offload("blocks.1")), guard=False)
    copies = (copy.deepcopy(model), pickle.loads(pickle.dumps(model)))
    reference = train_step(model)
    for other in copies:
        assert assert_wrapped(other) == {"blocks.1": "offload"}
        assert other.blocks[1].__dict__["_ckpt_plan_root"] is other
        assert_same_training(reference, train_step(other))
    remove_plan(model)
    assert wrapped_modules(model) == {} and "_ckpt_plan_root" not in vars(model.blocks[1])


def test_a_plan_that_offloads_is_schema_2_and_reads_back(tmp_path: Path) -> None:
    model = build_model()
    plan = dataclasses.replace(
        make_plan(model, offload("blocks.1")),
        host_budget_bytes=10**9,
        predicted_host_peak_bytes=2 * MIB,
    )
    path = save_plan(plan, tmp_path / "plan.json")
    assert '"schema_version": 2' in path.read_text() and OFFLOAD_SCHEMA_VERSION == 2
    loaded = load_plan(path)
    assert loaded.modules == plan.modules and loaded.offloads
    assert loaded.host_budget_bytes == 10**9 and loaded.predicted_host_peak_bytes == 2 * MIB
    plain = save_plan(make_plan(model, ModuleDecision("blocks.1")), tmp_path / "plain.json")
    assert '"schema_version": 1' in plain.read_text()
    assert "prefetch_module" not in plain.read_text() + path.read_text()
    # Without prefetch_module (and in plans written before it) a decision copies back at its
    # own backward: the offload-at-use unit; with it, the prefetched offload unit.
    assert loaded.units == (Unit("blocks.1", option="offload-at-use"),)
    prefetching = make_plan(model, offload("blocks.1", prefetch="blocks.2"))
    again = load_plan(save_plan(prefetching, tmp_path / "prefetch.json"))
    assert again.modules == prefetching.modules
    assert again.units == (Unit("blocks.1", option="offload"),)


@pytest.mark.cuda
def test_on_cuda_the_copies_use_pinned_buffers_and_a_side_stream() -> None:
    """Bit-identical on CUDA too; the storages leave the allocator's count when the forward
    ends (``memory_allocated``) and come back for the backward."""
    device = torch.device("cuda")
    reference_model = build_model().to(device)
    x = batch().to(device)

    def step(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        loss = model(x)
        torch.cuda.synchronize()
        after_forward = torch.cuda.memory_allocated(device)
        loss.backward()
        torch.cuda.synchronize()
        grads = {name: p.grad.detach().cpu() for name, p in model.named_parameters()}
        return loss.detach().cpu(), grads, after_forward

    reference = step(reference_model)
    model = build_model().to(device)
    apply_plan(model, make_plan(model, offload("blocks.1")), guard=False)
    HOST_MEMORY.reset_peak()
    planned = step(model)
    assert torch.equal(planned[0], reference[0])
    assert all(torch.equal(planned[1][name], grad) for name, grad in reference[1].items())
    assert reference[2] - planned[2] == HOST_MEMORY.peak_bytes == 2 * MIB
    assert HOST_MEMORY.current_bytes == 0
    # Prefetched at the next block's backward (the side stream's event waited for at the
    # first unpack), two blocks in a row: still bit-identical, nothing left on the host.
    model = build_model().to(device)
    prefetching = make_plan(
        model, offload("blocks.0", prefetch="blocks.1"), offload("blocks.1", prefetch="blocks.2")
    )
    apply_plan(model, prefetching, guard=False)
    HOST_MEMORY.reset_peak()
    planned = step(model)
    assert torch.equal(planned[0], reference[0])
    assert all(torch.equal(planned[1][name], grad) for name, grad in reference[1].items())
    assert reference[2] - planned[2] == HOST_MEMORY.peak_bytes == 4 * MIB
    assert HOST_MEMORY.current_bytes == 0


# -- the memory model against measured steps -----------------------------------------------
def offload_file() -> ModelFile:
    return model_file(build_model, batch, name="offload-model")


# A device with a host link, only to give the offload option a cost (any will do here).
LINKED = DeviceSpec("linked", "cuda", 2**40, {"float32": 1e12}, 1e11, host_link_bytes_per_s=1e10)

# Plans, each with how far above the measured peak its prediction may be. ``@offload``
# prefetches at the next block's backward (the memory model's point 8); ``@offload-at-use``
# brings the tensors back at the module's own backward. A checkpointed prefetch trigger
# (blocks.1 below) holds the prefetched bytes through its backward, where the checkpoint
# model is an upper bound: a recomputed saved tensor dies when the node that last reads it
# is done with it, not when the node ends, as unplanned (here before a Linear's 256-byte
# bias gradient is made: 512 bytes in the emulated CUDA step's blocks).
PLANS = [
    (("blocks.1@offload",), 0),
    (("blocks.1@offload-at-use",), 0),
    (("blocks.0@offload-at-use", "blocks.1", "blocks.2@offload"), 0),
    (("blocks.0@offload", "blocks.1", "blocks.2@offload"), 256),
    (("blocks.0@offload", "blocks.1.attention@save-matmuls", "blocks.2.up"), 0),
    (("blocks.0@offload", "blocks.1@offload", "blocks.2@offload"), 0),
    (("blocks.0@offload", "blocks.1@offload", "blocks.2@offload-at-use"), 0),
]


@pytest.fixture(scope="module")
def offload_profile() -> Profile:
    workload, session = build_fake_workload(offload_file(), "cpu", seed=0)
    return roofline_costs(record_memory(workload, session=session), LINKED)


@pytest.mark.parametrize(("names", "slack"), PLANS)
def test_a_planned_real_step_peaks_where_the_memory_model_says(
    offload_profile: Profile, names: tuple[str, ...], slack: int
) -> None:
    """Offload alone, prefetched or not, with checkpointing and policies beside it, on
    every block: the real step with the hooks, measured by its live storages, peaks at the
    prediction to the byte (see PLANS for the one exception), holds the predicted host
    memory, and trains bit-identically."""
    units = units_of(names)
    plan = build_plan(offload_profile, units, 0, strategy="test")
    assert plan.offloads and plan.predicted_host_peak_bytes > 0
    unplanned = measure_step(build_workload(offload_file(), seed=0), seed=0)
    real = build_workload(offload_file(), seed=0)
    apply_plan(real.model, plan, guard=False)
    measured = measure_step(real, seed=0)
    assert 0 <= plan.predicted_peak_bytes - measured.peak_bytes <= slack
    assert measured.host_peak_bytes == plan.predicted_host_peak_bytes
    assert torch.equal(measured.loss_tensor, unplanned.loss_tensor)
    for name, gradient in unplanned.gradients.items():
        assert torch.equal(measured.gradients[name], gradient), name
    for name, buffer in unplanned.buffers.items():
        assert torch.equal(measured.buffers[name], buffer), name


def test_under_autocast_the_weights_casts_stay_and_the_step_peaks_as_predicted() -> None:
    """fp32 weights trained under autocast: each Linear saves its weight's bf16 copy (1
    MiB), which autocast's cache holds until the forward ends. It stays on the device, as
    the weight does, in the step and in the memory model alike: the peak, inside autocast
    after the offloaded blocks, is the prediction, and the host holds only activations (1
    MiB each: GELU's input and ``down``'s). ``up`` casts its weight once for both of its
    calls, as without the plan, so training stays bit-identical."""
    workload, session = build_fake_workload(amp_file(), "cpu", seed=0)
    profile = roofline_costs(record_memory(workload, session=session), LINKED)
    session.release()
    casts = sorted(s.size_bytes for s in profile.timeline.storages if s.leaf_cast)
    # blocks.0 takes the batch (no grad): its ``up`` saves no weight, its ``down`` does; and
    # the head's (1 KiB).
    assert casts == [1024] + [MIB] * 5
    unplanned = measure_step(build_workload(amp_file(), seed=0), seed=0)
    for names, host_bytes in [
        (("blocks.1@offload",), 2 * MIB),
        (("blocks.0@offload", "blocks.1@offload-at-use"), 4 * MIB),
    ]:
        plan = build_plan(profile, units_of(names), 0, strategy="test")
        assert plan.predicted_host_peak_bytes == host_bytes, names
        assert plan.predicted_peak_bytes == unplanned.peak_bytes - host_bytes, names
        real = build_workload(amp_file(), seed=0)
        apply_plan(real.model, plan, guard=False)
        measured = measure_step(real, seed=0)
        assert measured.peak_bytes == plan.predicted_peak_bytes, names
        assert measured.host_peak_bytes == host_bytes, names
        assert torch.equal(measured.loss_tensor, unplanned.loss_tensor)
        for name, gradient in unplanned.gradients.items():
            assert torch.equal(measured.gradients[name], gradient), name


def test_the_emulated_cuda_step_with_offload_peaks_where_predicted() -> None:
    """A CUDA step emulated on fake CPU tensors (this machine has no GPU): the planned
    step's device peak, host copies counted apart, equals the prediction (storages in
    512-byte blocks, as CUDA's allocator counts them)."""
    workload, session = build_fake_workload(offload_file(), "cuda", seed=0, emulate=True)
    profile = roofline_costs(record_memory(workload, session=session), LINKED)
    session.release()
    memory = MemoryModel.for_profile(profile)
    # Checkpointed modules whose kernels the emulation replaces (attention, dropout)
    # recompute under it as their forward ran (planner.apply.wrap.RecomputedUnder).
    emulated = [
        (("blocks.1@offload-at-use",), 0),
        (("blocks.0@offload",), 0),
        (("blocks.0@offload", "blocks.1.up", "blocks.2@offload"), 0),
        (("blocks.0@offload", "blocks.1@offload", "blocks.2@offload"), 0),
        (("blocks.0@offload", "blocks.1@offload", "blocks.2@offload-at-use"), 0),
        (("blocks.0@offload-at-use", "blocks.1@offload", "blocks.2.attention"), 0),
        # See PLANS: here the model's held tensors (66 KiB) meet the bias gradient's
        # reduction scratch (2 MiB, planner.measure.kernel_scratch) instead of its 512 bytes.
        (("blocks.0@offload", "blocks.1", "blocks.2@offload"), 67584),
        (("blocks.0@offload", "blocks.1.attention@save-matmuls", "blocks.2.attention"), 0),
    ]
    for names, slack in emulated:
        plan = build_plan(profile, units_of(names), 0, strategy="test", memory=memory)
        workload, session = build_fake_workload(offload_file(), "cuda", seed=0, emulate=True)
        apply_plan(workload.model, plan, guard=False)
        HOST_MEMORY.reset_peak()
        measured = record_memory(workload, session=session)
        session.release()
        assert 0 <= plan.predicted_peak_bytes - measured.measured_peak_bytes <= slack, names
        assert HOST_MEMORY.peak_bytes == plan.predicted_host_peak_bytes, names
        assert plan.predicted_peak_bytes < profile.measured_peak_bytes
    # Prefetched one block early, blocks.1's tensors are back at blocks.2's backward, where
    # this step peaks: offloading it alone then lowers nothing; at its own backward it does.
    alone = [Unit("blocks.1", option="offload")]
    assert memory.peak_bytes(alone) == profile.measured_peak_bytes
    assert memory.prefetch_module(alone[0]) == "blocks.2"


# -- pinned host blocks: a CUDA plan's host memory in powers of two --------------------------
class OddBlock(nn.Module):
    """Saves two 3 MiB activations (768 x 1024 fp32), not a power of two: CUDA's caching host
    allocator takes a 4 MiB pinned block for each."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(256, 1024)
        self.down = nn.Linear(1024, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(x)))


class OddModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(OddBlock() for _ in range(3))
        self.head = nn.Linear(256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).pow(2).mean()


def odd_file() -> ModelFile:
    def build() -> OddModel:
        torch.manual_seed(0)
        return OddModel()

    def odd_batch() -> torch.Tensor:
        return torch.randn(768, 256, generator=torch.Generator().manual_seed(1))

    return model_file(build, odd_batch, name="odd-model")


ODD_UNITS = (Unit("blocks.0", option="offload"), Unit("blocks.1", option="offload"))


def test_a_cuda_plan_counts_its_host_copies_in_pinned_blocks() -> None:
    """Two offloaded blocks, each two 3 MiB activations: a CPU plan's host holds the 12 MiB
    copied (a real step measures it); a CUDA plan's holds 16 MiB, the powers of two the
    pinned host allocator takes (the emulated CUDA step measures it), records that
    assumption, and its host budget counts the blocks too."""
    from planner.core.allocator import PINNED_HOST_ASSUMPTION

    workload, session = build_fake_workload(odd_file(), "cpu", seed=0)
    cpu_profile = roofline_costs(record_memory(workload, session=session), LINKED)
    session.release()
    cpu_plan = build_plan(cpu_profile, ODD_UNITS, 0, strategy="test")
    assert cpu_plan.predicted_host_peak_bytes == 2 * 6 * MIB
    assert PINNED_HOST_ASSUMPTION not in {str(note) for note in cpu_plan.assumptions}
    real = build_workload(odd_file(), seed=0)
    apply_plan(real.model, cpu_plan, guard=False)
    assert measure_step(real, seed=0).host_peak_bytes == 2 * 6 * MIB

    workload, session = build_fake_workload(odd_file(), "cuda", seed=0, emulate=True)
    cuda_profile = roofline_costs(record_memory(workload, session=session), LINKED)
    session.release()
    cuda_plan = build_plan(cuda_profile, ODD_UNITS, 0, strategy="test")
    assert cuda_plan.predicted_host_peak_bytes == 2 * 8 * MIB
    assert [d.host_bytes for d in cuda_plan.modules] == [8 * MIB, 8 * MIB]
    assert PINNED_HOST_ASSUMPTION in {str(note) for note in cuda_plan.assumptions}
    workload, session = build_fake_workload(odd_file(), "cuda", seed=0, emulate=True)
    apply_plan(workload.model, cuda_plan, guard=False)
    HOST_MEMORY.reset_peak()
    record_memory(workload, session=session)
    session.release()
    assert HOST_MEMORY.peak_bytes == cuda_plan.predicted_host_peak_bytes
    assert HOST_MEMORY.current_bytes == 0
    # The copies still move the bytes themselves (what the link's time is charged for).
    memory = MemoryModel.for_profile(cuda_profile)
    assert memory.pinned_host and not MemoryModel.for_profile(cpu_profile).pinned_host
    (effect,) = memory.unit_effects(ODD_UNITS[0])
    assert effect.host_bytes == 6 * MIB
    # A 12 MiB host budget holds both blocks' copies on CPU, not their pinned blocks.
    assert Solver(cpu_profile, host_budget_bytes=12 * MIB).host_fits(ODD_UNITS)
    assert not Solver(cuda_profile, host_budget_bytes=12 * MIB).host_fits(ODD_UNITS)
    assert Solver(cuda_profile, host_budget_bytes=16 * MIB).host_fits(ODD_UNITS)


@pytest.mark.cuda
def test_on_cuda_the_pinned_host_memory_of_a_planned_step_is_the_prediction() -> None:
    """What CUDA's caching host allocator holds for a planned step, by its own count
    (``torch.cuda.host_memory_stats``), is the predicted host peak in pinned blocks; the
    blocks made in the warm-up step are reused by the next."""
    workload, session = build_fake_workload(odd_file(), "cuda", seed=0)
    profile = roofline_costs(record_memory(workload, session=session), LINKED)
    session.release()
    plan = build_plan(profile, ODD_UNITS, 0, strategy="test")
    assert plan.predicted_host_peak_bytes == 2 * 8 * MIB
    real = build_workload(odd_file(), device="cuda", seed=0)
    apply_plan(real.model, plan, guard=False)
    torch.cuda.synchronize()
    empty_host_cache()  # cached blocks of earlier tests given back
    torch.cuda.reset_peak_host_memory_stats()
    before = torch.cuda.host_memory_stats()
    measured = measure_step(real, seed=0)  # a warm-up step, then the measured one
    torch.cuda.synchronize()
    after = torch.cuda.host_memory_stats()
    held = after["allocated_bytes.peak"] - before["allocated_bytes.current"]
    assert held == plan.predicted_host_peak_bytes == measured.host_peak_bytes
    assert after["num_host_alloc"] - before["num_host_alloc"] == 4  # four blocks, made once


# A Llama-shaped model (bf16: flash attention in the emulation), big enough that its
# layers' saved tensors pass the offload threshold.
LLAMA_PLANS = [
    ("model.layers.0", "model.layers.1"),
    ("model.layers.0@save-matmuls", "model.layers.1@save-attention"),
    ("model.layers.0@torchtitan", "model.layers.1@nested"),
    ("model.layers.0@offload", "model.layers.1"),
    ("model.layers.0@offload", "model.layers.1@offload-at-use"),
    (
        "model.layers.0.self_attn@offload",
        "model.layers.0.mlp",
        "model.layers.1.self_attn@save-matmuls",
        "model.layers.1.mlp@offload",
    ),
]


@pytest.fixture(scope="module")
def emulated_llama() -> tuple[ModelFile, DeviceSpec, Profile]:
    from planner.measure.hf import hf_workload
    from planner.measure.workload import load_model_file
    from planner.plan.targets import load_spec

    config = Path(__file__).resolve().parent.parent / "examples/configs/tiny-llama.json"
    llama = load_model_file(hf_workload(config, 32, 256, "bfloat16"))
    spec = load_spec("h100-80gb")
    workload, session = build_fake_workload(llama, "cuda", seed=0, emulate=True)
    recorded = record_memory(workload, session=session, workspace_bytes=spec.workspace_bytes)
    session.release()
    return llama, spec, roofline_costs(recorded, spec)


@pytest.mark.parametrize("names", LLAMA_PLANS)
def test_the_emulated_cuda_step_recomputes_as_its_forward_ran(
    emulated_llama: tuple[ModelFile, DeviceSpec, Profile], names: tuple[str, ...]
) -> None:
    """Checkpointed Llama layers, whole, selective and nested, alone and beside offloaded
    ones, on the emulated CUDA step: the recomputation runs CUDA's kernels as the forward
    did (else torch.utils.checkpoint finds other tensors saved and raises), and the device
    and host peaks equal the prediction to the byte."""
    llama, spec, profile = emulated_llama
    plan = build_plan(profile, units_of(names), 0, strategy="test")
    workload, session = build_fake_workload(llama, "cuda", seed=0, emulate=True)
    apply_plan(workload.model, plan, guard=False)
    HOST_MEMORY.reset_peak()
    measured = record_memory(workload, session=session, workspace_bytes=spec.workspace_bytes)
    session.release()
    assert measured.measured_peak_bytes == plan.predicted_peak_bytes
    assert HOST_MEMORY.peak_bytes == plan.predicted_host_peak_bytes
    assert plan.predicted_peak_bytes < profile.measured_peak_bytes


# -- the solver: keep, recompute and offload under one budget --------------------------------
# A link fast enough that offloading a block costs less than recomputing any of it.
FAST_LINK = dataclasses.replace(LINKED, host_link_bytes_per_s=1e13)


@pytest.fixture(scope="module")
def fast_link_profile() -> Profile:
    workload, session = build_fake_workload(offload_file(), "cpu", seed=0)
    return roofline_costs(record_memory(workload, session=session), FAST_LINK)


@pytest.mark.parametrize("host_budget", [None, 2 * MIB, 0])
@pytest.mark.parametrize("nesting", [True, False])
def test_the_searches_agree_and_keep_to_the_host_budget(
    fast_link_profile: Profile, host_budget: int | None, nesting: bool
) -> None:
    """Exhaustive search (exact) against the tree and integer programs, at budgets from the
    lowest feasible to the unplanned peak: the same cost, every answer within the device
    budget and the host budget; offload chosen where it is cheapest and host memory allows."""
    profile = fast_link_profile
    exhaustive = Solver(profile, nesting=nesting, host_budget_bytes=host_budget)
    programs = Solver(
        profile, nesting=nesting, host_budget_bytes=host_budget, exhaustive_evaluations=0
    )
    lowest = exhaustive.lowest_peak()[1]
    assert programs.lowest_peak()[1] == lowest
    chosen: set[str] = set()
    for fraction in (0.0, 0.1, 0.3, 0.5, 0.8):
        budget = int(lowest + fraction * (profile.measured_peak_bytes - lowest))
        for solver in (exhaustive, programs):
            solution = solver.solve(budget)
            assert solution.predicted_peak_bytes <= budget
            host = solver.tree.host(solution.units)
            assert host_budget is None or host <= host_budget
            assert host == solver.memory.host_peak_bytes(solution.units)
            chosen.update(unit.option or "whole" for unit in solution.units)
        assert programs.solve(budget).recompute_ms == pytest.approx(
            exhaustive.solve(budget).recompute_ms, abs=1e-6
        )
    assert ("offload" in chosen) == (host_budget != 0)


def test_a_plan_holds_no_free_unit_the_budget_does_not_need(fast_link_profile: Profile) -> None:
    """Over a fast link an offload costs nothing, so a cheapest plan could offload more than
    its budget needs; each answer keeps a free unit only where the plan without it passes
    the budget (the one-at-a-time check of the solver), at the same cost."""
    from planner.solve.solver import IDLE_UNIT_MS

    profile = fast_link_profile
    lowest = Solver(profile).lowest_peak()[1]
    free_seen = 0
    for fraction in (0.1, 0.3, 0.5, 0.8, 0.95):
        budget = int(lowest + fraction * (profile.measured_peak_bytes - lowest))
        for solver in (Solver(profile), Solver(profile, exhaustive_evaluations=0)):
            units = solver.solve(budget).units
            for unit in units:
                if solver.tree.cost_ms[unit] >= IDLE_UNIT_MS:
                    continue
                free_seen += 1
                fewer = tuple(other for other in units if other != unit)
                assert solver.peak(fewer) > budget, f"{unit} is not needed at {budget}"
    assert free_seen  # the link makes offloads free, and some plans need them


def test_without_offload_no_module_offloads(fast_link_profile: Profile) -> None:
    solver = Solver(fast_link_profile, offload=False)
    assert not any(unit.option == "offload" for unit in solver.tree.names)
    assert solver.host_budget_bytes is None
    budget = fast_link_profile.measured_peak_bytes * 9 // 10
    with_offload = Solver(fast_link_profile).solve(budget)
    assert any(unit.option == "offload" for unit in with_offload.units)
    assert solver.solve(budget).recompute_ms > with_offload.recompute_ms


def test_offloading_costs_what_the_compute_does_not_hide_each_way(
    offload_profile: Profile,
) -> None:
    """blocks.0 moves 2 MiB: 0.21 ms each way at 10 GB/s. The copy out runs beside the
    compute up to the end of the next candidate's forward, blocks.1.attention (with the
    BatchNorm before it: torch.nn's own layers are not candidates), at the profile's
    roofline times. The copy back, prefetched at blocks.1's backward, runs beside it up to
    blocks.0's first unpack; at its own backward (``offload-at-use``) it is paid in full.
    blocks.2, the last block, has the rest of the step up to its copy back for its window."""
    transfer_ms = 2 * MIB / LINKED.host_link_bytes_per_s * 1000
    record = offload_profile.module("blocks.0")
    window_ms = sum(
        offload_profile.module(name).forward_ms for name in ("blocks.1.norm", "blocks.1.attention")
    )
    assert 0 < window_ms < transfer_ms
    at_use = record.option_cost("offload-at-use")
    assert at_use.recompute_ms == pytest.approx(transfer_ms - window_ms + transfer_ms)
    # The backward of blocks.1, from its first unpack to blocks.0's, at roofline times.
    memory = MemoryModel(offload_profile.timeline)
    (effect,) = memory.unit_effects(Unit("blocks.0", option="offload"))
    assert effect.prefetch_module == "blocks.1" and effect.prefetch_event < effect.release_event
    backward_ms = sum(
        op_time_ms(op.flops, op.bytes_moved, op.dtype, LINKED)
        for op in offload_profile.timeline.op_costs
        if effect.prefetch_event <= op.event < effect.release_event
    )
    assert backward_ms > 0
    prefetched = record.option_cost("offload")
    assert prefetched.recompute_ms == pytest.approx(
        transfer_ms - window_ms + max(0.0, transfer_ms - backward_ms)
    )
    assert prefetched.recompute_ms < at_use.recompute_ms
    for cost in (prefetched, at_use):
        assert cost.freed_bytes == 2 * MIB and cost.recompute_flops == 0
    last = offload_profile.module("blocks.2").option_cost("offload-at-use").recompute_ms
    assert transfer_ms <= last <= 2 * transfer_ms
    # No host link, no offload option.
    no_link = roofline_costs(offload_profile, dataclasses.replace(LINKED, host_link_bytes_per_s=0))
    assert not any(o.option == "offload" for m in no_link.modules for o in m.options)


def test_solve_on_the_command_line_offloads_within_the_host_budget(
    fast_link_profile: Profile, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from planner.cli.main import app
    from planner.plan.profile_file import save_profile

    path = save_profile(fast_link_profile, tmp_path / "profile.json")
    budget = str(fast_link_profile.measured_peak_bytes * 3 // 4)

    def solve(*options: str) -> Plan:
        out = tmp_path / "plan.json"
        result = CliRunner().invoke(
            app, ["solve", str(path), "--budget", budget, "-o", str(out), *options]
        )
        assert result.exit_code == 0, result.output
        return load_plan(out)

    plan = solve("--host-budget", "100MiB")
    assert plan.offloads and plan.schema_version == 2
    assert plan.host_budget_bytes == 100 * MIB
    assert 0 < plan.predicted_host_peak_bytes <= 100 * MIB
    decision = next(d for d in plan.modules if d.method is CheckpointMethod.OFFLOAD)
    assert decision.offload_min_bytes == MIB and decision.host_bytes == 2 * MIB
    one_block = solve("--host-budget", "2MiB")
    assert one_block.predicted_host_peak_bytes == 2 * MIB
    for options in (("--no-offload",), ("--host-budget", "1MiB")):
        plain = solve(*options)
        assert not plain.offloads and plain.schema_version == 1
        assert plain.predicted_overhead > plan.predicted_overhead


def test_the_default_host_budget_of_a_rank_is_its_share_of_the_host(
    fast_link_profile: Profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank of a torchrun job pins its own copies: without --host-budget, a rank's plan
    may fill the host's free memory divided among the ranks on one host (all of a job of up
    to 8 ranks; 8 for a larger job), so 8 ranks cannot together pin 8 times the host."""
    from typer.testing import CliRunner

    import planner.core.devices
    from planner.cli.main import app
    from planner.core.parallel import ParallelLayout
    from planner.plan.profile_file import save_profile

    monkeypatch.setattr(planner.core.devices, "available_host_memory_bytes", lambda: 64 * MIB)
    budget = str(fast_link_profile.measured_peak_bytes * 3 // 4)
    for world_size, share in [(None, 64 * MIB), (2, 32 * MIB), (8, 8 * MIB), (64, 8 * MIB)]:
        layout = None if world_size is None else ParallelLayout(world_size, "fsdp2")
        path = save_profile(
            dataclasses.replace(fast_link_profile, parallel=layout),
            tmp_path / f"{world_size}" / "profile.json",
        )
        out = path.parent / "plan.json"
        commands = [["solve", str(path), "--budget", budget, "-o", str(out)]]
        if world_size == 8:  # report takes it as solve does (and draws: once is enough)
            commands.append(["report", str(path), "--budget", budget, "-o", str(tmp_path / "r")])
        for command in commands:
            result = CliRunner().invoke(app, command)
            assert result.exit_code == 0, result.output
            assert f"of a {format_bytes(share)} host budget" in result.output, command
        plan = load_plan(out)
        assert plan.offloads and plan.host_budget_bytes == share
        assert plan.predicted_host_peak_bytes <= share


@pytest.mark.slow
def test_the_plan_check_passes_an_offloading_plan_measured_at_its_prediction() -> None:
    """What `ckpt-plan verify` runs, on examples/gpt.py: two blocks offloaded (every saved
    storage of theirs, threshold 1 MiB) and one checkpointed, against the unplanned step and
    against the recomputation; the measured peak is the predicted one."""
    from planner.check.compare import CheckReference, check_plan
    from planner.measure.workload import load_model_file

    path = Path(__file__).resolve().parent.parent / "examples" / "gpt.py"
    workload, session = build_fake_workload(load_model_file(path), "cpu", seed=0)
    profile = roofline_costs(record_memory(workload, session=session), LINKED)
    blocks = profile.block_names
    units = [Unit(blocks[0], option="offload"), Unit(blocks[1], option="offload"), Unit(blocks[2])]
    plan = dataclasses.replace(
        build_plan(profile, units, profile.measured_peak_bytes, strategy="test"), target=None
    )
    assert plan.predicted_peak_bytes < profile.measured_peak_bytes
    for reference in (CheckReference.UNPLANNED, CheckReference.RECOMPUTATION):
        check = check_plan(path, plan, device="cpu", reference=reference)
        assert check.passed and check.training_unchanged, reference
        assert check.measured_peak_bytes == plan.predicted_peak_bytes, reference


# -- tradeoff, report and fit: the host bound and the host peak ------------------------------
def test_tradeoff_takes_the_host_budget_and_shows_the_host_peak(
    fast_link_profile: Profile, tmp_path: Path
) -> None:
    import pandas as pd
    from typer.testing import CliRunner

    from planner.cli.main import app
    from planner.plan.profile_file import save_profile

    path = save_profile(fast_link_profile, tmp_path / "profile.json")

    def tradeoff(*options: str) -> pd.DataFrame:
        out = tmp_path / "tradeoff.csv"
        result = CliRunner().invoke(
            app, ["tradeoff", str(path), "--points", "6", "--csv", str(out), *options]
        )
        assert result.exit_code == 0, result.output
        return pd.read_csv(out)

    bounded = tradeoff("--host-budget", "2MiB")
    assert "host_peak_mib" in bounded.columns
    assert bounded["host_peak_mib"].max() == 2.0  # one block's 2 MiB, no more
    assert bounded["how"].str.contains("offload").any()
    free = tradeoff("--host-budget", "1GiB")
    assert free["host_peak_mib"].max() > 2.0
    # Without offloading the table is as it always was.
    plain = tradeoff("--no-offload")
    assert "host_peak_mib" not in plain.columns
    assert not plain["how"].str.contains("offload").any()
    result = CliRunner().invoke(
        app, ["tradeoff", str(path), "--no-offload", "--host-budget", "1GB"]
    )
    assert result.exit_code == 2 and "--host-budget goes with --offload" in result.output


def test_report_takes_the_host_budget_and_shows_the_host_peak(
    fast_link_profile: Profile, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from planner.cli.main import app
    from planner.plan.profile_file import save_profile
    from planner.report.frames import tradeoff_frame
    from planner.report.summary import summary_markdown
    from planner.solve.planning import baseline_plans, frontier, plan_for_budget

    path = save_profile(fast_link_profile, tmp_path / "profile.json")
    budget = str(fast_link_profile.measured_peak_bytes * 3 // 4)

    def report(folder: str, *options: str) -> tuple[str, str]:
        result = CliRunner().invoke(
            app, ["report", str(path), "--budget", budget, "-o", str(tmp_path / folder), *options]
        )
        assert result.exit_code == 0, result.output
        return result.output, (tmp_path / folder / "summary.md").read_text()

    output, summary = report("bounded", "--host-budget", "2MiB")
    line = "host memory the plan's offloaded tensors hold (predicted) | 2.00 MiB of a 2.00 MiB"
    assert line in summary
    assert "host memory (offloaded tensors): 2.00 MiB of a 2.00 MiB host budget" in output
    assert (tmp_path / "bounded" / "tradeoff.png").stat().st_size > 0
    # A plan that offloads nothing says nothing about host memory.
    plain = plan_for_budget(
        fast_link_profile, int(budget), solver=Solver(fast_link_profile, offload=False)
    )[0]
    assert "host memory" not in summary_markdown(fast_link_profile, plain, {})
    # The frame behind the chart holds each plan's host peak.
    solver = Solver(fast_link_profile, host_budget_bytes=2 * MIB)
    sweep = frontier(fast_link_profile, 6, solver=solver)
    data = tradeoff_frame(fast_link_profile, sweep, baseline_plans(fast_link_profile))
    offloading = data[data["options"].str.contains("offload")]
    assert len(offloading) and (offloading["host_peak_bytes"] == 2 * MIB).all()
    assert (data[~data["options"].str.contains("offload")]["host_peak_bytes"] == 0).all()


WIDE_MODEL = """
import torch
from torch import nn

ROWS, WIDTH = 1024, 256


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(*(Block() for _ in range(4)), nn.Linear(WIDTH, 1))


def sample_batch(batch_size=1):
    return torch.randn(batch_size * ROWS, WIDTH)


def loss_fn(output, batch):
    return output.pow(2).mean()
"""


def test_fit_takes_the_host_budget_and_shows_the_host_peak(tmp_path: Path) -> None:
    """A device whose host link is fast enough that offloading is the cheapest answer: the
    largest batch's plan offloads, within --host-budget; the table gets a host column."""
    import json

    from typer.testing import CliRunner

    from planner.cli.main import app

    model = tmp_path / "wide.py"
    model.write_text(WIDE_MODEL)
    spec = tmp_path / "link.json"
    spec.write_text(
        json.dumps(
            {
                "name": "linked",
                "memory_bytes": 2**40,
                "peak_flops_per_s": {"float32": 1e12},
                "memory_bandwidth_bytes_per_s": 1e11,
                "host_link_bytes_per_s": 1e13,
            }
        )
    )

    def fit(*options: str) -> tuple[str, Plan]:
        out = tmp_path / "plan.json"
        result = CliRunner().invoke(
            app,
            [
                *("fit", str(model), "--budget", "40MiB", "--target", str(spec)),
                *("--max-size", "2", "-o", str(out), *options),
            ],
        )
        assert result.exit_code == 0, result.output
        return result.output, load_plan(out)

    output, plan = fit("--host-budget", "1GiB")
    assert plan.offloads and plan.host_budget_bytes == 2**30
    assert 0 < plan.predicted_host_peak_bytes <= 2**30
    assert "host memory" in output and format_bytes(plan.predicted_host_peak_bytes) in output
    for options in (("--no-offload",), ("--host-budget", "1MiB")):
        output, plain = fit(*options)
        assert not plain.offloads, options
        assert "host memory" not in output


# -- offloading on a CUDA device here: the host link measured ---------------------------------
def test_a_measured_cuda_profile_is_offered_offload_at_the_measured_link(
    offload_profile: Profile,
) -> None:
    """Times measured on a GPU here (relabelled: this machine has none) and a measured host
    link: every candidate that moves something gets both offload options, costed at the
    link with the measured step shared among the ops; a slower link costs more."""
    from planner.core.errors import PlannerError
    from planner.core.records import CostSource
    from planner.plan.targets import with_offload_options

    measured = dataclasses.replace(offload_profile, device="cuda", cost_source=CostSource.MEASURED)
    fast = with_offload_options(measured, 1e11)
    slow = with_offload_options(measured, 1e9)
    transfer_ms = 2 * MIB / 1e9 * 1000
    for profile in (fast, slow):
        options = {cost.option: cost for cost in profile.module("blocks.0").options}
        assert {"offload", "offload-at-use"} <= options.keys()
        assert options["offload"].recompute_ms < options["offload-at-use"].recompute_ms
        assert options["offload"].freed_bytes == 2 * MIB
        assert any("host link measured here" in str(note) for note in profile.assumptions)
    slow_cost = slow.module("blocks.0").option_cost("offload-at-use").recompute_ms
    assert fast.module("blocks.0").option_cost("offload-at-use").recompute_ms < slow_cost
    assert transfer_ms < slow_cost <= 2 * transfer_ms
    # The solver takes them as any other option.
    assert Solver(fast, host_budget_bytes=2 * MIB).lowest_peak()[1] < fast.measured_peak_bytes
    with pytest.raises(PlannerError, match="measured on a CUDA device"):
        with_offload_options(offload_profile, 1e11)  # roofline times
    with pytest.raises(ValueError, match="positive"):
        with_offload_options(measured, 0)


def test_calibrate_needs_a_cuda_device_and_checks_the_spec_first(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from planner.cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", "--device", "cpu"])
    assert result.exit_code == 4
    assert "measuring the host link needs a CUDA device, not cpu" in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = runner.invoke(app, ["calibrate", "--spec", str(tmp_path / "missing.json")])
    assert result.exit_code == 2 and "give an existing device spec .json file" in result.output
    if not torch.cuda.is_available():
        result = runner.invoke(app, ["calibrate"])
        assert result.exit_code == 4 and "no CUDA device is available" in result.output


def test_a_measured_link_written_into_a_spec_file_is_read_back(tmp_path: Path) -> None:
    import json

    from planner.plan.targets import load_spec, write_host_link

    path = tmp_path / "gpu.json"
    fields = {
        "name": "here",
        "memory_bytes": 2**34,
        "peak_flops_per_s": {"float32": 1e13},
        "memory_bandwidth_bytes_per_s": 1e12,
        "notes": ["kept"],
    }
    path.write_text(json.dumps(fields))
    spec = write_host_link(path, 2.5e10)
    assert spec.host_link_bytes_per_s == 2.5e10 == load_spec(str(path)).host_link_bytes_per_s
    assert json.loads(path.read_text())["notes"] == ["kept"]


def wide_file(tmp_path: Path) -> ModelFile:
    from planner.measure.source import WorkloadSource
    from planner.measure.workload import load_model_file

    path = tmp_path / "wide.py"
    path.write_text(WIDE_MODEL)
    return load_model_file(WorkloadSource.model_file(path))


def test_fit_with_a_measured_host_link_offers_offload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fit` on a GPU here: each timed size's measured times are costed for offloading at
    the link measured once, as `profile`'s are (this machine has no GPU: the measured
    profiles are relabelled CUDA's, as a GPU's would be); without the link, no offload."""
    import planner.pipeline
    from planner.fit import fit_largest

    measured_costs = planner.pipeline.with_measured_costs

    def on_cuda(*args: object, **kwargs: object) -> Profile:
        return dataclasses.replace(measured_costs(*args, **kwargs), device="cuda")

    monkeypatch.setattr(planner.pipeline, "with_measured_costs", on_cuda)

    def fit(link_bytes_per_s: float, **options: object) -> Plan:
        result = fit_largest(
            wide_file(tmp_path),
            40 * MIB,
            max_size=2,
            timing_steps=1,
            check=False,
            host_link_bytes_per_s=link_bytes_per_s,
            **options,
        )
        assert result.planned.profile.device == "cuda"
        return result.planned.plan

    plan = fit(1e13, host_budget_bytes=2**30)
    assert plan.offloads and 0 < plan.predicted_host_peak_bytes <= 2**30
    assert any("host link measured here" in str(note) for note in plan.assumptions)
    for link, options in ((0.0, {}), (1e13, {"offload": False})):
        plain = fit(link, **options)
        assert not plain.offloads, (link, options)


def test_fit_on_the_command_line_measures_the_host_link_once_on_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fit --device cuda` measures the link as `profile` does (one line on stderr) and
    passes it to the search; `--no-offload` and `--device cpu` measure nothing. (The GPU,
    the link and the search are stood in for: the boundary is what is tested.)"""
    from typer.testing import CliRunner

    import planner.fit
    import planner.measure.host_link
    from planner.cli.main import app
    from planner.core.errors import PlannerError
    from planner.measure.host_link import HostLink

    measured: list[tuple[str, int]] = []

    def measure_host_link(device: str, *, size_bytes: int, copies: int = 5) -> HostLink:
        measured.append((device, size_bytes))
        return HostLink(device, "stand-in GPU", 3e10, 2e10, size_bytes, copies)

    links: list[float] = []

    def fit_largest(*args: object, **kwargs: object) -> None:
        links.append(float(kwargs["host_link_bytes_per_s"]))
        raise PlannerError("stopped here")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(planner.measure.host_link, "measure_host_link", measure_host_link)
    monkeypatch.setattr(planner.fit, "fit_largest", fit_largest)
    model = tmp_path / "wide.py"
    model.write_text(WIDE_MODEL)
    runner = CliRunner()
    result = runner.invoke(app, ["fit", str(model), "--budget", "40MiB", "--device", "cuda"])
    assert "stopped here" in result.output
    assert "host link of stand-in GPU: 20.0 GB/s" in result.output
    assert measured == [("cuda", 10 * MIB)] and links == [2e10]
    for options in (("--device", "cuda", "--no-offload"), ("--device", "cpu")):
        runner.invoke(app, ["fit", str(model), "--budget", "40MiB", *options])
    assert len(measured) == 1 and links == [2e10, 0.0, 0.0]


@pytest.mark.cuda
def test_on_cuda_fit_measures_the_host_link_and_offers_offload(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from planner.cli.main import app

    model = tmp_path / "wide.py"
    model.write_text(WIDE_MODEL)
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(
        app,
        [
            *("fit", str(model), "--budget", "40MiB", "--device", "cuda"),
            *("--max-size", "2", "--host-budget", "1GiB", "-o", str(out)),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "host link of" in result.output
    plan = load_plan(out)
    assert any("host link measured here" in str(note) for note in plan.assumptions)
    assert plan.predicted_host_peak_bytes <= 2**30


@pytest.mark.cuda
def test_on_cuda_the_host_link_is_measured_and_a_profile_offers_offload(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from planner.cli.main import app
    from planner.measure.host_link import measure_host_link
    from planner.pipeline import profile_model_file

    link = measure_host_link("cuda", size_bytes=64 * MIB, copies=3)
    assert link.bytes_per_s > 1e9 and link.copies == 3 and link.size_bytes == 64 * MIB
    profile = profile_model_file(
        offload_file(), device="cuda", host_link_bytes_per_s=link.bytes_per_s, timing_steps=1
    )
    options = {cost.option for cost in profile.module("blocks.0").options}
    assert {"offload", "offload-at-use"} <= options
    spec = tmp_path / "gpu.json"
    spec.write_text(
        '{"name": "here", "memory_bytes": 17179869184, "peak_flops_per_s": {"float32": 1e13},'
        ' "memory_bandwidth_bytes_per_s": 1e12}'
    )
    result = CliRunner().invoke(app, ["calibrate", "--size", "64MiB", "--spec", str(spec)])
    assert result.exit_code == 0, result.output
    assert "host_link_bytes_per_s" in spec.read_text()
