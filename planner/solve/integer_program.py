"""The integer program with lazy constraints (scipy's HiGHS ``milp``), for the budgets whose
rows the tree program cannot represent (one input storage shared by several blocks that
could each be checkpointed, say), and for the lowest peak there.

Rows are added lazily: solve, replay the answer exactly, add the row of the event (or spike)
where the replay exceeds the budget, repeat; the loop ends with a plan whose exact replay
fits, the cheapest under the memory model (``proven_optimal``) at the program's cost
resolution (10 microseconds, finer for costs of microseconds), unless HiGHS hit its node
limit first: then the best plan found, and the bound HiGHS proved
(:attr:`IntegerProgram.cost_bound_ms`: no plan that fits costs less).

Why a node limit: the memory rows are knapsack rows over many near-identical items (layers
of one shape, options of almost equal cost and saving). On such programs HiGHS finds its
plan at the root node, then spends thousands of nodes without raising its bound above the
root's. A node limit, unlike a time limit, gives the same answer on a loaded machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

import numpy as np

from planner.core.records import Unit
from planner.solve.rows import MemoryRows, PlanPeaks, Violation
from planner.solve.tree import UnitTree

__all__ = ["IntegerProgram"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence what HiGHS prints from C++ straight to file descriptor 1 (a stray debugging
    line in some releases), which would land in the middle of the CLI's output."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no usable descriptor 1: nothing to protect
        yield
        return
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class IntegerProgram:
    """The lazy-constraint integer program: binary ``x_u`` per unit (plus the helper columns
    of :class:`~planner.solve.rows.MemoryRows`); minimise ``sum_u cost_u x_u`` subject to
    one unit per path (a row per leaf of the unit tree) and the memory and spike rows,
    added lazily where the exact replay of an answer exceeds the budget.
    """

    def __init__(
        self,
        tree: UnitTree,
        memory_rows: MemoryRows,
        peaks: PlanPeaks,
        host_budget_bytes: int | None = None,
    ) -> None:
        self.tree = tree
        self.memory_rows = memory_rows
        self.peaks = peaks
        self.units = list(tree.names)
        # The host memory offloaded modules may hold: one knapsack row over them (in units
        # of the budget, so its coefficients are at most about 1).
        self.host_rows: list[tuple[dict[int, float], float]] = []
        offloads = {i: tree.host_bytes[u] for i, u in enumerate(self.units) if tree.host_bytes[u]}
        if host_budget_bytes is not None and sum(offloads.values()) > host_budget_bytes:
            scale = float(max(1, host_budget_bytes))
            host_row = {i: size / scale for i, size in offloads.items()}
            self.host_rows.append((host_row, host_budget_bytes / scale))
        # One unit per path: a row per unit-tree leaf node (its units and its ancestors').
        self.path_rows: list[dict[int, float]] = []
        for leaf in tree.nodes:
            if tree.node_children[leaf]:
                continue
            row: dict[int, float] = {}
            node: str | None = leaf
            while node is not None:
                row.update((i, 1.0) for i in tree.node_units[node])
                node = tree.node_parent[node]
            self.path_rows.append(row)
        # Costs in whole 10-microsecond units (finer where all units together cost less
        # than 100 ms: roofline costs of a GPU are microseconds): an integral objective
        # lets HiGHS round its bounds, which closes the tiny gaps between near-identical
        # blocks quickly. The answer is exact at that resolution, far below the timing
        # noise of a profile.
        cost_ms = np.array([tree.cost_ms[u] for u in self.units])
        self.quantum_ms = min(0.01, max(1e-9, float(cost_ms.sum())) / 10_000)
        self.cost = np.round(cost_ms / self.quantum_ms)
        self.scale = float(memory_rows.base.max()) or 1.0
        self.rounds = 0
        # Branch-and-bound nodes per HiGHS solve; past it the answer is the best plan found
        # and the bound proven so far. Fewer for more units, for about the same work per
        # solve (a node's LP grows with the units): small programs still finish, large ones
        # stop soon after the root. Time is a safety net only (it depends on the load).
        self.max_nodes = max(1, 50_000 // max(1, len(self.units)))
        self.time_limit_s = 20.0
        # Rows added per round: every stretch of the replay above the bound, up to this many.
        self.rows_per_round = 32
        # Rounds without a rise of the lowest-peak bound before that search stops.
        self.stall_rounds = 12
        # Rounds of a budget's search before it stops without a plan (the solver then
        # falls back on the lowest-peak plan, which fits any budget it is asked for).
        self.max_rounds = 100
        # The proven lower bound of the last lowest_peak (its answer's peak when proven).
        self.lowest_bound_bytes = 0
        # The proven lower bound of the last solve's cost: no plan that fits its budget
        # recomputes in less, at the cost resolution (``quantum_ms``); the answer's cost
        # (at that resolution) when proven.
        self.cost_bound_ms = 0.0
        # What the last HiGHS solve proved: the optimum of its rows (False: stopped at the
        # node or time limit), and the lower bound of its objective.
        self._optimal = True
        self._bound = 0.0

    # -- solving -------------------------------------------------------------------------
    def _milp(
        self,
        objective: np.ndarray,
        rows: list[tuple[dict[int, float], float]],
        *,
        peak_column: bool = False,
    ) -> np.ndarray | None:
        """Solve with the given rows (plus path and helper-link rows). Columns: units,
        helpers, then the peak variable when ``peak_column``. Returns the best solution
        found (None: infeasible, or none found within the limits); sets ``_optimal`` and
        ``_bound``."""
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_array

        helpers = len(self.memory_rows.helpers)
        count = len(self.units) + helpers + (1 if peak_column else 0)
        all_rows = (
            [(row, 1.0) for row in self.path_rows]
            + self.memory_rows.link_rows
            + self.host_rows
            + rows
        )
        data, row_index, column_index, upper = [], [], [], []
        for number, (row, bound) in enumerate(all_rows):
            for column, value in row.items():
                if value:
                    row_index.append(number)
                    column_index.append(column)
                    data.append(value)
            upper.append(bound)
        matrix = coo_array((data, (row_index, column_index)), shape=(len(all_rows), count)).tocsr()
        full_objective = np.zeros(count)
        full_objective[: len(self.units)] = objective[: len(self.units)]
        if peak_column:
            full_objective[-1] = objective[-1]
        integrality = np.zeros(count)
        integrality[: len(self.units)] = 1
        high = np.ones(count)
        if peak_column:
            high[-1] = np.inf
        with _quiet_stdout():
            result = milp(
                full_objective,
                constraints=[LinearConstraint(matrix, -np.inf, np.array(upper))],
                integrality=integrality,
                bounds=Bounds(np.zeros(count), high),
                options={
                    "mip_rel_gap": 0.0,
                    "time_limit": self.time_limit_s,
                    "node_limit": self.max_nodes,
                },
            )
        self.rounds += 1
        # 0: optimal; 2: proven infeasible; anything else (a node or time limit): the best
        # solution found, if any, and the bound proven so far.
        self._optimal = result.status in (0, 2)
        dual = result.get("mip_dual_bound")
        self._bound = float(dual) if dual is not None and np.isfinite(dual) else -np.inf
        if result.x is None:
            return None
        if self._optimal:
            self._bound = float(result.fun)
        return np.asarray(result.x)

    def _chosen(self, x: np.ndarray) -> tuple[Unit, ...]:
        return tuple(sorted(u for u, value in zip(self.units, x, strict=False) if value > 0.5))

    def _scaled(self, row: dict[int, float], bound: float) -> tuple[dict[int, float], float]:
        # Memory rows in units of the unplanned peak, so HiGHS's tolerances are relative.
        return {c: v / self.scale for c, v in row.items()}, bound / self.scale

    def solve(
        self, budget_bytes: int, fitting: tuple[Unit, ...] | None = None
    ) -> tuple[tuple[Unit, ...] | None, bool]:
        """The cheapest plan whose exact replay fits ``budget_bytes`` (None: none fits), and
        whether it is proven the cheapest; :attr:`cost_bound_ms` is the proven bound.

        ``fitting``: a plan known to fit (a cheaper budget's answer, say). It is the answer
        where HiGHS stops at its limit with nothing cheaper."""
        budget = float(budget_bytes)
        rows: list[tuple[dict[int, float], float]] = []
        added: set[Violation] = set()
        violation = self.memory_rows.violation((), budget)
        self.cost_bound_ms = 0.0
        if violation is None:
            return (), True
        exact = True
        chosen: tuple[Unit, ...] = ()
        violations = [violation]
        bound = 0.0  # in quanta: each round's rows are a relaxation of the next round's
        for _ in range(self.max_rounds):
            fresh = [v for v in violations if v not in added]
            if not fresh:
                # Cannot happen with exact rows; kept as a safety net: cut off this plan.
                exact = False
                rows.append(({self.tree.index[u]: 1.0 for u in chosen}, len(chosen) - 1.0))
            for new in fresh:
                added.add(new)
                rows.append(self._scaled(*self.memory_rows.row_for(new, budget)))
            x = self._milp(self.cost, rows)
            bound = max(bound, self._bound)
            if x is None:
                if self._optimal:  # infeasible: no plan fits
                    return None, exact
                break
            chosen = self._chosen(x)
            violations = self.memory_rows.violations(chosen, budget, self.rows_per_round)
            if not violations:
                return self._answer(chosen, fitting, bound, self._optimal, exact)
        else:
            logger.debug("integer program: no plan within %d rounds", self.max_rounds)
        if fitting is None:
            return None, False
        return self._answer(fitting, None, bound, False, exact)

    def _answer(
        self,
        chosen: tuple[Unit, ...],
        fitting: tuple[Unit, ...] | None,
        bound: float,
        optimal: bool,
        exact: bool,
    ) -> tuple[tuple[Unit, ...], bool]:
        """``chosen`` (a plan that fits, optimal for the last rows or not), or ``fitting``
        where that is cheaper; whether it is proven the cheapest, and :attr:`cost_bound_ms`
        from the proven ``bound`` (in quanta; none where the rows were not exact)."""
        quanta = self._quanta(chosen)
        if fitting is not None and self._quanta(fitting) < quanta:
            chosen, quanta, optimal = fitting, self._quanta(fitting), False
        if optimal:
            bound = quanta
        proven = exact and bound >= quanta
        self.cost_bound_ms = min(bound, quanta) * self.quantum_ms if exact else 0.0
        return chosen, proven

    def _quanta(self, units: tuple[Unit, ...]) -> float:
        return float(sum(self.cost[self.tree.index[u]] for u in units))

    def lowest_peak(self) -> tuple[Unit, ...]:
        """Minimise the peak: a column z with z >= each lazily added memory/spike row.

        Each round solves for the lowest ``z``, replays the answer exactly and adds the row
        where the replay exceeds ``z``; it stops when the replay equals ``z``.
        """
        count = len(self.units)
        # Objective: the peak (in units of the unplanned peak), plus a tiny cost term that
        # prefers the cheaper of two plans with the same peak.
        objective = np.concatenate([self.cost / (self.cost.sum() + 1.0) * 1e-9, [1.0]])
        peak_rows: list[tuple[dict[int, float], float]] = []  # delta.x - z <= -base
        cuts: list[tuple[dict[int, float], float]] = []
        added: set[Violation] = set()
        best: tuple[int, tuple[Unit, ...]] = (self.peaks(()), ())
        violations: list[Violation] = [("point", int(self.memory_rows.base.argmax()), -1)]
        chosen: tuple[Unit, ...] = ()
        floor, stalled = 0.0, 0
        for _ in range(200):
            fresh = [v for v in violations if v not in added]
            if not fresh:  # safety net, as in solve()
                cuts.append(({self.tree.index[u]: 1.0 for u in chosen}, len(chosen) - 1.0))
            for new in fresh:
                added.add(new)
                peak_rows.append(self._scaled(*self.memory_rows.row_for(new, 0.0)))
            peak_column = count + len(self.memory_rows.helpers)
            rows = [({**row, peak_column: -1.0}, bound) for row, bound in peak_rows] + cuts
            x = self._milp(objective, rows, peak_column=True)
            if x is None:
                break
            chosen = self._chosen(x[:count])
            # The answer's own peak under the rows; the proven bound is lower where HiGHS
            # stopped at its limit (less the tiny cost term of the objective).
            level = float(x[-1]) * self.scale
            lower = level if self._optimal else max(0.0, self._bound - 1e-9) * self.scale
            peak = self.peaks(chosen)
            if peak < best[0]:
                best = (peak, chosen)
            if best[0] <= lower + 0.5:
                floor = best[0]
                break
            # Blocks of one shape give many plans at the same bound, each peaking at its own
            # event: the bound can stay put for hundreds of rounds. Stop when it has not
            # risen for a while, with the best plan found and the bound proven so far.
            stalled = stalled + 1 if lower <= floor + 0.5 else 0
            floor = max(floor, lower)
            if stalled >= self.stall_rounds:
                logger.debug("lowest peak: bound stalled at %d bytes, best %d", floor, best[0])
                break
            violations = self.memory_rows.violations(chosen, level + 0.5, self.rows_per_round)
            if not violations:
                break
        self.lowest_bound_bytes = min(best[0], int(floor))
        return best[1]
