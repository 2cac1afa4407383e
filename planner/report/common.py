"""What every report part shares: labels, formats, colours, units and titles."""

from __future__ import annotations

from planner.core.records import Profile
from planner.core.units import format_bytes

CHOSEN = "chosen"
"""Label of the chosen plan in :func:`tradeoff_frame` and in its ``measured`` mapping."""

REPORT_FORMATS = ("png", "svg")
"""Image formats :func:`write_report` can write."""

MIB = 2**20
GIB = 2**30
DPI = 120
CHOSEN_COLOR = "tab:orange"
COVERED_COLOR = "#fdd0a2"  # a light tab:orange
OTHER_COLOR = "tab:gray"


def memory_unit(profile: Profile) -> tuple[str, int]:
    """One display unit for every chart of a report: MiB, or GiB for steps of 10 GiB and up."""
    return ("GiB", GIB) if profile.measured_peak_bytes >= 10 * GIB else ("MiB", MIB)


def chart_title(profile: Profile, what: str, budget_bytes: int | None) -> str:
    """Every chart says the model, the device and the budget."""
    budget = f"budget {format_bytes(budget_bytes)}" if budget_bytes is not None else "no budget"
    return f"{profile.model_name} on {profile.device}: {what}, {budget}"
