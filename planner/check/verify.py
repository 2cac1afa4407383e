"""Verify a written plan against its model file: what ``ckpt-plan verify`` runs.

:func:`verify_plan` reads the plan, loads the model file, warns when the model file's batch is
not the one the plan was measured with, and runs :func:`planner.check.compare.check_plan` (the
unplanned and the planned step from the same seed, in a separate process, in the training
loop's shape the plan records). The result, :class:`Verification`, says whether the plan
passed and, if not, what differs, one item per problem, in words a person can act on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.apply.tensors import describe_batch
from planner.check.compare import check_plan
from planner.check.ranks import RanksCheck, check_plan_on_ranks
from planner.check.result import CheckReference, Difference, DifferenceKind, PlanCheck
from planner.core.allocator import (
    ALLOCATOR_SETTING,
    ALLOCATOR_VARIABLE,
    ReservedVerdict,
    missing_setting_warning,
)
from planner.core.devices import device_type
from planner.core.errors import ModelFileError, PlanMismatchError, PlannerError
from planner.core.units import format_bytes
from planner.measure.model_file import _user_code
from planner.measure.source import WorkloadSource
from planner.measure.workload import load_model_file
from planner.plan.plan_file import Plan, load_plan

__all__ = [
    "Verification",
    "batch_mismatch_warning",
    "format_batch",
    "reserved_failure",
    "verify_plan",
]

WarningCallback = Callable[[str], None]
"""Called with each one-line warning once the check has run (unless the plan turned out to be
for another model, which makes the warnings moot)."""


@dataclass(frozen=True)
class Verification:
    """A plan run against its model file. ``check`` holds the measurements."""

    model_path: Path
    plan_path: Path
    plan: Plan
    check: PlanCheck
    device: str
    seed: int
    warnings: tuple[str, ...]
    ranks: RanksCheck | None = None

    @property
    def passed(self) -> bool:
        """Training unchanged, and both the allocated and (CUDA) the reserved peak within
        the budget: an out-of-memory error comes from reserved memory."""
        reserved = self.check.reserved
        return self.check.passed and (reserved is None or reserved.within_budget)

    @property
    def prediction_error(self) -> float:
        """(measured - predicted) / predicted peak of the planned step."""
        predicted = self.plan.predicted_peak_bytes
        return (self.check.measured_peak_bytes - predicted) / predicted if predicted else 0.0

    def failures(self) -> tuple[str, ...]:
        """What differs from the unplanned step or the budget, one item each; empty if passed."""
        check = self.check
        found = []
        if check.recomputation_equal is False:
            recomputations = _of_kind(check.differences, DifferenceKind.RECOMPUTATION)
            found.append(
                "recomputation differs from the forward: "
                + _some(list(check.recompute_mismatches))
                + " ("
                + "; ".join(map(str, recomputations))[:300]
                + ")"
            )
        if check.loss_equal is False:
            losses = _of_kind(check.differences, DifferenceKind.LOSS)
            found.append(f"the loss differs ({losses[0]})" if losses else "the loss differs")
        if check.gradients_equal is False:
            gradients = _of_kind(check.differences, DifferenceKind.GRADIENT)
            found.append(
                f"gradients differ (max difference {check.max_gradient_difference:.3g}): "
                + _some([difference.name for difference in gradients])
            )
        if check.buffers_equal is False:
            buffers = _of_kind(check.differences, DifferenceKind.BUFFER)
            found.append("buffers differ: " + _some([difference.name for difference in buffers]))
            if check.reference is CheckReference.RECOMPUTATION:
                found[-1] = "buffers or RNG state changed during backward: " + "; ".join(
                    str(d) for d in check.differences if d.kind is not DifferenceKind.RECOMPUTATION
                )
        if not check.state_dict_keys_equal:
            found.append("applying the plan changed the state_dict keys")
        if not check.within_budget:
            over = check.measured_peak_bytes - check.budget_bytes
            found.append(
                f"the measured peak {format_bytes(check.measured_peak_bytes)} is "
                f"{format_bytes(over)} over the budget {format_bytes(check.budget_bytes)}"
            )
        if (reserved := check.reserved) is not None and reserved.reserved_over_bytes:
            found.append(reserved_failure(reserved))
        return tuple(found)


def reserved_failure(reserved: ReservedVerdict) -> str:
    """The failure for a CUDA step whose reserved peak passed the budget."""
    return (
        f"the caching allocator's reserved peak {format_bytes(reserved.reserved_peak_bytes)} is "
        f"{format_bytes(reserved.reserved_over_bytes)} over the budget "
        f"{format_bytes(reserved.budget_bytes)} (allocated peak "
        f"{format_bytes(reserved.allocated_peak_bytes)}): run with "
        f"{ALLOCATOR_VARIABLE}={ALLOCATOR_SETTING}, as the plan assumes, or plan for a lower "
        "budget"
    )


def _of_kind(differences: tuple[Difference, ...], kind: DifferenceKind) -> list[Difference]:
    return [difference for difference in differences if difference.kind is kind]


def _some(names: list[str], shown: int = 3) -> str:
    if not names:
        return "(not named)"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def format_batch(batch: dict[str, Any]) -> str:
    """``describe_batch`` output on one line: ``input_ids=[8, 128] int64, labels=[8] int64``."""

    def one(value: Any) -> str:
        if isinstance(value, dict) and "shape" in value:
            return f"{value['shape']} {value.get('dtype', '')}".strip()
        if isinstance(value, list):
            return "(" + ", ".join(one(item) for item in value) + ")"
        return str(value)

    return ", ".join(f"{key}={one(value)}" for key, value in batch.items()) or "(empty)"


def batch_mismatch_warning(plan: Plan, batch: dict[str, Any]) -> str | None:
    """A one-line warning if ``batch`` (as ``describe_batch`` gives it) is not the plan's."""
    if plan.batch == batch:
        return None
    return (
        f"the plan was measured with batch {format_batch(plan.batch)} but sample_batch() now "
        f"gives {format_batch(batch)}; peaks depend on the batch: re-run `ckpt-plan profile` "
        "for this batch"
    )


