"""Offloading saved tensors to host memory, on a Llama-3-8B-shaped step for one H100.

    python benchmarks/offload.py

Profiles ``--hf examples/configs/llama-3-8b.json --batch-size 1 --seq-len 8192 --target
h100-80gb`` (fake tensors, roofline times; the built-in spec's host link: PCIe Gen5 x16,
50 GB/s each way) and, with a host budget of 256 GB (a DGX H100's 2 TB over its 8 GPUs):

* the smallest feasible budget with offloading and without it, and what each plan is made of
  (offloading: ``offload``, its copy back prefetched at the next layer's backward, or
  ``offload-at-use``, at its own);
* the plan at a budget halfway between the two;
* the predicted overhead with and without offloading at budgets where both fit;
* the same with a host link of 450 GB/s (NVLink-C2C, as on a GH200; the H100's compute);
* plans that offload, checkpoint, or both (the solver's plans above) run on the CUDA step
  emulated on fake CPU tensors, their device and host peaks measured against the prediction.

Writes reports/benchmarks/offload.md.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.core.records import Profile, Unit  # noqa: E402
from planner.core.units import format_bytes  # noqa: E402
from planner.plan.policies import option_summary  # noqa: E402
from planner.plan.targets import DeviceSpec, load_spec, roofline_costs  # noqa: E402
from planner.solve import Solver  # noqa: E402
from planner.solve.planning import build_plan, plan_for_budget  # noqa: E402

CONFIG = ROOT / "examples" / "configs" / "llama-3-8b.json"
HOST_BUDGET = 256 * 10**9
GIB = 2**30
BUDGETS_GIB = (62, 64, 68, 72, 76)


def _gib(size: int) -> str:
    return f"{size / GIB:.2f} GiB"


def _tradeoff(profile: Profile, lowest_without: int) -> list[str]:
    """Rows: a budget, the plan and overhead with offloading, and without."""
    with_offload = Solver(profile, host_budget_bytes=HOST_BUDGET)
    without = Solver(profile, offload=False)
    rows = []
    budgets = sorted([lowest_without, *(size * GIB for size in BUDGETS_GIB), 80 * 10**9])
    for budget in budgets:
        offloading, _ = plan_for_budget(profile, budget, solver=with_offload)
        plain, _ = plan_for_budget(profile, budget, solver=without)
        host = format_bytes(offloading.predicted_host_peak_bytes)
        rows.append(
            f"| {_gib(budget)} | {offloading.predicted_overhead:+.2%} "
            f"({option_summary(offloading.units)}; host {host}) "
            f"| {plain.predicted_overhead:+.2%} ({option_summary(plain.units)}) |"
        )
    return rows


def _emulated(
    model_file: object, profile: Profile, spec: DeviceSpec, solved: dict[str, list[Unit]]
) -> list[str]:
    """Offloading plans, and the ``solved`` plans (offload and checkpointing mixed, or
    checkpointing alone), run on the emulated CUDA step: predicted and measured peaks."""
    from planner.apply import apply_plan
    from planner.apply.offload import HOST_MEMORY
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory

    layers = range(32)
    plans = {
        "every decoder layer offloaded (prefetched)": [
            Unit(f"model.layers.{i}", option="offload") for i in layers
        ],
        "every decoder layer offloaded (at use)": [
            Unit(f"model.layers.{i}", option="offload-at-use") for i in layers
        ],
        "layers 0-15 offloaded": [Unit(f"model.layers.{i}", option="offload") for i in range(16)],
        "every self_attn and mlp offloaded": [
            Unit(f"model.layers.{i}.{part}", option="offload")
            for i in layers
            for part in ("self_attn", "mlp")
        ],
        "every decoder layer checkpointed": [Unit(f"model.layers.{i}") for i in layers],
        **solved,
    }
    rows = []
    for name, units in plans.items():
        plan = build_plan(profile, units, 80 * 10**9, strategy=name)
        workload, session = build_fake_workload(model_file, "cuda", seed=0)  # type: ignore[arg-type]
        apply_plan(workload.model, plan, guard=False)
        HOST_MEMORY.reset_peak()
        measured = record_memory(workload, session=session, workspace_bytes=spec.workspace_bytes)
        session.release()
        device = measured.measured_peak_bytes
        error = (plan.predicted_peak_bytes - device) / device
        rows.append(
            f"| {name} | {plan.predicted_peak_bytes:,} | {device:,} | {error:+.4%} "
            f"| {plan.predicted_host_peak_bytes:,} | {HOST_MEMORY.peak_bytes:,} "
            f"| {plan.predicted_overhead:+.1%} |"
        )
    return rows


def main() -> int:
    from planner.measure.hf import hf_workload
    from planner.measure.workload import load_model_file
    from planner.pipeline import profile_model_file

    started = time.perf_counter()
    model_file = load_model_file(hf_workload(CONFIG, 1, 8192, None))
    spec = load_spec("h100-80gb")
    profile = profile_model_file(model_file, device="cuda", target=spec)
    profiled_s = time.perf_counter() - started

    with_offload = Solver(profile, host_budget_bytes=HOST_BUDGET)
    without = Solver(profile, offload=False)
    _, floor = with_offload.lowest_peak()
    _, plain_floor = without.lowest_peak()
    # The cheapest plans at those budgets (lowest_peak's own answer is any plan that fits).
    floor_units = plan_for_budget(profile, floor, solver=with_offload)[0].units
    plain_units = plan_for_budget(profile, plain_floor, solver=without)[0].units
    middle = (floor + plain_floor) // 2
    plan, solution = plan_for_budget(profile, middle, solver=with_offload)
    offloaded = [d for d in plan.modules if d.how == "offload"]
    block = profile.module("model.layers.5")
    costs = {cost.option: cost for cost in block.options}

    linked = dataclasses.replace(
        spec, name="h100-80gb, 450 GB/s host link", host_link_bytes_per_s=450e9
    )
    fast = roofline_costs(profile, linked)
    fast_floor = Solver(fast, host_budget_bytes=HOST_BUDGET).lowest_peak()[1]
    fast_block = {cost.option: cost for cost in fast.module("model.layers.5").options}
    solved_s = time.perf_counter() - started - profiled_s

    assert middle < plain_floor  # no plan without offloading fits it
    unplanned, static = profile.measured_peak_bytes, profile.static_bytes
    layer_host = with_offload.memory.host_bytes(Unit("model.layers.5", option="offload"))
    layer_costs = (
        f"{block.forward_ms:.2f} / {costs['torchtitan'].recompute_ms:.2f} / "
        f"{costs['offload'].recompute_ms:.2f} / {costs['offload-at-use'].recompute_ms:.2f} ms "
        f"(offload moves {format_bytes(layer_host)})"
    )
    floor_host = format_bytes(with_offload.tree.host(floor_units))
    moved = ", ".join(
        f"`{d.module_name}` ({format_bytes(d.host_bytes)}, {d.recompute_ms:.2f} ms)"
        for d in offloaded
    )
    header = "| plan | predicted peak (bytes) | measured | error | predicted host peak | measured "
    lines = [
        "# Offloading saved tensors to host memory: Llama-3-8B, 1 x 8192 tokens, one H100",
        "",
        "`python benchmarks/offload.py`: `--hf examples/configs/llama-3-8b.json --batch-size 1 "
        "--seq-len 8192 --target h100-80gb` (bf16, fake tensors, roofline times; host link "
        f"{spec.host_link_bytes_per_s / 1e9:.0f} GB/s each way, PCIe Gen5 x16), host budget "
        f"{HOST_BUDGET / 1e9:.0f} GB. Profiled in {profiled_s:.1f} s, solved in {solved_s:.1f} s "
        "on this machine.",
        "",
        "| | |",
        "|---|---|",
        f"| unplanned peak | {unplanned:,} bytes ({_gib(unplanned)}) |",
        f"| static memory | {static:,} bytes ({_gib(static)}) |",
        f"| step (roofline) | {profile.step_ms:.1f} ms |",
        "| smallest feasible budget, without offloading | "
        f"{plain_floor:,} bytes ({_gib(plain_floor)}): {option_summary(plain_units)} |",
        "| smallest feasible budget, with offloading | "
        f"{floor:,} bytes ({_gib(floor)}): {option_summary(floor_units)}, host {floor_host} |",
        f"| lower by | {plain_floor - floor:,} bytes ({format_bytes(plain_floor - floor)}) |",
        "| a decoder layer: recompute whole / torchtitan / offload (prefetched at the next "
        f"layer's backward) / offload at use | {layer_costs} |",
        "",
        f"## The plan halfway between, at {middle:,} bytes ({_gib(middle)})",
        "",
        f"{option_summary(plan.units)}; predicted peak {plan.predicted_peak_bytes:,} bytes, "
        f"host {plan.predicted_host_peak_bytes:,} bytes, overhead {plan.predicted_overhead:+.2%} "
        f"({'proven cheapest' if solution.proven_optimal else 'search cut short'}). Offloaded: "
        + moved
        + ". No plan without offloading fits this budget.",
        "",
        "## Predicted overhead with and without offloading, where both fit",
        "",
        "| budget | with offloading (plan; host memory) | without |",
        "|---|---|---|",
        *_tradeoff(profile, plain_floor),
        "",
        "## With a 450 GB/s host link (NVLink-C2C, as on a GH200; the H100's compute)",
        "",
        f"A decoder layer's offload costs {fast_block['offload'].recompute_ms:.2f} ms prefetched, "
        f"{fast_block['offload-at-use'].recompute_ms:.2f} ms at use (its whole "
        f"recomputation {block.forward_ms:.2f} ms); smallest feasible budget "
        f"{fast_floor:,} bytes ({_gib(fast_floor)}).",
        "",
        "| budget | with offloading (plan; host memory) | without |",
        "|---|---|---|",
        *_tradeoff(fast, plain_floor),
        "",
        "## Offloading plans on the emulated CUDA step",
        "",
        "Each plan applied with `apply_plan` to the model on fake CPU tensors emulating CUDA "
        "(512-byte blocks, cuBLAS workspaces of the spec), its step recorded; the host copies "
        "are counted apart (`planner.apply.offload.HOST_MEMORY`). A checkpoint's "
        "recomputation runs under the emulation as its forward did "
        "(`planner.apply.wrap.RecomputedUnder`).",
        "",
        header + "| overhead |",
        "|---|---|---|---|---|---|---|",
        *_emulated(
            model_file,
            profile,
            spec,
            {
                "cheapest plan at the lowest peak with offloading": list(floor_units),
                "cheapest plan at the lowest peak without offloading": list(plain_units),
                "the plan halfway between (mixed)": list(plan.units),
            },
        ),
        "",
        f"Total {time.perf_counter() - started:.0f} s.",
        "",
    ]
    out = ROOT / "reports" / "benchmarks" / "offload.md"
    atomic_write_text(out, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
