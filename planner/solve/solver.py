"""The solver's front: which search answers a budget (exhaustive for small trees, the tree
program, the integer program where the tree program cannot take a row), the lowest feasible
peak, and the "budget too small" error that says what the floor is made of."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from planner.core.errors import InfeasibleBudgetError
from planner.core.parallel import ParallelStrategy
from planner.core.records import Phase, Profile, Unit
from planner.core.units import format_bytes, format_bytes_apart
from planner.plan.memory_model import MemoryModel
from planner.plan.policies import NESTED, OFFLOAD_OPTIONS
from planner.solve.exhaustive import branch_and_bound
from planner.solve.integer_program import IntegerProgram
from planner.solve.rows import MemoryRows, PlanPeaks
from planner.solve.tree import UnitTree
from planner.solve.tree_dp import Incompatible, TreeDP

__all__ = ["Solution", "Solver", "lowest_peak", "solve"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Solution:
    """A set of units to checkpoint (sorted) with its predicted peak and recompute cost.

    ``proven_optimal``: no plan within the budget recomputes in less. Otherwise
    ``lower_bound_ms`` is what the search proved: no plan within the budget recomputes in
    less than that (at the integer program's cost resolution,
    :attr:`~planner.solve.integer_program.IntegerProgram.quantum_ms` per unit); 0.0 where it
    proved nothing (an exhaustive search cut short)."""

    units: tuple[Unit, ...]
    predicted_peak_bytes: int
    recompute_ms: float
    proven_optimal: bool
    evaluations: int
    lower_bound_ms: float

    @property
    def module_names(self) -> tuple[str, ...]:
        """The modules the units are on, one per unit."""
        return tuple(unit.module for unit in self.units)


# A unit costing less than this is free to the searches (their time resolution is 10 us):
# a plan keeps it only where the budget needs it (Solver._without_idle_units).
IDLE_UNIT_MS = 0.01


class Solver:
    """Holds a profile's memory model and unit tree; answers many budgets quickly.

    ``tree`` (:class:`~planner.solve.tree.UnitTree`) is what may be chosen; ``peak`` the
    exact replay of a plan; the tree program and the integer program are built on first
    need and share their memory rows, so a sweep of budgets reuses the rows found.

    ``offload``: whether modules may offload their saved tensors (where the profile offers
    it: a device spec with a host link); ``host_budget_bytes`` bounds the host memory the
    offloaded modules hold together (:meth:`UnitTree.host`; None: no bound). Every search
    keeps to it: the exhaustive one prunes on it, the integer program has it as a row, and
    an answer of the tree program that passes it (it ignores it) goes to the integer
    program."""

    def __init__(
        self,
        profile: Profile,
        memory: MemoryModel | None = None,
        *,
        sequential: bool = True,
        options: bool = True,
        nesting: bool = True,
        offload: bool = True,
        host_budget_bytes: int | None = None,
        exhaustive_evaluations: int = 2_000,
        against_module_only: bool = True,
    ) -> None:
        self.profile = profile
        self.memory = memory or MemoryModel.for_profile(profile)
        self.exhaustive_evaluations = exhaustive_evaluations
        self.tree = UnitTree(
            profile,
            self.memory,
            sequential=sequential,
            options=options,
            nesting=nesting,
            offload=offload,
        )
        self.offload = offload and any(unit.option in OFFLOAD_OPTIONS for unit in self.tree.names)
        self.host_budget_bytes = host_budget_bytes if self.offload else None
        # Nesting is the last resort (see solve): the same search without it, first.
        self._without_nesting: Solver | None = None
        if nesting and any(unit.option == NESTED for unit in self.tree.names):
            self._without_nesting = Solver(
                profile,
                self.memory,
                sequential=sequential,
                options=options,
                nesting=False,
                offload=offload,
                host_budget_bytes=host_budget_bytes,
                exhaustive_evaluations=exhaustive_evaluations,
                against_module_only=False,  # this solver compares its answers
            )
        # The module-only solver every answer is checked against (see the class notes).
        self._module_only: Solver | None = None
        self._against_module_only = against_module_only and any(
            unit.option is not None for unit in self.tree.names
        )
        self._sequential = sequential
        self.names = self.tree.names
        self.plan_count = self.tree.plan_count
        self.peak = PlanPeaks(self.memory)
        self.integer_program_used = False
        self._memory_rows: MemoryRows | None = None
        self._integer_program: IntegerProgram | None = None
        self._tree_program: TreeDP | None = None
        self._known: list[tuple[int, float, tuple[Unit, ...]]] = []
        self._lowest: tuple[tuple[Unit, ...], int] | None = None
        # No plan's peak is below this (the lowest peak itself once that is proven).
        self.lowest_bound_bytes = 1 << 62

    @property
    def evaluations(self) -> int:
        """Plans replayed exactly so far."""
        return self.peak.evaluations

    def cost(self, units: Iterable[Unit]) -> float:
        return self.tree.cost(units)

    def conflicts(self, first: Unit, second: Unit) -> bool:
        return self.tree.conflicts(first, second)

    # -- the solvers, built on first need ----------------------------------------------
    def memory_rows(self) -> MemoryRows:
        if self._memory_rows is None:
            self._memory_rows = MemoryRows(self.tree, self.memory)
        return self._memory_rows

    def tree_program(self) -> TreeDP:
        if self._tree_program is None:
            self._tree_program = TreeDP(self.tree, self.memory_rows(), self.peak)
        return self._tree_program

    def integer_program(self) -> IntegerProgram:
        if self._integer_program is None:
            self._integer_program = IntegerProgram(
                self.tree, self.memory_rows(), self.peak, self.host_budget_bytes
            )
        return self._integer_program

    def host_fits(self, units: Iterable[Unit]) -> bool:
        """Whether a plan's offloaded modules keep to the host budget."""
        return self.host_budget_bytes is None or self.tree.host(units) <= self.host_budget_bytes

    def _tree_answer(self, best: tuple[Unit, ...] | None) -> tuple[Unit, ...] | None:
        """The tree program's answer where it keeps to the host budget (which it does not
        see: it is then the cheapest that does too); else Incompatible."""
        if best is not None and not self.host_fits(best):
            raise Incompatible(f"host memory of {best}")
        return best

    # -- answers -----------------------------------------------------------------------
    def _floor_explanation(self, names: tuple[Unit, ...]) -> str:
        """What the lowest peak is made of, and what would lower it where plans cannot."""
        static = (
            "static memory alone (parameters, gradients, optimizer state) is "
            f"{format_bytes(self.profile.static_bytes)}"
        ) + self._pipeline_sharding_floor()
        curve = self.memory.memory_curve(names)
        phases = self.memory.timeline.phase_end_events
        backward_end = phases.get(Phase.BACKWARD)
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

    def _pipeline_sharding_floor(self) -> str:
        """Under a pipeline with FSDP2, what of the floor is the stage's weights gathered and
        gradients unsharded: torch's pipelining keeps them from the first micro-batch's
        backward to the last (``set_reshard_after_backward(False)``,
        ``set_requires_gradient_sync(False)``; docs/distributed.md, "Pipeline stages"). Their
        size is the rank's shards times the shard count (a shard's padding aside); '' for any
        other layout."""
        layout = self.profile.parallel
        if (
            layout is None
            or layout.pipeline is None
            or layout.strategy is not ParallelStrategy.FSDP2
        ):
            return ""
        shards = layout.world_size // layout.pipeline.stages
        if shards < 2:
            return ""
        gathered = self.profile.parameter_bytes * shards
        unsharded = self.profile.gradient_bytes * shards
        return (
            f"; beside it this stage holds its parameters gathered (about "
            f"{format_bytes(gathered)}) and its gradients unsharded (about "
            f"{format_bytes(unsharded)}), which torch's pipelining keeps under FSDP2 from the "
            "first micro-batch's backward to the last and no checkpointing lowers: more "
            "pipeline stages (--pp) put fewer layers, and so fewer of both, on each rank"
        )

    def lowest_peak(self) -> tuple[tuple[Unit, ...], int]:
        """The plan with the lowest predicted peak (ties: the cheapest; and a plan without
        nesting where one reaches it: nesting is the last resort, see :meth:`solve`).

        Proven lowest, except where the integer program's bound stalls (see
        :meth:`IntegerProgram.lowest_peak`): then the best plan found, and
        :attr:`lowest_bound_bytes` is the peak no plan goes below."""
        if self._lowest is None:
            if self._without_nesting is not None:
                plain, plain_peak = self._without_nesting.lowest_peak()
                nested, nested_peak = self._lowest_peak()
                if nested_peak < plain_peak:
                    self._lowest = (nested, nested_peak)
                else:
                    self._remember(plain)
                    self._lowest = (plain, plain_peak)
            else:
                self._lowest = self._lowest_peak()
        return self._lowest

    def _lowest_peak(self) -> tuple[tuple[Unit, ...], int]:
        best, finished = None, False
        if self.plan_count <= self.exhaustive_evaluations:
            best, finished = branch_and_bound(
                self.tree, self.peak, None, self.exhaustive_evaluations, self.host_budget_bytes
            )
        if not finished:
            try:
                best = self._tree_answer(self.tree_program().lowest_peak())
                assert best is not None
                # Among the plans with that peak, the cheapest.
                cheapest = self._tree_answer(
                    self.tree_program().solve(self.peak(best), fitting=best)
                )
                best = best if cheapest is None else cheapest
            except Incompatible:
                best = self.integer_program().lowest_peak()
                self.lowest_bound_bytes = self.integer_program().lowest_bound_bytes
        assert best is not None
        self._remember(best)
        self.lowest_bound_bytes = min(self.lowest_bound_bytes, self.peak(best))
        return best, self.peak(best)

    def solve(self, budget_bytes: int, max_evaluations: int | None = None) -> Solution:
        """The cheapest plan whose predicted peak is within ``budget_bytes``; with options,
        never one that costs more time or FLOPs than the module-only plan (class notes).

        Nesting is the last resort: it only lowers the smallest feasible budget (its inner
        modules run a third time, and its memory is not of the tree program's prefix
        form), so the plan is the cheapest without nesting wherever one fits, and the
        cheapest of all plans (by the integer program) only below that."""
        solution = self._solve(budget_bytes, max_evaluations)
        if not self._against_module_only:
            return solution
        if self._module_only is None:
            self._module_only = Solver(
                self.profile,
                self.memory,
                sequential=self._sequential,
                options=False,
                exhaustive_evaluations=self.exhaustive_evaluations,
            )
        try:
            module_only = self._module_only.solve(budget_bytes, max_evaluations)
        except InfeasibleBudgetError:  # only a plan with options fits
            return solution
        slower = solution.recompute_ms > module_only.recompute_ms * (1 + 1e-9)
        more_flops = self.recompute_flops(solution.units) > self.recompute_flops(module_only.units)
        if not (slower or more_flops):
            return solution
        logger.debug(
            "the plan with options costs more %s than the module-only plan; taking that",
            "time" if slower else "FLOPs",
        )
        self._remember(module_only.units)
        return Solution(
            units=module_only.units,
            predicted_peak_bytes=module_only.predicted_peak_bytes,
            recompute_ms=module_only.recompute_ms,
            # Cheapest among module-only plans; a plan with options may still be cheaper.
            proven_optimal=module_only.proven_optimal and slower,
            evaluations=solution.evaluations + module_only.evaluations,
            lower_bound_ms=min(solution.lower_bound_ms, module_only.recompute_ms),
        )

    def recompute_flops(self, units: Iterable[Unit]) -> int:
        """The FLOPs a plan's recomputation runs (as recorded: matmuls, convolutions,
        attention): each unit's module forward, option, or checkpointed segments."""
        from planner.solve.planning import recomputed_modules

        total = 0
        for unit in units:
            if unit.option is not None:
                total += self.profile.module(unit.module).option_cost(unit.option).recompute_flops
            else:
                total += sum(
                    self.profile.module(name).forward_flops
                    for name in recomputed_modules(self.profile, unit)
                )
        return total

    def _solve(self, budget_bytes: int, max_evaluations: int | None) -> Solution:
        if self._without_nesting is not None:
            try:
                return self._without_nesting.solve(budget_bytes, max_evaluations)
            except InfeasibleBudgetError:
                logger.debug("no plan without nesting fits %d bytes; nesting allowed", budget_bytes)
        start = self.evaluations
        limit = self.exhaustive_evaluations if max_evaluations is None else max_evaluations
        best, proven, bound_ms = None, False, 0.0
        if self.plan_count <= limit:
            best, proven = branch_and_bound(
                self.tree, self.peak, budget_bytes, limit, self.host_budget_bytes
            )
        if not proven:
            try:
                best = self._tree_answer(
                    self.tree_program().solve(budget_bytes, fitting=self._fitting(budget_bytes))
                )
                proven = True
            except Incompatible as error:
                logger.debug("tree DP cannot take row %s; solving the integer program", error)
                self.integer_program_used = True
                # Below the lowest peak no plan fits (proven, or the lowest found where
                # that search stalled: the two answers agree).
                if budget_bytes >= self.lowest_peak()[1]:
                    program = self.integer_program()
                    best, proven = program.solve(budget_bytes, self._fitting(budget_bytes))
                    bound_ms = program.cost_bound_ms
        if best is None:
            names, lowest = self.lowest_peak()
            if lowest <= budget_bytes:  # cannot happen with a finished search; be safe
                best, proven = names, False
        if best is None:
            budget_text, lowest_text = format_bytes_apart(budget_bytes, lowest)
            unproven = ""
            if self.lowest_bound_bytes < lowest:
                unproven = (
                    "; the lowest found, and no plan peaks below "
                    f"{format_bytes(self.lowest_bound_bytes)}"
                )
            raise InfeasibleBudgetError(
                f"no checkpointing plan fits {budget_text}: the smallest budget "
                f"that fits is {lowest_text} ({lowest} bytes, checkpointing "
                f"{len(names)} module{'s' if len(names) != 1 else ''}{unproven}); "
                + self._floor_explanation(names)
                + (f"; {note}" if (note := self.profile.excluded_blocks_note()) else ""),
                budget_bytes=budget_bytes,
                min_budget_bytes=lowest,
            )
        best = self._without_idle_units(best, budget_bytes)
        self._remember(best)
        return Solution(
            units=best,
            predicted_peak_bytes=self.peak(best),
            recompute_ms=self.cost(best),
            proven_optimal=proven,
            evaluations=self.evaluations - start,
            lower_bound_ms=self.cost(best) if proven else min(bound_ms, self.cost(best)),
        )

    def _without_idle_units(self, units: tuple[Unit, ...], budget_bytes: int) -> tuple[Unit, ...]:
        """``units`` less those that cost (next to) nothing and that the plan fits the budget
        without. The searches are indifferent to a free unit (an offload whose copies the
        compute hides costs 0 ms), so a cheapest plan may hold more of them than the budget
        needs: among plans of the same cost, fewer modules and less host memory are
        better. Tried one at a time, the most host memory first, each removal checked by
        exact replay; a unit with a cost is never removed (the plan stays the cheapest)."""
        idle = sorted(
            (unit for unit in units if self.tree.cost_ms[unit] < IDLE_UNIT_MS),
            key=lambda unit: -self.tree.host_bytes[unit],
        )
        kept = list(units)
        for unit in idle:
            fewer = tuple(other for other in kept if other != unit)
            if self.peak(fewer) <= budget_bytes:
                kept = list(fewer)
        return tuple(kept)

    def _remember(self, plan: tuple[Unit, ...]) -> None:
        self._known.append((self.peak(plan), self.cost(plan), plan))

    def _fitting(self, budget_bytes: int) -> tuple[Unit, ...] | None:
        """The cheapest plan solved before whose peak fits this budget (bounds the DP)."""
        fitting = [(cost, plan) for peak, cost, plan in self._known if peak <= budget_bytes]
        return min(fitting)[1] if fitting else None


def solve(profile: Profile, budget_bytes: int, max_evaluations: int | None = None) -> Solution:
    """The cheapest plan (least recompute time) whose predicted peak is within the budget.

    Raises :class:`InfeasibleBudgetError` (with the smallest budget that fits) when no plan
    fits.
    """
    return Solver(profile).solve(budget_bytes, max_evaluations)


def lowest_peak(profile: Profile) -> int:
    """The lowest predicted peak of any plan (the smallest usable budget)."""
    return Solver(profile).lowest_peak()[1]
