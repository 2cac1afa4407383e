"""Head to head on a GPU (issue #28, point 5): ckpt-plan against the usual ways to checkpoint,
at two budgets, each strategy's step time and peaks measured the same way.

Run on a machine with a GPU:

    python benchmarks/cuda_head_to_head.py                  # the 1B Llama, 2 x 2048 tokens
    python benchmarks/cuda_head_to_head.py --device cpu --model benchmarks/models/tiny_llama.py \\
        --repeats 2 --no-compile                            # the plumbing only, on this CPU

Model: ``benchmarks/models/llama_1b.py`` (Llama-3.2-1B's shape, bf16, fused AdamW, 2 x 2048
tokens). It is profiled as ``ckpt-plan profile --device cuda`` does (fake CUDA tensors, the
cuBLAS workspace and the times measured on this GPU), and two budgets are taken from that
profile: **every block's peak** (the predicted peak of checkpointing every decoder layer) and
**halfway** from there to the unplanned peak. The strategies:

* ``ckpt-plan at <budget>``: the plan ``profile`` writes for that budget (solved, tried and
  re-planned on this device: :func:`planner.pipeline.plan_checked`);
* ``every block`` and ``every 2nd block`` (whole decoder layers, :func:`baseline_plans`);
* ``torchtitan rule, every block``: torchtitan's selective-op rule (its ``_save_list``, every
  other matmul kept) on every decoder layer (the solver's ``torchtitan`` option);
* ``torch.compile, activation_memory_budget 0.5``: the compiled model, torch's own min-cut
  choosing what to recompute within half the activation memory;
* ``HF gradient_checkpointing_enable()``: the model's own, non-reentrant, on every layer;
* ``none``: no checkpointing.

Each runs in a fresh process (an empty caching allocator, so the reserved peaks compare):
the model built from the same seed, the strategy applied, two warm-up steps, the peak
statistics reset, then ``--repeats`` synchronized steps: ``step_ms`` is their median,
``allocated`` and ``reserved`` the peaks of ``torch.cuda.max_memory_allocated()`` and
``max_memory_reserved()`` over them (under ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``,
which CUDA plans assume). A strategy is within a budget when both peaks are. The verdict per
budget: among the strategies within it, whether ckpt-plan's step is the fastest, and if not,
by how much it is slower than the fastest. On CPU (``--device cpu``) the peak is the live
tensor storages of one tracked step (none for the compiled model, whose kernels allocate out
of the dispatcher's sight) and there is no reserved peak: that run checks the script, not
the claim.

Writes reports/benchmarks/cuda_head_to_head.md (``--device cpu``: cpu_head_to_head.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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

from benchmarks.common import markdown_table, run_child  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402

MIB = 2**20
MODEL = ROOT / "benchmarks" / "models" / "llama_1b.py"
COMPILE_BUDGET = 0.5
BUDGETS = ("every block's peak", "halfway")


# -- parent: profile once, make every strategy's plan ---------------------------------------
def strategies(path: Path, device: str, compile_too: bool) -> tuple[dict[str, int], list[dict]]:
    """The two budgets and every strategy to measure (``plan``: a Plan or None)."""
    from benchmarks.selective import uniform
    from planner.measure.workload import load_model_file
    from planner.pipeline import plan_checked, profile_model_file
    from planner.solve.planning import baseline_plans, build_plan

    profile = profile_model_file(load_model_file(path), device=device)
    baselines = baseline_plans(profile)
    every = baselines["every-block"].predicted_peak_bytes
    budgets = dict(zip(BUDGETS, (every, (every + profile.measured_peak_bytes) // 2), strict=True))
    titan = build_plan(profile, uniform(profile, "torchtitan"), 0, strategy="torchtitan")
    runs: list[dict[str, Any]] = [
        {"strategy": "none", "plan": baselines["none"]},
        {"strategy": "every block", "plan": baselines["every-block"]},
        {"strategy": "every 2nd block", "plan": baselines["every-2nd-block"]},
        {"strategy": "torchtitan rule, every block", "plan": titan},
        {"strategy": "HF gradient_checkpointing_enable()", "plan": None, "hf": True},
    ]
    if compile_too:
        runs.append(
            {
                "strategy": f"torch.compile, activation_memory_budget {COMPILE_BUDGET}",
                "plan": None,
                "compile_budget": COMPILE_BUDGET,
            }
        )
    for label, budget in budgets.items():
        checked = plan_checked(profile, budget, model_path=path, device=device)
        runs.append({"strategy": f"ckpt-plan at {label}", "plan": checked.plan, "budget": label})
    return budgets, runs


def measure_in_child(path: Path, device: str, run: dict, repeats: int, folder: Path) -> dict:
    """One strategy measured in a fresh process (see the module docstring)."""
    from planner.plan.plan_file import save_plan

    spec = {
        "model": str(path),
        "device": device,
        "repeats": repeats,
        "hf": bool(run.get("hf")),
        "compile_budget": run.get("compile_budget"),
        "plan": None,
    }
    if run["plan"] is not None:
        name = run["strategy"].replace(" ", "_").replace("'", "").replace(",", "")
        spec["plan"] = str(save_plan(run["plan"], folder / f"{name}.json"))
    measured, stderr = run_child(__file__, "--child", spec, folder)
    if measured is None:
        return {"error": (stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return measured


# -- child: one strategy's steps ------------------------------------------------------------
def child(spec_path: Path) -> None:
    import torch

    from planner.apply import apply_plan
    from planner.apply.offload import HOST_MEMORY
    from planner.measure.step import measure_step
    from planner.measure.workload import build_workload, load_model_file, run_training_step
    from planner.plan.plan_file import load_plan

    spec = json.loads(spec_path.read_text())
    device = spec["device"]
    cuda = device.startswith("cuda")
    workload = build_workload(load_model_file(spec["model"]), device=device, seed=0)
    if spec["plan"] is not None:
        apply_plan(workload.model, load_plan(spec["plan"]))
    if spec["hf"]:
        workload.model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    if spec["compile_budget"] is not None:
        import torch._functorch.config as functorch_config

        functorch_config.activation_memory_budget = float(spec["compile_budget"])
        workload.model = torch.compile(workload.model)

    def synchronize() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    for step in range(2):  # warm-up: optimizer state made, kernels chosen, compiled
        run_training_step(workload, seed=step)
    synchronize()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.reset_peak_host_memory_stats()
    HOST_MEMORY.reset_peak()
    times, losses = [], []
    for repeat in range(spec["repeats"]):
        started = time.perf_counter()
        loss = run_training_step(workload, seed=10 + repeat)
        synchronize()
        times.append((time.perf_counter() - started) * 1000)
        losses.append(loss.item())
    # The losses (bit for bit: float.hex) and the host memory offloaded tensors held.
    result: dict[str, Any] = {
        "step_ms": statistics.median(times),
        "losses": [value.hex() for value in losses],
        "host_peak_bytes": HOST_MEMORY.peak_bytes,
    }
    if cuda:
        result["allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        result["reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        # Pinned memory by CUDA's caching host allocator's own count.
        result["pinned_peak_bytes"] = torch.cuda.host_memory_stats().get("allocated_bytes.peak")
    elif spec["compile_budget"] is None:
        measured = measure_step(workload, seed=10, warmup_steps=0, copy_state=False)
        result["allocated_bytes"] = measured.peak_bytes
    print(json.dumps(result), flush=True)


# -- report ---------------------------------------------------------------------------------
def _mib(value: Any) -> Any:
    return None if value is None or pd.isna(value) else round(value / MIB, 1)


def report(budgets: dict[str, int], measured: list[dict], cuda: bool) -> str:
    none_ms = next(m["step_ms"] for m in measured if m["strategy"] == "none")
    parts = []
    for label, budget in budgets.items():
        rows = []
        for entry in measured:
            if entry.get("budget") not in (None, label) or entry["strategy"] == "none":
                continue
            peaks = [entry.get("allocated_bytes"), entry.get("reserved_bytes") if cuda else None]
            known = [peak for peak in peaks if peak is not None]
            within = bool(known) and all(peak <= budget for peak in known)
            rows.append(
                {
                    "strategy": entry["strategy"],
                    "allocated (MiB)": _mib(entry.get("allocated_bytes")),
                    "reserved (MiB)": _mib(entry.get("reserved_bytes")),
                    "within budget": "yes" if within else ("?" if not known else "no"),
                    "step (ms)": None
                    if entry.get("step_ms") is None
                    else round(entry["step_ms"], 1),
                    "overhead": None
                    if entry.get("step_ms") is None
                    else f"{100 * (entry['step_ms'] / none_ms - 1):+.1f}%",
                    "error": entry.get("error", ""),
                }
            )
        frame = pd.DataFrame(rows)
        fitting = frame[(frame["within budget"] == "yes") & frame["step (ms)"].notna()]
        ours = fitting[fitting.strategy.str.startswith("ckpt-plan")]
        if ours.empty:
            verdict = "ckpt-plan's plan is not within the budget."
        else:
            fastest = fitting.loc[fitting["step (ms)"].idxmin()]
            gap = 100 * (ours.iloc[0]["step (ms)"] / fastest["step (ms)"] - 1)
            verdict = (
                "ckpt-plan's step is the fastest within the budget."
                if fastest.strategy.startswith("ckpt-plan")
                else f"ckpt-plan's step is {gap:.1f}% slower than the fastest within the "
                f"budget ({fastest.strategy})."
            )
        parts += [
            f"## Budget: {label}, {budget / MIB:,.1f} MiB ({budget:,} bytes)",
            markdown_table(frame),
            verdict,
        ]
    return "\n\n".join(parts)


def _shown_path(path: Path) -> str:
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.child is not None:
        child(arguments.child)
        return 0
    import torch

    cuda = arguments.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("no CUDA device here: run on a GPU machine (or --device cpu)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    budgets, runs = strategies(arguments.model, arguments.device, not arguments.no_compile)
    measured = []
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-h2h-") as folder:
        for run in runs:
            result = measure_in_child(
                arguments.model, arguments.device, run, arguments.repeats, Path(folder)
            )
            measured.append({"strategy": run["strategy"], "budget": run.get("budget"), **result})
            print(measured[-1], flush=True)
    device_name = torch.cuda.get_device_name(arguments.device) if cuda else "this CPU"
    text = "\n\n".join(
        [
            "# Head to head: ckpt-plan against the usual checkpointing choices",
            f"Written by `benchmarks/cuda_head_to_head.py` on {device_name}, torch "
            f"{torch.__version__}, model `{_shown_path(arguments.model)}`, "
            f"{arguments.repeats} timed steps per strategy (median), each strategy in a fresh "
            f"process; {time.perf_counter() - started:.0f} s in all. " + peaks_sentence(cuda),
            report(budgets, measured, cuda),
        ]
    )
    write_markdown(arguments.out, "head_to_head", cuda, text)
    return 0


def peaks_sentence(cuda: bool) -> str:
    """How a report's peaks were measured (on CPU: what the run checks)."""
    if cuda:
        return (
            "Peaks: `max_memory_allocated` and `max_memory_reserved` under "
            f"`PYTORCH_CUDA_ALLOC_CONF={os.environ['PYTORCH_CUDA_ALLOC_CONF']}`."
        )
    return (
        "On CPU: live tensor storages of one tracked step; a check of the script, not the GPU "
        "claim."
    )


def write_markdown(folder: Path, stem: str, cuda: bool, text: str) -> None:
    """Write ``text`` to ``folder``/cuda_STEM.md (cpu_STEM.md off CUDA), atomically; print it."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / f"{'cuda' if cuda else 'cpu'}_{stem}.md", text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
