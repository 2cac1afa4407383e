"""Charts: functions from data to a matplotlib ``Figure`` (object API, no pyplot state).

The caller decides where to save them (``figure.savefig(path)``).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from planner.memory_model import MemoryModel
from planner.plan import Plan
from planner.records import Profile

__all__ = ["memory_timeline_figure", "timeline_frame"]

_MIB = 2**20


def timeline_frame(
    profile: Profile, plan: Plan, memory: MemoryModel | None = None
) -> dict[str, np.ndarray]:
    """The data behind the timeline chart: live MiB after each event, unplanned and planned."""
    memory = memory or MemoryModel(profile.timeline)
    unplanned = memory.memory_curve(()) / _MIB
    planned = memory.memory_curve(plan.units) / _MIB
    return {"event": np.arange(len(unplanned)), "unplanned_mib": unplanned, "planned_mib": planned}


def memory_timeline_figure(
    profile: Profile, plan: Plan, memory: MemoryModel | None = None
) -> Figure:
    """Live memory over one step, without and with the plan (predicted), with the budget."""
    data = timeline_frame(profile, plan, memory)
    figure = Figure(figsize=(9, 4.5), layout="constrained")
    axes = figure.add_subplot()
    axes.plot(
        data["event"], data["unplanned_mib"], color="tab:gray", label="no checkpointing (measured)"
    )
    axes.plot(
        data["event"],
        data["planned_mib"],
        color="tab:blue",
        label=f"with plan: {len(plan.modules)} modules checkpointed (predicted)",
    )
    spikes = (memory or MemoryModel(profile.timeline)).recompute_spikes(plan.units)
    if spikes:
        axes.scatter(
            [event for event, _ in spikes],
            [peak / _MIB for _, peak in spikes],
            marker="^",
            color="tab:blue",
            s=18,
            zorder=3,
            label="recompute spikes (predicted)",
        )
    axes.axhline(plan.budget_bytes / _MIB, color="tab:red", linestyle="--", label="budget")
    axes.axhline(
        profile.static_bytes / _MIB,
        color="tab:green",
        linestyle=":",
        label="static (params, grads, optimizer)",
    )
    phases = profile.timeline.phase_end_events
    for phase, label in (("forward", "forward | backward"), ("backward", "backward | optimizer")):
        if phase in phases:
            axes.axvline(phases[phase] + 1, color="black", linewidth=0.8)
            axes.annotate(
                label,
                (phases[phase] + 1, axes.get_ylim()[1]),
                rotation=90,
                va="top",
                ha="right",
                fontsize=8,
            )
    axes.set_xlabel("step progress (memory events, in order)")
    axes.set_ylabel("live memory (MiB)")
    axes.set_title(
        f"{profile.model_name} on {profile.device}: memory over one training step, "
        f"budget {plan.budget_bytes / _MIB:.1f} MiB"
    )
    axes.legend(loc="lower right", fontsize=8)
    axes.grid(alpha=0.3)
    return figure
