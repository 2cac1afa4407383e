"""Exhaustive branch and bound, for small unit trees.

Depth-first over the units in tree pre-order, each either taken (its subtree is then
skipped) or not; a branch whose cost reaches the best known is cut; a plan that fits ends
its branch. Every plan it looks at is replayed exactly, so the answer is the cheapest under
the memory model.
"""

from __future__ import annotations

from planner.core.records import Unit
from planner.solve.rows import PlanPeaks
from planner.solve.tree import UnitTree

__all__ = ["branch_and_bound"]


def branch_and_bound(
    tree: UnitTree,
    peaks: PlanPeaks,
    budget_bytes: int | None,
    max_evaluations: int,
    host_budget_bytes: int | None = None,
) -> tuple[tuple[Unit, ...] | None, bool]:
    """The cheapest plan within ``budget_bytes`` (with None: the lowest peak, then the
    cheapest), replaying at most ``max_evaluations`` new plans, among the plans whose
    offloaded modules hold at most ``host_budget_bytes`` (:meth:`UnitTree.host`). Returns
    (best plan, whether the search finished)."""
    limit = peaks.evaluations + max_evaluations
    best: tuple[Unit, ...] | None = None
    best_key: tuple[float, float] = (float("inf"), float("inf"))
    finished = True

    def visit(position: int, chosen: list[Unit], cost: float) -> None:
        nonlocal best, best_key, finished
        if budget_bytes is not None and cost > best_key[0] + 1e-9:
            return
        if host_budget_bytes is not None and tree.host(chosen) > host_budget_bytes:
            return  # adding units only adds host memory
        if not peaks.known(chosen) and peaks.evaluations >= limit:
            finished = False
            return
        peak = peaks(chosen)
        if budget_bytes is None:
            if (peak, cost) < best_key:
                best, best_key = tuple(sorted(chosen)), (peak, cost)
        elif peak <= budget_bytes:
            # Among equally cheap plans the lower peak wins: the chosen plan's peak is then
            # monotone in the budget.
            if (cost, peak) < best_key:
                best, best_key = tuple(sorted(chosen)), (cost, peak)
            return
        for index in range(position, len(tree.names)):
            unit = tree.names[index]
            chosen.append(unit)
            # Skip the unit's node's other alternatives and its subtree.
            visit(tree.skip_to[index], chosen, cost + tree.cost_ms[unit])
            chosen.pop()
            if not finished:
                return

    visit(0, [], 0.0)
    return best, finished
