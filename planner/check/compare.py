"""Check a plan by running it: the measured peak and an unchanged training step.

:func:`check_plan` runs the planned step in a fresh Python process (``python -m
planner.check.compare``), measures its peak with
:class:`~planner.measure.tracking.PeakMemoryTracker`, and shows that it trains exactly as
the unplanned step would, against one of two references (:class:`CheckReference`):

* ``unplanned``: the unplanned step is run too, from the same seed, and the loss, every
  gradient and every buffer are compared bit for bit. It needs the unplanned step's memory.
* ``recomputation``: only the planned step runs (within the budget), and every
  recomputation is compared, op by op, with the forward it repeats: each op's output is
  hashed when the checkpointed function first runs and again when it is recomputed in
  backward. Checkpointing changes nothing in the forward (the loss is the unplanned one),
  and backward reads from a recomputed tensor exactly what the forward made when every
  recomputed op's output is bit-identical; so gradients are the unplanned ones. Buffers and
  the RNG state must also be as the forward left them once backward is done (a
  recomputation must not update BatchNorm statistics twice, or draw random numbers the next
  step would have drawn). Ops whose outputs are uninitialized memory (``empty``) are not
  compared (:mod:`planner.check.recompute_hashes`). A recomputation that differs names its
  module, so the pipeline can exclude it.

The result is a :class:`~planner.check.result.PlanCheck`; what differs, each a
:class:`~planner.check.result.Difference`.

A separate process means the measurement sees only what a training script would: the model
file, the plan JSON and ``apply_plan``. Every step runs in the training loop's shape the
plan records (``plan.loop``: where gradients are zeroed, how many micro-batches are
accumulated), which reaches the process in the plan file. ``limit_bytes`` stops a CPU run
whose live memory passes it, so checking a plan never uses more than its budget.

Errors keep their type across the process boundary (:mod:`planner.check.child`): a plan that
does not fit the model is a :class:`PlanMismatchError` (found before any step runs), a model
file whose own step fails is a :class:`ProfilingError`, and a planned step that fails where
the unplanned one ran (a recomputation that differs from the forward: ``CheckpointError``)
is a :class:`PlanCheckError`. ``debug=True`` runs the planned step under
``torch.utils.checkpoint.set_checkpoint_debug_enabled(True)``, so such an error's ``trace``
lists the operations of the original forward and of the recomputation.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from planner.check.child import ChildFailure, answer, read_reply, run_child
from planner.check.result import CheckReference, Difference, DifferenceKind, PlanCheck
from planner.core.errors import (
    PlanCheckError,
    PlanFileError,
    PlanMismatchError,
    ProfilingError,
)
from planner.plan.plan_file import Plan, save_plan

if TYPE_CHECKING:
    from planner.measure.source import WorkloadSource
    from planner.measure.step import StepMeasurement

__all__ = [
    "CheckReference",
    "PlanCheck",
    "StepComparison",
    "check_plan",
    "compare_steps",
    "run_check",
]


def _summary(message: str) -> str:
    """The first paragraph of a (possibly multi-line) error message, on one line."""
    paragraph = message.strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines() if line.strip())


def run_check(
    model_path: str | Path,
    plan: Plan | str | Path,
    *,
    device: str = "cpu",
    seed: int = 0,
    debug: bool = False,
    reference: CheckReference = CheckReference.UNPLANNED,
    limit_bytes: int | None = None,
) -> PlanCheck:
    """Run the comparison in this process (``check_plan`` calls this in a child process).

    ``reference`` picks what the planned step is compared with (module docstring).
    ``limit_bytes`` (CPU) stops a step whose live memory passes it. ``debug`` turns on
    ``torch.utils.checkpoint``'s debug mode for the planned step; if that step fails, the
    :class:`PlanCheckError`'s message is one line and its ``trace`` the whole of torch's
    error (the traced operations of the forward and the recomputation).
    """
    from planner.model_switches import routing_as_planned
    from planner.plan.plan_file import load_plan

    plan_value = plan if isinstance(plan, Plan) else load_plan(plan)
    # Mixture-of-experts steps whose memory depends on routing run as the plan assumed.
    with routing_as_planned(plan_value.switches.expert_load):
        return _run_check(model_path, plan_value, device, seed, debug, reference, limit_bytes)


def _run_check(
    model_path: str | Path,
    plan_value: Plan,
    device: str,
    seed: int,
    debug: bool,
    reference: CheckReference,
    limit_bytes: int | None,
) -> PlanCheck:
    from torch.utils.checkpoint import set_checkpoint_debug_enabled

    from planner.apply import apply_plan, remove_plan
    from planner.check.recompute_hashes import RecomputeComparison
    from planner.measure.step import measure_step
    from planner.measure.tracking import MemoryLimitExceeded
    from planner.measure.workload import build_workload, load_model_file

    model_file = load_model_file(model_path)
    reference = CheckReference(reference)
    reference_run = None
    if reference is CheckReference.UNPLANNED:
        reference_workload = build_workload(
            model_file, device=device, seed=seed, loop=plan_value.loop
        )
        # Fail fast on a plan made for another model, before any step runs.
        remove_plan(apply_plan(reference_workload.model, plan_value, guard=False))
        keys_before = list(reference_workload.model.state_dict().keys())
        reference_run = measure_step(reference_workload, seed=seed)
        del reference_workload
        _release_memory(device)

    planned_workload = build_workload(model_file, device=device, seed=seed, loop=plan_value.loop)
    if reference is CheckReference.RECOMPUTATION:
        keys_before = list(planned_workload.model.state_dict().keys())
    apply_plan(planned_workload.model, plan_value, guard=False)
    keys_after = list(planned_workload.model.state_dict().keys())
    comparison = RecomputeComparison(planned_workload.model)
    try:
        with set_checkpoint_debug_enabled(True if debug else None):
            if reference is CheckReference.UNPLANNED:
                planned = measure_step(planned_workload, seed=seed, limit_bytes=limit_bytes)
            else:
                # The warm-up step as measure_step takes it, then the compared step.
                measure_step(
                    planned_workload,
                    seed=seed + 1000,
                    warmup_steps=0,
                    limit_bytes=limit_bytes,
                    copy_state=False,
                )
                with comparison.installed():
                    planned = measure_step(
                        planned_workload,
                        seed=seed,
                        warmup_steps=0,
                        limit_bytes=limit_bytes,
                        copy_state=False,
                    )
    except MemoryLimitExceeded as error:
        # Stopped before using more: the peak is at least what it had reached.
        return PlanCheck(
            budget_bytes=plan_value.budget_bytes,
            measured_peak_bytes=error.reached_bytes,
            unplanned_peak_bytes=None,
            loss_equal=None,
            gradients_equal=None,
            buffers_equal=None,
            max_gradient_difference=0.0,
            differences=(Difference(DifferenceKind.STOPPED, detail=str(error)),),
            state_dict_keys_equal=keys_before == keys_after,
            reference=reference,
        )
    except ProfilingError as error:
        # The unplanned step ran: the plan is what breaks it. The first paragraph says so on
        # one line; with debug, checkpoint's trace of both runs follows it.
        raise PlanCheckError(
            f"the planned step fails where the unplanned one runs: {_summary(str(error))}",
            trace=str(error.__cause__ or error) if debug else "",
        ) from error

    if reference_run is None:
        verdict = comparison.compare()
        return PlanCheck(
            budget_bytes=plan_value.budget_bytes,
            measured_peak_bytes=planned.peak_bytes,
            reserved_peak_bytes=planned.reserved_peak_bytes,
            unplanned_peak_bytes=None,
            loss_equal=None,
            gradients_equal=None,
            buffers_equal=verdict.state_equal,
            max_gradient_difference=0.0,
            differences=(*verdict.reasons, *verdict.state_differences)[:20],
            state_dict_keys_equal=keys_before == keys_after,
            reference=CheckReference.RECOMPUTATION,
            recomputation_equal=verdict.recomputation_equal,
            recomputed_ops=verdict.compared_ops,
            recompute_mismatches=verdict.mismatches,
            mismatch_reasons=verdict.reasons,
        )

    steps = compare_steps(reference_run, planned)
    loss_equal: bool | None = steps.loss_equal
    gradients_equal: bool | None = steps.gradients_equal
    buffers_equal: bool | None = steps.buffers_equal
    differences = steps.differences
    if not (loss_equal and gradients_equal):
        # Kernels with atomic or threaded accumulation (GPU attention and embedding backward,
        # index_put with accumulate on CPU) may give different bits on every run: then the
        # unplanned step is no bit-exact reference. Run it again to find out.
        del comparison, planned_workload
        _release_memory(device)
        again = measure_step(
            build_workload(model_file, device=device, seed=seed, loop=plan_value.loop), seed=seed
        )
        _release_memory(device)
        apart = compare_steps(reference_run, again)
        if not (apart.loss_equal and apart.gradients_equal):
            differing = sum(d.kind is DifferenceKind.GRADIENT for d in apart.differences)
            unreproducible = Difference(
                DifferenceKind.UNREPRODUCIBLE,
                detail="two unplanned steps differ on this device "
                f"({differing} of {len(reference_run.gradients)} gradients, largest "
                f"difference {apart.max_gradient_difference:.3g}; the planned step's is "
                f"{steps.max_gradient_difference:.3g}): its kernels are not deterministic; "
                "check with --reference recomputation",
            )
            differences = (unreproducible, *differences)
            loss_equal = gradients_equal = None
            if not apart.buffers_equal:  # buffers the model sets from its own seeds
                buffers_equal = None
    return PlanCheck(
        budget_bytes=plan_value.budget_bytes,
        measured_peak_bytes=planned.peak_bytes,
        reserved_peak_bytes=planned.reserved_peak_bytes,
        unplanned_peak_bytes=reference_run.peak_bytes,
        loss_equal=loss_equal,
        gradients_equal=gradients_equal,
        buffers_equal=buffers_equal,
        max_gradient_difference=steps.max_gradient_difference,
        differences=differences[:20],
        state_dict_keys_equal=keys_before == keys_after,
    )


def _release_memory(device: str) -> None:
    """Free what a finished workload held (its model may sit in reference cycles), so that
    the next step's device peak does not count it."""
    import gc

    import torch

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class StepComparison:
    """Two measured steps compared bit for bit (:func:`compare_steps`): whether the loss,
    every gradient and every buffer are equal, the largest difference between two gradients,
    and what differs (the loss, then each gradient, then each buffer)."""

    loss_equal: bool
    gradients_equal: bool
    buffers_equal: bool
    max_gradient_difference: float
    differences: tuple[Difference, ...]


