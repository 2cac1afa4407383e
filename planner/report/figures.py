"""The charts, drawn from the frames into new ``Figure`` objects (matplotlib's object API, no
pyplot state): trade-off, modules, memory timeline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from planner.core.records import Phase, Profile
from planner.core.units import format_bytes
from planner.plan.memory_model import MemoryModel
from planner.plan.plan_file import Plan
from planner.report.common import (
    CHOSEN,
    CHOSEN_COLOR,
    COVERED_COLOR,
    MIB,
    OTHER_COLOR,
    chart_title,
    memory_unit,
)
from planner.report.frames import module_frame, timeline_frame, tradeoff_frame
from planner.report.summary import unplanned_source


def tradeoff_figure(
    profile: Profile,
    plans: Sequence[Plan],
    baselines: Mapping[str, Plan],
    measured: Mapping[str, int] | None = None,
    *,
    chosen: Plan | None = None,
) -> Figure:
    """Predicted overhead (%) against predicted peak memory: the frontier as a staircase,
    the chosen plan, the baselines, the budget (``chosen.budget_bytes``) and measured peaks.
    Arguments as in :func:`tradeoff_frame`."""
    data = tradeoff_frame(profile, plans, baselines, measured, chosen=chosen)
    unit, unit_bytes = memory_unit(profile)
    figure = Figure(figsize=(9, 5.8), layout="constrained")
    axes = figure.add_subplot()

    on_frontier = data[data["on_frontier"]].sort_values("predicted_peak_bytes")
    peaks = on_frontier["predicted_peak_bytes"].to_numpy() / unit_bytes
    overheads = on_frontier["overhead_percent"].to_numpy()
    # Past the last plan the cheapest fitting plan stays the same: extend the last step to
    # the unplanned peak (where no checkpointing is needed).
    right = max(profile.measured_peak_bytes / unit_bytes, peaks.max() if len(peaks) else 0.0)
    axes.plot(
        np.append(peaks, right),
        np.append(overheads, overheads[-1] if len(overheads) else 0.0),
        drawstyle="steps-post",
        color="tab:blue",
        linewidth=1.6,
        label="frontier: cheapest plan that fits each budget (predicted)",
    )
    sweep = on_frontier[on_frontier["kind"] == "sweep"]
    axes.scatter(
        sweep["predicted_peak_bytes"] / unit_bytes,
        sweep["overhead_percent"],
        color="tab:blue",
        s=14,
        zorder=3,
    )
    dominated = data[(data["kind"] == "sweep") & ~data["on_frontier"]]
    if len(dominated):
        axes.scatter(
            dominated["predicted_peak_bytes"] / unit_bytes,
            dominated["overhead_percent"],
            color="tab:blue",
            marker="x",
            s=18,
            alpha=0.5,
            label="solver plans beaten by another (off the frontier)",
        )

    baseline_rows = data[data["kind"] == "baseline"]
    axes.scatter(
        baseline_rows["predicted_peak_bytes"] / unit_bytes,
        baseline_rows["overhead_percent"],
        marker="s",
        s=36,
        color="black",
        zorder=4,
        label="manual choices (predicted)",
    )
    for row in baseline_rows.itertuples():
        axes.annotate(
            f"{row.label}: {row.overhead_percent:.{0 if row.overhead_percent >= 10 else 1}f}%",
            (row.predicted_peak_bytes / unit_bytes, row.overhead_percent),
            xytext=(6, 5),
            textcoords="offset points",
            fontsize=8,
        )

    chosen_rows = data[data["kind"] == CHOSEN]
    for row in chosen_rows.itertuples():
        axes.scatter(
            [row.predicted_peak_bytes / unit_bytes],
            [row.overhead_percent],
            marker="*",
            s=220,
            color=CHOSEN_COLOR,
            edgecolor="black",
            linewidth=0.6,
            zorder=5,
            label=(
                f"chosen plan: {row.predicted_peak_bytes / unit_bytes:.1f} {unit}, "
                f"{row.overhead_percent:.1f}% (predicted): {row.options}"
                + (
                    f"; host {row.host_peak_bytes / unit_bytes:.1f} {unit}"
                    if row.host_peak_bytes
                    else ""
                )
            ),
        )

    measured_rows = data[data["measured_peak_bytes"].notna()]
    if len(measured_rows):
        measured_peaks = measured_rows["measured_peak_bytes"].astype(float) / unit_bytes
        axes.scatter(
            measured_peaks,
            measured_rows["overhead_percent"],
            marker="o",
            s=90,
            facecolor="none",
            edgecolor="tab:green",
            linewidth=1.5,
            zorder=6,
            label="measured peak of a plan that was run (same overhead)",
        )
        for row, peak in zip(measured_rows.itertuples(), measured_peaks, strict=True):
            axes.plot(
                [row.predicted_peak_bytes / unit_bytes, peak],
                [row.overhead_percent] * 2,
                color="tab:green",
                linewidth=1,
                zorder=2,
            )

    offloading = data[(data["kind"] != "baseline") & (data["host_peak_bytes"] > 0)]
    if len(offloading):
        # Plans that offload hold host memory too: their host peak on a second axis.
        offloading = offloading.sort_values("predicted_peak_bytes")
        host_axes = axes.twinx()
        host_axes.scatter(
            offloading["predicted_peak_bytes"] / unit_bytes,
            offloading["host_peak_bytes"] / unit_bytes,
            marker="^",
            s=22,
            color="tab:orange",
            zorder=3,
            label=f"host memory of a plan that offloads ({unit}, right axis)",
        )
        host_axes.set_ylabel(f"host memory of offloaded tensors ({unit})", color="tab:orange")
        host_axes.tick_params(axis="y", colors="tab:orange")
        host_axes.set_ylim(bottom=0.0)
    if chosen is not None:
        axes.axvline(
            chosen.budget_bytes / unit_bytes,
            color="tab:red",
            linestyle="--",
            label=f"budget {format_bytes(chosen.budget_bytes)}",
        )
    axes.set_xlabel(f"peak memory of one training step ({unit})")
    axes.set_ylabel("predicted recompute overhead (% of one step)")
    axes.margins(x=0.08)  # room for the labels of the rightmost points
    axes.set_ylim(bottom=min(0.0, axes.get_ylim()[0]))
    budget_bytes = chosen.budget_bytes if chosen is not None else None
    axes.set_title(chart_title(profile, "step-time overhead against peak memory", budget_bytes))
    axes.grid(alpha=0.3)
    figure.legend(loc="outside lower center", ncols=2, fontsize=8)
    return figure


def _module_row_label(row: Any) -> str:
    """``blocks.*.mlp  (MLP ×48)``, and for a group a second line: which were chosen."""
    if row.count == 1:
        how = f": {row.chosen_options[2:]}" if row.chosen_options else ""
        return f"{row.group}  ({row.module_type}){how}"
    notes = []
    if row.chosen_count:
        indices = row.chosen_indices
        indices = indices if len(indices) <= 30 else indices[:29] + "…"
        notes.append(f"chosen {indices} ({row.chosen_options})")
    if row.covered_count:
        notes.append(f"{row.covered_count} inside a chosen module")
    label = f"{row.group}  ({row.module_type} ×{row.count})"
    return label + ("\n" + "; ".join(notes) if notes else "")


def module_figure(
    profile: Profile, plan: Plan, *, group_above: int = 24, max_rows: int = 40
) -> Figure:
    """Horizontal bars per candidate (or group, see :func:`module_frame`): memory freed and
    recompute time, mean per module with whiskers over a group's range; what the plan wraps
    in orange, what it recomputes inside a wrapped module in light orange (hatched when only
    some of a group). With more than ``max_rows`` rows, the
    chosen ones and those freeing the most in total are shown and the title says so."""
    data = module_frame(profile, plan, group_above=group_above)
    total_rows, module_count = len(data), int(data["count"].sum())
    if total_rows > max_rows:
        weight = data["freed_bytes_mean"] * data["count"] + np.where(
            data["chosen_count"] > 0, np.inf, 0.0
        )
        data = data.loc[sorted(weight.nlargest(max_rows).index)]
    unit, unit_bytes = memory_unit(profile)
    rows = len(data)
    counts = data["count"].to_numpy()
    row_inches = 0.45 if (counts > 1).any() else 0.3  # grouped rows have two label lines
    figure = Figure(figsize=(11, 2.3 + row_inches * max(rows, 3)), layout="constrained")
    freed_axes, time_axes = figure.subplots(1, 2, sharey=True)
    positions = np.arange(rows)
    chosen_counts = data["chosen_count"].to_numpy()
    covered_counts = data["covered_count"].to_numpy()
    colors = [
        CHOSEN_COLOR if chosen else COVERED_COLOR if covered else OTHER_COLOR
        for chosen, covered in zip(chosen_counts, covered_counts, strict=True)
    ]
    hatches = [
        "//" if 0 < chosen + covered < count else ""
        for chosen, covered, count in zip(chosen_counts, covered_counts, counts, strict=True)
    ]

    def bars(axes: Any, mean: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
        patches = axes.barh(positions, mean, color=colors, edgecolor="white", height=0.7)
        for patch, hatch in zip(patches, hatches, strict=True):
            patch.set_hatch(hatch)
        spread = (low < high) & (counts > 1)
        if spread.any():
            axes.errorbar(
                mean[spread],
                positions[spread],
                xerr=[mean[spread] - low[spread], high[spread] - mean[spread]],
                fmt="none",
                ecolor="black",
                elinewidth=0.8,
                capsize=2,
            )
        axes.grid(axis="x", alpha=0.3)

    bars(
        freed_axes,
        data["freed_bytes_mean"].to_numpy() / unit_bytes,
        data["freed_bytes_min"].to_numpy() / unit_bytes,
        data["freed_bytes_max"].to_numpy() / unit_bytes,
    )
    bars(
        time_axes,
        data["recompute_ms_mean"].to_numpy(),
        data["recompute_ms_min"].to_numpy(),
        data["recompute_ms_max"].to_numpy(),
    )
    freed_axes.set_yticks(positions, [_module_row_label(row) for row in data.itertuples()])
    freed_axes.tick_params(axis="y", labelsize=8)
    freed_axes.invert_yaxis()
    freed_axes.set_xlabel(f"memory freed by checkpointing ({unit} per module)")
    time_axes.set_xlabel("recompute time (ms per module: its forward)")
    handles = [Patch(color=CHOSEN_COLOR, label="checkpointed by the plan")]
    if covered_counts.any():
        handles.append(Patch(color=COVERED_COLOR, label="recomputed inside a checkpointed module"))
    if any(hatches):
        handles.append(
            Patch(facecolor="white", hatch="//", edgecolor="black", label="only some of a group")
        )
    handles.append(Patch(color=OTHER_COLOR, label="not recomputed"))
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    if (counts > 1).any():
        shown = (
            f"{module_count} candidates in {total_rows} rows: names that differ only by an "
            "index are one row (*), bars show the mean, whiskers the range"
        )
    else:
        shown = f"{module_count} candidates"
    if rows < total_rows:
        shown += f"; {rows} of {total_rows} rows shown (the chosen, then the largest savings)"
    figure.suptitle(
        chart_title(profile, "checkpoint candidates", plan.budget_bytes)
        + f"\n{shown}; {len(plan.modules)} modules checkpointed",
        fontsize=10,
    )
    return figure


def memory_timeline_figure(
    profile: Profile, plan: Plan, memory: MemoryModel | None = None
) -> Figure:
    """Live memory over one step, without and with the plan (predicted), with the budget,
    the recompute spikes and the forward | backward | optimizer boundaries."""
    memory = memory or MemoryModel.for_profile(profile)
    data = timeline_frame(profile, plan, memory)
    unit, unit_bytes = memory_unit(profile)
    scale = MIB / unit_bytes
    figure = Figure(figsize=(9, 5.2), layout="constrained")
    axes = figure.add_subplot()
    axes.plot(
        data["event"],
        data["unplanned_mib"] * scale,
        color=OTHER_COLOR,
        label=f"no checkpointing ({unplanned_source(profile)}), "
        f"peak {format_bytes(profile.measured_peak_bytes)}",
    )
    if plan.modules:
        axes.plot(
            data["event"],
            data["planned_mib"] * scale,
            color="tab:blue",
            label=f"with plan: {len(plan.modules)} modules checkpointed (predicted), "
            f"peak {format_bytes(plan.predicted_peak_bytes)}",
        )
    spikes = memory.recompute_spikes(plan.units)
    if spikes:
        axes.scatter(
            [event for event, _ in spikes],
            [peak / unit_bytes for _, peak in spikes],
            marker="^",
            color="tab:blue",
            s=18,
            zorder=3,
            label="recompute spikes (predicted)",
        )
    axes.axhline(
        plan.budget_bytes / unit_bytes,
        color="tab:red",
        linestyle="--",
        label=f"budget {format_bytes(plan.budget_bytes)}",
    )
    axes.axhline(
        profile.static_bytes / unit_bytes,
        color="tab:green",
        linestyle=":",
        label="static (params, grads, optimizer)",
    )
    axes.set_ylim(bottom=0)
    phases = profile.timeline.phase_end_events
    for phase, label in (
        (Phase.FORWARD, "forward | backward"),
        (Phase.BACKWARD, "backward | optimizer"),
    ):
        if phase in phases:
            axes.axvline(phases[phase] + 1, color="black", linewidth=0.8)
            axes.annotate(
                label,
                (phases[phase] + 1, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-3, -4),
                textcoords="offset points",
                rotation=90,
                va="top",
                ha="right",
                fontsize=8,
            )
    axes.set_xlabel("step progress (memory events, in order)")
    axes.set_ylabel(f"live memory ({unit})")
    axes.set_title(chart_title(profile, "memory over one training step", plan.budget_bytes))
    axes.grid(alpha=0.3)
    figure.legend(loc="outside lower center", ncols=2, fontsize=8)
    return figure
