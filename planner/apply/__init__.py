"""Apply a plan to a live model: wrap the chosen submodules in activation checkpointing
(or offloading).

The lowest torch layer: it knows plans (:mod:`planner.plan.plan_file`) and the switches a
plan sets in a model (:mod:`planner.model_switches`), and nothing of model files, profiling
or checking; every training script imports it. One job per module:

* :mod:`~planner.apply.wrap`: :func:`apply_plan` and :func:`remove_plan`, the checkpointed
  forward (selective policies, ``checkpoint_sequential`` segments);
* :mod:`~planner.apply.locate`: the model a plan was made for (:func:`model_fingerprint`),
  found inside wrappers, and the parallel layout it runs in;
* :mod:`~planner.apply.guard`: the first-forward guard (:func:`step_differences`);
* :mod:`~planner.apply.offload`: an offloaded module's saved tensors, sent to host memory
  when its forward ends and brought back for its backward;
* :mod:`~planner.apply.observe`: the recomputation observer that a plan check and timing
  install (:func:`observing_recomputation`);
* :mod:`~planner.apply.tensors`: the tensors inside a batch, described as a plan records
  them.
"""

from planner.apply.guard import step_differences
from planner.apply.locate import layout_mismatch, model_fingerprint
from planner.apply.observe import Region, observing_recomputation
from planner.apply.wrap import (
    apply_plan,
    is_cached_op,
    is_wrapped,
    remove_plan,
    selective_contexts,
    wrapped_modules,
)

__all__ = [
    "Region",
    "apply_plan",
    "is_cached_op",
    "is_wrapped",
    "layout_mismatch",
    "model_fingerprint",
    "observing_recomputation",
    "remove_plan",
    "selective_contexts",
    "step_differences",
    "wrapped_modules",
]
