"""A whole report folder, written atomically: charts, frames and the summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from planner.core.fileio import atomic_path, atomic_write_text
from planner.core.records import Profile
from planner.plan.plan_file import Plan
from planner.report.common import DPI, REPORT_FORMATS
from planner.report.figures import memory_timeline_figure, module_figure, tradeoff_figure
from planner.report.summary import summary_markdown
from planner.solve import Solver
from planner.solve.planning import (
    baseline_plans,
    frontier,
)


def write_report(
    profile: Profile,
    plan: Plan,
    folder: str | Path,
    *,
    formats: Sequence[str] = ("png",),
    frontier_points: int = 50,
    measured: Mapping[str, int] | None = None,
    offload: bool = True,
    host_budget_bytes: int | None = None,
) -> list[Path]:
    """Write a report on ``plan`` into ``folder``: ``tradeoff``, ``modules`` and
    ``memory_timeline`` charts in each of ``formats`` (``"png"``, ``"svg"``), and
    ``summary.md`` linking them (the PNGs when written, else the first format). Solves
    ``frontier_points`` budgets for the trade-off curve. ``measured`` as in
    :func:`tradeoff_frame`. ``offload`` and ``host_budget_bytes`` are the frontier's, as for
    :class:`~planner.solve.Solver` (whether plans may offload, and the host memory they may
    fill; None: no bound). Every file is written atomically. Returns the paths written,
    ``summary.md`` last.
    """
    unknown = [fmt for fmt in formats if fmt not in REPORT_FORMATS]
    if unknown or not formats:
        raise ValueError(f"formats must be some of {REPORT_FORMATS}, got {tuple(formats)}")
    target = Path(folder)
    solver = Solver(profile, offload=offload, host_budget_bytes=host_budget_bytes)
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
                figure.savefig(temp_path, format=fmt, dpi=DPI)
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
