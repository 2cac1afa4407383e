"""Selective checkpointing options: which ops a policy saves (pure), and on a real model
that the memory model predicts each option's peak to the byte while training stays
bit-identical; nesting likewise; the solver weighs options by cost."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from planner.core.records import StorageKind, StorageLifetime, Unit
from planner.plan.policies import (
    NESTED,
    PolicyRule,
    SelectivePolicy,
    is_attention_op,
    kept_storages,
    policy_rules,
)
from tests.models import memory_profile

DATA = Path(__file__).parent / "data"
MM, ADDMM, BMM = "aten.mm.default", "aten.addmm.default", "aten.bmm.default"
SDPA = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def storage(op: str, written: bool = False) -> StorageLifetime:
    return StorageLifetime(64, 1, 2, 0, StorageKind.ACTIVATION, op, written)


def test_units_carry_the_option_and_print_as_before() -> None:
    unit = Unit("blocks.3", option="save-matmuls")
    assert str(unit) == "blocks.3@save-matmuls"
    assert (unit.module, unit.segments, unit.option) == ("blocks.3", None, "save-matmuls")
    assert str(Unit("blocks", segments=3)) == "blocks#3" and str(Unit("blocks.3")) == "blocks.3"
    assert unit != Unit("blocks.3") and unit == Unit("blocks.3", option="save-matmuls")
    assert len({unit, Unit("blocks.3", option="save-matmuls"), Unit("blocks.3")}) == 2
    with pytest.raises(ValueError, match="not both"):
        Unit("blocks", segments=3, option="nested")


def test_units_sort_as_they_print() -> None:
    """The order plans list their modules in (``build_plan`` sorts its units)."""
    units = [
        Unit("blocks.10"),
        Unit("blocks.1", option="nested"),
        Unit("blocks", segments=10),
        Unit("blocks", segments=2),
        Unit("blocks.1"),
        Unit("blocks"),
    ]
    assert [str(unit) for unit in sorted(units)] == sorted(str(unit) for unit in units)
    assert Unit("blocks.10") < Unit("blocks.1", option="nested")


def test_attention_ops_of_every_backend_are_recognised() -> None:
    assert is_attention_op(SDPA)
    assert is_attention_op("aten._scaled_dot_product_efficient_attention.default")
    assert is_attention_op("aten._scaled_dot_product_flash_attention.default")
    assert not is_attention_op("aten._scaled_dot_product_flash_attention_backward.default")
    assert not is_attention_op(MM)


def test_policy_op_lists_come_from_the_ops_the_module_ran() -> None:
    made = [storage(ADDMM), storage("aten.gelu.default"), storage(SDPA), storage(MM)]
    rules = {rule.policy: rule for rule in policy_rules(made)}
    assert rules[SelectivePolicy.SAVE_MATMULS].saved_ops == (ADDMM, MM)
    assert rules[SelectivePolicy.SAVE_ATTENTION].saved_ops == (SDPA,)
    assert rules[SelectivePolicy.SAVE_MATMULS_AND_ATTENTION].saved_ops == (SDPA, ADDMM, MM)
    titan = rules[SelectivePolicy.TORCHTITAN]
    assert titan.saved_ops == (SDPA,) and titan.alternating_ops == (ADDMM, MM)


def test_a_policy_never_saves_an_op_whose_output_is_written_later() -> None:
    # CPU dropout: empty_like's output is written by bernoulli_; a Linear then relu_.
    made = [storage("aten.empty_like.default", written=True), storage(ADDMM, written=True)]
    assert policy_rules(made) == []
    made.append(storage(BMM))
    (rule,) = policy_rules(made)  # save-matmuls; torchtitan would save the same: left out
    assert rule.saved_ops == (BMM,)


def test_torchtitan_saves_every_other_matmul_counted_together() -> None:
    made = [storage(MM), storage(ADDMM), storage("aten.relu.default"), storage(MM), storage(MM)]
    rule = PolicyRule(SelectivePolicy.TORCHTITAN, (), (MM, ADDMM))
    assert kept_storages(made, rule) == [0, 3]


# -- on a real model (fake-tensor profile, real measured steps) -------------------------


@pytest.fixture(scope="module")
def sdpa_profile():  # type: ignore[no-untyped-def]
    return memory_profile(DATA / "sdpa_blocks.py")


def test_blocks_get_every_option_with_concrete_ops(sdpa_profile) -> None:  # type: ignore[no-untyped-def]
    block = sdpa_profile.module("blocks.0")
    names = [option.option for option in block.options]
    assert names == [*(str(policy) for policy in SelectivePolicy), NESTED]
    nested = block.option_cost(NESTED)
    assert nested.inner_modules == ("blocks.0.attn", "blocks.0.mlp")
    # Nesting recomputes the inner modules once more; a policy recomputes fewer FLOPs.
    assert nested.recompute_flops > block.forward_flops
    assert block.option_cost("save-matmuls").recompute_flops < block.forward_flops
    # A policy frees less than the whole module (it keeps what it saves); nesting the same.
    for option in block.options:
        assert 0 < option.freed_bytes <= block.checkpoint_saving_bytes
    assert nested.freed_bytes == block.checkpoint_saving_bytes


@pytest.mark.slow
@pytest.mark.parametrize("option", [*(str(policy) for policy in SelectivePolicy), NESTED])
def test_every_option_is_predicted_to_the_byte_and_trains_identically(
    sdpa_profile,  # type: ignore[no-untyped-def]
    option: str,
) -> None:
    from planner.check.compare import CheckReference, check_plan
    from planner.plan.memory_model import MemoryModel
    from planner.solve.planning import build_plan

    memory = MemoryModel.for_profile(sdpa_profile)
    units = [Unit(block, option=option) for block in sdpa_profile.block_names]
    plan = build_plan(sdpa_profile, units, 0, strategy="test", memory=memory)
    plan = dataclasses.replace(plan, budget_bytes=plan.predicted_peak_bytes)
    assert plan.units == tuple(sorted(units))
    check = check_plan(DATA / "sdpa_blocks.py", plan)
    assert check.measured_peak_bytes == plan.predicted_peak_bytes
    assert check.loss_equal and check.gradients_equal and check.buffers_equal
    assert plan.predicted_peak_bytes < sdpa_profile.measured_peak_bytes
    # The check `profile` runs: each recomputation against its forward, op by op (a
    # policy's cached ops are handed back, not run again).
    recomputation = check_plan(
        DATA / "sdpa_blocks.py", plan, reference=CheckReference.RECOMPUTATION
    )
    assert recomputation.recomputation_equal and recomputation.recomputed_ops > 0


def test_nesting_lowers_the_floor_below_every_block() -> None:
    from planner.solve import Solver

    profile = memory_profile(DATA.parent.parent / "examples" / "gpt.py")
    _, module_only = Solver(profile, options=False).lowest_peak()
    units, with_options = Solver(profile).lowest_peak()
    assert with_options < module_only
    assert any(unit.option == NESTED for unit in units)


@pytest.mark.slow
def test_the_solver_takes_an_option_only_where_it_is_cheaper(sdpa_profile) -> None:  # type: ignore[no-untyped-def]
    from planner.solve import Solver
    from planner.solve.exhaustive import branch_and_bound

    # Make one policy nearly free: the solver must use it where memory allows.
    cheap = dataclasses.replace(
        sdpa_profile,
        modules=tuple(
            dataclasses.replace(
                record,
                options=tuple(
                    dataclasses.replace(o, recompute_ms=o.recompute_ms / 100)
                    if o.option == "save-attention"
                    else o
                    for o in record.options
                ),
            )
            for record in sdpa_profile.modules
        ),
    )
    for profile in (sdpa_profile, cheap):
        solver = Solver(profile)
        _, lowest = solver.lowest_peak()
        for fraction in (0.2, 0.5, 0.8):
            budget = int(lowest + (profile.measured_peak_bytes - lowest) * fraction)
            solution = solver.solve(budget)
            best, finished = branch_and_bound(solver.tree, solver.peak, budget, 10**7)
            assert finished and best is not None
            assert solution.predicted_peak_bytes <= budget
            assert solution.recompute_ms == pytest.approx(solver.cost(best))
    solver = Solver(cheap)
    unit = Unit("blocks.0", option="save-attention")
    solution = solver.solve(solver.peak([unit]))
    assert solution.recompute_ms <= solver.cost([unit])


def _never_worse_than_module_only(profile, fractions) -> int:  # type: ignore[no-untyped-def]
    """Over budgets from the lowest peak to the unplanned one: the plan with options costs
    no more time and no more FLOPs than the module-only plan; how many budgets took options."""
    from planner.core.errors import InfeasibleBudgetError
    from planner.solve import Solver

    with_options, module_only = Solver(profile), Solver(profile, options=False)
    _, lowest = with_options.lowest_peak()
    took_options = 0
    for fraction in fractions:
        budget = int(lowest + (profile.measured_peak_bytes - lowest) * fraction)
        chosen = with_options.solve(budget)
        assert chosen.predicted_peak_bytes <= budget
        took_options += any(unit.option is not None for unit in chosen.units)
        try:
            plain = module_only.solve(budget)
        except InfeasibleBudgetError:  # below the module-only floor: only options fit
            continue
        assert chosen.recompute_ms <= plain.recompute_ms * (1 + 1e-9), budget
        flops = with_options.recompute_flops(chosen.units)
        assert flops <= with_options.recompute_flops(plain.units), budget
    return took_options


def test_a_plan_with_options_never_costs_more_time_or_flops_than_module_only(
    sdpa_profile,  # type: ignore[no-untyped-def]
) -> None:
    from planner.plan.targets import load_spec, roofline_costs

    h100 = load_spec("h100-80gb")
    fractions = [step / 10 for step in range(11)]
    gpt = memory_profile(DATA.parent.parent / "examples" / "gpt.py")
    took = [
        _never_worse_than_module_only(profile, fractions)
        for profile in (
            roofline_costs(sdpa_profile, load_spec("a100-80gb")),  # a pure roofline
            roofline_costs(sdpa_profile, h100),
            roofline_costs(gpt, h100),
        )
    ]
    assert sum(took) > 0  # options were taken somewhere: the comparison was not vacuous


def test_an_option_cheaper_in_time_but_dearer_in_flops_gives_way_to_module_only(
    sdpa_profile,  # type: ignore[no-untyped-def]
) -> None:
    from planner.plan.targets import load_spec, roofline_costs
    from planner.solve import Solver

    # save-attention nearly free in time but recomputing a thousand times the block's FLOPs:
    # the time-optimal plan takes it, and the module-only plan is the answer instead.
    costed = roofline_costs(sdpa_profile, load_spec("a100-80gb"))
    skewed = dataclasses.replace(
        costed,
        modules=tuple(
            dataclasses.replace(
                record,
                options=tuple(
                    dataclasses.replace(
                        o,
                        recompute_ms=o.recompute_ms / 100,
                        recompute_flops=1000 * record.forward_flops + 1,
                    )
                    if o.option == "save-attention"
                    else o
                    for o in record.options
                ),
            )
            for record in costed.modules
        ),
    )
    solver, module_only = Solver(skewed), Solver(skewed, options=False)
    alone = Solver(skewed, against_module_only=False)  # the search, without the comparison
    _, lowest = module_only.lowest_peak()
    skewed_taken = 0
    for fraction in (0.1, 0.3, 0.5, 0.7, 0.9):
        budget = int(lowest + (skewed.measured_peak_bytes - lowest) * fraction)
        searched = alone.solve(budget)
        if not any(unit.option == "save-attention" for unit in searched.units):
            continue
        skewed_taken += 1
        chosen, plain = solver.solve(budget), module_only.solve(budget)
        assert chosen.units == plain.units and not chosen.proven_optimal
        assert searched.recompute_ms < chosen.recompute_ms
    assert skewed_taken > 0
