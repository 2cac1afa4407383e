"""Shared by the benchmark scripts."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from planner.core.records import Profile


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table; missing values are empty cells. (pandas' own to_markdown
    needs an extra package.)"""
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = [
        "| " + " | ".join("" if pd.isna(v) else str(v) for v in row) + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join([header, rule, *body])


def halfway_budget(profile: Profile) -> int:
    """Halfway from the peak with every block checkpointed (or, where some blocks cannot be,
    the smallest feasible peak: T5's decoder) to the unplanned peak."""
    from planner.core.records import Unit
    from planner.plan.memory_model import MemoryModel
    from planner.solve import Solver

    model = MemoryModel.for_profile(profile)
    _, lowest = Solver(profile, model).lowest_peak()
    low = max(model.peak_bytes(Unit(block) for block in profile.block_names), lowest)
    return (low + profile.measured_peak_bytes) // 2
