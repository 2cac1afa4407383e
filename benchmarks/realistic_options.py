"""Checkpointing options on realistic shapes, planned for an H100 (issue #28, point 4).

    python benchmarks/realistic_options.py

For the Llama-3-8B and Qwen2.5-7B configs (1 x 4096 tokens, bf16) and GPT-2 small (1 x 1024,
fp32), as ``ckpt-plan profile --hf CONFIG --batch-size 1 --seq-len N --target h100-80gb``
profiles them (fake tensors, the ``h100-80gb`` time model), on CPU:

* at the halfway budget (halfway from every block checkpointed to the unplanned peak): the
  plan's estimated extra time against checkpointing every block (goal: at most 0.3x), with
  and without offloading (the spec has a host link), and against the module-only plan
  (whole modules and segments, no options);
* at budgets from the lowest feasible peak to the unplanned one: whether the plan with
  options ever estimates more time or more FLOPs than the module-only plan.

Writes reports/benchmarks/realistic_options.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import halfway_budget, markdown_table  # noqa: E402
from benchmarks.selective import label, memory_profile, step_flops  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.plan.targets import load_spec, roofline_costs  # noqa: E402
from planner.solve import Solver  # noqa: E402
from planner.solve.planning import baseline_every_block  # noqa: E402

CONFIGS = {
    "llama-3-8b": "hf:examples/configs/llama-3-8b.json?batch_size=1&seq_len=4096&dtype=bfloat16",
    "qwen2.5-7b": "hf:examples/configs/qwen2.5-7b.json?batch_size=1&seq_len=4096&dtype=bfloat16",
    "gpt2 (small)": "hf:examples/configs/gpt2.json?batch_size=1&seq_len=1024&dtype=float32",
}
GIB = 2**30
SWEEP = 12  # budgets from the lowest peak to the unplanned one


def run_config(name: str, source: str, target: str) -> tuple[dict[str, object], list[dict]]:
    spec = load_spec(target)
    started = time.perf_counter()
    profile = roofline_costs(memory_profile(source, spec), spec)
    profiled_s = time.perf_counter() - started
    total_flops = step_flops(profile)
    with_options, module_only = Solver(profile), Solver(profile, options=False)
    every = baseline_every_block(profile)
    half = halfway_budget(profile)
    chosen, plain = with_options.solve(half), module_only.solve(half)
    no_offload = Solver(profile, offload=False).solve(half)
    regime = next(
        ("host-bound" if "host-bound" in note.text else "device-bound")
        for note in profile.assumptions
        if note.text.startswith("roofline on")
    )
    row = {
        "config": name,
        "step_ms": round(profile.step_ms, 1),
        "regime": regime,
        "halfway_GiB": round(half / GIB, 2),
        "every_block_extra_ms": round(every.recompute_ms, 1),
        "plan": label(chosen.units),
        "plan_extra_ms": round(chosen.recompute_ms, 2),
        "plan_over_every_block": round(chosen.recompute_ms / every.recompute_ms, 3),
        "plan_extra_flops_pct": round(
            100 * with_options.recompute_flops(chosen.units) / total_flops, 2
        ),
        "without_offload": label(no_offload.units),
        "without_offload_over_every_block": round(no_offload.recompute_ms / every.recompute_ms, 3),
        "module_only": label(plain.units),
        "module_only_extra_ms": round(plain.recompute_ms, 2),
        "module_only_extra_flops_pct": round(
            100 * with_options.recompute_flops(plain.units) / total_flops, 2
        ),
        "profiled_s": round(profiled_s, 1),
    }
    _, lowest = with_options.lowest_peak()
    sweep = []
    for step in range(SWEEP + 1):
        budget = lowest + (profile.measured_peak_bytes - lowest) * step // SWEEP
        option_plan = with_options.solve(budget)
        try:
            plain_plan = module_only.solve(budget)
        except Exception:  # below the module-only floor: only options fit
            plain_plan = None
        flops = with_options.recompute_flops(option_plan.units)
        sweep.append(
            {
                "config": name,
                "budget_GiB": round(budget / GIB, 2),
                "options_ms": round(option_plan.recompute_ms, 2),
                "module_only_ms": round(plain_plan.recompute_ms, 2) if plain_plan else "-",
                "options_gflop": round(flops / 1e9, 1),
                "module_only_gflop": (
                    round(with_options.recompute_flops(plain_plan.units) / 1e9, 1)
                    if plain_plan
                    else "-"
                ),
                "options_never_worse": plain_plan is None
                or (
                    option_plan.recompute_ms <= plain_plan.recompute_ms * (1 + 1e-9)
                    and flops <= with_options.recompute_flops(plain_plan.units)
                ),
            }
        )
    print(row, flush=True)
    return row, sweep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="h100-80gb")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args(argv)
    rows, sweeps = [], []
    for name in arguments.configs:
        row, sweep = run_config(name, CONFIGS[name], arguments.target)
        rows.append(row)
        sweeps += sweep
    halfway, swept = pd.DataFrame(rows), pd.DataFrame(sweeps)
    goal = bool(
        (halfway["plan_over_every_block"] <= 0.3).all()
        and (halfway["without_offload_over_every_block"] <= 0.3).all()
    )
    never_worse = bool(swept["options_never_worse"].all())
    text = (
        "# Checkpointing options on realistic shapes, for an H100\n\n"
        f"Written by `benchmarks/realistic_options.py` (CPU; `--target {arguments.target}`, "
        "fake tensors, the spec's time model). Llama-3-8B and Qwen2.5-7B at 1 x 4096 tokens "
        "(bf16), GPT-2 small at 1 x 1024 (fp32).\n\n"
        "## At the halfway budget\n\n"
        + markdown_table(halfway)
        + "\n\n`without_offload`: the plan with selective options and nesting only "
        "(`--no-offload`).\n\n"
        f"Every plan, with and without offloading, at most 0.3x every block's extra time: "
        f"{goal}.\n\n"
        f"## Options against module-only, {SWEEP + 1} budgets from the lowest peak to the "
        "unplanned one\n\n"
        + markdown_table(swept)
        + f"\n\nNo plan with options costs more time or FLOPs than the module-only plan: "
        f"{never_worse}.\n"
    )
    atomic_write_text(arguments.out / "realistic_options.md", text)
    print(markdown_table(halfway))
    print("halfway goal met:", goal, "never worse:", never_worse)
    return 0 if goal and never_worse else 1


if __name__ == "__main__":
    sys.exit(main())