def compare_steps(reference: StepMeasurement, planned: StepMeasurement) -> StepComparison:
    """``planned``'s loss, gradients and buffers against ``reference``'s, bit for bit (their
    CPU copies, keyed by qualified name: a rank's are its own shards)."""
    import torch

    differences = []
    loss_equal = bool(torch.equal(reference.loss_tensor, planned.loss_tensor))
    if not loss_equal:
        differences.append(
            Difference(
                DifferenceKind.LOSS,
                detail=f"{float(planned.loss_tensor)!r} != unplanned "
                f"{float(reference.loss_tensor)!r}",
            )
        )
    max_difference = 0.0
    gradients_equal = reference.gradients.keys() == planned.gradients.keys()
    for name, gradient in reference.gradients.items():
        other = planned.gradients.get(name)
        if other is None or not torch.equal(gradient, other):
            gradients_equal = False
            if other is not None:
                max_difference = max(max_difference, float((gradient - other).abs().max()))
            differences.append(Difference(DifferenceKind.GRADIENT, name))
    buffers_equal = reference.buffers.keys() == planned.buffers.keys()
    for name, buffer in reference.buffers.items():
        other = planned.buffers.get(name)
        if other is None or not torch.equal(buffer, other):
            buffers_equal = False
            differences.append(Difference(DifferenceKind.BUFFER, name))
    return StepComparison(
        loss_equal, gradients_equal, buffers_equal, max_difference, tuple(differences)
    )


