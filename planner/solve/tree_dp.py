"""Exact dynamic program over the unit tree, for memory rows of prefix form (see
:class:`TreeDP`). O(units x cost range) per round; rows found at one budget are kept for the
next, so a sweep of budgets reuses them. Where a needed row is not of that form it raises
:class:`Incompatible`, and the integer program solves that budget instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.core.records import Phase, Unit
from planner.solve.rows import MemoryRows, PlanPeaks
from planner.solve.tree import UnitTree, tree_key

__all__ = ["Incompatible", "Row", "TreeDP"]


class Incompatible(Exception):
    """A memory row the tree dynamic program cannot represent exactly (see :class:`TreeDP`);
    the integer program takes over."""


@dataclass(frozen=True)
class Row:
    """One lazily added memory row: ``offset + coefficients . x + shared . flags <= budget``
    (a spike row only when ``unit`` is chosen), and where it sits in the visiting order."""

    coefficients: np.ndarray
    shared: np.ndarray  # bytes per shared-input class whose flag the row counts
    offset: float
    anchor: str  # "end", "before" (node), "at" (a leaf node) or "spike" (the unit's node)
    node: str | None
    unit: int


class TreeDP:
    """Exact dynamic program over the unit tree, for memory rows of prefix form.

    **State.** Nodes are visited in the order they first ran (parents before children).
    After visiting a prefix of that order, ``g[f, c]`` is the least *delta* (the change in
    live bytes the chosen units make, ``sum_u w_u x_u``) of any antichain of the visited
    units whose recompute cost is ``c`` cost quanta and whose shared-input flags are ``f``
    (``inf``: none). ``w_u`` is unit ``u``'s own change at the end of the forward pass: what
    it drops minus the inputs it alone holds. A node combines two branches: its children
    visited one after another from the incoming ``g`` (no unit of the node chosen), or one
    of its own units on top of the incoming ``g`` (shifted by the unit's cost, plus
    ``w_u``, its flags set; its subtree then stays unchosen).

    **Shared inputs.** A storage that several blocks take as input (an attention mask, a
    rotary table) lives, under a plan, until the last chosen one of them lets it go: it
    counts once, while *any* chosen holder still holds it. Holders of the same storages
    form a class; bit ``k`` of ``f`` says whether a holder of class ``k`` was chosen among
    the visited units (at most three classes, eight flag states).

    **Rows.** The memory at an event is ``base(t) + sum_u a_u(t) x_u`` (plus the shared
    inputs). In a chain of blocks a unit that ran forward before ``t`` and has not been
    recomputed by ``t`` contributes its whole ``w_u``, and a unit that has not run yet, or
    was already recomputed and freed, contributes 0: ``a(t)`` is ``w`` on a prefix of the
    visiting order and 0 after it, except on the units whose calls are open at ``t`` (the
    module running then and its ancestors); likewise a shared input is held at ``t`` by
    exactly the chosen holders in that prefix (or open). Such a row is *anchored*:
    ``before`` node N (N and its subtree after the prefix; N's ancestors open), ``at`` leaf
    node N (N's units open too), or at the ``end``. It becomes a filter at its anchor:
    states whose delta exceeds ``budget - base(t) - shared(t) . f`` are dropped there, and an
    open unit ``v``'s branch keeps only incoming states with delta
    ``<= budget - base(t) - a_v(t) - shared(t) . (f | flags(v))``. A recompute spike of
    unit ``u`` filters ``u``'s branch alone. Because every row anchored later has the same
    coefficients ``w`` on the earlier units, the least delta dominates every other state of
    the same cost and flags, so keeping one number per (flags, cost) is exact: the answer is
    the cheapest antichain that satisfies every row, at the cost resolution ``quantum_ms``.

    Rows are added lazily (:class:`~planner.solve.rows.MemoryRows`): solve, replay the
    answer exactly, add the row where the replay exceeds the budget. A row not of that form raises
    :class:`Incompatible` and the integer program solves that budget instead. Rows do not
    depend on the budget (only their bound does), so they are kept for later budgets: a
    sweep reuses them.
    """

    resolution_steps = 30_000
    choice_table_bytes = 200 * 2**20
    max_shared_classes = 3

    def __init__(self, tree: UnitTree, memory_rows: MemoryRows, peaks: PlanPeaks) -> None:
        self.tree = tree
        self.memory_rows = memory_rows
        self.peaks = peaks
        memory = memory_rows.memory
        rows = memory_rows
        calls = memory.timeline.calls

        def first_run(node: str) -> tuple[int, tuple[object, ...]]:
            indices = memory.calls_of(node)
            return (calls[indices[0]].forward_start_event if indices else -1, tree_key(node))

        self.children = {
            parent: sorted(nodes, key=first_run) for parent, nodes in tree.node_children.items()
        }
        # Positions: units in visiting order. first: a node's first unit; end: past its subtree.
        self.order: list[int] = []
        self.first: dict[str, int] = {}
        self.end: dict[str, int] = {}
        self.ancestor_units: dict[str, list[int]] = {}
        stack: list[tuple[str, bool]] = [(n, False) for n in reversed(self.children[None])]
        while stack:
            node, done = stack.pop()
            if done:
                self.end[node] = len(self.order)
                continue
            parent = tree.node_parent[node]
            self.ancestor_units[node] = (
                [] if parent is None else self.ancestor_units[parent] + tree.node_units[parent]
            )
            self.first[node] = len(self.order)
            self.order.extend(tree.node_units[node])
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(self.children[node]))
        count = len(tree.names)
        self.position = np.empty(count, dtype=np.int64)
        self.position[self.order] = np.arange(count)
        # Shared-input classes: the holder sets of the rows' OR columns.
        classes: list[frozenset[int]] = []
        for _storage, _size, gap, held in rows.coupled:
            members = frozenset(v for v, _ in held)
            if gap is None and members not in classes:
                classes.append(members)
        self.classes = classes if len(classes) <= self.max_shared_classes else []
        self.flags = np.zeros(count, dtype=np.int64)
        for k, members in enumerate(self.classes):
            for unit in members:
                self.flags[unit] |= 1 << k
        self.states = 1 << len(self.classes)
        # bit[f, k]: whether flag state f has class k set.
        self.bit = np.array(
            [[(f >> k) & 1 for k in range(len(self.classes))] for f in range(self.states)],
            dtype=float,
        ).reshape(self.states, len(self.classes))
        self.helper_keys = rows.helpers
        # w: each unit's change at the end of the forward pass.
        forward_end = memory.timeline.phase_end_events.get(Phase.FORWARD)
        point = forward_end + 1 if forward_end is not None else int(rows.base.argmax())
        self.w = np.zeros(count)
        for column, value in rows.delta_at(point).items():
            if column < count:
                self.w[column] = value
        # Costs in whole quanta: 10 microseconds, finer where the costliest plan would
        # need fewer than 1,000 of them (roofline costs of a GPU are microseconds),
        # coarser where it would need more than resolution_steps, or the backtracking
        # tables (a byte or two per node, flag state and step) more than
        # choice_table_bytes.
        cost_ms = np.array([tree.cost_ms[u] for u in tree.names])
        bytes_per_step = len(tree.nodes) * self.states * (1 if self.states == 1 else 2)
        steps = max(1_000, min(self.resolution_steps, self.choice_table_bytes // bytes_per_step))
        costliest = max(1e-9, self._costliest(cost_ms))
        self.quantum_ms = max(costliest / steps, min(0.01, costliest / 1_000))
        self.cost = np.round(cost_ms / self.quantum_ms).astype(np.int64)
        self.length = int(self._costliest(self.cost.astype(float))) + 1
        self.rows: dict[tuple[str, int, int], Row | None] = {}
        self.rounds = 0

    def _costliest(self, cost: np.ndarray) -> float:
        """The largest total cost of an antichain (the DP's cost range)."""
        best: dict[str, float] = {}
        for node in reversed(self.tree.nodes):
            below = sum(best[child] for child in self.children[node])
            own = max((float(cost[u]) for u in self.tree.node_units[node]), default=0.0)
            best[node] = max(below, own)
        return sum(best[node] for node in self.children[None])

    # -- rows ------------------------------------------------------------------------------
    def _row(self, key: tuple[str, int, int]) -> Row:
        if key in self.rows:
            row = self.rows[key]
        else:
            row = self.rows[key] = self._make_row(key)
        if row is None:
            raise Incompatible(key)
        return row

    def _make_row(self, key: tuple[str, int, int]) -> Row | None:
        kind, point, unit = key
        rows = self.memory_rows
        delta = rows.delta_at(point)
        count = len(self.tree.names)
        columns = {column: key for key, column in rows.helpers.items()}
        a = np.zeros(count)
        shared = np.zeros(len(self.classes))
        holding: dict[int, frozenset[int]] = {}  # class -> the holders the row counts
        for column, value in delta.items():
            if column < count:
                a[column] = value
                continue
            helper = columns[column]
            members = frozenset(int(m) for m in helper[1:])  # type: ignore[call-overload]
            k = next((k for k, c in enumerate(self.classes) if members <= c), None)
            if helper[0] != "or" or k is None or holding.get(k, members) != members:
                return None  # a storage one unit drops and another holds: not of this form
            holding[k] = members
            shared[k] += value
        offset = float(rows.base[point])
        tree = self.tree
        if kind == "spike":
            offset += rows.spike_bytes(unit, point)
            node = tree.node_of[tree.names[unit]]
            ignored = set(self.ancestor_units[node])
            ignored.update(self.order[self.first[node] : self.end[node]])
            ignored.discard(unit)
            if self._fits(a, holding, self.first[node], self.end[node], ignored, {unit}):
                return Row(a, shared, offset, "spike", node, unit)
            return None
        mismatched = np.flatnonzero(a[self.order] != self.w[self.order])
        if not len(mismatched):
            if self._fits(a, holding, count, count, set(), set()):
                return Row(a, shared, offset, "end", None, -1)
            return None
        node = tree.node_of[tree.names[self.order[int(mismatched[0])]]]
        while True:
            ancestors = set(self.ancestor_units[node])
            if self._fits(a, holding, self.first[node], self.first[node], set(), ancestors):
                return Row(a, shared, offset, "before", node, -1)
            own = tree.node_units[node]
            if not self.children[node]:
                open_units = ancestors | set(own)
                if self._fits(a, holding, self.first[node], self.end[node], set(), open_units):
                    return Row(a, shared, offset, "at", node, -1)
                return None
            # The node's call is open at the row's event: look inside it.
            inside = [
                p for p in mismatched.tolist() if self.first[node] + len(own) <= p < self.end[node]
            ]
            if not inside:
                return None
            node = tree.node_of[tree.names[self.order[inside[0]]]]

    def _fits(
        self,
        a: np.ndarray,
        holding: dict[int, frozenset[int]],
        before: int,
        after: int,
        ignored: set[int],
        open_units: set[int],
    ) -> bool:
        """Whether a row is of prefix form for this anchor: ``a`` is ``w`` on the positions
        before ``before`` and 0 from ``after`` on (outside the open and ignored units), and
        each shared input it counts is held by exactly its class's holders in that prefix
        and among the open units."""
        skip = ignored | open_units
        keep = np.ones(len(self.order), dtype=bool)
        if skip:
            keep[self.position[list(skip)]] = False
        by_position, w = a[self.order], self.w[self.order]
        head, tail = keep[:before], keep[after:]
        if not np.array_equal(by_position[:before][head], w[:before][head]):
            return False
        if np.any(by_position[after:][tail]):
            return False
        for k, members in holding.items():
            expected = {
                v
                for v in self.classes[k]
                if v not in ignored and (v in open_units or self.position[v] < before)
            }
            if members - ignored != expected:
                return False
        return True

    def _filters(
        self, budget: float
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[int, np.ndarray], np.ndarray]:
        """Per anchor, the largest delta each flag state may have there (per incoming flag
        state for a unit's branch)."""
        before: dict[str, np.ndarray] = {}
        unchosen: dict[str, np.ndarray] = {}
        branch: dict[int, np.ndarray] = {}
        final = np.full(self.states, math.inf)
        states = np.arange(self.states)

        def tighten(table: dict[Any, np.ndarray], key: Any, bound: np.ndarray) -> None:
            table[key] = np.minimum(table[key], bound) if key in table else bound

        def open_branch(row: Row, unit: int, bound: float) -> None:
            after = states | self.flags[unit]
            tighten(branch, unit, bound - row.coefficients[unit] - self.bit[after] @ row.shared)

        for row in self.rows.values():
            if row is None:
                continue
            bound = budget - row.offset
            if row.anchor == "spike":
                open_branch(row, row.unit, bound)
                continue
            here = bound - self.bit @ row.shared
            if row.anchor == "end":
                final = np.minimum(final, here)
                continue
            assert row.node is not None
            if row.anchor == "before":
                tighten(before, row.node, here)
            else:  # "at" a leaf: its own units are open
                tighten(unchosen, row.node, here)
                for unit in self.tree.node_units[row.node]:
                    open_branch(row, unit, bound)
            for unit in self.ancestor_units[row.node]:
                open_branch(row, unit, bound)
        return before, unchosen, branch, final

    # -- the program -----------------------------------------------------------------------
    def _run(self, budget: float, length: int) -> list[int] | None:
        """The cheapest antichain satisfying every kept row at ``budget`` (unit indices), or
        None when none does. ``length``: the cost range searched, in quanta (plus one)."""
        before, unchosen, branch, final = self._filters(budget)
        tree, cost, w, flags = self.tree, self.cost, self.w, self.flags
        states = np.arange(self.states)
        choices: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        inf = math.inf

        def cut(g: np.ndarray, bound: np.ndarray | None) -> np.ndarray:
            return g if bound is None else np.where(g > bound[:, None], inf, g)

        def visit(node: str, g: np.ndarray) -> np.ndarray:
            g = cut(g, before.get(node))
            g_sub = g
            for child in self.children[node]:
                g_sub = visit(child, g_sub)
            g_sub = cut(g_sub, unchosen.get(node))
            units = tree.node_units[node]
            if not units:
                return g_sub
            best = g_sub.copy()
            pick = np.full(best.shape, -1, dtype=np.int8 if len(units) < 127 else np.int16)
            # The flag state each pick came from (with one state, always 0).
            source = np.zeros(best.shape, dtype=np.int8) if self.states > 1 else None
            for k, unit in enumerate(units):
                c = int(cost[unit])
                if c >= length:
                    continue
                incoming = cut(g[:, : length - c], branch.get(unit)) + w[unit]
                for state in states.tolist():
                    target_state = state | int(flags[unit])
                    target = best[target_state, c:]
                    better = incoming[state] < target
                    target[better] = incoming[state][better]
                    pick[target_state, c:][better] = k
                    if source is not None:
                        source[target_state, c:][better] = state
            choices[node] = (pick, source)
            return best

        g = np.full((self.states, length), inf)
        g[0, 0] = 0.0
        for root in self.children[None]:
            g = visit(root, g)
        g = cut(g, final)
        finite = np.isfinite(g)
        if not finite.any():
            return None
        cheapest = int(np.flatnonzero(finite.any(axis=0))[0])
        state = int(np.flatnonzero(finite[:, cheapest])[0])
        chosen: list[int] = []

        def back(node: str, state: int, c: int) -> tuple[int, int]:
            choice = choices.get(node)
            if choice is not None and choice[0][state, c] >= 0:
                unit = tree.node_units[node][int(choice[0][state, c])]
                chosen.append(unit)
                came_from = 0 if choice[1] is None else int(choice[1][state, c])
                return came_from, c - int(cost[unit])
            for child in reversed(self.children[node]):
                state, c = back(child, state, c)
            return state, c

        c = cheapest
        for root in reversed(self.children[None]):
            state, c = back(root, state, c)
        assert c == 0 and state == 0, "tree DP backtracking lost its way"
        return chosen

    def _feasible(self, budget: float) -> list[int] | None:
        """Any antichain satisfying every kept row at ``budget`` (cost ignored): the program
        of :meth:`_run` with one entry per flag state. Written again in plain Python on
        purpose: the lowest-peak bisection calls it about 25 times per row, and numpy's
        per-call overhead on one-entry arrays made that search twice as slow (gpt334:
        0.65 s against 1.4 s, a 50-budget sweep 2.7 s against 3.6 s). The brute-force tests
        check each of the two."""
        filters = self._filters(budget)
        before = {key: bound.tolist() for key, bound in filters[0].items()}
        unchosen = {key: bound.tolist() for key, bound in filters[1].items()}
        branch = {key: bound.tolist() for key, bound in filters[2].items()}
        final = filters[3].tolist()
        tree, states, inf = self.tree, range(self.states), math.inf
        w, flags = self.w.tolist(), self.flags.tolist()
        choices: dict[str, tuple[list[int], list[int]]] = {}

        def cut(g: list[float], bound: list[float] | None) -> list[float]:
            return (
                g
                if bound is None
                else [x if x <= b else inf for x, b in zip(g, bound, strict=True)]
            )

        def visit(node: str, g: list[float]) -> list[float]:
            g = cut(g, before.get(node))
            g_sub = g
            for child in self.children[node]:
                g_sub = visit(child, g_sub)
            best = cut(g_sub, unchosen.get(node))
            units = tree.node_units[node]
            if not units:
                return best
            best = list(best)
            pick, source = [-1] * self.states, [0] * self.states
            for k, unit in enumerate(units):
                bound = branch.get(unit)
                for state in states:
                    value = g[state]
                    if value == inf or (bound is not None and value > bound[state]):
                        continue
                    target = state | flags[unit]
                    if value + w[unit] < best[target]:
                        best[target] = value + w[unit]
                        pick[target], source[target] = k, state
            choices[node] = (pick, source)
            return best

        g = [0.0] + [inf] * (self.states - 1)
        for root in self.children[None]:
            g = visit(root, g)
        g = cut(g, final)
        state = next((f for f in states if g[f] < inf), None)
        if state is None:
            return None
        chosen: list[int] = []

        def back(node: str, state: int) -> int:
            choice = choices.get(node)
            if choice is not None and choice[0][state] >= 0:
                chosen.append(tree.node_units[node][choice[0][state]])
                return choice[1][state]
            for child in reversed(self.children[node]):
                state = back(child, state)
            return state

        for root in reversed(self.children[None]):
            state = back(root, state)
        assert state == 0, "tree DP backtracking lost its way"
        return chosen

    def quanta(self, plan: Iterable[Unit]) -> int:
        """A plan's recompute cost in the program's cost quanta (what it minimises)."""
        return int(sum(self.cost[self.tree.index[unit]] for unit in plan))

    def _names(self, units: list[int]) -> tuple[Unit, ...]:
        return tuple(sorted(self.tree.names[u] for u in units))

    def solve(
        self, budget_bytes: int, fitting: Sequence[Unit] | None = None
    ) -> tuple[Unit, ...] | None:
        """The cheapest plan within the budget, or None if no plan fits. ``fitting``: a plan
        known to fit (its cost bounds the search). Raises :class:`Incompatible` when a
        needed row is not of prefix form."""
        budget = float(budget_bytes)
        length = self.length
        if fitting is not None:
            length = min(length, self.quanta(fitting) + 1)
        violation = self.memory_rows.violation((), budget)
        if violation is None:
            return ()
        self._row(violation)
        for _ in range(500):
            self.rounds += 1
            chosen = self._run(budget, length)
            if chosen is None:
                if length < self.length:  # the hint was wrong: search the whole range
                    length = self.length
                    chosen = self._run(budget, length)
                if chosen is None:
                    return None
            names = self._names(chosen)
            violation = self.memory_rows.violation(names, budget)
            if violation is None:
                return names
            if violation in self.rows:
                raise Incompatible(violation)  # cannot happen with exact rows; be safe
            self._row(violation)
        raise Incompatible(("rounds", 0, 0))

    def lowest_peak(self) -> tuple[Unit, ...]:
        """The plan with the lowest peak: the least budget at which the kept rows admit a
        plan (a bisection over bytes), replayed exactly; a violated row is added and the
        bisection resumes above the last answer (a lower bound, since rows only tighten)."""
        best_plan: tuple[Unit, ...] = ()
        high = self.peaks(())
        low = 0
        for _ in range(500):
            # Least budget in [low, high] the kept rows admit; high always admits best_plan.
            lo, hi = low, high
            while lo < hi:
                middle = (lo + hi) // 2
                if self._feasible(float(middle)) is None:
                    lo = middle + 1
                else:
                    hi = middle
            low = lo
            chosen = self._feasible(float(low))
            assert chosen is not None
            names = self._names(chosen)
            peak = self.peaks(names)
            if peak < high:
                high, best_plan = peak, names
            if peak <= low:
                return best_plan
            violation = self.memory_rows.violation(names, float(low))
            assert violation is not None
            if violation in self.rows:
                raise Incompatible(violation)
            self._row(violation)
        raise Incompatible(("rounds", 0, 0))
