"""Reports: the data behind each chart (pandas), the charts (matplotlib), and the files.

Each chart comes in two parts: a ``*_frame`` function that returns the numbers as a
``DataFrame`` (sizes in ``*_bytes``, times in ``*_ms``, shares in ``*_percent``), and a
``*_figure`` function that draws them into a new ``Figure`` with the object API (no pyplot
state). The caller decides where to save a figure; :func:`write_report` is the caller that
writes a whole report folder, atomically.

What the charts show
--------------------
* **Trade-off** (:func:`tradeoff_figure`): predicted recompute overhead against predicted
  peak memory. The frontier is the cheapest plan the solver finds at evenly spaced budgets
  (``planning.frontier``), reduced to the plans no other plan beats on both peak and
  overhead, and drawn as a staircase: at any budget on the x axis, the line's height is the
  overhead of the cheapest plan that fits it. The chosen plan, the usual manual choices
  (``planning.baseline_plans``), the budget, and measured peaks (where a plan was run) are
  drawn over it.
* **Modules** (:func:`module_figure`): what each checkpoint candidate would free and what
  its recomputation costs. Candidates whose names differ only by numeric indices
  (``blocks.0.mlp`` ... ``blocks.47.mlp``) and share a type are one row, ``blocks.*.mlp``,
  with the mean per module, the range over the group and how many of them the plan chose.
* **Memory timeline** (:func:`memory_timeline_figure`): live memory over one step, measured
  without checkpointing and predicted with the plan, with its recompute spikes.

The overhead is a prediction: the profiled forward time of the recomputed modules as a
share of one unplanned step, not a measured slowdown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from planner.errors import BudgetError, PlanFileError, PlanMismatchError
from planner.fileio import atomic_path, atomic_write_text
from planner.memory_model import MemoryModel
from planner.plan import Plan, plan_from_dict
from planner.planning import (
    baseline_plans,
    build_plan,
    frontier,
    plan_for_budget,
    recomputed_modules,
)
from planner.profile_io import load_profile
from planner.records import CostSource, MemorySource, ModuleProfile, Profile
from planner.solve import Solver
from planner.units import format_bytes

__all__ = [
    "CHOSEN",
    "REPORT_FORMATS",
    "load_report_inputs",
    "memory_timeline_figure",
    "module_figure",
    "module_frame",
    "summary_markdown",
    "timeline_frame",
    "tradeoff_figure",
    "tradeoff_frame",
    "write_report",
]

CHOSEN = "chosen"
"""Label of the chosen plan in :func:`tradeoff_frame` and in its ``measured`` mapping."""

REPORT_FORMATS = ("png", "svg")
"""Image formats :func:`write_report` can write."""

_MIB = 2**20
_GIB = 2**30
_DPI = 120
_CHOSEN_COLOR = "tab:orange"
_COVERED_COLOR = "#fdd0a2"  # a light tab:orange
_OTHER_COLOR = "tab:gray"


def _memory_unit(profile: Profile) -> tuple[str, int]:
    """One display unit for every chart of a report: MiB, or GiB for steps of 10 GiB and up."""
    return ("GiB", _GIB) if profile.measured_peak_bytes >= 10 * _GIB else ("MiB", _MIB)


def _title(profile: Profile, what: str, budget_bytes: int | None) -> str:
    """Every chart says the model, the device and the budget."""
    budget = f"budget {format_bytes(budget_bytes)}" if budget_bytes is not None else "no budget"
    return f"{profile.model_name} on {profile.device}: {what}, {budget}"


# -- trade-off ---------------------------------------------------------------------------


def tradeoff_frame(
    profile: Profile,
    plans: Sequence[Plan],
    baselines: Mapping[str, Plan],
    measured: Mapping[str, int] | None = None,
    *,
    chosen: Plan | None = None,
) -> pd.DataFrame:
    """The data behind the trade-off chart: one row per plan.

    ``plans`` is a budget sweep (``planning.frontier``); a plan that appears at several
    budgets is one row, with the first of them as ``budget_bytes``, and a plan equal to
    ``chosen`` appears only as the chosen row. ``baselines`` maps names to plans
    (``planning.baseline_plans``). ``chosen`` is the plan being reported.
    ``measured`` maps a row's ``label`` (:data:`CHOSEN` or a baseline name) to the peak
    measured by running that plan; the chosen plan's own ``measured_peak_bytes`` is used
    when ``measured`` does not name it. A label that matches no row is a ``ValueError``.

    Columns: ``kind`` (``"sweep"``, ``"chosen"`` or ``"baseline"``), ``label``,
    ``strategy``, ``budget_bytes``, ``predicted_peak_bytes``, ``measured_peak_bytes``
    (nullable), ``overhead_percent`` (predicted recompute time, % of one step),
    ``recompute_ms``, ``module_count``, ``units`` (what is checkpointed, comma-separated),
    and ``on_frontier``: True for the sweep and chosen plans that no other of them beats on
    both peak and overhead (baselines are never marked; they are compared, not searched).
    """
    measured = dict(measured or {})
    rows: list[dict[str, Any]] = []
    # The chosen plan is its own row, so the sweep does not repeat it.
    seen: set[tuple[str, ...]] = {tuple(sorted(chosen.units))} if chosen is not None else set()
    for plan in plans:
        units = tuple(sorted(plan.units))
        if units in seen:
            continue
        seen.add(units)
        rows.append(_tradeoff_row("sweep", "", plan))
    if chosen is not None:
        if chosen.measured_peak_bytes is not None:
            measured.setdefault(CHOSEN, chosen.measured_peak_bytes)
        rows.append(_tradeoff_row(CHOSEN, CHOSEN, chosen))
    rows.extend(_tradeoff_row("baseline", name, plan) for name, plan in baselines.items())

    labels = {row["label"] for row in rows if row["label"]}
    unknown = sorted(set(measured) - labels)
    if unknown:
        raise ValueError(
            f"measured peaks given for {unknown}, which name no plan; use one of {sorted(labels)}"
        )
    for row in rows:
        value = measured.get(row["label"]) if row["label"] else None
        row["measured_peak_bytes"] = value

    # The frontier: walk the searched plans from the lowest peak up; a plan is on it when
    # it is cheaper than every plan with a lower (or equal) peak. The chosen plan goes
    # first among equals, so a sweep plan identical to it does not hide it.
    searched = sorted(
        (index for index, row in enumerate(rows) if row["kind"] != "baseline"),
        key=lambda index: (
            rows[index]["predicted_peak_bytes"],
            rows[index]["overhead_percent"],
            rows[index]["kind"] != CHOSEN,
        ),
    )
    cheapest = float("inf")
    for row in rows:
        row["on_frontier"] = False
    for index in searched:
        if rows[index]["overhead_percent"] < cheapest:
            rows[index]["on_frontier"] = True
            cheapest = rows[index]["overhead_percent"]

    frame = pd.DataFrame(rows, columns=_TRADEOFF_COLUMNS)
    frame["measured_peak_bytes"] = frame["measured_peak_bytes"].astype("Int64")
    return frame


_TRADEOFF_COLUMNS = [
    "kind",
    "label",
    "strategy",
    "budget_bytes",
    "predicted_peak_bytes",
    "measured_peak_bytes",
    "overhead_percent",
    "recompute_ms",
    "module_count",
    "units",
    "on_frontier",
]


def _tradeoff_row(kind: str, label: str, plan: Plan) -> dict[str, Any]:
    return {
        "kind": kind,
        "label": label,
        "strategy": plan.strategy,
        "budget_bytes": plan.budget_bytes,
        "predicted_peak_bytes": plan.predicted_peak_bytes,
        "overhead_percent": plan.predicted_overhead * 100,
        "recompute_ms": plan.recompute_ms,
        "module_count": len(plan.modules),
        "units": ", ".join(sorted(plan.units)),
    }


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
    unit, unit_bytes = _memory_unit(profile)
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
            color=_CHOSEN_COLOR,
            edgecolor="black",
            linewidth=0.6,
            zorder=5,
            label=(
                f"chosen plan: {row.predicted_peak_bytes / unit_bytes:.1f} {unit}, "
                f"{row.overhead_percent:.1f}% (predicted)"
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
    axes.set_title(_title(profile, "step-time overhead against peak memory", budget_bytes))
    axes.grid(alpha=0.3)
    figure.legend(loc="outside lower center", ncols=2, fontsize=8)
    return figure


# -- modules -----------------------------------------------------------------------------

_INDEX = re.compile(r"^\d+$")


def _group_pattern(module_name: str) -> str:
    """``blocks.12.mlp`` -> ``blocks.*.mlp``: the name with every numeric part replaced."""
    return ".".join("*" if _INDEX.match(part) else part for part in module_name.split("."))


def _index_text(names: Sequence[str]) -> str:
    """The numeric parts of ``names``, runs compressed: blocks.0..3, blocks.7 -> "0-3, 7"."""
    indices = [".".join(part for part in name.split(".") if _INDEX.match(part)) for name in names]
    if not all(index.isdigit() for index in indices):
        return ", ".join(indices)
    numbers = sorted(int(index) for index in indices)
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ", ".join(
        str(run[0]) if len(run) == 1 else f"{run[0]}{'-' if len(run) > 2 else ', '}{run[-1]}"
        for run in runs
    )


def _is_inside(name: str, root: str) -> bool:
    return name.startswith(root + ".")


def _recomputed_roots(profile: Profile, plan: Plan) -> list[str]:
    """The modules whose whole forward the plan recomputes: the wrapped modules, and for
    ``checkpoint_sequential`` the children in its checkpointed segments."""
    return [name for unit in plan.units for name in recomputed_modules(profile, unit)]


def module_frame(profile: Profile, plan: Plan, *, group_above: int = 24) -> pd.DataFrame:
    """The data behind the per-module chart: one row per candidate, or per group of them.

    Rows cover the checkpoint candidates and any module the plan wraps, in module-tree
    order. With more than ``group_above`` of them (0: always), those whose names differ only
    in numeric parts and whose types match form one row named by the pattern
    (``blocks.*.mlp``); a group of one keeps the module's own name.

    Columns: ``group``, ``module_type``, ``depth``, ``count`` (modules in the row),
    ``chosen_count`` (of them, those the plan wraps), ``chosen_indices`` (their numeric
    name parts, e.g. ``"0-11, 14"``; empty when none or when the row is one module),
    ``covered_count`` (not wrapped themselves but recomputed inside a wrapped module),
    ``saved_bytes_mean``/``_min``/``_max`` (``checkpoint_saving_bytes``: what wrapping one
    module frees between its forward and its backward) and ``recompute_ms_mean``/``_min``/
    ``_max`` (its profiled forward time, what recomputation costs).
    """
    chosen = set(plan.module_names)
    recomputed_roots = _recomputed_roots(profile, plan)
    records = [
        record for record in profile.modules if record.is_candidate or record.module_name in chosen
    ]
    grouped = len(records) > group_above
    groups: dict[tuple[str, str], list[ModuleProfile]] = {}
    for record in records:
        pattern = _group_pattern(record.module_name) if grouped else record.module_name
        groups.setdefault((pattern, record.module_type), []).append(record)
    rows = []
    for (pattern, module_type), members in groups.items():
        saved = np.array([member.checkpoint_saving_bytes for member in members], dtype=float)
        recompute = np.array([member.forward_ms for member in members], dtype=float)
        chosen_names = [member.module_name for member in members if member.module_name in chosen]
        rows.append(
            {
                "group": pattern if len(members) > 1 else members[0].module_name,
                "module_type": module_type,
                "depth": members[0].depth,
                "count": len(members),
                "chosen_count": len(chosen_names),
                "chosen_indices": _index_text(chosen_names) if len(members) > 1 else "",
                "covered_count": sum(
                    member.module_name not in chosen
                    and any(
                        member.module_name == root or _is_inside(member.module_name, root)
                        for root in recomputed_roots
                    )
                    for member in members
                ),
                "saved_bytes_mean": saved.mean(),
                "saved_bytes_min": int(saved.min()),
                "saved_bytes_max": int(saved.max()),
                "recompute_ms_mean": recompute.mean(),
                "recompute_ms_min": recompute.min(),
                "recompute_ms_max": recompute.max(),
            }
        )
    return pd.DataFrame(rows, columns=_MODULE_COLUMNS)


_MODULE_COLUMNS = [
    "group",
    "module_type",
    "depth",
    "count",
    "chosen_count",
    "chosen_indices",
    "covered_count",
    "saved_bytes_mean",
    "saved_bytes_min",
    "saved_bytes_max",
    "recompute_ms_mean",
    "recompute_ms_min",
    "recompute_ms_max",
]


def _module_row_label(row: Any) -> str:
    """``blocks.*.mlp  (MLP ×48)``, and for a group a second line: which were chosen."""
    if row.count == 1:
        return f"{row.group}  ({row.module_type})"
    notes = []
    if row.chosen_count:
        indices = row.chosen_indices
        indices = indices if len(indices) <= 30 else indices[:29] + "…"
        notes.append(f"{row.chosen_count} chosen: {indices}")
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
        weight = data["saved_bytes_mean"] * data["count"] + np.where(
            data["chosen_count"] > 0, np.inf, 0.0
        )
        data = data.loc[sorted(weight.nlargest(max_rows).index)]
    unit, unit_bytes = _memory_unit(profile)
    rows = len(data)
    counts = data["count"].to_numpy()
    row_inches = 0.45 if (counts > 1).any() else 0.3  # grouped rows have two label lines
    figure = Figure(figsize=(11, 2.3 + row_inches * max(rows, 3)), layout="constrained")
    saved_axes, time_axes = figure.subplots(1, 2, sharey=True)
    positions = np.arange(rows)
    chosen_counts = data["chosen_count"].to_numpy()
    covered_counts = data["covered_count"].to_numpy()
    colors = [
        _CHOSEN_COLOR if chosen else _COVERED_COLOR if covered else _OTHER_COLOR
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
        saved_axes,
        data["saved_bytes_mean"].to_numpy() / unit_bytes,
        data["saved_bytes_min"].to_numpy() / unit_bytes,
        data["saved_bytes_max"].to_numpy() / unit_bytes,
    )
    bars(
        time_axes,
        data["recompute_ms_mean"].to_numpy(),
        data["recompute_ms_min"].to_numpy(),
        data["recompute_ms_max"].to_numpy(),
    )
    saved_axes.set_yticks(positions, [_module_row_label(row) for row in data.itertuples()])
    saved_axes.tick_params(axis="y", labelsize=8)
    saved_axes.invert_yaxis()
    saved_axes.set_xlabel(f"memory freed by checkpointing ({unit} per module)")
    time_axes.set_xlabel("recompute time (ms per module: its forward)")
    handles = [Patch(color=_CHOSEN_COLOR, label="checkpointed by the plan")]
    if covered_counts.any():
        handles.append(Patch(color=_COVERED_COLOR, label="recomputed inside a checkpointed module"))
    if any(hatches):
        handles.append(
            Patch(facecolor="white", hatch="//", edgecolor="black", label="only some of a group")
        )
    handles.append(Patch(color=_OTHER_COLOR, label="not recomputed"))
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
        _title(profile, "checkpoint candidates", plan.budget_bytes)
        + f"\n{shown}; {len(plan.modules)} modules checkpointed",
        fontsize=10,
    )
    return figure


# -- memory timeline ---------------------------------------------------------------------


def timeline_frame(profile: Profile, plan: Plan, memory: MemoryModel | None = None) -> pd.DataFrame:
    """The data behind the timeline chart: live MiB after each event, unplanned and planned
    (columns ``event``, ``unplanned_mib``, ``planned_mib``)."""
    memory = memory or MemoryModel(profile.timeline)
    unplanned = memory.memory_curve(()) / _MIB
    planned = memory.memory_curve(plan.units) / _MIB
    return pd.DataFrame(
        {"event": np.arange(len(unplanned)), "unplanned_mib": unplanned, "planned_mib": planned}
    )


def memory_timeline_figure(
    profile: Profile, plan: Plan, memory: MemoryModel | None = None
) -> Figure:
    """Live memory over one step, without and with the plan (predicted), with the budget,
    the recompute spikes and the forward | backward | optimizer boundaries."""
    memory = memory or MemoryModel(profile.timeline)
    data = timeline_frame(profile, plan, memory)
    unit, unit_bytes = _memory_unit(profile)
    scale = _MIB / unit_bytes
    figure = Figure(figsize=(9, 5.2), layout="constrained")
    axes = figure.add_subplot()
    axes.plot(
        data["event"],
        data["unplanned_mib"] * scale,
        color=_OTHER_COLOR,
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
    for phase, label in (("forward", "forward | backward"), ("backward", "backward | optimizer")):
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
    axes.set_title(_title(profile, "memory over one training step", plan.budget_bytes))
    axes.grid(alpha=0.3)
    figure.legend(loc="outside lower center", ncols=2, fontsize=8)
    return figure


# -- files -------------------------------------------------------------------------------


def load_report_inputs(
    path: str | Path,
    *,
    profile_path: str | Path | None = None,
    budget_bytes: int | None = None,
) -> tuple[Profile, Plan]:
    """The profile and plan to report on, from a plan file or a profile file at ``path``.

    A plan: its profile is ``profile_path`` or ``profile.json`` beside it, and must be of
    the same model (same fingerprint). A profile: with ``budget_bytes``, the cheapest plan
    for that budget (solved now, not run); without, an empty plan whose budget is the
    unplanned peak. Raises :class:`PlanFileError` (or ``ProfileFileError``) for a missing or
    corrupt file, :class:`PlanMismatchError` for a profile of another model,
    ``InfeasibleBudgetError`` for a budget no plan fits, and :class:`BudgetError` for a
    budget given with a plan (which has its own).
    """
    source = Path(path)
    if not source.is_file():
        raise PlanFileError(
            f"{source} does not exist; give a plan.json or profile.json written by "
            "`ckpt-plan profile`"
        )
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PlanFileError(
            f"{source} is not valid JSON ({error}); re-create it with `ckpt-plan profile`"
        ) from error
    if isinstance(data, dict) and "timeline" in data:
        profile = load_profile(source)
        if budget_bytes is None:
            budget = profile.measured_peak_bytes
            return profile, build_plan(profile, [], budget, strategy="none")
        plan, _ = plan_for_budget(profile, budget_bytes)
        return profile, plan

    plan = plan_from_dict(data, source=f"plan file {source}")
    if budget_bytes is not None:
        raise BudgetError(
            f"{source} is a plan, made for a budget of {format_bytes(plan.budget_bytes)}; "
            "to plan for another budget, report on its profile.json with that budget"
        )
    profile = load_profile(profile_path or source.parent / "profile.json")
    if profile.fingerprint.get("digest") != plan.fingerprint.get("digest"):
        raise PlanMismatchError(
            f"plan file {source} was made for another model than the profile "
            f"{profile_path or source.parent / 'profile.json'} (fingerprints differ); "
            "give the profile the plan was made from"
        )
    return profile, plan


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
        f"{plan.step_ms:.1f} ms step"
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
        f"# {_title(profile, 'activation checkpointing report', plan.budget_bytes)}",
        "",
        "| | |",
        "|---|---|",
        f"| model | `{profile.model_name}` (`{profile.model_file}`) |",
        f"| device | {profile.device}, torch {profile.torch_version} |",
        f"| batch | {_batch_text(profile.batch)} |",
        f"| budget | {format_bytes(plan.budget_bytes)} |",
        f"| unplanned peak ({unplanned_source(profile)}) | "
        f"{format_bytes(profile.measured_peak_bytes)} |",
        f"| predicted peak with the plan | {format_bytes(plan.predicted_peak_bytes)} |",
        "| measured peak with the plan | "
        + (
            f"{format_bytes(measured_peak)} (the plan was run)"
            if measured_peak is not None
            else "not measured (the plan was not run)"
        )
        + " |",
        "| static (parameters, gradients, optimizer state, buffers) | "
        f"{format_bytes(profile.static_bytes)} |",
        f"| recompute per step (predicted) | {_overhead_text(plan)} |",
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
        lines += [f"- {line}" for line in profile.assumptions]
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
            method = decision.method.value + (
                f" ({decision.segments} segments)" if decision.segments else ""
            )
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


def write_report(
    profile: Profile,
    plan: Plan,
    folder: str | Path,
    *,
    formats: Sequence[str] = ("png",),
    frontier_points: int = 50,
    measured: Mapping[str, int] | None = None,
) -> list[Path]:
    """Write a report on ``plan`` into ``folder``: ``tradeoff``, ``modules`` and
    ``memory_timeline`` charts in each of ``formats`` (``"png"``, ``"svg"``), and
    ``summary.md`` linking them (the PNGs when written, else the first format). Solves
    ``frontier_points`` budgets for the trade-off curve. ``measured`` as in
    :func:`tradeoff_frame`. Every file is written atomically. Returns the paths written,
    ``summary.md`` last.
    """
    unknown = [fmt for fmt in formats if fmt not in REPORT_FORMATS]
    if unknown or not formats:
        raise ValueError(f"formats must be some of {REPORT_FORMATS}, got {tuple(formats)}")
    target = Path(folder)
    solver = Solver(profile)
    sweep = frontier(profile, frontier_points, solver=solver)
    baselines = baseline_plans(profile, plan.budget_bytes)
    figures = {
        "tradeoff": tradeoff_figure(profile, sweep, baselines, measured, chosen=plan),
        "modules": module_figure(profile, plan),
        "memory_timeline": memory_timeline_figure(profile, plan, solver.memory),
    }
    wrote = []
    for name, figure in figures.items():
        for fmt in dict.fromkeys(formats):
            path = target / f"{name}.{fmt}"
            with atomic_path(path) as temp_path:
                figure.savefig(temp_path, format=fmt, dpi=_DPI)
            wrote.append(path)
    linked = "png" if "png" in formats else formats[0]
    summary = target / "summary.md"
    atomic_write_text(
        summary,
        summary_markdown(
            profile,
            plan,
            baselines,
            measured,
            images={name: f"{name}.{linked}" for name in figures},
        ),
    )
    wrote.append(summary)
    return wrote
