"""Offloading on a GPU (issue #31): plans that offload saved tensors to host memory, run for
real, against the best plan that only recomputes, at the same budgets.

Run on a machine with a GPU:

    python benchmarks/cuda_offload.py                  # the 1B Llama, 2 x 2048 tokens
    python benchmarks/cuda_offload.py --device cpu --model benchmarks/models/tiny_llama.py \\
        --batch-size 64 --link-gbps 25 --repeats 2     # the plumbing only, on this CPU

Model: ``benchmarks/models/llama_1b.py`` (Llama-3.2-1B's shape, bf16, fused AdamW, 2 x 2048
tokens), profiled as ``ckpt-plan profile --device cuda`` does: fake CUDA tensors, times
measured on this GPU, and the host link measured here (pinned copies on a side stream, as
``ckpt-plan calibrate`` does), at which offloading is offered and costed. Three budgets from
that profile:

* **recompute floor**: the smallest budget a plan that only recomputes fits (both kinds fit);
* **below it**: halfway from the smallest budget a plan with offloading fits to the
  recompute floor (only offloading fits; left out where the two floors are equal);
* **halfway**: halfway from the recompute floor to the unplanned peak.

At each, the plan ``profile`` writes with offloading allowed and the one it writes with
``--no-offload`` (:func:`planner.pipeline.plan_checked`: solved, run on this device, re-planned
if over), and the unplanned step once. Each runs in a fresh process
(``benchmarks/cuda_head_to_head.py``'s child: two warm-up steps, then ``--repeats`` timed
steps): ``allocated`` and ``reserved`` are the peaks of ``max_memory_allocated`` and
``max_memory_reserved`` (under ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``),
``pinned`` what CUDA's caching host allocator held at most (``host_memory_stats``),
``host`` what the offloaded tensors held by ckpt-plan's own count, ``step`` the median step
time. A plan is within its budget when both device peaks are; its losses are compared, bit
for bit, with the unplanned run's. The verdict per budget: the offloading plan's step time
against the recompute-only plan's.

On CPU (``--device cpu``) the copies are the CPU twin's in-line copies, costed at
``--link-gbps``; the peak is the live tensor storages of one tracked step, with no reserved
peak: that run checks the script, not the GPU claim. Writes
reports/benchmarks/cuda_offload.md (``--device cpu``: cpu_offload.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The allocator setting CUDA plans assume (planner.core.allocator), before torch starts CUDA.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import pandas as pd  # noqa: E402

from benchmarks.common import markdown_table  # noqa: E402
from benchmarks.cuda_head_to_head import (  # noqa: E402
    measure_in_child,
    peaks_sentence,
    write_markdown,
)

MIB = 2**20
MODEL = ROOT / "benchmarks" / "models" / "llama_1b.py"
KINDS = ("offload allowed", "recompute only")


def plans(source: str, device: str, link_bytes_per_s: float) -> tuple[Any, list[dict]]:
    """The profile and every run to measure: the unplanned step, then per budget the plan
    with offloading allowed and the plan without."""
    from planner.measure.workload import load_model_file
    from planner.pipeline import plan_checked, profile_model_file
    from planner.solve import Solver
    from planner.solve.planning import baseline_plans

    model_file = load_model_file(source)
    if device.startswith("cuda"):
        profile = profile_model_file(
            model_file, device=device, host_link_bytes_per_s=link_bytes_per_s
        )
    else:  # the plumbing: times are a CPU roofline's, offloading costed at the link given
        from planner.plan.targets import DeviceSpec

        twin = DeviceSpec(
            "cpu-twin",
            "cpu",
            2**40,
            {"float32": 1e11},
            2e10,
            host_link_bytes_per_s=link_bytes_per_s,
        )
        profile = profile_model_file(model_file, device=device, target=twin)
    floor_with = Solver(profile).lowest_peak()[1]
    floor_without = Solver(profile, offload=False).lowest_peak()[1]
    budgets = {"recompute floor": floor_without}
    if floor_with < floor_without:
        budgets["below it"] = (floor_with + floor_without) // 2
    budgets["halfway"] = (floor_without + profile.measured_peak_bytes) // 2
    runs: list[dict[str, Any]] = [{"kind": "none", "plan": baseline_plans(profile)["none"]}]
    for label, budget in budgets.items():
        for kind in KINDS:
            offload = kind == "offload allowed"
            if not offload and budget < floor_without:
                continue
            checked = plan_checked(
                profile, budget, model_path=source, device=device, offload=offload
            )
            runs.append(
                {"kind": kind, "budget": label, "budget_bytes": budget, "plan": checked.plan}
            )
    return profile, runs


def _mib(value: Any) -> Any:
    return None if value is None or pd.isna(value) else round(value / MIB, 1)


def report(runs: list[dict], cuda: bool) -> str:
    """A table per budget and its verdict."""
    from planner.plan.policies import option_summary

    none = next(run for run in runs if run["kind"] == "none")
    parts = []
    for label in dict.fromkeys(run["budget"] for run in runs if run["kind"] != "none"):
        at = [run for run in runs if run.get("budget") == label]
        budget = at[0]["budget_bytes"]
        rows = []
        for run in at:
            plan, measured = run["plan"], run["measured"]
            peaks = [measured.get("allocated_bytes"), measured.get("reserved_bytes")]
            known = [peak for peak in peaks if peak is not None]
            step = measured.get("step_ms")
            rows.append(
                {
                    "plan": run["kind"],
                    "how": option_summary(plan.units),
                    "predicted (MiB)": _mib(plan.predicted_peak_bytes),
                    "allocated (MiB)": _mib(measured.get("allocated_bytes")),
                    "reserved (MiB)": _mib(measured.get("reserved_bytes")),
                    "within budget": "yes" if known and max(known) <= budget else "no",
                    "host predicted (MiB)": _mib(plan.predicted_host_peak_bytes),
                    "host (MiB)": _mib(measured.get("host_peak_bytes")),
                    "pinned (MiB)": _mib(measured.get("pinned_peak_bytes")) if cuda else None,
                    "predicted overhead": f"{100 * plan.predicted_overhead:+.1f}%",
                    "step (ms)": None if step is None else round(step, 1),
                    "overhead": None
                    if step is None or none["measured"].get("step_ms") is None
                    else f"{100 * (step / none['measured']['step_ms'] - 1):+.1f}%",
                    "losses as unplanned": "yes"
                    if measured.get("losses") == none["measured"].get("losses")
                    else "no",
                    "error": measured.get("error", ""),
                }
            )
        frame = pd.DataFrame(rows)
        times = {row["plan"]: row["step (ms)"] for row in rows if row["within budget"] == "yes"}
        offloading, recomputing = times.get(KINDS[0]), times.get(KINDS[1])
        same = at[0]["plan"].units == at[-1]["plan"].units and len(at) == 2
        if offloading is None:
            verdict = "The plan with offloading allowed is not within the budget."
        elif same:
            verdict = "Both plans are the same (the solver did not offload here)."
        elif recomputing is None:
            verdict = (
                "Only the plan with offloading fits: no recompute-only plan reaches this budget."
            )
        else:
            verdict = (
                f"The offloading plan's step is {100 * (offloading / recomputing - 1):+.1f}% "
                "against the recompute-only plan's."
            )
        parts += [
            f"## Budget: {label}, {budget / MIB:,.1f} MiB ({budget:,} bytes)",
            markdown_table(frame),
            verdict,
        ]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--batch-size", type=int, help="passed to the model's sample_batch()")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--link-gbps", type=float, help="the host link to cost at, GB/s (CPU)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args(argv)
    import torch

    cuda = arguments.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("no CUDA device here: run on a GPU machine (or --device cpu)", file=sys.stderr)
        return 2
    if cuda:
        from planner.measure.host_link import measure_host_link

        link = measure_host_link(arguments.device).bytes_per_s
    elif arguments.link_gbps is None:
        print("--device cpu needs --link-gbps (there is no host link to measure)", file=sys.stderr)
        return 2
    else:
        link = arguments.link_gbps * 1e9
    source = str(arguments.model)
    if arguments.batch_size is not None:
        source += f"?batch_size={arguments.batch_size}"
    started = time.perf_counter()
    profile, runs = plans(source, arguments.device, link)
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-offload-") as folder:
        for number, run in enumerate(runs):
            strategy = {"strategy": f"{number} {run['kind']}", "plan": run["plan"]}
            run["measured"] = measure_in_child(
                Path(source), arguments.device, strategy, arguments.repeats, Path(folder)
            )
            print(run["kind"], run.get("budget"), run["measured"], flush=True)
    device_name = torch.cuda.get_device_name(arguments.device) if cuda else "this CPU"
    none_ms = runs[0]["measured"].get("step_ms")
    text = "\n\n".join(
        [
            "# Offloading on a GPU: plans that offload against plans that only recompute",
            f"Written by `benchmarks/cuda_offload.py` on {device_name}, torch "
            f"{torch.__version__}, model `{source}`; host link {link / 1e9:.1f} GB/s each way "
            f"({'measured here' if cuda else '--link-gbps, the CPU twin copies in line'}); "
            f"unplanned peak {profile.measured_peak_bytes / MIB:,.1f} MiB (predicted), "
            f"unplanned step {none_ms:.1f} ms (median); {arguments.repeats} timed steps per "
            f"plan, each in a fresh process; {time.perf_counter() - started:.0f} s in all. "
            + peaks_sentence(cuda),
            report(runs, cuda),
        ]
    )
    write_markdown(arguments.out, "offload", cuda, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
