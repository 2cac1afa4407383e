"""The training loop's shape: where gradients are zeroed, how many micro-batches a step
accumulates (docs/architecture.md, "The loop's shape").

The step a plan describes must be the step the user runs. Frameworks run the same forward,
backward and optimizer step in different orders, and the order decides which gradients are
alive during the forward, where activations peak:

* **Plain loop** (``zero_grad`` before the forward; the default): last step's gradients
  are freed before the forward, and backward makes new ones.
* **Lightning** (automatic optimization): ``zero_grad`` runs inside the closure *after*
  the forward (``training_step``) and before backward, so last step's gradients are alive
  during the forward.
* **Gradient accumulation** over N micro-batches: micro-batches 2..N run their forward with
  the accumulated gradients alive, and their backward adds each new gradient into the
  existing ``.grad`` (a temporary per parameter while it is added); ``zero_grad`` and the
  optimizer step come once per N micro-batches.
* **Without syncing** (``no_sync``) the micro-batches before the last skip the gradients'
  all-reduce or reduce-scatter (DDP's ``no_sync()``, FSDP2's
  ``set_requires_gradient_sync(False)``), as Hugging Face's Trainer, accelerate and
  Lightning do when they accumulate. Under FSDP2 that keeps every parameter's *unsharded*
  gradient from the first micro-batch's backward to the last's, which the last micro-batch
  alone does not show: the step recorded is the cycle (docs/distributed.md, "Gradient
  accumulation without syncing").

A :class:`LoopShape` names one of these; :func:`planner.measure.workload.run_training_step`
runs it, and plans and profiles record it (``"loop": {"zero_grad": "before-forward",
"grad_accum": 1}``; a file without it was made for the plain loop). Pure Python, no torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from planner.core.errors import LoopShapeError

__all__ = ["PLAIN_LOOP", "LoopShape", "ZeroGrad", "loop_from_dict", "loop_to_dict"]


class ZeroGrad(str, enum.Enum):
    """Where the loop calls ``optimizer.zero_grad(set_to_none=True)``."""

    BEFORE_FORWARD = "before-forward"
    """A plain loop: last step's gradients are freed before the forward."""
    AFTER_FORWARD = "after-forward"
    """Lightning's automatic optimization: after the forward, before backward; last step's
    gradients are alive during the forward."""