def check_plan(
    model_path: WorkloadSource | str | Path,
    plan: Plan,
    *,
    device: str = "cpu",
    seed: int = 0,
    debug: bool = False,
    reference: CheckReference = CheckReference.UNPLANNED,
    limit_bytes: int | None = None,
    timeout_s: float = 3600,
) -> PlanCheck:
    """Run :func:`run_check` in a fresh Python process (:mod:`planner.check.child`) and
    return its result.

    Errors raised there are raised here with the same :class:`PlannerError` subclass: the
    plan's own (:class:`PlanCheckError`, :class:`PlanMismatchError`, :class:`PlanFileError`)
    as they are, any other after "checking the plan failed: "."""
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-check-") as folder:
        plan_path = save_plan(plan, Path(folder) / "plan.json")
        reply_path = Path(folder) / "reply.json"
        command = [
            sys.executable,
            "-m",
            "planner.check.compare",
            str(model_path),
            str(plan_path),
            "--reply",
            str(reply_path),
            "--device",
            device,
            "--seed",
            str(seed),
            "--reference",
            CheckReference(reference).value,
            *(["--limit-bytes", str(limit_bytes)] if limit_bytes is not None else []),
            *(["--debug"] if debug else []),
        ]
        what = "checking the plan in a separate process"
        result = run_child(command, what=what, output_of="the check", timeout_s=timeout_s)
        reply = read_reply(reply_path)
    if reply is None:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProfilingError(f"{what} failed: {detail}")
    if not isinstance(reply, ChildFailure):
        return PlanCheck.from_json(reply)
    failure = reply
    if failure.error_class in (PlanCheckError, PlanMismatchError, PlanFileError):
        raise failure.rebuilt()
    if failure.error_class is None:  # no planner error: a bug, or torch's own
        raise failure.rebuilt(f"{what} failed: ")
    raise failure.rebuilt("checking the plan failed: ")


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a plan and its reference; write JSON.")
    parser.add_argument("model_path")
    parser.add_argument("plan_path")
    parser.add_argument("--reply", required=True, help="where to write the answer")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--reference", default=CheckReference.UNPLANNED.value)
    parser.add_argument("--limit-bytes", type=int, default=None)
    arguments = parser.parse_args(argv)
    return answer(
        Path(arguments.reply),
        lambda: run_check(
            arguments.model_path,
            arguments.plan_path,
            device=arguments.device,
            seed=arguments.seed,
            debug=arguments.debug,
            reference=CheckReference(arguments.reference),
            limit_bytes=arguments.limit_bytes,
        ),
    )


if __name__ == "__main__":
    sys.exit(_main())