def available_memory_bytes(device: str) -> int:
    """Free memory for tensors on ``device``: CUDA's free memory, or the operating system's
    available memory (``MemAvailable``) for the CPU; 0 if it cannot be read."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def choose_reference(plan: Plan, device: str) -> CheckReference:
    """``unplanned`` where the unplanned step (and a copy of its gradients and buffers) fits
    the free memory here, else ``recomputation``."""
    needed = plan.baseline_peak_bytes + plan.static_bytes
    if needed <= available_memory_bytes(device):
        return CheckReference.UNPLANNED
    return CheckReference.RECOMPUTATION


def verify_plan(
    model_path: WorkloadSource | str | Path | None,
    plan_path: str | Path,
    *,
    device: str | None = None,
    seed: int = 0,
    debug: bool = False,
    reference: CheckReference | None = None,
    on_warning: WarningCallback | None = None,
    nproc: int | None = None,
) -> Verification:
    """Run the plan at ``plan_path`` against the model file at ``model_path``: a path, a
    workload's source (:mod:`planner.measure.source`), or None for the one the plan records
    (``Plan.model_file``).

    ``reference`` (default: :func:`choose_reference`) is what the planned step is compared
    with (:class:`CheckReference`). ``device`` defaults to the plan's. ``debug`` runs the
    planned step under
    ``torch.utils.checkpoint.set_checkpoint_debug_enabled(True)``. Raises
    :class:`PlanFileError` (unreadable plan), :class:`ModelFileError` or
    :class:`ProfilingError` (the model file, or its unplanned step, fails),
    :class:`PlanMismatchError` (a plan for another model), :class:`PlanCheckError` (the
    planned step fails where the unplanned one runs). A plan that runs but changes the step
    or overshoots its budget is not an error: see :meth:`Verification.failures`.

    A plan for a ``torchrun`` job (``Plan.parallel``) is run on ``nproc`` real ranks here
    (default and only value: its world size; :func:`planner.check.ranks.check_plan_on_ranks`),
    against the unplanned distributed step on every rank (``Verification.ranks``).
    """
    plan = load_plan(plan_path)
    if model_path is None:
        if plan.model_file is None:
            raise ModelFileError(
                f"{plan_path} does not record its model file (it was written by an older "
                "ckpt-plan): pass it, `ckpt-plan verify MODEL.py PLAN`"
            )
        model_path = plan.model_file
    model_file = load_model_file(model_path)
    target = device or plan.device
    warnings = []
    with _user_code("sample_batch()", model_file.path):
        batch = describe_batch(model_file.sample_batch())
    batch_warning = batch_mismatch_warning(plan, batch)
    if batch_warning:
        warnings.append(batch_warning)
    if device_type(target) != device_type(plan.device):
        warnings.append(
            f"the plan was made on {plan.device} and is run on {target}: its predicted peak "
            "is for the other device"
        )
    if device_type(target) == "cuda":
        from planner.apply.cuda_allocator import allocator_settings

        # The check runs in a child process, which inherits this one's allocator settings.
        allocator_warning = missing_setting_warning(allocator_settings())
        if allocator_warning:
            warnings.append(allocator_warning)

    def report_warnings() -> None:
        for warning in warnings:
            if on_warning:
                on_warning(warning)

    chosen = reference or choose_reference(plan, target)
    ranks = None
    try:
        if plan.parallel is not None or nproc is not None:
            ranks = check_plan_on_ranks(
                model_file.source, plan, device=target, seed=seed, nproc=nproc
            )
            check = ranks.combined()
        else:
            check = check_plan(
                model_file.source, plan, device=target, seed=seed, debug=debug, reference=chosen
            )
    except PlanMismatchError:
        raise  # a plan for another model: its batch and device do not matter
    except PlannerError:
        report_warnings()  # context for the failure (another batch can explain it)
        raise
    report_warnings()
    return Verification(
        model_path=model_file.path,
        plan_path=Path(plan_path),
        plan=plan,
        check=check,
        device=target,
        seed=seed,
        warnings=tuple(warnings),
        ranks=ranks,
    )
