"""Choose what to checkpoint: the least recompute time whose predicted peak fits the budget.

Pure Python, numpy and scipy (no torch). The memory of a plan comes from
:class:`planner.memory_model.MemoryModel`; its cost is the summed forward time of what it
recomputes.

What is chosen
--------------
A plan is a set of *units*. A unit is a candidate module (``"blocks.3"``: wrap it in
``checkpoint``) or, for a candidate ``nn.Sequential`` with at least three children,
``"name#k"``: ``checkpoint_sequential`` over its children in ``k`` segments. Every unit sits
on one node of the module tree; a plan uses at most one unit per root-to-leaf path (never a
module together with its ancestor: wrapping a parent already recomputes its children).

The search
----------
The peak is not additive over units (recompute spikes, and where the peak falls, move with
the plan), so every answer is checked with the exact replay (``MemoryModel.peak_bytes``).

* **Small trees: exhaustive branch and bound.** Depth-first over the units in tree pre-order,
  each either taken (its subtree is then skipped) or not; a branch whose cost reaches the
  best known is cut; a plan that fits ends its branch. If the search finishes within
  ``exhaustive_evaluations`` replays the answer is the cheapest under the memory model.
* **Large trees: an integer program with lazy constraints** (scipy's HiGHS ``milp``).
  Binary ``x_u`` per unit; minimise ``sum_u cost_u x_u`` subject to

  - *one unit per path*: for every leaf of the unit tree, ``sum of x over its path <= 1``;
  - *memory at event t*: ``base(t) + sum_u delta_u(t) x_u <= budget``, where ``base`` is the
    measured curve and ``delta_u`` how unit ``u`` alone changes it (activations dropped
    between its forward and its recomputation, inputs held until its backward ends);
  - *recompute spike of unit u at event r* (only if ``x_u = 1``):
    ``base(r) + sum_v delta_v(r) x_v + spike_u <= budget + M (1 - x_u)``.

  Memory rows are added lazily: solve, replay the answer exactly, add the row of the event
  (or spike) where the replay exceeds the budget, repeat. A plan whose exact replay still
  exceeds the budget at an event already constrained shows the units interact (two
  checkpoints holding one storage); it is cut off by a no-good row. The loop ends with a
  plan whose exact replay fits. It is the cheapest under the memory model when no two units
  interact (``proven_optimal``); otherwise it is the cheapest under the additive model.

The lowest feasible peak (the smallest budget any plan fits, for the "budget too small"
error) is searched the same two ways, minimising the peak instead of the cost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from planner.errors import InfeasibleBudgetError
from planner.memory_model import MemoryModel, sequential_segments
from planner.records import Profile
from planner.units import format_bytes

__all__ = ["Solution", "Solver", "lowest_peak", "solve"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Solution:
    """A set of units to checkpoint with its predicted peak and recompute cost."""

    module_names: tuple[str, ...]
    predicted_peak_bytes: int
    recompute_ms: float
    proven_optimal: bool
    evaluations: int

    @property
    def units(self) -> tuple[str, ...]:
        return self.module_names


def _is_ancestor(ancestor: str, name: str) -> bool:
    return ancestor == "" or name.startswith(ancestor + ".")


def _tree_key(name: str) -> tuple[object, ...]:
    """Sort key that puts a module right before its descendants, numbered children in order."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in name.split("."))


