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
    StepTimeModel,
    check_budget_fits,
    load_spec,
    op_time_ms,
    roofline_costs,
    write_spec,
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


def test_a_written_spec_reads_back_the_same_and_a_bad_one_is_not_written(tmp_path: Path) -> None:
    import dataclasses

    h100 = dataclasses.replace(BUILT_IN_SPECS["h100-80gb"], notes=("measured", "fitted"))
    path = tmp_path / "sub" / "h100.json"
    assert write_spec(path, h100) == path
    assert load_spec(str(path)) == h100
    assert json.loads(path.read_text())["notes"] == ["measured", "fitted"]
    # A value load_spec would refuse is refused before writing: the file stays as it was.
    written = path.read_text()
    for bad in ({"matmul_efficiency": 1.5}, {"kernel_launch_s": -1.0}, {"peak_flops_per_s": {}}):
        with pytest.raises(TargetSpecError, match="device spec"):
            write_spec(path, dataclasses.replace(h100, **bad))
        assert path.read_text() == written
    with pytest.raises(TargetSpecError, match=r"ending in \.json"):
        write_spec(tmp_path / "h100.txt", h100)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["h100.json", "sub"]


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


def _two_module_profile(mm_flops: int, views: int):  # type: ignore[no-untyped-def]
    """Calls: root (0) > block (1); a matmul and ``views`` views in the block's forward, one
    memory-bound op in backward."""
    calls = (
        ModuleCall("", -1, 0, 9, -1, -1, (), (), (), False, (), ()),
        ModuleCall("block", 0, 1, 8, -1, -1, (), (), (), False, (), ()),
    )
    ops = (
        OpCost("aten.mm.default", 1, 2, mm_flops, 0, "float32"),
        *(OpCost("aten.view.default", 1, 3, 0, 0, "float32") for _ in range(views)),
        OpCost("prim.device.default", 1, 3, 0, 0, "float32"),  # a fake-tensor query: free
        OpCost("aten.add.Tensor", -1, 12, 0, 10**8, "float32"),
    )
    timeline = MemoryTimeline(
        event_count=20, storages=(), calls=calls, phase_end_events={"forward": 10}, op_costs=ops
    )
    return _profile(timeline, {"block": 0.0})


def test_efficiency_scales_each_kind_of_kernel_and_views_take_no_device_time() -> None:
    spec = DeviceSpec(
        "x", "cuda", 2**40, {"float32": 1e12}, 1e11, matmul_efficiency=0.5, memory_efficiency=0.8
    )
    assert op_time_ms(10**9, 10**6, "float32", spec) == pytest.approx(2.0)  # 1 ms / 0.5
    assert op_time_ms(0, 10**8, "float32", spec) == pytest.approx(1.25)  # 1 ms / 0.8
    assert op_time_ms(0, 0, "float32", spec) == 0.0


def test_a_device_bound_step_hides_the_hosts_work_and_checkpointings_own_cost() -> None:
    # 1 ms matmul + 1 ms add on the device against 3 dispatched ops x 0.1 ms on the host
    spec = DeviceSpec(
        "x", "cuda", 2**40, {"float32": 1e12}, 1e11, kernel_launch_s=1e-4, checkpoint_call_s=1e-3
    )
    profile = _two_module_profile(10**9, views=1)
    times = StepTimeModel.of(profile.timeline.op_costs, spec)
    assert not times.host_bound
    assert (times.device_ms, times.host_ms) == pytest.approx((2.0, 0.3))
    estimated = roofline_costs(profile, spec)
    assert estimated.step_ms == pytest.approx(2.0)
    assert estimated.module("block").forward_ms == pytest.approx(1.0)
    assert estimated.checkpoint_call_ms == 0.0
    assert any("device-bound" in note.text for note in estimated.assumptions)


def test_a_host_bound_step_pays_each_ops_launch_and_checkpointings_own_cost() -> None:
    # a tiny matmul (0.001 ms) and 40 views: 42 dispatched ops x 0.1 ms on the host
    spec = DeviceSpec(
        "x", "cuda", 2**40, {"float32": 1e12}, 1e11, kernel_launch_s=1e-4, checkpoint_call_s=1e-3
    )
    profile = _two_module_profile(10**6, views=40)
    times = StepTimeModel.of(profile.timeline.op_costs, spec)
    assert times.host_bound and times.host_ms == pytest.approx(4.2)
    estimated = roofline_costs(profile, spec)
    # each op the longer of its device (add: 1 ms) and host (0.1 ms) time
    assert estimated.step_ms == pytest.approx(41 * 0.1 + 1.0)
    # its recomputation: 41 ops launched, and checkpointing's own 1 ms for its one call
    assert estimated.module("block").forward_ms == pytest.approx(41 * 0.1 + 1.0)
    assert estimated.checkpoint_call_ms == pytest.approx(1.0)
    assert any("host-bound" in note.text for note in estimated.assumptions)
    # without a time model the same profile is the pure roofline
    plain = roofline_costs(profile, DeviceSpec("x", "cuda", 2**40, {"float32": 1e12}, 1e11))
    assert plain.step_ms == pytest.approx(1.001)


def test_the_h100_time_model_is_read_from_a_spec_file_and_checked(tmp_path: Path) -> None:
    h100 = load_spec("h100-80gb")
    assert h100.kernel_launch_s > 0 and h100.checkpoint_call_s > 0
    assert 0 < h100.matmul_efficiency < 1 and 0 < h100.memory_efficiency < 1
    # only the H100's was fitted to measurements; the others stay pure rooflines
    assert all(
        spec.kernel_launch_s == 0 and spec.matmul_efficiency == 1
        for name, spec in BUILT_IN_SPECS.items()
        if name != "h100-80gb"
    )
    fields = {
        "name": "mine",
        "memory_bytes": 2**34,
        "peak_flops_per_s": {"float32": 1e13},
        "memory_bandwidth_bytes_per_s": 1e12,
        "kernel_launch_s": 8e-6,
        "matmul_efficiency": 0.6,
    }
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(fields))
    spec = load_spec(str(path))
    assert (spec.kernel_launch_s, spec.matmul_efficiency, spec.memory_efficiency) == (
        8e-6,
        0.6,
        1.0,
    )
    path.write_text(json.dumps({**fields, "matmul_efficiency": 1.5}))
    with pytest.raises(TargetSpecError, match="fractions of the roofline"):
        load_spec(str(path))
    path.write_text(json.dumps({**fields, "kernel_launch_s": -1}))
    with pytest.raises(TargetSpecError, match="cannot be negative"):
        load_spec(str(path))
