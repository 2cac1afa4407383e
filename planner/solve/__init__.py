"""Choose what to checkpoint: the least recompute time whose predicted peak fits the budget.

Owns the unit tree, the exact memory rows, the three searches over them and planning
(profile + budget -> plan); imports only ``planner.core`` and ``planner.plan``, numpy and
scipy: no torch.

The memory of a plan comes from
:class:`planner.plan.memory_model.MemoryModel`; its cost is the summed forward time of what it
recomputes.

What is chosen
--------------
A plan is a set of *units* (:class:`~planner.core.records.Unit`). A unit is a candidate
module (``blocks.3``: wrap it in ``checkpoint``), one of its options (a selective policy,
nesting) or, for a candidate ``nn.Sequential`` with at least three children, ``name#k``:
``checkpoint_sequential`` over its children in ``k`` segments. Every unit sits
on one node of the module tree; a plan uses at most one unit per root-to-leaf path (never a
module together with its ancestor: wrapping a parent already recomputes its children).

The search
----------
The peak is not additive over units (recompute spikes, and where the peak falls, move with
the plan), so every answer is checked with the exact replay (``MemoryModel.peak_bytes``).

* **Small trees: exhaustive branch and bound** (:mod:`planner.solve.exhaustive`). When
  there are at most ``exhaustive_evaluations`` plans (counted first by a product over the
  tree): depth-first over the units in tree pre-order, each either taken (its subtree is
  then skipped) or not; a branch whose cost reaches the best known is cut; a plan that fits
  ends its branch. The answer is the cheapest under the memory model.
* **Large trees: a dynamic program over the unit tree with lazy rows**
  (:mod:`planner.solve.tree_dp`). Its state, after visiting the nodes in the order they ran,
  is per recompute cost (in quanta of 10 microseconds, finer for costs of microseconds) the
  least change in live bytes any antichain of the visited units makes. Memory rows (the live
  bytes at one event, or at one unit's recompute spike) are added lazily, as below, and act
  as filters at the place in the visiting order where the row's event falls. That is exact
  when every row has the prefix form a chain of blocks gives (the units that ran before the
  event and are not yet recomputed count in full, the ones after not at all, the running
  module's ancestors freely; see the class). O(units x cost range) per round; a sweep reuses
  the rows found at earlier budgets.
* **Otherwise an integer program with lazy constraints**
  (:mod:`planner.solve.integer_program`, scipy's HiGHS ``milp``), for the budgets whose
  rows the dynamic program cannot represent (one input storage shared by several blocks
  that could each be checkpointed, say).
  Binary ``x_u`` per unit; minimise ``sum_u cost_u x_u`` subject to

  - *one unit per path*: for every leaf of the unit tree, ``sum of x over its path <= 1``;
  - *memory at event t*: ``base(t) + sum_u delta_u(t) x_u <= budget``, where ``base`` is the
    measured curve and ``delta_u`` how unit ``u`` alone changes it (activations dropped
    between its forward and its recomputation, inputs held until its backward ends);
  - *recompute spike of unit u at event r* (only if ``x_u = 1``):
    ``base(r) + sum_v delta_v(r) x_v + spike_u <= budget + M (1 - x_u)``.

  Where units interact through one storage (several checkpoints holding the same input,
  or a checkpoint's input that another unit would drop), helper columns make the rows exact
  (see :mod:`planner.solve.rows`). Memory rows are added lazily: solve, replay the answer
  exactly, add the row of the event (or spike) where the replay exceeds the budget, repeat;
  the loop ends with a plan whose exact replay fits, the cheapest under the memory model
  (``proven_optimal``) at the program's cost resolution (10 microseconds, or finer), unless HiGHS
  hit its time limit. Tests check the rows against the replay and the answers against
  brute force.

The lowest feasible peak (the smallest budget any plan fits, for the "budget too small"
error) is searched the same three ways: exhaustively; by bisection over budgets with the
dynamic program (cost ignored); or by the integer program minimising the peak.
"""

from planner.solve.solver import Solution, Solver, lowest_peak, solve

__all__ = ["Solution", "Solver", "lowest_peak", "solve"]