class Solver:
    """Holds a profile's memory model and unit tree; answers many budgets quickly."""

    def __init__(
        self,
        profile: Profile,
        memory: MemoryModel | None = None,
        *,
        sequential: bool = True,
        exhaustive_evaluations: int = 20_000,
    ) -> None:
        self.profile = profile
        self.memory = memory or MemoryModel(profile.timeline)
        self.exhaustive_evaluations = exhaustive_evaluations
        candidates = sorted(profile.candidates, key=lambda m: _tree_key(m.module_name))
        self.cost_ms: dict[str, float] = {}
        self.node_of: dict[str, str] = {}
        for record in candidates:
            self.cost_ms[record.module_name] = record.forward_ms
            self.node_of[record.module_name] = record.module_name
            if sequential and record.module_type == "Sequential":
                for unit, cost in self._sequential_units(record.module_name):
                    self.cost_ms[unit] = cost
                    self.node_of[unit] = record.module_name
        # Units in tree pre-order; the alternatives of one node are adjacent.
        self.names: tuple[str, ...] = tuple(
            sorted(self.cost_ms, key=lambda u: (_tree_key(self.node_of[u]), u))
        )
        # skip_to[i]: the first unit after unit i's node and that node's whole subtree.
        self.skip_to: list[int] = []
        for index, unit in enumerate(self.names):
            node = self.node_of[unit]
            end = index + 1
            while end < len(self.names) and (
                self.node_of[self.names[end]] == node
                or _is_ancestor(node, self.node_of[self.names[end]])
            ):
                end += 1
            self.skip_to.append(end)
        self.evaluations = 0
        self._cache: dict[frozenset[str], int] = {}
        self._integer_program: _IntegerProgram | None = None
        self.plan_count = self._count_plans()

    def _count_plans(self) -> float:
        """How many plans there are (antichains of units): per node, its own units plus
        the product over its nearest unit-bearing descendants; a product over the roots."""
        nodes = sorted(set(self.node_of.values()), key=_tree_key)
        options = {node: sum(1 for u in self.names if self.node_of[u] == node) for node in nodes}
        count: dict[str, float] = {}
        for node in reversed(nodes):  # children before parents
            children = [
                other
                for other in nodes
                if _is_ancestor(node, other)
                and other != node
                and not any(
                    _is_ancestor(m, other) and _is_ancestor(node, m) and m not in (node, other)
                    for m in nodes
                )
            ]
            product = 1.0
            for child in children:
                product *= count[child]
            count[node] = options[node] + product
        total = 1.0
        for node in nodes:
            if not any(_is_ancestor(other, node) and other != node for other in nodes):
                total *= count[node]
        return total

    def _sequential_units(self, name: str) -> list[tuple[str, float]]:
        """``name#k`` units for each distinct segmentation of a Sequential's children."""
        calls = self.memory.calls_of(name)
        counts = {len(self.memory.child_calls(call)) for call in calls}
        if len(counts) != 1:
            return []
        (count,) = counts
        units, seen = [], set()
        children = sorted(
            (
                m
                for m in self.profile.modules
                if m.module_name.startswith(name + ".")
                and "." not in m.module_name[len(name) + 1 :]
            ),
            key=lambda m: _tree_key(m.module_name),
        )
        if count < 3 or len(children) != count:
            return []
        for segments in range(2, count + 1):
            spans = tuple(sequential_segments(count, segments))
            if not spans or spans in seen:
                continue
            seen.add(spans)
            cost = sum(
                children[i].forward_ms for first, last in spans for i in range(first, last + 1)
            )
            units.append((f"{name}#{segments}", cost))
        return units

    # -- evaluation ----------------------------------------------------------------------
    def peak(self, units: Iterable[str]) -> int:
        key = frozenset(units)
        cached = self._cache.get(key)
        if cached is None:
            self.evaluations += 1
            cached = self.memory.peak_bytes(sorted(key))
            self._cache[key] = cached
        return cached

    def cost(self, units: Iterable[str]) -> float:
        return sum(self.cost_ms[unit] for unit in units)

    def conflicts(self, first: str, second: str) -> bool:
        a, b = self.node_of[first], self.node_of[second]
        return a == b or _is_ancestor(a, b) or _is_ancestor(b, a)

    # -- exhaustive search -------------------------------------------------------------
    def _exhaustive(
        self, budget_bytes: int | None, max_evaluations: int
    ) -> tuple[tuple[str, ...] | None, bool]:
        """Branch and bound (module docstring). With ``budget_bytes`` None, minimise the peak
        instead of the cost. Returns (best plan, whether the search finished)."""
        limit = self.evaluations + max_evaluations
        best: tuple[str, ...] | None = None
        best_key: tuple[float, float] = (float("inf"), float("inf"))
        finished = True
        seen: set[frozenset[str]] = set()

        def visit(position: int, chosen: list[str], cost: float) -> None:
            nonlocal best, best_key, finished
            if budget_bytes is not None and cost > best_key[0] + 1e-9:
                return
            key = frozenset(chosen)
            if key not in self._cache and self.evaluations >= limit:
                finished = False
                return
            seen.add(key)
            peak = self.peak(chosen)
            if budget_bytes is None:
                if (peak, cost) < best_key:
                    best, best_key = tuple(sorted(chosen)), (peak, cost)
            elif peak <= budget_bytes:
                # Among equally cheap plans the lower peak wins: the chosen plan's peak is
                # then monotone in the budget.
                if (cost, peak) < best_key:
                    best, best_key = tuple(sorted(chosen)), (cost, peak)
                return
            for index in range(position, len(self.names)):
                unit = self.names[index]
                chosen.append(unit)
                # Skip the unit's node's other alternatives and its subtree.
                visit(self.skip_to[index], chosen, cost + self.cost_ms[unit])
                chosen.pop()
                if not finished:
                    return

        visit(0, [], 0.0)
        return best, finished

    # -- answers -----------------------------------------------------------------------
    def lowest_peak(self) -> tuple[tuple[str, ...], int]:
        """The plan with the lowest predicted peak (ties: the cheapest)."""
        best, finished = None, False
        if self.plan_count <= self.exhaustive_evaluations:
            best, finished = self._exhaustive(None, self.exhaustive_evaluations)
        if not finished:
            best = self._program().lowest_peak()
        assert best is not None
        return best, self.peak(best)

    def solve(self, budget_bytes: int, max_evaluations: int | None = None) -> Solution:
        """The cheapest plan whose predicted peak is within ``budget_bytes``."""
        start = self.evaluations
        limit = self.exhaustive_evaluations if max_evaluations is None else max_evaluations
        best, proven = None, False
        if self.plan_count <= limit:
            best, proven = self._exhaustive(budget_bytes, limit)
        if not proven:
            best, proven = self._program().solve(budget_bytes)
        if best is None:
            names, lowest = self.lowest_peak()
            if lowest <= budget_bytes:  # cannot happen with a finished search; be safe
                best, proven = names, False
        if best is None:
            raise InfeasibleBudgetError(
                f"no checkpointing plan fits {format_bytes(budget_bytes)}: the smallest budget "
                f"that fits is {format_bytes(lowest)} ({lowest} bytes, checkpointing "
                f"{len(names)} module{'s' if len(names) != 1 else ''}); static memory alone "
                f"(parameters, gradients, optimizer state) is "
                f"{format_bytes(self.profile.static_bytes)}",
                budget_bytes=budget_bytes,
                min_budget_bytes=lowest,
            )
        return Solution(
            module_names=best,
            predicted_peak_bytes=self.peak(best),
            recompute_ms=self.cost(best),
            proven_optimal=proven,
            evaluations=self.evaluations - start,
        )

    def _program(self) -> _IntegerProgram:
        if self._integer_program is None:
            self._integer_program = _IntegerProgram(self)
        return self._integer_program


