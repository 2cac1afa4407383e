"""The exact memory of plans, two ways: replayed (:class:`PlanPeaks`), and as linear rows
over the units (:class:`MemoryRows`) that the tree program and the integer program both
build on.

The memory at curve index ``t`` under a plan is ``base(t) + sum_u delta_u(t) x_u`` (plus
helper columns where units interact through one storage), where ``base`` is the unplanned
curve and ``delta_u`` how unit ``u`` alone changes it: activations dropped between its
forward and its recomputation, inputs held until its backward ends. A recompute spike of a
chosen unit ``u`` at event ``r`` adds ``spike_u`` there. Rows are made lazily, where the
exact replay of an answer exceeds the budget (:meth:`MemoryRows.violation`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from planner.core.records import Unit
from planner.plan.memory_model import MemoryModel
from planner.solve.tree import UnitTree

__all__ = ["MemoryRows", "PlanPeaks", "Violation"]

# Where a replay exceeds a budget: ("point", curve index, -1) or ("spike", event, unit).
Violation = tuple[str, int, int]


class PlanPeaks:
    """The exact peak of a plan (``MemoryModel.peak_bytes``), cached; ``evaluations`` counts
    the replays actually run."""

    def __init__(self, memory: MemoryModel) -> None:
        self.memory = memory
        self.evaluations = 0
        self._cache: dict[frozenset[Unit], int] = {}

    def known(self, units: Iterable[Unit]) -> bool:
        return frozenset(units) in self._cache

    def __call__(self, units: Iterable[Unit]) -> int:
        key = frozenset(units)
        cached = self._cache.get(key)
        if cached is None:
            self.evaluations += 1
            cached = self._cache[key] = self.memory.peak_bytes(sorted(key))
        return cached


class MemoryRows:
    """Memory rows over unit columns, exact at every event they cover.

    Columns are the units (``tree.names`` order), then helper columns made as rows need
    them, which keep the rows exact where units interact through one storage:

    * ``OR(V)`` for a storage several chosen checkpoints hold as an input: it stays alive
      while any of them holds it, so it counts once (``OR >= x_v`` for each ``v`` in V);
    * ``AND(u, OR(V))`` for a storage unit ``u`` would drop, whose drop a checkpoint in V
      delays by holding it (``AND >= x_u + OR - 1``).

    Both appear only with positive coefficients in ``<=`` rows, so at an optimum they take
    their least feasible values: exactly the OR and the AND. ``link_rows`` holds the rows
    that define them. ``coupled`` lists the storages that need them: (storage, bytes, the
    owner's drop interval or None, the holders); a solver may read it to find classes of
    holders.
    """

    def __init__(self, tree: UnitTree, memory: MemoryModel) -> None:
        self.tree = tree
        self.memory = memory
        units = tree.names
        self.base = memory.memory_curve(())  # live bytes after each event (index 0: start)
        storages = memory.timeline.storages
        # Per storage: the unit that would drop it [start, end) and the units holding it as
        # a checkpoint input until curve index ``until``. All in curve indices.
        # (A storage made inside a child is dropped by the child and by its parent: one
        # entry per unit; the two are never chosen together.)
        gaps: dict[int, list[tuple[int, int, int]]] = {}
        holders: dict[int, list[tuple[int, int]]] = {}
        extra: list[tuple[int, int, int, int]] = []
        self.spikes: list[list[tuple[int, int]]] = []
        for unit_index, unit in enumerate(units):
            spikes = []
            for effect in memory.unit_effects(unit):
                if effect.recompute_event < 0:
                    continue
                for storage, _size, drop in effect.retained + effect.released_outputs:
                    gap = (unit_index, drop + 1, effect.recompute_event + 1)
                    if gap not in gaps.setdefault(storage, []):  # nesting: named twice
                        gaps[storage].append(gap)
                for storage in effect.input_storages:
                    holders.setdefault(storage, []).append((unit_index, effect.release_event + 1))
                # A selective policy holds the outputs it saves until its recomputation.
                for storage, _size, until in effect.kept:
                    holders.setdefault(storage, []).append((unit_index, until + 1))
                if effect.offload:
                    # No spike; a copy made at the unpack, or a storage gone early.
                    extra.extend(
                        (unit_index, start + 1, until + 1, size)
                        for _storage, size, start, until in effect.revived
                    )
                else:
                    spikes.append((effect.recompute_event, effect.recompute_peak_bytes))
            self.spikes.append(spikes)
        # Plain (additive) intervals: (unit, start, end, bytes) in numpy arrays for speed.
        plain: list[tuple[int, int, int, int]] = list(extra)
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
                    if until > start and not tree.conflicts(units[owner], units[v])
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
                    tree.conflicts(units[v], units[other])
                    for v, _ in extending
                    for other, _ in extending
                ):
                    # At most one of them is chosen (one path of the tree): additive.
                    plain.extend((v, free, until, size) for v, until in extending)
                elif extending:
                    self.coupled.append((storage, size, None, extending))
        self.plain = np.array(plain, dtype=np.int64).reshape(-1, 4)
        self.free_of = {storage: storages[storage].free_event + 1 for storage in holders}
        # Helper columns: key -> column index, and the linking rows they need.
        self.helpers: dict[tuple[object, ...], int] = {}
        self.link_rows: list[tuple[dict[int, float], float]] = []

    # -- helper columns ------------------------------------------------------------------
    def _or(self, members: list[int]) -> int:
        if len(members) == 1:
            return members[0]
        key = ("or", *sorted(members))
        column = self.helpers.get(key)
        if column is None:
            column = self.helpers[key] = len(self.tree.names) + len(self.helpers)
            for member in members:  # OR >= x_member
                self.link_rows.append(({member: 1.0, column: -1.0}, 0.0))
        return column

    def _and(self, owner: int, other: int) -> int:
        key = ("and", owner, other)
        column = self.helpers.get(key)
        if column is None:
            column = self.helpers[key] = len(self.tree.names) + len(self.helpers)
            # AND >= x_owner + other - 1
            self.link_rows.append(({owner: 1.0, other: 1.0, column: -1.0}, 1.0))
        return column

    # -- rows ----------------------------------------------------------------------------
    def delta_at(self, point: int) -> dict[int, float]:
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

    def spike_bytes(self, unit: int, event: int) -> int:
        return dict(self.spikes[unit])[event]

    def row_for(self, violation: Violation, budget: float) -> tuple[dict[int, float], float]:
        """The row ``coefficients . x <= bound`` that the violated event needs: a memory row,
        or a spike row ``base(r) + delta(r).x + spike_u <= budget + M (1 - x_u)``."""
        kind, point, unit = violation
        row = self.delta_at(point)
        if kind == "point":
            return row, budget - float(self.base[point])
        spike = self.spike_bytes(unit, point)
        # <=>  delta(r).x + M x_u <= budget - base(r) - spike + M
        big = max(
            0.0,
            float(self.base[point]) + sum(c for c in row.values() if c > 0) + spike - budget,
        )
        row[unit] = row.get(unit, 0.0) + big
        return row, budget - float(self.base[point]) - spike + big

    def violation(self, chosen: Sequence[Unit], budget: float) -> Violation | None:
        """Where the exact replay of ``chosen`` exceeds ``budget`` the most, or None."""
        worst = self.violations(chosen, budget, limit=1)
        return worst[0] if worst else None

    def violations(self, chosen: Sequence[Unit], budget: float, limit: int) -> list[Violation]:
        """Up to ``limit`` places where the exact replay of ``chosen`` exceeds ``budget``,
        the worst first: the highest point of each stretch of the curve above the budget,
        and each recompute spike above it. The worst one (first) is the highest of all.

        The integer program adds all of them in one round: blocks of one shape peak at
        different events, and a round per event would take hundreds of rounds."""
        curve = self.memory.memory_curve(chosen)
        found: list[tuple[float, Violation]] = []
        worst_point = int(curve.argmax())
        found.append((float(curve[worst_point]), ("point", worst_point, -1)))
        if limit > 1:
            above = np.flatnonzero(curve > budget)
            if len(above):
                # Stretches of consecutive indices above the budget; the top of each.
                breaks = np.flatnonzero(np.diff(above) > 1) + 1
                for stretch in np.split(above, breaks):
                    top = int(stretch[int(curve[stretch].argmax())])
                    if top != worst_point:
                        found.append((float(curve[top]), ("point", top, -1)))
        for unit in chosen:
            index = self.tree.index[unit]
            for event, spike in self.spikes[index]:
                value = float(curve[event]) + spike
                if value > budget or value > found[0][0]:
                    found.append((value, ("spike", event, index)))
        found.sort(key=lambda item: -item[0])
        return [violation for value, violation in found[:limit] if value > budget]