@dataclass(frozen=True)
class LoopShape:
    """How the training loop orders one step (see the module docstring).

    ``zero_grad``: where gradients are zeroed (:class:`ZeroGrad`). ``grad_accum``: the
    micro-batches accumulated per optimizer step (1: none). With ``grad_accum`` > 1 the step
    measured is the worst micro-step for memory, the last one: the gradients of the ones
    before it are alive during its forward, its backward accumulates into them, and the
    optimizer step follows it. Where ``zero_grad`` falls does not change that micro-step (it
    zeroes in the first micro-step of a cycle, before or after its forward), so both values
    give the same step.

    ``no_sync``: the micro-batches before the last run without syncing gradients across
    ranks (see the module docstring; only with ``grad_accum`` > 1). The step measured is
    then the cycle, shortened to :attr:`micro_batches_run` micro-batches: the first
    (from zeroed gradients), one standing for the 2nd..(N-1)th (identical steps, each with
    the unsynced gradients alive) where N > 2, and the last, which syncs; then the
    optimizer step.
    """

    zero_grad: ZeroGrad = ZeroGrad.BEFORE_FORWARD
    grad_accum: int = 1
    no_sync: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "zero_grad", ZeroGrad(self.zero_grad))
        except ValueError:
            choices = ", ".join(choice.value for choice in ZeroGrad)
            raise LoopShapeError(
                f"zero_grad must be one of {choices}, not {self.zero_grad!r}"
            ) from None
        if (
            not isinstance(self.grad_accum, int)
            or isinstance(self.grad_accum, bool)
            or self.grad_accum < 1
        ):
            raise LoopShapeError(
                f"grad_accum must be a whole number of micro-batches >= 1, not "
                f"{self.grad_accum!r} (1 means no accumulation)"
            )
        if not isinstance(self.no_sync, bool):
            raise LoopShapeError(f"no_sync must be true or false, not {self.no_sync!r}")
        if self.no_sync and not self.accumulates:
            raise LoopShapeError(
                "no_sync needs gradient accumulation (grad_accum > 1): with one micro-batch "
                "per optimizer step every backward syncs"
            )

    @property
    def micro_batches_run(self) -> int:
        """Micro-batches one measured step runs: 1, or with ``no_sync`` the shortened cycle
        (the first, one of the middle ones where there are any, the last)."""
        return min(self.grad_accum, 3) if self.no_sync else 1

    @property
    def accumulates(self) -> bool:
        """Whether backward adds into gradients that already exist (``grad_accum`` > 1)."""
        return self.grad_accum > 1

    @property
    def gradients_in_forward(self) -> bool:
        """Whether gradients from before are alive during the measured step's forward: then
        that step needs a step before it to make them (a warm-up step does)."""
        return self.accumulates or self.zero_grad is ZeroGrad.AFTER_FORWARD

    @property
    def starts_a_cycle(self) -> bool:
        """Whether the measured step is the first of an optimizer step's micro-batches, so
        zeroes the gradients (before its forward or after it): a loop that does not
        accumulate, or a ``no_sync`` cycle; the last micro-batch of one that accumulates is
        no cycle's first."""
        return self.no_sync or not self.accumulates

    def step_words(self) -> str:
        """What one measured step is, for "of a 5.0 ms step" lines: "step", or with
        ``no_sync`` "cycle of 3 micro-batches"."""
        if self.no_sync:
            return f"{self.step_name} of {self.micro_batches_run} micro-batches"
        return self.step_name

    @property
    def step_name(self) -> str:
        """One word for a measured step, for "recompute per step" labels: "step", or
        "cycle" with ``no_sync``."""
        return "cycle" if self.no_sync else "step"

    def describe(self) -> str:
        """One line for summaries: the loop, and what it means for the measured step."""
        if self.no_sync:
            middle = "; the 2nd..(N-1)th alike" if self.grad_accum > 2 else ""
            return (
                f"gradient accumulation over {self.grad_accum} micro-batches without syncing "
                "before the last (no_sync): planned for the whole cycle, whose unsynced "
                f"gradients are alive from the first backward to the last{middle}"
            )
        if self.accumulates:
            return (
                f"gradient accumulation over {self.grad_accum} micro-batches: planned for the "
                "last, whose forward runs with the accumulated gradients alive and whose "
                "backward adds into them"
            )
        if self.zero_grad is ZeroGrad.AFTER_FORWARD:
            return (
                "zero_grad after the forward (Lightning): last step's gradients alive during "
                "the forward"
            )
        return "plain loop: zero_grad before the forward, no gradient accumulation"


PLAIN_LOOP = LoopShape()
"""The default: ``zero_grad`` before the forward, no accumulation."""


def loop_to_dict(loop: LoopShape) -> dict[str, Any]:
    """The JSON object plans and profiles record: ``{"zero_grad": ..., "grad_accum": ...}``,
    and ``"no_sync": true`` where set (left out otherwise, so files for other loops read
    as before)."""
    data: dict[str, Any] = {"zero_grad": loop.zero_grad.value, "grad_accum": loop.grad_accum}
    if loop.no_sync:
        data["no_sync"] = True
    return data


def loop_from_dict(data: Any) -> LoopShape:
    """The :class:`LoopShape` of a plan's or profile's ``"loop"`` object; None (absent)
    means the plain loop. Raises :class:`LoopShapeError` for anything else."""
    if data is None:
        return PLAIN_LOOP
    if not isinstance(data, dict) or set(data) - {"zero_grad", "grad_accum", "no_sync"}:
        raise LoopShapeError(
            f'"loop" should be an object with zero_grad and grad_accum, not {data!r}'
        )
    return LoopShape(
        zero_grad=data.get("zero_grad", ZeroGrad.BEFORE_FORWARD.value),
        grad_accum=data.get("grad_accum", 1),
        no_sync=data.get("no_sync", False),
    )
