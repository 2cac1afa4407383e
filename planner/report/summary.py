"""The report's summary in Markdown, and the one-line texts of where its figures came from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.core.records import CostSource, MemorySource, Profile
from planner.core.units import format_bytes
from planner.plan.plan_file import Plan
from planner.report.common import CHOSEN, chart_title


def _batch_text(batch: Mapping[str, Any]) -> str:
    parts = []
    for name, value in batch.items():
        if isinstance(value, dict) and "shape" in value:
            shape = "×".join(str(size) for size in value["shape"])
            parts.append(f"`{name}` {value.get('dtype', '')} [{shape}]")
        else:
            parts.append(f"`{name}` {value}")
    return ", ".join(parts) or "—"


def _overhead_text(plan: Plan) -> str:
    return (
        f"{plan.recompute_ms:.1f} ms = {plan.predicted_overhead:.1%} of a "
        f"{plan.step_ms:.1f} ms {plan.loop.step_words()}"
    )


def unplanned_source(profile: Profile) -> str:
    """How the unplanned peak was obtained, in a few words."""
    if profile.memory_source is MemorySource.FAKE:
        return "fake-tensor step"
    return "measured"


def memory_source_text(profile: Profile) -> str:
    if profile.memory_source is MemorySource.FAKE:
        return "recorded on fake tensors (sizes and lifetimes, no memory used)"
    return "recorded by running the unplanned step"


def cost_source_text(profile: Profile) -> str:
    if profile.cost_source is CostSource.ROOFLINE:
        return f"estimated for {profile.target} (roofline from FLOPs and bytes)"
    if profile.cost_source is CostSource.MEASURED:
        return "measured on this device"
    return "not measured"


def _host_text(plan: Plan) -> str:
    """The host peak of a plan that offloads, and the host budget it was solved under."""
    text = format_bytes(plan.predicted_host_peak_bytes)
    if plan.host_budget_bytes is not None:
        text += f" of a {format_bytes(plan.host_budget_bytes)} host budget"
    return text


def summary_markdown(
    profile: Profile,
    plan: Plan,
    baselines: Mapping[str, Plan],
    measured: Mapping[str, int] | None = None,
    *,
    images: Mapping[str, str] | None = None,
) -> str:
    """The ``summary.md`` of a report: the numbers, the chosen modules, the baselines, and
    links to ``images`` (chart name -> file name beside the summary)."""
    measured = dict(measured or {})
    if plan.measured_peak_bytes is not None:
        measured.setdefault(CHOSEN, plan.measured_peak_bytes)
    images = dict(images or {})
    measured_peak = measured.get(CHOSEN)
    lines = [
        f"# {chart_title(profile, 'activation checkpointing report', plan.budget_bytes)}",
        "",
        "| | |",
        "|---|---|",
        f"| model | `{profile.model_name}` (`{profile.model_file}`) |",
        f"| device | {profile.device}, torch {profile.torch_version} |",
        f"| batch | {_batch_text(profile.batch)} |",
        f"| budget | {format_bytes(plan.budget_bytes)} |",
        f"| training loop | {plan.loop.describe()} |",
        f"| unplanned peak ({unplanned_source(profile)}) | "
        f"{format_bytes(profile.measured_peak_bytes)} |",
        f"| predicted peak with the plan | {format_bytes(plan.predicted_peak_bytes)} |",
        *(
            [f"| host memory the plan's offloaded tensors hold (predicted) | {_host_text(plan)} |"]
            if plan.offloads
            else []
        ),
        "| measured peak with the plan | "
        + (
            f"{format_bytes(measured_peak)} (the plan was run)"
            if measured_peak is not None
            else "not measured (the plan was not run)"
        )
        + " |",
        "| static (parameters, gradients, optimizer state, buffers) | "
        f"{format_bytes(profile.static_bytes)} |",
        f"| recompute per {plan.loop.step_name} (predicted) | {_overhead_text(plan)} |",
        f"| modules checkpointed | {len(plan.modules)} ({plan.strategy}) |",
        f"| memory figures | {memory_source_text(profile)} |",
        f"| times | {cost_source_text(profile)} |",
        "",
        "The overhead is a prediction: the profiled forward time of the recomputed modules "
        "as a share of one unplanned training step, not a measured slowdown.",
    ]
    if plan.notes:
        lines += ["", *(f"- {note}" for note in plan.notes)]
    if profile.assumptions:
        lines += ["", "Assumed about the device:", ""]
        lines += [f"- {note}" for note in profile.assumptions]
    lines += ["", "## Chosen modules", ""]
    if plan.modules:
        lines += [
            "| module | type | method | frees | recompute (ms) | RNG replay |",
            "|---|---|---|---:|---:|---|",
        ]
        for decision in plan.modules:
            try:
                module_type = profile.module(decision.module_name).module_type
            except KeyError:
                module_type = "?"
            method = f"{decision.method.value} ({decision.how})"
            lines.append(
                f"| `{decision.module_name}` | {module_type} | {method} | "
                f"{format_bytes(decision.saving_bytes)} | {decision.recompute_ms:.1f} | "
                f"{'yes' if decision.preserve_rng_state else 'no'} |"
            )
    else:
        lines.append("None: the step fits the budget without checkpointing.")
    lines += [
        "",
        "## Baselines (the usual manual choices, predicted by the same memory model)",
        "",
        "| plan | modules | predicted peak | measured peak | fits the budget | overhead |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for name, baseline in {CHOSEN: plan, **baselines}.items():
        peak = measured.get(name)
        fits = (peak if peak is not None else baseline.predicted_peak_bytes) <= plan.budget_bytes
        lines.append(
            f"| {'**chosen plan**' if name == CHOSEN else name} | {len(baseline.modules)} | "
            f"{format_bytes(baseline.predicted_peak_bytes)} | "
            f"{format_bytes(peak) if peak is not None else '—'} | {'yes' if fits else 'no'} | "
            f"{baseline.predicted_overhead:.1%} |"
        )
    captions = {
        "tradeoff": "Trade-off: predicted overhead against predicted peak memory",
        "modules": "Checkpoint candidates: memory freed and recompute time",
        "memory_timeline": "Memory over one training step, without and with the plan",
    }
    lines += ["", "## Charts", ""]
    for name, file_name in images.items():
        caption = captions.get(name, name)
        lines += [f"### {caption}", "", f"![{caption}]({file_name})", ""]
    return "\n".join(lines).rstrip() + "\n"
