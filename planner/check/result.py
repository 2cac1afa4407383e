"""What a check of a plan finds: :class:`PlanCheck`, and each :class:`Difference` between the
planned step and its reference (:class:`CheckReference`). Plain data: no torch here."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from planner.core.allocator import ReservedVerdict, reserved_verdict

__all__ = ["CheckReference", "Difference", "DifferenceKind", "PlanCheck"]


class CheckReference(str, enum.Enum):
    """What a planned step is compared with (see :mod:`planner.check.compare`)."""

    UNPLANNED = "unplanned"
    RECOMPUTATION = "recomputation"


class DifferenceKind(enum.Enum):
    """What a :class:`Difference` is about."""

    LOSS = "loss"
    """The loss (``detail``: ``planned != unplanned reference``)."""
    GRADIENT = "gradient"
    """The gradient of the parameter ``name``."""
    BUFFER = "buffer"
    """The buffer ``name`` (``detail``: how, where it says more than that it differs)."""
    RNG_STATE = "rng state"
    """The RNG state after backward (``detail``: why)."""
    RECOMPUTATION = "recomputation"
    """The recomputation of the checkpointed function ``name`` (``detail``: where it differs
    from its forward)."""
    STOPPED = "stopped"
    """The planned step was stopped at its memory limit (``detail``: the limit's error)."""
    UNREPRODUCIBLE = "unreproducible"
    """Two unplanned steps differ: no bit-exact reference (``detail``: by how much)."""


@dataclass(frozen=True)
class Difference:
    """One thing a planned step did not do as its reference did. ``rank``: the rank of a
    ``torchrun`` job it was found on (None for one process). ``str()`` says it in words."""

    kind: DifferenceKind
    name: str = ""
    detail: str = ""
    rank: int | None = None

    def __str__(self) -> str:
        match self.kind:
            case DifferenceKind.LOSS:
                words = f"loss {self.detail}"
            case DifferenceKind.GRADIENT:
                words = f"gradient of {self.name}"
            case DifferenceKind.BUFFER:
                words = " ".join(filter(None, ("buffer", self.name, self.detail)))
            case DifferenceKind.RNG_STATE:
                words = f"backward changed the RNG state ({self.detail})"
            case DifferenceKind.RECOMPUTATION:
                words = f"recomputation of {self.name} {self.detail}"
            case DifferenceKind.STOPPED:
                words = f"stopped: {self.detail}"
            case DifferenceKind.UNREPRODUCIBLE:
                words = f"not compared bit for bit: {self.detail}"
        return words if self.rank is None else f"rank {self.rank}: {words}"

    def on_rank(self, rank: int) -> Difference:
        return replace(self, rank=rank)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Difference:
        return cls(**{**data, "kind": DifferenceKind(data["kind"])})


@dataclass(frozen=True)
class PlanCheck:
    """The result of running a plan against a reference (:class:`CheckReference`).

    Against the unplanned step, ``loss_equal``, ``gradients_equal`` and ``buffers_equal``
    compare the two steps and ``unplanned_peak_bytes`` is the unplanned step's peak. Against
    the recomputation, ``recomputation_equal`` says whether every recomputed op matched its
    forward (``recompute_mismatches`` names the modules that did not), ``buffers_equal``
    whether backward left buffers and the RNG state as the forward did; loss and gradients
    follow from those (``loss_equal``/``gradients_equal`` are None: not compared directly),
    and ``unplanned_peak_bytes`` is None (the unplanned step was not run).
    """

    budget_bytes: int
    measured_peak_bytes: int
    unplanned_peak_bytes: int | None
    loss_equal: bool | None
    gradients_equal: bool | None
    buffers_equal: bool | None
    max_gradient_difference: float
    differences: tuple[Difference, ...]
    state_dict_keys_equal: bool
    reference: CheckReference = CheckReference.UNPLANNED
    recomputation_equal: bool | None = None
    recomputed_ops: int = 0
    recompute_mismatches: tuple[str, ...] = field(default_factory=tuple)
    # For each of ``recompute_mismatches``, in order: where its recomputation first differed.
    mismatch_reasons: tuple[Difference, ...] = field(default_factory=tuple)
    # CUDA: the planned step's reserved peak (the caching allocator's segments: what runs
    # out of memory; planner.core.allocator). None where not measured (CPU).
    reserved_peak_bytes: int | None = None

    @property
    def within_budget(self) -> bool:
        """The allocated peak (``max_memory_allocated``: the budget's meaning) fits."""
        return self.measured_peak_bytes <= self.budget_bytes

    @property
    def reserved(self) -> ReservedVerdict | None:
        """The reserved peak against the budget, where it was measured."""
        if self.reserved_peak_bytes is None:
            return None
        return reserved_verdict(
            self.measured_peak_bytes, self.reserved_peak_bytes, self.budget_bytes
        )

    @property
    def training_unchanged(self) -> bool:
        compared = (
            self.loss_equal,
            self.gradients_equal,
            self.buffers_equal,
            self.recomputation_equal,
        )
        return all(value is not False for value in compared)

    @property
    def passed(self) -> bool:
        return self.within_budget and self.training_unchanged and self.state_dict_keys_equal

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlanCheck:
        """The check as :func:`dataclasses.asdict` and JSON left it (a child's answer)."""
        return cls(
            **{
                **data,
                "reference": CheckReference(data["reference"]),
                "differences": tuple(map(Difference.from_json, data["differences"])),
                "recompute_mismatches": tuple(data["recompute_mismatches"]),
                "mismatch_reasons": tuple(map(Difference.from_json, data["mismatch_reasons"])),
            }
        )
