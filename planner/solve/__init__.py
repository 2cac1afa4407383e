"""Choose what to checkpoint: the least recompute time whose predicted peak fits the budget.

Owns the unit tree, the exact memory rows, the three searches over them and planning
(profile + budget -> plan); imports only ``planner.core`` and ``planner.plan``, numpy and
scipy: no torch. The memory of a plan comes from
:class:`planner.plan.memory_model.MemoryModel`; its cost is the summed forward time of what it
recomputes.

A plan is a set of units, at most one per root-to-leaf path of the module tree. Every
answer is checked with the exact replay (``MemoryModel.peak_bytes``). Which search answers
a budget: exhaustive branch and bound for small trees (:mod:`planner.solve.exhaustive`), a
dynamic program over the unit tree with lazy rows for large ones
(:mod:`planner.solve.tree_dp`), and an integer program with lazy constraints
(:mod:`planner.solve.integer_program`) for rows the dynamic program cannot represent. What
each search does and why it is exact: docs/how-it-works.md, "The solver".
"""

from planner.solve.solver import Solution, Solver, lowest_peak, solve

__all__ = ["Solution", "Solver", "lowest_peak", "solve"]