class _IntegerProgram:
    """The lazy-constraint integer program of the module docstring."""

    def __init__(self, solver: Solver) -> None:
        self.solver = solver
        memory = solver.memory
        self.units = list(solver.names)
        self.index = {unit: i for i, unit in enumerate(self.units)}
        self.base = memory.memory_curve(())  # live bytes after each event (index 0: start)
        # Per unit: intervals [start, end) of curve indices and the bytes they add (+) or
        # remove (-) when the unit is checkpointed alone; and its recompute spikes.
        self.intervals: list[list[tuple[int, int, int]]] = []
        self.spikes: list[list[tuple[int, int]]] = []
        storages = memory.timeline.storages
        held: dict[int, set[int]] = {}
        touched: list[set[int]] = []
        for unit in self.units:
            changes: list[tuple[int, int, int]] = []
            spikes = []
            storages_touched: set[int] = set()
            for effect in memory.unit_effects(unit):
                if effect.recompute_event < 0:
                    continue
                for storage, size, drop in effect.retained + effect.released_outputs:
                    changes.append((drop + 1, effect.recompute_event + 1, -size))
                    storages_touched.add(storage)
                for storage in effect.input_storages:
                    record = storages[storage]
                    if effect.release_event > record.free_event:
                        changes.append(
                            (record.free_event + 1, effect.release_event + 1, record.size_bytes)
                        )
                        held.setdefault(storage, set()).add(self.index[unit])
                        storages_touched.add(storage)
                spikes.append((effect.recompute_event, effect.recompute_peak_bytes))
            self.intervals.append(changes)
            self.spikes.append(spikes)
            touched.append(storages_touched)
        # Units interact when one holds (as a checkpoint input) a storage another one also
        # holds or drops: then the additive rows are not exact.
        self.interacting = any(
            len(holders) > 1
            or any(
                storage in touched[other]
                for other in range(len(self.units))
                if other not in holders
            )
            for storage, holders in held.items()
        )
        # One unit per path: a row per unit-tree leaf node.
        nodes = sorted({solver.node_of[u] for u in self.units}, key=_tree_key)
        leaves = [n for n in nodes if not any(_is_ancestor(n, m) and m != n for m in nodes)]
        self.path_rows = []
        for leaf in leaves:
            row = np.zeros(len(self.units))
            for i, unit in enumerate(self.units):
                node = solver.node_of[unit]
                if node == leaf or _is_ancestor(node, leaf):
                    row[i] = 1.0
            self.path_rows.append(row)
        # Costs in whole 10-microsecond units: an integral objective lets HiGHS round its
        # bounds, which closes the tiny gaps between near-identical blocks quickly. The
        # answer is exact at that resolution, far below the timing noise of a profile.
        self.cost = np.round(np.array([solver.cost_ms[u] for u in self.units]) * 100.0)
        self.scale = float(self.base.max()) or 1.0
        self.rounds = 0
        self.time_limit_s = 20.0
        self.timed_out = False

    def _delta_at(self, point: int) -> np.ndarray:
        """How each unit alone changes the live bytes at curve index ``point``."""
        delta = np.zeros(len(self.units))
        for i, changes in enumerate(self.intervals):
            delta[i] = sum(size for start, end, size in changes if start <= point < end)
        return delta

    def _memory_row(self, point: int, budget: float) -> tuple[np.ndarray, float]:
        return self._delta_at(point), budget - float(self.base[point])

    def _spike_row(
        self, unit: int, event: int, spike: int, budget: float
    ) -> tuple[np.ndarray, float]:
        # base(r) + sum_v delta_v(r) x_v + spike <= budget + M (1 - x_u)
        # <=>  sum_v delta_v(r) x_v + M x_u <= budget - base(r) - spike + M
        delta = self._delta_at(event)
        big = max(
            0.0, float(self.base[event]) + float(np.clip(delta, 0, None).sum()) + spike - budget
        )
        row = delta.copy()
        row[unit] += big
        return row, budget - float(self.base[event]) - spike + big

    def _violation(self, chosen: Sequence[str], budget: float) -> tuple[str, int, int] | None:
        """Where the exact replay of ``chosen`` exceeds ``budget`` the most, or None."""
        memory = self.solver.memory
        curve = memory.memory_curve(chosen)
        worst_point = int(curve.argmax())
        worst: tuple[float, tuple[str, int, int]] = (
            float(curve[worst_point]),
            ("point", worst_point, -1),
        )
        for unit in chosen:
            for event, spike in self.spikes[self.index[unit]]:
                value = float(curve[event]) + spike
                if value > worst[0]:
                    worst = (value, ("spike", event, self.index[unit]))
        return worst[1] if worst[0] > budget else None

    def _milp(
        self,
        objective: np.ndarray,
        rows: list[np.ndarray],
        upper: list[float],
        integrality: np.ndarray,
    ) -> np.ndarray | None:
        from scipy.optimize import LinearConstraint, milp

        constraints = [LinearConstraint(np.array(rows), -np.inf, np.array(upper))] if rows else []
        bounds_low = np.zeros(len(objective))
        bounds_high = np.ones(len(objective))
        if len(objective) > len(self.units):  # the peak variable of lowest_peak
            bounds_high[-1] = np.inf
        from scipy.optimize import Bounds

        result = milp(
            objective,
            constraints=constraints,
            integrality=integrality,
            bounds=Bounds(bounds_low, bounds_high),
            options={"mip_rel_gap": 0.0, "time_limit": self.time_limit_s},
        )
        self.rounds += 1
        if result.status == 1:  # time limit: the answer (if any) is not proven optimal
            self.timed_out = True
        if result.x is None:
            return None
        return np.asarray(result.x)

    def solve(self, budget_bytes: int) -> tuple[tuple[str, ...] | None, bool]:
        budget = float(budget_bytes)
        count = len(self.units)
        rows = list(self.path_rows)
        upper = [1.0] * len(rows)
        added: set[tuple[str, int, int]] = set()
        first = self._violation((), budget)
        if first is None:
            return (), True
        self._add(first, budget, rows, upper, added, count)
        interacted = False
        self.timed_out = False
        for _ in range(500):
            x = self._milp(self.cost, rows, upper, np.ones(count))
            if x is None:
                return None, not interacted
            chosen = tuple(sorted(u for u, value in zip(self.units, x, strict=True) if value > 0.5))
            violation = self._violation(chosen, budget)
            if violation is None:
                return chosen, not (interacted or self.interacting or self.timed_out)
            if violation in added:
                interacted = True  # additive rows hold but the replay does not: cut this plan
                row = np.zeros(count)
                for unit in chosen:
                    row[self.index[unit]] = 1.0
                rows.append(row)
                upper.append(len(chosen) - 1.0)
            else:
                self._add(violation, budget, rows, upper, added, count)
        logger.warning("integer program did not converge; no plan returned")
        return None, False

    def _add(
        self,
        violation: tuple[str, int, int],
        budget: float,
        rows: list[np.ndarray],
        upper: list[float],
        added: set[tuple[str, int, int]],
        count: int,
    ) -> None:
        kind, point, unit = violation
        added.add(violation)
        if kind == "point":
            row, bound = self._memory_row(point, budget)
        else:
            event = point
            spike = dict(self.spikes[unit])[event]
            row, bound = self._spike_row(unit, event, spike, budget)
        # Memory rows in units of the unplanned peak, so HiGHS's tolerances are relative.
        rows.append(row[:count] / self.scale)
        upper.append(bound / self.scale)

    def lowest_peak(self) -> tuple[str, ...]:
        """Minimise the peak: variables x and z; z >= each lazily added memory/spike row.

        Each round solves for the lowest ``z``, replays the answer exactly and adds the row
        where the replay exceeds ``z``. It stops when the replay equals ``z`` (with no
        interacting units, the lowest peak) or when ``z`` reaches the best replay found.
        A plan whose replay exceeds a row already added (interacting units) is cut off by a
        no-good row; its exact peak is already counted in the best found.
        """
        count = len(self.units)
        scale = self.scale
        # Objective: the peak (in units of the unplanned peak), plus a tiny cost term that
        # prefers the cheaper of two plans with the same peak.
        objective = np.concatenate([self.cost / (self.cost.sum() + 1.0) * 1e-9, [1.0]])
        integrality = np.concatenate([np.ones(count), [0]])
        rows = [np.concatenate([row, [0.0]]) for row in self.path_rows]
        upper = [1.0] * len(rows)
        added: set[tuple[str, int, int]] = set()
        best: tuple[int, tuple[str, ...]] = (self.solver.peak(()), ())
        violation: tuple[str, int, int] = ("point", int(self.base.argmax()), -1)
        chosen: tuple[str, ...] = ()
        for _ in range(200):
            if violation in added:
                row = np.zeros(count + 1)
                for name in chosen:
                    row[self.index[name]] = 1.0
                rows.append(row)
                upper.append(len(chosen) - 1.0)
            else:
                added.add(violation)
                kind, point, unit = violation
                if kind == "point":
                    delta, bound = self._memory_row(point, 0.0)  # delta.x - z <= -base(t)
                else:
                    delta, bound = self._spike_row(unit, point, dict(self.spikes[unit])[point], 0.0)
                rows.append(np.concatenate([delta / scale, [-1.0]]))
                upper.append(bound / scale)
            x = self._milp(objective, rows, upper, integrality)
            if x is None:
                break
            chosen = tuple(u for u, value in zip(self.units, x[:count], strict=True) if value > 0.5)
            lower = float(x[-1]) * scale
            peak = self.solver.peak(chosen)
            if peak < best[0]:
                best = (peak, chosen)
            if best[0] <= lower + 0.5:
                break
            found = self._violation(chosen, lower + 0.5)
            violation = found if found is not None else ("point", -1, -1)
            if found is None:  # replay within z yet above the best: cannot happen; be safe
                break
        return tuple(sorted(best[1]))


def solve(profile: Profile, budget_bytes: int, max_evaluations: int | None = None) -> Solution:
    """The cheapest plan (least recompute time) whose predicted peak is within the budget.

    Raises :class:`InfeasibleBudgetError` (with the smallest budget that fits) when no plan
    fits.
    """
    return Solver(profile).solve(budget_bytes, max_evaluations)


def lowest_peak(profile: Profile) -> int:
    """The lowest predicted peak of any plan (the smallest usable budget)."""
    return Solver(profile).lowest_peak()[1]
