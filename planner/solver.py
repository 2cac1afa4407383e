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

* **Small trees: exhaustive branch and bound.** When there are at most
  ``exhaustive_evaluations`` plans (counted first by a product over the tree): depth-first
  over the units in tree pre-order, each either taken (its subtree is then skipped) or not;
  a branch whose cost reaches the best known is cut; a plan that fits ends its branch. The
  answer is the cheapest under the memory model.
* **Large trees: a dynamic program over the unit tree with lazy rows** (:class:`_TreeDP`).
  Its state, after visiting the nodes in the order they ran, is per recompute cost (in
  quanta of 10 microseconds) the least change in live bytes any antichain of the visited
  units makes. Memory rows (the live bytes at one event, or at one unit's recompute spike)
  are added lazily, as below, and act as filters at the place in the visiting order where
  the row's event falls. That is exact when every row has the prefix form a chain of
  blocks gives (the units that ran before the event and are not yet recomputed count in
  full, the ones after not at all, the running module's ancestors freely; see the class).
  O(units x cost range) per round; a sweep reuses the rows found at earlier budgets.
* **Otherwise an integer program with lazy constraints** (scipy's HiGHS ``milp``), for the
  budgets whose rows the dynamic program cannot represent (one input storage shared by
  several blocks that could each be checkpointed, say).
  Binary ``x_u`` per unit; minimise ``sum_u cost_u x_u`` subject to

  - *one unit per path*: for every leaf of the unit tree, ``sum of x over its path <= 1``;
  - *memory at event t*: ``base(t) + sum_u delta_u(t) x_u <= budget``, where ``base`` is the
    measured curve and ``delta_u`` how unit ``u`` alone changes it (activations dropped
    between its forward and its recomputation, inputs held until its backward ends);
  - *recompute spike of unit u at event r* (only if ``x_u = 1``):
    ``base(r) + sum_v delta_v(r) x_v + spike_u <= budget + M (1 - x_u)``.

  Where units interact through one storage (several checkpoints holding the same input,
  or a checkpoint's input that another unit would drop), helper columns make the rows exact
  (see :class:`_IntegerProgram`). Memory rows are added lazily: solve, replay the answer
  exactly, add the row of the event (or spike) where the replay exceeds the budget, repeat;
  the loop ends with a plan whose exact replay fits, the cheapest under the memory model
  (``proven_optimal``) at the program's cost resolution of 10 microseconds, unless HiGHS
  hit its time limit. Tests check the rows against the replay and the answers against
  brute force.

The lowest feasible peak (the smallest budget any plan fits, for the "budget too small"
error) is searched the same three ways: exhaustively; by bisection over budgets with the
dynamic program (cost ignored); or by the integer program minimising the peak.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.errors import InfeasibleBudgetError
from planner.memory_model import MemoryModel, sequential_segments
from planner.records import Profile
from planner.units import format_bytes, format_bytes_apart

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
        exhaustive_evaluations: int = 2_000,
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
            # checkpoint_sequential cannot restore buffers after recomputing (a wrapped
            # module can), so a Sequential whose forward changes buffers gets no segments.
            if sequential and record.module_type == "Sequential" and not record.mutated_buffers:
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
        # The tree of unit-bearing nodes (a node's parent: its nearest unit-bearing ancestor;
        # None stands for the root). Nodes in tree pre-order, children in the same order.
        self.nodes: list[str] = sorted(set(self.node_of.values()), key=_tree_key)
        self.node_units: dict[str, list[int]] = {node: [] for node in self.nodes}
        for index, unit in enumerate(self.names):
            self.node_units[self.node_of[unit]].append(index)
        self.node_parent: dict[str, str | None] = {}
        self.node_children: dict[str | None, list[str]] = {None: []}
        stack: list[str] = []
        for node in self.nodes:
            while stack and not _is_ancestor(stack[-1], node):
                stack.pop()
            parent = stack[-1] if stack else None
            self.node_parent[node] = parent
            self.node_children[parent].append(node)
            self.node_children[node] = []
            stack.append(node)
        self.evaluations = 0
        self._cache: dict[frozenset[str], int] = {}
        self._integer_program: _IntegerProgram | None = None
        self._tree_dp: _TreeDP | None = None
        self._known: list[tuple[int, float, tuple[str, ...]]] = []
        self._integer_program_used = False
        self.plan_count = self._count_plans()

    def _count_plans(self) -> float:
        """How many plans there are (antichains of units): per node, its own units plus
        the product over its child nodes; a product over the roots."""
        count: dict[str, float] = {}
        for node in reversed(self.nodes):  # children before parents
            product = 1.0
            for child in self.node_children[node]:
                product *= count[child]
            count[node] = len(self.node_units[node]) + product
        total = 1.0
        for node in self.node_children[None]:
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

        def visit(position: int, chosen: list[str], cost: float) -> None:
            nonlocal best, best_key, finished
            if budget_bytes is not None and cost > best_key[0] + 1e-9:
                return
            key = frozenset(chosen)
            if key not in self._cache and self.evaluations >= limit:
                finished = False
                return
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
    def _floor_explanation(self, names: tuple[str, ...]) -> str:
        """What the lowest peak is made of, and what would lower it where plans cannot."""
        static = (
            "static memory alone (parameters, gradients, optimizer state) is "
            f"{format_bytes(self.profile.static_bytes)}"
        )
        curve = self.memory.memory_curve(names)
        phases = self.memory.timeline.phase_end_events
        backward_end = phases.get("backward")
        if backward_end is None or len(curve) <= backward_end + 1:
            return static
        optimizer_peak = int(curve[backward_end + 1 :].max(initial=0))
        if optimizer_peak < self.peak(names):
            return static
        temporaries = optimizer_peak - self.profile.static_bytes - self.profile.workspace_bytes
        return (
            f"{static}, and the optimizer step itself peaks at {format_bytes(optimizer_peak)} "
            f"({format_bytes(max(0, temporaries))} of temporaries, after every activation is "
            "freed), which no checkpointing can lower: use an optimizer that updates in place "
            "(torch.optim's fused=True, or foreach=False) or a larger budget"
        )

    def lowest_peak(self) -> tuple[tuple[str, ...], int]:
        """The plan with the lowest predicted peak (ties: the cheapest)."""
        best, finished = None, False
        if self.plan_count <= self.exhaustive_evaluations:
            best, finished = self._exhaustive(None, self.exhaustive_evaluations)
        if not finished:
            try:
                best = self._dp().lowest_peak()
                # Among the plans with that peak, the cheapest.
                cheapest = self._dp().solve(self.peak(best), fitting=best)
                best = best if cheapest is None else cheapest
            except _Incompatible:
                best = self._program().lowest_peak()
        assert best is not None
        self._remember(best)
        return best, self.peak(best)

    def solve(self, budget_bytes: int, max_evaluations: int | None = None) -> Solution:
        """The cheapest plan whose predicted peak is within ``budget_bytes``."""
        start = self.evaluations
        limit = self.exhaustive_evaluations if max_evaluations is None else max_evaluations
        best, proven = None, False
        if self.plan_count <= limit:
            best, proven = self._exhaustive(budget_bytes, limit)
        if not proven:
            try:
                best = self._dp().solve(budget_bytes, fitting=self._fitting(budget_bytes))
                proven = True
            except _Incompatible as error:
                logger.debug("tree DP cannot take row %s; solving the integer program", error)
                self._integer_program_used = True
                best, proven = self._program().solve(budget_bytes)
        if best is None:
            names, lowest = self.lowest_peak()
            if lowest <= budget_bytes:  # cannot happen with a finished search; be safe
                best, proven = names, False
        if best is None:
            budget_text, lowest_text = format_bytes_apart(budget_bytes, lowest)
            raise InfeasibleBudgetError(
                f"no checkpointing plan fits {budget_text}: the smallest budget "
                f"that fits is {lowest_text} ({lowest} bytes, checkpointing "
                f"{len(names)} module{'s' if len(names) != 1 else ''}); "
                + self._floor_explanation(names)
                + (f"; {note}" if (note := self.profile.excluded_blocks_note()) else ""),
                budget_bytes=budget_bytes,
                min_budget_bytes=lowest,
            )
        self._remember(best)
        return Solution(
            module_names=best,
            predicted_peak_bytes=self.peak(best),
            recompute_ms=self.cost(best),
            proven_optimal=proven,
            evaluations=self.evaluations - start,
        )

    def _remember(self, plan: tuple[str, ...]) -> None:
        self._known.append((self.peak(plan), self.cost(plan), plan))

    def _fitting(self, budget_bytes: int) -> tuple[str, ...] | None:
        """The cheapest plan solved before whose peak fits this budget (bounds the DP)."""
        fitting = [(cost, plan) for peak, cost, plan in self._known if peak <= budget_bytes]
        return min(fitting)[1] if fitting else None

    def _dp(self) -> _TreeDP:
        if self._tree_dp is None:
            self._tree_dp = _TreeDP(self, self._program())
        return self._tree_dp

    def _program(self) -> _IntegerProgram:
        if self._integer_program is None:
            self._integer_program = _IntegerProgram(self)
        return self._integer_program


class _Incompatible(Exception):
    """A memory row the tree dynamic program cannot represent exactly (see :class:`_TreeDP`);
    the integer program takes over."""


@dataclass(frozen=True)
class _Row:
    """One lazily added memory row: ``offset + coefficients . x + shared . flags <= budget``
    (a spike row only when ``unit`` is chosen), and where it sits in the visiting order."""

    coefficients: np.ndarray
    shared: np.ndarray  # bytes per shared-input class whose flag the row counts
    offset: float
    anchor: str  # "end", "before" (node), "at" (a leaf node) or "spike" (the unit's node)
    node: str | None
    unit: int


class _TreeDP:
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

    Rows are added lazily, as in :class:`_IntegerProgram`: solve, replay the answer exactly,
    add the row where the replay exceeds the budget. A row not of that form raises
    :class:`_Incompatible` and the integer program solves that budget instead. Rows do not
    depend on the budget (only their bound does), so they are kept for later budgets: a
    sweep reuses them.
    """

    resolution_steps = 30_000
    choice_table_bytes = 200 * 2**20
    max_shared_classes = 3

    def __init__(self, solver: Solver, program: _IntegerProgram) -> None:
        self.solver = solver
        self.program = program
        memory = solver.memory
        calls = memory.timeline.calls

        def first_run(node: str) -> tuple[int, tuple[object, ...]]:
            indices = memory.calls_of(node)
            return (calls[indices[0]].forward_start_event if indices else -1, _tree_key(node))

        self.children = {
            parent: sorted(nodes, key=first_run) for parent, nodes in solver.node_children.items()
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
            parent = solver.node_parent[node]
            self.ancestor_units[node] = (
                [] if parent is None else self.ancestor_units[parent] + solver.node_units[parent]
            )
            self.first[node] = len(self.order)
            self.order.extend(solver.node_units[node])
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(self.children[node]))
        count = len(solver.names)
        self.position = np.empty(count, dtype=np.int64)
        self.position[self.order] = np.arange(count)
        # Shared-input classes: the holder sets of the integer program's OR columns.
        classes: list[frozenset[int]] = []
        for _storage, _size, gap, held in program.coupled:
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
        self.helper_keys = program.helpers
        # w: each unit's change at the end of the forward pass.
        forward_end = memory.timeline.phase_end_events.get("forward")
        point = forward_end + 1 if forward_end is not None else int(program.base.argmax())
        self.w = np.zeros(count)
        for column, value in program._delta_at(point).items():
            if column < count:
                self.w[column] = value
        # Costs in whole quanta: 10 microseconds, coarser if the costliest plan would need
        # more than resolution_steps of them, or the backtracking tables (a byte or two per
        # node, flag state and step) more than choice_table_bytes.
        cost_ms = np.array([solver.cost_ms[u] for u in solver.names])
        bytes_per_step = len(solver.nodes) * self.states * (1 if self.states == 1 else 2)
        steps = max(1_000, min(self.resolution_steps, self.choice_table_bytes // bytes_per_step))
        self.quantum_ms = max(0.01, self._costliest(cost_ms) / steps)
        self.cost = np.round(cost_ms / self.quantum_ms).astype(np.int64)
        self.length = int(self._costliest(self.cost.astype(float))) + 1
        self.rows: dict[tuple[str, int, int], _Row | None] = {}
        self.rounds = 0

    def _costliest(self, cost: np.ndarray) -> float:
        """The largest total cost of an antichain (the DP's cost range)."""
        best: dict[str, float] = {}
        for node in reversed(self.solver.nodes):
            below = sum(best[child] for child in self.children[node])
            own = max((float(cost[u]) for u in self.solver.node_units[node]), default=0.0)
            best[node] = max(below, own)
        return sum(best[node] for node in self.children[None])

    # -- rows ------------------------------------------------------------------------------
    def _row(self, key: tuple[str, int, int]) -> _Row:
        if key in self.rows:
            row = self.rows[key]
        else:
            row = self.rows[key] = self._make_row(key)
        if row is None:
            raise _Incompatible(key)
        return row

    def _make_row(self, key: tuple[str, int, int]) -> _Row | None:
        kind, point, unit = key
        program = self.program
        delta = program._delta_at(point)
        count = len(self.solver.names)
        columns = {column: key for key, column in program.helpers.items()}
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
        offset = float(program.base[point])
        solver = self.solver
        if kind == "spike":
            offset += dict(program.spikes[unit])[point]
            node = solver.node_of[solver.names[unit]]
            ignored = set(self.ancestor_units[node])
            ignored.update(self.order[self.first[node] : self.end[node]])
            ignored.discard(unit)
            if self._fits(a, holding, self.first[node], self.end[node], ignored, {unit}):
                return _Row(a, shared, offset, "spike", node, unit)
            return None
        mismatched = np.flatnonzero(a[self.order] != self.w[self.order])
        if not len(mismatched):
            if self._fits(a, holding, count, count, set(), set()):
                return _Row(a, shared, offset, "end", None, -1)
            return None
        node = solver.node_of[solver.names[self.order[int(mismatched[0])]]]
        while True:
            ancestors = set(self.ancestor_units[node])
            if self._fits(a, holding, self.first[node], self.first[node], set(), ancestors):
                return _Row(a, shared, offset, "before", node, -1)
            own = solver.node_units[node]
            if not self.children[node]:
                open_units = ancestors | set(own)
                if self._fits(a, holding, self.first[node], self.end[node], set(), open_units):
                    return _Row(a, shared, offset, "at", node, -1)
                return None
            # The node's call is open at the row's event: look inside it.
            inside = [
                p for p in mismatched.tolist() if self.first[node] + len(own) <= p < self.end[node]
            ]
            if not inside:
                return None
            node = solver.node_of[solver.names[self.order[inside[0]]]]

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

        def open_branch(row: _Row, unit: int, bound: float) -> None:
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
                for unit in self.solver.node_units[row.node]:
                    open_branch(row, unit, bound)
            for unit in self.ancestor_units[row.node]:
                open_branch(row, unit, bound)
        return before, unchosen, branch, final

    # -- the program -----------------------------------------------------------------------
    def _run(self, budget: float, length: int) -> list[int] | None:
        """The cheapest antichain satisfying every kept row at ``budget`` (unit indices), or
        None when none does. ``length``: the cost range searched, in quanta (plus one)."""
        before, unchosen, branch, final = self._filters(budget)
        solver, cost, w, flags = self.solver, self.cost, self.w, self.flags
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
            units = solver.node_units[node]
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
                unit = solver.node_units[node][int(choice[0][state, c])]
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
        solver, states, inf = self.solver, range(self.states), math.inf
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
            units = solver.node_units[node]
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
                chosen.append(solver.node_units[node][choice[0][state]])
                return choice[1][state]
            for child in reversed(self.children[node]):
                state = back(child, state)
            return state

        for root in reversed(self.children[None]):
            state = back(root, state)
        assert state == 0, "tree DP backtracking lost its way"
        return chosen

    def quanta(self, plan: Iterable[str]) -> int:
        """A plan's recompute cost in the program's cost quanta (what it minimises)."""
        return int(sum(self.cost[self.program.index[unit]] for unit in plan))

    def _names(self, units: list[int]) -> tuple[str, ...]:
        return tuple(sorted(self.solver.names[u] for u in units))

    def solve(
        self, budget_bytes: int, fitting: Sequence[str] | None = None
    ) -> tuple[str, ...] | None:
        """The cheapest plan within the budget, or None if no plan fits. ``fitting``: a plan
        known to fit (its cost bounds the search). Raises :class:`_Incompatible` when a
        needed row is not of prefix form."""
        budget = float(budget_bytes)
        length = self.length
        if fitting is not None:
            length = min(length, self.quanta(fitting) + 1)
        violation = self.program._violation((), budget)
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
            violation = self.program._violation(names, budget)
            if violation is None:
                return names
            if violation in self.rows:
                raise _Incompatible(violation)  # cannot happen with exact rows; be safe
            self._row(violation)
        raise _Incompatible(("rounds", 0, 0))

    def lowest_peak(self) -> tuple[str, ...]:
        """The plan with the lowest peak: the least budget at which the kept rows admit a
        plan (a bisection over bytes), replayed exactly; a violated row is added and the
        bisection resumes above the last answer (a lower bound, since rows only tighten)."""
        best_plan: tuple[str, ...] = ()
        high = self.solver.peak(())
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
            peak = self.solver.peak(names)
            if peak < high:
                high, best_plan = peak, names
            if peak <= low:
                return best_plan
            violation = self.program._violation(names, float(low))
            assert violation is not None
            if violation in self.rows:
                raise _Incompatible(violation)
            self._row(violation)
        raise _Incompatible(("rounds", 0, 0))


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


class _IntegerProgram:
    """The lazy-constraint integer program of the module docstring.

    Columns are the unit variables ``x_u`` (binary), then helper columns made as rows need
    them, which keep the rows exact where units interact through one storage:

    * ``OR(V)`` for a storage several chosen checkpoints hold as an input: it stays alive
      while any of them holds it, so it counts once (``OR >= x_v`` for each ``v`` in V);
    * ``AND(u, OR(V))`` for a storage unit ``u`` would drop, whose drop a checkpoint in V
      delays by holding it (``AND >= x_u + OR - 1``).

    Both appear only with positive coefficients in ``<=`` rows, so at an optimum they take
    their least feasible values: exactly the OR and the AND. The rows then equal the exact
    replay of :class:`~planner.memory_model.MemoryModel` at every event they cover.
    """

    def __init__(self, solver: Solver) -> None:
        self.solver = solver
        memory = solver.memory
        self.units = list(solver.names)
        self.index = {unit: i for i, unit in enumerate(self.units)}
        self.base = memory.memory_curve(())  # live bytes after each event (index 0: start)
        storages = memory.timeline.storages
        # Per storage: the unit that would drop it [start, end) and the units holding it as
        # a checkpoint input until curve index ``until``. All in curve indices.
        # (A storage made inside a child is dropped by the child and by its parent: one
        # entry per unit; the two are never chosen together.)
        gaps: dict[int, list[tuple[int, int, int]]] = {}
        holders: dict[int, list[tuple[int, int]]] = {}
        self.spikes: list[list[tuple[int, int]]] = []
        for unit_index, unit in enumerate(self.units):
            spikes = []
            for effect in memory.unit_effects(unit):
                if effect.recompute_event < 0:
                    continue
                for storage, _size, drop in effect.retained + effect.released_outputs:
                    gaps.setdefault(storage, []).append(
                        (unit_index, drop + 1, effect.recompute_event + 1)
                    )
                for storage in effect.input_storages:
                    holders.setdefault(storage, []).append((unit_index, effect.release_event + 1))
                spikes.append((effect.recompute_event, effect.recompute_peak_bytes))
            self.spikes.append(spikes)
        # Plain (additive) intervals: (unit, start, end, bytes) in numpy arrays for speed.
        plain: list[tuple[int, int, int, int]] = []
        self.coupled: list[tuple[int, int, tuple[int, int, int] | None, list[tuple[int, int]]]] = []
        for storage in gaps.keys() | holders.keys():
            size = storages[storage].size_bytes
            held = holders.get(storage, [])
            for owner, start, end in gaps.get(storage, ()):
                # A holder never chosen with the owner (its ancestor or descendant) cannot
                # delay the drop.
                delaying = [
                    (v, until)
                    for v, until in held
                    if until > start and not solver.conflicts(self.units[owner], self.units[v])
                ]
                if delaying:
                    self.coupled.append((storage, size, (owner, start, end), delaying))
                else:
                    plain.append((owner, start, end, -size))
            # Holders extend its life past its free. (A unit that would drop it is then
            # never chosen with them: it contains them, or its drop starts after they let go.)
            if held:
                free = storages[storage].free_event + 1
                extending = [(v, until) for v, until in held if until > free]
                if all(
                    solver.conflicts(self.units[v], self.units[other])
                    for v, _ in extending
                    for other, _ in extending
                ):
                    # At most one of them is chosen (one path of the tree): additive.
                    plain.extend((v, free, until, size) for v, until in extending)
                elif extending:
                    self.coupled.append((storage, size, None, extending))
        self.plain = np.array(plain, dtype=np.int64).reshape(-1, 4)
        self.free_of = {storage: storages[storage].free_event + 1 for storage in holders}
        # One unit per path: a row per unit-tree leaf node (its units and its ancestors').
        self.path_rows: list[dict[int, float]] = []
        for leaf in solver.nodes:
            if solver.node_children[leaf]:
                continue
            row: dict[int, float] = {}
            node: str | None = leaf
            while node is not None:
                row.update((i, 1.0) for i in solver.node_units[node])
                node = solver.node_parent[node]
            self.path_rows.append(row)
        # Costs in whole 10-microsecond units: an integral objective lets HiGHS round its
        # bounds, which closes the tiny gaps between near-identical blocks quickly. The
        # answer is exact at that resolution, far below the timing noise of a profile.
        self.cost = np.round(np.array([solver.cost_ms[u] for u in self.units]) * 100.0)
        self.scale = float(self.base.max()) or 1.0
        self.rounds = 0
        self.time_limit_s = 20.0
        self.timed_out = False
        # Helper columns: key -> column index, and the linking rows they need.
        self.helpers: dict[tuple[object, ...], int] = {}
        self.link_rows: list[tuple[dict[int, float], float]] = []

    # -- rows ----------------------------------------------------------------------------
    def _or(self, members: list[int]) -> int:
        if len(members) == 1:
            return members[0]
        key = ("or", *sorted(members))
        column = self.helpers.get(key)
        if column is None:
            column = self.helpers[key] = len(self.units) + len(self.helpers)
            for member in members:  # OR >= x_member
                self.link_rows.append(({member: 1.0, column: -1.0}, 0.0))
        return column

    def _and(self, owner: int, other: int) -> int:
        key = ("and", owner, other)
        column = self.helpers.get(key)
        if column is None:
            column = self.helpers[key] = len(self.units) + len(self.helpers)
            # AND >= x_owner + other - 1
            self.link_rows.append(({owner: 1.0, other: 1.0, column: -1.0}, 1.0))
        return column

    def _delta_at(self, point: int) -> dict[int, float]:
        """How the chosen plan changes the live bytes at curve index ``point``, as
        coefficients over unit and helper columns (exact, see the class docstring)."""
        row: dict[int, float] = {}
        if len(self.plain):
            units, starts, ends, sizes = self.plain.T
            mask = (starts <= point) & (point < ends)
            for unit, size in zip(units[mask].tolist(), sizes[mask].tolist(), strict=True):
                row[unit] = row.get(unit, 0.0) + size
        for storage, size, gap, held in self.coupled:
            active = [v for v, until in held if point < until]
            if gap is not None:
                owner, start, end = gap
                if start <= point < end:
                    row[owner] = row.get(owner, 0.0) - size
                    if active:
                        column = self._and(owner, self._or(active))
                        row[column] = row.get(column, 0.0) + size
            elif point >= self.free_of[storage] and active:
                column = self._or(active)
                row[column] = row.get(column, 0.0) + size
        return row

    def _memory_row(self, point: int, budget: float) -> tuple[dict[int, float], float]:
        return self._delta_at(point), budget - float(self.base[point])

    def _spike_row(
        self, unit: int, event: int, spike: int, budget: float
    ) -> tuple[dict[int, float], float]:
        # base(r) + delta(r).x + spike <= budget + M (1 - x_u)
        # <=>  delta(r).x + M x_u <= budget - base(r) - spike + M
        row = self._delta_at(event)
        big = max(
            0.0,
            float(self.base[event]) + sum(c for c in row.values() if c > 0) + spike - budget,
        )
        row[unit] = row.get(unit, 0.0) + big
        return row, budget - float(self.base[event]) - spike + big

    def _violation(self, chosen: Sequence[str], budget: float) -> tuple[str, int, int] | None:
        """Where the exact replay of ``chosen`` exceeds ``budget`` the most, or None."""
        curve = self.solver.memory.memory_curve(chosen)
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

    def _row_for(
        self, violation: tuple[str, int, int], budget: float
    ) -> tuple[dict[int, float], float]:
        kind, point, unit = violation
        if kind == "point":
            return self._memory_row(point, budget)
        return self._spike_row(unit, point, dict(self.spikes[unit])[point], budget)

    # -- solving -------------------------------------------------------------------------
    def _milp(
        self,
        objective: np.ndarray,
        rows: list[tuple[dict[int, float], float]],
        *,
        peak_column: bool = False,
    ) -> np.ndarray | None:
        """Solve with the given rows (plus path and helper-link rows). Columns: units,
        helpers, then the peak variable when ``peak_column``."""
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_array

        helpers = len(self.helpers)
        count = len(self.units) + helpers + (1 if peak_column else 0)
        all_rows = [(row, 1.0) for row in self.path_rows] + self.link_rows + rows
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
                options={"mip_rel_gap": 0.0, "time_limit": self.time_limit_s},
            )
        self.rounds += 1
        if result.status == 1:  # time limit: the answer (if any) is not proven optimal
            self.timed_out = True
        if result.x is None:
            return None
        return np.asarray(result.x)

    def _chosen(self, x: np.ndarray) -> tuple[str, ...]:
        return tuple(sorted(u for u, value in zip(self.units, x, strict=False) if value > 0.5))

    def _scaled(self, row: dict[int, float], bound: float) -> tuple[dict[int, float], float]:
        # Memory rows in units of the unplanned peak, so HiGHS's tolerances are relative.
        return {c: v / self.scale for c, v in row.items()}, bound / self.scale

    def solve(self, budget_bytes: int) -> tuple[tuple[str, ...] | None, bool]:
        budget = float(budget_bytes)
        rows: list[tuple[dict[int, float], float]] = []
        added: set[tuple[str, int, int]] = set()
        violation = self._violation((), budget)
        if violation is None:
            return (), True
        self.timed_out = False
        exact = True
        chosen: tuple[str, ...] = ()
        for _ in range(500):
            if violation in added:
                # Cannot happen with exact rows; kept as a safety net: cut off this plan.
                exact = False
                rows.append(({self.index[u]: 1.0 for u in chosen}, len(chosen) - 1.0))
            else:
                added.add(violation)
                rows.append(self._scaled(*self._row_for(violation, budget)))
            x = self._milp(self.cost, rows)
            if x is None:
                return None, exact and not self.timed_out
            chosen = self._chosen(x)
            violation = self._violation(chosen, budget)
            if violation is None:
                return chosen, exact and not self.timed_out
        logger.warning("integer program did not converge; no plan returned")
        return None, False

    def lowest_peak(self) -> tuple[str, ...]:
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
        added: set[tuple[str, int, int]] = set()
        best: tuple[int, tuple[str, ...]] = (self.solver.peak(()), ())
        violation: tuple[str, int, int] | None = ("point", int(self.base.argmax()), -1)
        chosen: tuple[str, ...] = ()
        for _ in range(200):
            assert violation is not None
            if violation in added:  # safety net, as in solve()
                cuts.append(({self.index[u]: 1.0 for u in chosen}, len(chosen) - 1.0))
            else:
                added.add(violation)
                peak_rows.append(self._scaled(*self._row_for(violation, 0.0)))
            peak_column = count + len(self.helpers)
            rows = [({**row, peak_column: -1.0}, bound) for row, bound in peak_rows] + cuts
            x = self._milp(objective, rows, peak_column=True)
            if x is None:
                break
            chosen = self._chosen(x[:count])
            lower = float(x[-1]) * self.scale
            peak = self.solver.peak(chosen)
            if peak < best[0]:
                best = (peak, chosen)
            if best[0] <= lower + 0.5:
                break
            violation = self._violation(chosen, lower + 0.5)
            if violation is None:
                break
        return best[1]


def solve(profile: Profile, budget_bytes: int, max_evaluations: int | None = None) -> Solution:
    """The cheapest plan (least recompute time) whose predicted peak is within the budget.

    Raises :class:`InfeasibleBudgetError` (with the smallest budget that fits) when no plan
    fits.
    """
    return Solver(profile).solve(budget_bytes, max_evaluations)


def lowest_peak(profile: Profile) -> int:
    """The lowest predicted peak of any plan (the smallest usable budget)."""
    return Solver(profile).lowest_peak()[1]
