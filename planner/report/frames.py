"""The numbers behind each chart, as DataFrames (sizes in ``*_bytes``, times in ``*_ms``,
shares in ``*_percent``): trade-off, modules, memory timeline."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from planner.core.records import ModuleProfile, Profile, Unit
from planner.plan.memory_model import MemoryModel
from planner.plan.plan_file import ModuleDecision, Plan
from planner.plan.policies import option_summary, unit_how
from planner.report.common import CHOSEN, MIB
from planner.solve.planning import (
    recomputed_modules,
)

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
    ``recompute_ms``, ``module_count``, ``units`` (what is checkpointed, comma-
    separated), ``options`` (how, counted: ``"4 save-matmuls, 2 whole"``),
    ``host_peak_bytes`` (the host memory its offloaded tensors hold at once; 0 for a plan
    that offloads nothing) and ``on_frontier``: True for the sweep and chosen plans that no
    other of them beats on both peak and overhead (baselines are never marked; they are
    compared, not searched).
    """
    measured = dict(measured or {})
    rows: list[dict[str, Any]] = []
    # The chosen plan is its own row, so the sweep does not repeat it.
    seen: set[tuple[Unit, ...]] = {tuple(sorted(chosen.units))} if chosen is not None else set()
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
    "options",
    "host_peak_bytes",
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
        "units": ", ".join(str(unit) for unit in sorted(plan.units)),
        "options": option_summary(plan.units),
        "host_peak_bytes": plan.predicted_host_peak_bytes,
    }


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
    ``freed_bytes_mean``/``_min``/``_max`` (``checkpoint_saving_bytes``: what wrapping one
    module frees between its forward and its backward) and ``recompute_ms_mean``/``_min``/
    ``_max`` (its profiled forward time, what recomputation costs), and ``chosen_options``
    (how the chosen ones are checkpointed, counted: ``"4 save-matmuls, 2 whole"``; a module
    checkpointed inside a nested one counts as ``inside``).
    """
    chosen = set(plan.module_names)
    how = {
        decision.module_name: "inside" if decision.nested_in else unit_how(unit)
        for decision, unit in _decision_units(plan)
    }
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
        freed = np.array([member.checkpoint_saving_bytes for member in members], dtype=float)
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
                "freed_bytes_mean": freed.mean(),
                "freed_bytes_min": int(freed.min()),
                "freed_bytes_max": int(freed.max()),
                "recompute_ms_mean": recompute.mean(),
                "recompute_ms_min": recompute.min(),
                "recompute_ms_max": recompute.max(),
                "chosen_options": _counted(how[name] for name in chosen_names),
            }
        )
    return pd.DataFrame(rows, columns=_MODULE_COLUMNS)


def _decision_units(plan: Plan) -> list[tuple[ModuleDecision, Unit]]:
    """Each decision with the unit it belongs to (an inner decision of nesting: its outer
    module's)."""
    by_module = {unit.module: unit for unit in plan.units}
    return [
        (decision, by_module[decision.nested_in or decision.module_name])
        for decision in plan.modules
    ]


def _counted(words: Iterable[str]) -> str:
    counts: dict[str, int] = {}
    for word in words:
        counts[word] = counts.get(word, 0) + 1
    return ", ".join(f"{count} {word}" for word, count in sorted(counts.items()))


_MODULE_COLUMNS = [
    "group",
    "module_type",
    "depth",
    "count",
    "chosen_count",
    "chosen_indices",
    "covered_count",
    "freed_bytes_mean",
    "freed_bytes_min",
    "freed_bytes_max",
    "recompute_ms_mean",
    "recompute_ms_min",
    "recompute_ms_max",
    "chosen_options",
]


# -- memory timeline ---------------------------------------------------------------------


def timeline_frame(profile: Profile, plan: Plan, memory: MemoryModel | None = None) -> pd.DataFrame:
    """The data behind the timeline chart: live MiB after each event, unplanned and planned
    (columns ``event``, ``unplanned_mib``, ``planned_mib``)."""
    memory = memory or MemoryModel.for_profile(profile)
    unplanned = memory.memory_curve(()) / MIB
    planned = memory.memory_curve(plan.units) / MIB
    return pd.DataFrame(
        {"event": np.arange(len(unplanned)), "unplanned_mib": unplanned, "planned_mib": planned}
    )
