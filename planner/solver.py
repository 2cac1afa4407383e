"""Choose which modules to checkpoint: the least recompute time whose predicted peak fits.

Pure Python (no torch). The memory of a plan comes from :class:`planner.memory_model.MemoryModel`;
its cost is the sum of the chosen modules' forward times (each is recomputed once per call
during backward).

The search
----------
A plan is an *antichain* of the candidate tree: a set of candidate modules none of which is
an ancestor of another (wrapping a parent already recomputes its children). The peak is not
additive over modules (recompute spikes and the position of the peak move with the plan),
so we search plans directly, evaluating each with the memory model:

1. **Greedy descent.** From the empty plan, repeatedly add the candidate that removes the
   most predicted peak per millisecond of recompute (replacing any chosen descendants),
   until the plan fits. Then drop chosen modules, most expensive first, while it still fits.
   This gives a feasible plan and an upper bound on the cost.
2. **Branch and bound.** Depth-first over the candidates in tree pre-order: each is either
   wrapped (its subtree is then skipped) or not. A branch whose cost already reaches the
   best known cost is cut; a plan that fits ends its branch (adding modules only adds
   cost). If the search finishes within ``max_evaluations`` plan evaluations, the plan is
   the cheapest under the memory model (``proven_optimal``); otherwise it is the best found.

The smallest budget any plan fits (for the "budget too small" error) is the lowest peak
over all plans when there are few enough to enumerate, else the best of a local search.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planner.errors import InfeasibleBudgetError
from planner.memory_model import MemoryModel
from planner.records import Profile
from planner.units import format_bytes

__all__ = ["Solution", "Solver", "lowest_peak", "solve"]


@dataclass(frozen=True)
class Solution:
    """A set of modules to checkpoint with its predicted peak and recompute cost."""

    module_names: tuple[str, ...]
    predicted_peak_bytes: int
    recompute_ms: float
    proven_optimal: bool
    evaluations: int


def _is_ancestor(ancestor: str, name: str) -> bool:
    return name.startswith(ancestor + ".")


class Solver:
    """Holds a profile's memory model and candidate tree; answers many budgets quickly."""

    def __init__(self, profile: Profile, memory: MemoryModel | None = None) -> None:
        self.profile = profile
        self.memory = memory or MemoryModel(profile.timeline)
        # Pre-order (names sort parents before their children's dotted names per prefix).
        candidates = sorted(profile.candidates, key=lambda m: _tree_key(m.module_name))
        self.names: tuple[str, ...] = tuple(m.module_name for m in candidates)
        self.cost_ms: dict[str, float] = {m.module_name: m.forward_ms for m in candidates}
        # subtree_end[i]: first index after candidate i's subtree in ``names``.
        self.subtree_end: list[int] = []
        for index, name in enumerate(self.names):
            end = index + 1
            while end < len(self.names) and _is_ancestor(name, self.names[end]):
                end += 1
            self.subtree_end.append(end)
        # The nearest candidate descendants of each candidate (its children in the tree of
        # candidates, skipping excluded modules in between).
        self.candidate_children: dict[str, tuple[str, ...]] = {
            name: tuple(
                child
                for child in self.names
                if _is_ancestor(name, child)
                and not any(
                    _is_ancestor(name, middle) and _is_ancestor(middle, child)
                    for middle in self.names
                )
            )
            for name in self.names
        }
        self.evaluations = 0
        self._cache: dict[frozenset[str], int] = {}

    def peak(self, names: Iterable[str]) -> int:
        key = frozenset(names)
        cached = self._cache.get(key)
        if cached is None:
            self.evaluations += 1
            cached = self.memory.peak_bytes(sorted(key))
            self._cache[key] = cached
        return cached

    def cost(self, names: Iterable[str]) -> float:
        return sum(self.cost_ms[name] for name in names)

    def _with(self, chosen: Sequence[str], name: str) -> tuple[str, ...]:
        """``chosen`` plus ``name``, minus ``name``'s descendants; None-safe for ancestors."""
        return tuple(sorted([n for n in chosen if not _is_ancestor(name, n)] + [name]))

    def _addable(self, chosen: Sequence[str]) -> list[str]:
        return [
            name
            for name in self.names
            if name not in chosen and not any(_is_ancestor(c, name) for c in chosen)
        ]

    def greedy(self, budget_bytes: int) -> tuple[str, ...] | None:
        """Step 1 of the search (module docstring); None if greedy cannot fit the budget."""
        chosen: tuple[str, ...] = ()
        peak = self.peak(chosen)
        while peak > budget_bytes:
            best: tuple[float, tuple[str, ...], int] | None = None
            for name in self._addable(chosen):
                trial = self._with(chosen, name)
                trial_peak = self.peak(trial)
                gain = peak - trial_peak
                if gain <= 0:
                    continue
                extra = max(self.cost(trial) - self.cost(chosen), 1e-6)
                score = gain / extra
                if best is None or score > best[0]:
                    best = (score, trial, trial_peak)
            if best is None:
                return None
            _, chosen, peak = best
        return self._prune(chosen, budget_bytes)

    def _prune(self, chosen: tuple[str, ...], budget_bytes: int) -> tuple[str, ...]:
        for name in sorted(chosen, key=lambda n: -self.cost_ms[n]):
            trial = tuple(n for n in chosen if n != name)
            if self.peak(trial) <= budget_bytes:
                chosen = trial
        return chosen

    def branch_and_bound(
        self, budget_bytes: int, incumbent: tuple[str, ...] | None, max_evaluations: int
    ) -> tuple[tuple[str, ...] | None, bool]:
        """Step 2 of the search. Returns (best plan, whether the search finished)."""
        # Plans are ranked by (cost, peak): among equally cheap plans the lower peak wins,
        # which makes the chosen plan's peak monotone in the budget when the search finishes.
        best = incumbent
        best_key = (
            (self.cost(incumbent), self.peak(incumbent))
            if incumbent is not None
            else (float("inf"), 0)
        )
        limit = self.evaluations + max_evaluations
        finished = True

        def visit(position: int, chosen: list[str], cost: float) -> None:
            nonlocal best, best_key, finished
            if cost > best_key[0] + 1e-9:
                return
            if self.evaluations >= limit:
                finished = False
                return
            peak = self.peak(chosen)
            if peak <= budget_bytes:
                if (cost, peak) < best_key:
                    best, best_key = tuple(sorted(chosen)), (cost, peak)
                return
            for index in range(position, len(self.names)):
                name = self.names[index]
                chosen.append(name)
                visit(self.subtree_end[index], chosen, cost + self.cost_ms[name])
                chosen.pop()
                if not finished:
                    return

        visit(0, [], 0.0)
        return best, finished

    def _neighbours(self, chosen: tuple[str, ...]) -> list[tuple[str, ...]]:
        """Plans one move away: add a module (dropping its chosen descendants), replace a
        chosen module by its candidate children, or drop a chosen module."""
        moves = [self._with(chosen, name) for name in self._addable(chosen)]
        for name in chosen:
            rest = [n for n in chosen if n != name]
            children = self.candidate_children.get(name, ())
            if children:
                moves.append(tuple(sorted(rest + list(children))))
            moves.append(tuple(rest))
        return moves

    def lowest_peak(self, max_evaluations: int = 20_000) -> tuple[tuple[str, ...], int]:
        """The plan with the lowest predicted peak: exact (every antichain) when there are at
        most ``max_evaluations`` of them, else the best of a local search."""
        exhaustive = self._lowest_peak_exhaustive(max_evaluations)
        if exhaustive is not None:
            return exhaustive
        return self._lowest_peak_local()

    def _lowest_peak_exhaustive(self, max_evaluations: int) -> tuple[tuple[str, ...], int] | None:
        best: tuple[int, float, tuple[str, ...]] | None = None
        budget = max_evaluations

        def visit(position: int, chosen: list[str]) -> bool:
            nonlocal best, budget
            budget -= 1
            if budget < 0:
                return False
            key = (self.peak(chosen), self.cost(chosen), tuple(sorted(chosen)))
            if best is None or key[:2] < best[:2]:
                best = key
            for index in range(position, len(self.names)):
                chosen.append(self.names[index])
                complete = visit(self.subtree_end[index], chosen)
                chosen.pop()
                if not complete:
                    return False
            return True

        if not visit(0, []):
            return None
        assert best is not None
        return best[2], best[0]

    def _lowest_peak_local(self) -> tuple[tuple[str, ...], int]:
        """Descent over :meth:`_neighbours` from the empty plan, every block, and every
        top-level candidate; the best end point."""
        starts = [
            (),
            tuple(n for n in self.profile.block_names if n in self.cost_ms),
            tuple(n for n in self.names if not any(_is_ancestor(a, n) for a in self.names)),
        ]
        best: tuple[int, tuple[str, ...]] | None = None
        for start in starts:
            chosen, peak = start, self.peak(start)
            while True:
                moves = self._neighbours(chosen)
                if not moves:
                    break
                trial_peak, trial = min((self.peak(m), m) for m in moves)
                if trial_peak >= peak:
                    break
                chosen, peak = trial, trial_peak
            if best is None or (peak, self.cost(chosen)) < (best[0], self.cost(best[1])):
                best = (peak, chosen)
        assert best is not None
        return best[1], best[0]

    def solve(self, budget_bytes: int, max_evaluations: int = 20_000) -> Solution:
        start = self.evaluations
        incumbent = self.greedy(budget_bytes)
        if incumbent is None:
            blocks = tuple(n for n in self.profile.block_names if n in self.cost_ms)
            if blocks and self.peak(blocks) <= budget_bytes:
                incumbent = self._prune(blocks, budget_bytes)
        best, finished = self.branch_and_bound(budget_bytes, incumbent, max_evaluations)
        if best is None:
            names, lowest = self.lowest_peak()
            if lowest <= budget_bytes:  # the cut-short search missed what local search found
                best, finished = self._prune(names, budget_bytes), False
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
            proven_optimal=finished,
            evaluations=self.evaluations - start,
        )


def _tree_key(name: str) -> tuple[object, ...]:
    """Sort key that puts a module right before its descendants, numbered children in order."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in name.split("."))


def solve(profile: Profile, budget_bytes: int, max_evaluations: int = 20_000) -> Solution:
    """The cheapest plan (least recompute time) whose predicted peak is within the budget.

    Raises :class:`InfeasibleBudgetError` (with the smallest budget found to fit) when no
    plan fits.
    """
    return Solver(profile).solve(budget_bytes, max_evaluations)


def lowest_peak(profile: Profile) -> int:
    """The lowest predicted peak of any plan the solver finds (the smallest usable budget)."""
    return Solver(profile).lowest_peak()[1]
