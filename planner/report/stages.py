"""A pipeline's plan, stage by stage: each stage's peak before and after its plan, against
the budget (docs/distributed.md, "Pipeline stages"). Each stage also has a report of its
own (:func:`~planner.report.files.write_report` on the stage's profile and plan); this is the
page over them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from planner.core.fileio import atomic_path, atomic_write_text
from planner.core.units import format_bytes
from planner.plan.plan_file import Plan
from planner.report.common import CHOSEN_COLOR, DPI, GIB, MIB, OTHER_COLOR

__all__ = ["stage_frame", "stage_peaks_figure", "stages_markdown", "write_stages_report"]


def stage_frame(plan: Plan) -> pd.DataFrame:
    """One row per stage of a pipeline's plan: ``stage``, ``in_flight`` (micro-batches its
    schedule keeps alive), ``unplanned_peak_bytes``, ``predicted_peak_bytes``,
    ``measured_peak_bytes`` (None where not run), ``budget_bytes``, ``checkpointed`` (how
    many modules), ``recompute_ms`` and ``overhead_percent``."""
    rows = []
    for stage in plan.stages:
        pipeline = stage.parallel.pipeline if stage.parallel is not None else None
        index = pipeline.stage if pipeline is not None and pipeline.stage is not None else 0
        rows.append(
            {
                "stage": index,
                "in_flight": pipeline.in_flight(index) if pipeline is not None else 1,
                "unplanned_peak_bytes": stage.baseline_peak_bytes,
                "predicted_peak_bytes": stage.predicted_peak_bytes,
                "measured_peak_bytes": stage.measured_peak_bytes,
                "budget_bytes": stage.budget_bytes,
                "checkpointed": len(stage.modules),
                "recompute_ms": stage.recompute_ms,
                "overhead_percent": 100.0 * stage.predicted_overhead,
            }
        )
    return pd.DataFrame(rows)


def stage_peaks_figure(plan: Plan) -> Figure:
    """Each stage's unplanned and planned peak (predicted; measured where run) as bars,
    with the budget as a line."""
    frame = stage_frame(plan)
    unit, scale = ("GiB", GIB) if frame["unplanned_peak_bytes"].max() >= 10 * GIB else ("MiB", MIB)
    figure = Figure(figsize=(max(5.0, 1.2 * len(frame) + 3), 4))
    axes = figure.add_subplot()
    positions = np.arange(len(frame))
    width = 0.38
    axes.bar(
        positions - width / 2,
        frame["unplanned_peak_bytes"] / scale,
        width,
        color=OTHER_COLOR,
        label="unplanned",
    )
    axes.bar(
        positions + width / 2,
        frame["predicted_peak_bytes"] / scale,
        width,
        color=CHOSEN_COLOR,
        label="with its plan (predicted)",
    )
    measured = frame["measured_peak_bytes"]
    if measured.notna().any():
        axes.scatter(
            positions + width / 2,
            measured / scale,
            marker="x",
            color="black",
            zorder=3,
            label="with its plan (measured)",
        )
    axes.axhline(plan.budget_bytes / scale, color="black", linestyle="--", label="budget")
    axes.set_xticks(
        positions,
        [f"stage {row.stage}\n{row.in_flight} in flight" for row in frame.itertuples()],
    )
    axes.set_ylabel(f"peak memory per rank ({unit})")
    axes.set_title("each pipeline stage's peak, before and after its plan")
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    return figure


def stages_markdown(plan: Plan, image: str | None = "stages.png") -> str:
    """The stages' table, as Markdown, linking ``image`` and each stage's own report."""
    frame = stage_frame(plan)
    lines = [
        "# Pipeline stages",
        "",
        f"{plan.parallel.describe() if plan.parallel is not None else ''}; budget "
        f"{format_bytes(plan.budget_bytes)} per rank.",
        "",
    ]
    if image:
        lines += [f"![each stage's peak]({image})", ""]
    lines += [
        "| stage | in flight | unplanned peak | predicted peak | measured peak "
        "| checkpointed | overhead | report |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in frame.itertuples():
        measured = (
            format_bytes(int(row.measured_peak_bytes))
            if row.measured_peak_bytes is not None and not pd.isna(row.measured_peak_bytes)
            else "not run"
        )
        lines.append(
            f"| {row.stage} | {row.in_flight} | {format_bytes(row.unplanned_peak_bytes)} "
            f"| {format_bytes(row.predicted_peak_bytes)} | {measured} | {row.checkpointed} "
            f"| {row.overhead_percent:+.1f}% | [stage {row.stage}](stage{row.stage}/summary.md) |"
        )
    return "\n".join(lines) + "\n"


def write_stages_report(plan: Plan, folder: str | Path) -> list[Path]:
    """Write ``stages.png`` and ``stages.md`` into ``folder``, atomically; returns them."""
    target = Path(folder)
    chart = target / "stages.png"
    with atomic_path(chart) as temp_path:
        stage_peaks_figure(plan).savefig(temp_path, format="png", dpi=DPI)
    page = target / "stages.md"
    atomic_write_text(page, stages_markdown(plan))
    return [chart, page]
