"""Running plans for real: the recomputation probe that tries each candidate before the
solver chooses (``safety``), the check that runs a plan in its own process against the
unplanned step or the recomputation (``compare``; ``python -m planner.check.compare``; its
op hashes in ``recompute_hashes``), the same check on the ranks of a ``torchrun`` job
(``ranks``), the child-process protocol both use (``child``), what a check finds
(``result``: ``PlanCheck``, ``Difference``), and ``ckpt-plan verify``'s result (``verify``).

May import ``planner.measure``, ``planner.apply`` and the layers below them; never
``planner.pipeline`` or the cli. Import a submodule by name: this package imports nothing.
"""
