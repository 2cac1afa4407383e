"""Device specs and roofline estimates (pure Python, no torch needed for the maths)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.core.errors import BudgetError, TargetSpecError
from planner.core.records import CostSource, MemoryTimeline, ModuleCall, NoteTopic, OpCost
from planner.plan.targets import (
    BUILT_IN_SPECS,
    DeviceSpec,
    check_budget_fits,
    load_spec,
    op_time_ms,
    roofline_costs,
)
from tests.test_solver import _profile


def test_every_built_in_spec_is_a_cuda_device_with_the_figures_a_roofline_needs() -> None:
    assert set(BUILT_IN_SPECS) == {"a100-40gb", "a100-80gb", "h100-80gb", "h200", "l4", "rtx-4090"}
    for spec in BUILT_IN_SPECS.values():
        assert spec.device_type == "cuda" and spec.memory_bytes > 16 * 2**30
        assert spec.peak_for("bfloat16") > spec.peak_for("float32") > 0
        assert spec.memory_bandwidth_bytes_per_s > 1e11
    h100 = load_spec("h100-80gb")
    assert h100.peak_for("bfloat16") == 989.4e12 and h100.workspace_bytes == 65 * 2**20
    assert h100.peak_for("int64") == h100.peak_for("float32")  # unlisted dtypes: fp32's
    # The host link each way: PCIe Gen5 x16 on Hopper, Gen4 x16 on the others.
    assert {name: spec.host_link_bytes_per_s for name, spec in BUILT_IN_SPECS.items()} == {
        "a100-40gb": 25e9,
        "a100-80gb": 25e9,
        "h100-80gb": 50e9,
        "h200": 50e9,
        "l4": 25e9,
        "rtx-4090": 25e9,
    }


def test_a_spec_file_is_read_and_a_bad_one_is_a_clear_error(tmp_path: Path) -> None:
    good = tmp_path / "mygpu.json"
    good.write_text(
        json.dumps(
            {
                "name": "mygpu",
                "memory_bytes": 48 * 2**30,
                "peak_flops_per_s": {"float32": 1e13, "bfloat16": 1e14},
                "memory_bandwidth_bytes_per_s": 1e12,
            }
        )
    )
    spec = load_spec(str(good))
    assert spec == DeviceSpec(
        "mygpu", "cuda", 48 * 2**30, {"float32": 1e13, "bfloat16": 1e14}, 1e12
    )
    with pytest.raises(TargetSpecError, match="not a built-in device"):
        load_spec("h100")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(TargetSpecError, match="cannot read the device spec"):
        load_spec(str(broken))
    incomplete = tmp_path / "incomplete.json"
    incomplete.write_text(json.dumps({"name": "x", "memory_bytes": 1}))
    with pytest.raises(TargetSpecError, match="must be a JSON object with"):
        load_spec(str(incomplete))
    grace = tmp_path / "gh200.json"
    fields = {
        "name": "gh200",
        "memory_bytes": 96 * 10**9,
        "peak_flops_per_s": {"float32": 1e13},
        "memory_bandwidth_bytes_per_s": 4e12,
        "host_link_bytes_per_s": 450e9,
        "host_memory_bytes": 480 * 10**9,
    }
    grace.write_text(json.dumps(fields))
    linked = load_spec(str(grace))
    assert (linked.host_link_bytes_per_s, linked.host_memory_bytes) == (450e9, 480 * 10**9)
    grace.write_text(json.dumps({**fields, "host_link_bytes_per_s": -1}))
    with pytest.raises(TargetSpecError, match="cannot be negative"):
        load_spec(str(grace))


def test_a_budget_above_the_targets_memory_is_refused() -> None:
    spec = load_spec("l4")
    check_budget_fits(spec, 20 * 10**9)
    with pytest.raises(BudgetError, match="more than l4's memory"):
        check_budget_fits(spec, 30 * 10**9)


def test_an_op_takes_the_longer_of_its_compute_and_its_memory_traffic() -> None:
    spec = DeviceSpec("x", "cuda", 2**40, {"float32": 1e12, "bfloat16": 4e12}, 1e11)
    assert op_time_ms(2 * 10**9, 10**6, "float32", spec) == pytest.approx(2.0)  # compute
    assert op_time_ms(2 * 10**9, 10**6, "bfloat16", spec) == pytest.approx(0.5)
    assert op_time_ms(0, 10**9, "float32", spec) == pytest.approx(10.0)  # bytes only


def test_roofline_costs_sum_each_modules_forward_ops_and_the_whole_step() -> None:
    # Calls: root (0) > block (1) > inner (2); forward ends at event 10.
    calls = (
        ModuleCall("", -1, 0, 9, -1, -1, (), (), (), False, (), ()),
        ModuleCall("block", 0, 1, 8, -1, -1, (), (), (), False, (), ()),
        ModuleCall("block.inner", 1, 2, 5, -1, -1, (), (), (), False, (), ()),
    )
    ops = (
        OpCost("aten.mm.default", 2, 3, 10**9, 0, "float32"),  # 1 ms, inside inner
        OpCost("aten.add.Tensor", 1, 6, 0, 10**8, "float32"),  # 1 ms, block only
        OpCost("aten.mm.default", -1, 12, 3 * 10**9, 0, "float32"),  # backward: step only
    )
    timeline = MemoryTimeline(
        event_count=20, storages=(), calls=calls, phase_end_events={"forward": 10}, op_costs=ops
    )
    profile = _profile(timeline, {"block": 0.0, "block.inner": 0.0})
    spec = DeviceSpec("x", "cuda", 2**40, {"float32": 1e12}, 1e11)
    estimated = roofline_costs(profile, spec)
    assert estimated.module("block.inner").forward_ms == pytest.approx(1.0)
    assert estimated.module("block").forward_ms == pytest.approx(2.0)
    assert estimated.step_ms == pytest.approx(5.0)
    assert estimated.cost_source is CostSource.ROOFLINE and estimated.target == "x"
    assert any(
        note.topic is NoteTopic.TIMES and note.text.startswith("roofline on x")
        for note in estimated.assumptions
    )
