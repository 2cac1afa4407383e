"""Check a plan by running it: the measured peak and an unchanged training step.

:func:`check_plan` runs, in a fresh Python process (``python -m planner.check``), the
unplanned step and the planned step from the same seed, and compares their loss, every
gradient and every buffer, and measures the planned step's peak with
:class:`~planner.tracking.PeakMemoryTracker`. A separate process means the measurement
sees only what a training script would: the model file, the plan JSON and ``apply_plan``.

Errors keep their type across the process boundary: a plan that does not fit the model is a
:class:`PlanMismatchError` (found before any step runs), a model file whose own step fails
is a :class:`ProfilingError`, and a planned step that fails where the unplanned one ran (a
recomputation that differs from the forward: ``CheckpointError``) is a
:class:`PlanCheckError`. ``debug=True`` runs the planned step under
``torch.utils.checkpoint.set_checkpoint_debug_enabled(True)``, so such an error lists the
operations of the original forward and of the recomputation.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planner import errors
from planner.errors import PlanCheckError, PlannerError, ProfilingError
from planner.plan import Plan, save_plan

__all__ = ["PlanCheck", "check_plan", "run_check"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanCheck:
    """The result of running a plan against the unplanned step."""

    budget_bytes: int
    measured_peak_bytes: int
    unplanned_peak_bytes: int
    loss_equal: bool
    gradients_equal: bool
    buffers_equal: bool
    max_gradient_difference: float
    differences: tuple[str, ...]
    state_dict_keys_equal: bool

    @property
    def within_budget(self) -> bool:
        return self.measured_peak_bytes <= self.budget_bytes

    @property
    def training_unchanged(self) -> bool:
        return self.loss_equal and self.gradients_equal and self.buffers_equal

    @property
    def passed(self) -> bool:
        return self.within_budget and self.training_unchanged and self.state_dict_keys_equal


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
) -> PlanCheck:
    """Run the comparison in this process (``check_plan`` calls this in a child process).

    ``debug`` turns on ``torch.utils.checkpoint``'s debug mode for the planned step; if that
    step fails, the :class:`PlanCheckError`'s message is one line, a blank line, then the
    whole of torch's error (the traced operations of the forward and the recomputation).
    """
    import torch
    from torch.utils.checkpoint import set_checkpoint_debug_enabled

    from planner.apply import apply_plan, remove_plan
    from planner.measure import measure_step
    from planner.plan import load_plan
    from planner.workload import build_workload, load_model_file

    plan_value = plan if isinstance(plan, Plan) else load_plan(plan)
    model_file = load_model_file(model_path)
    reference_workload = build_workload(model_file, device=device, seed=seed)
    # Fail fast on a plan made for another model, before any step runs.
    remove_plan(apply_plan(reference_workload.model, plan_value))
    keys_before = list(reference_workload.model.state_dict().keys())
    reference = measure_step(reference_workload, seed=seed)
    del reference_workload

    planned_workload = build_workload(model_file, device=device, seed=seed)
    apply_plan(planned_workload.model, plan_value)
    keys_after = list(planned_workload.model.state_dict().keys())
    try:
        with set_checkpoint_debug_enabled(True if debug else None):
            planned = measure_step(planned_workload, seed=seed)
    except ProfilingError as error:
        # The unplanned step ran: the plan is what breaks it. The first paragraph says so on
        # one line; with debug, checkpoint's trace of both runs follows it.
        message = f"the planned step fails where the unplanned one runs: {_summary(str(error))}"
        if debug:
            message += "\n\n" + str(error.__cause__ or error)
        raise PlanCheckError(message) from error

    differences = []
    loss_equal = bool(torch.equal(reference.loss_tensor, planned.loss_tensor))
    if not loss_equal:
        differences.append(f"loss {planned.loss!r} != unplanned {reference.loss!r}")
    max_difference = 0.0
    gradients_equal = reference.gradients.keys() == planned.gradients.keys()
    for name, gradient in reference.gradients.items():
        other = planned.gradients.get(name)
        if other is None or not torch.equal(gradient, other):
            gradients_equal = False
            if other is not None:
                max_difference = max(max_difference, float((gradient - other).abs().max()))
            differences.append(f"gradient of {name}")
    buffers_equal = True
    for name, buffer in reference.buffers.items():
        other = planned.buffers.get(name)
        if other is None or not torch.equal(buffer, other):
            buffers_equal = False
            differences.append(f"buffer {name}")
    return PlanCheck(
        budget_bytes=plan_value.budget_bytes,
        measured_peak_bytes=planned.peak_bytes,
        unplanned_peak_bytes=reference.peak_bytes,
        loss_equal=loss_equal,
        gradients_equal=gradients_equal,
        buffers_equal=buffers_equal,
        max_gradient_difference=max_difference,
        differences=tuple(differences[:20]),
        state_dict_keys_equal=keys_before == keys_after,
    )


def check_plan(
    model_path: str | Path,
    plan: Plan,
    *,
    device: str = "cpu",
    seed: int = 0,
    debug: bool = False,
    timeout_s: float = 3600,
) -> PlanCheck:
    """Run :func:`run_check` in a fresh Python process and return its result.

    Errors raised there are raised here with the same :class:`PlannerError` subclass."""
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-check-") as folder:
        plan_path = save_plan(plan, Path(folder) / "plan.json")
        command = [
            sys.executable,
            "-m",
            "planner.check",
            str(model_path),
            str(plan_path),
            "--device",
            device,
            "--seed",
            str(seed),
            *(["--debug"] if debug else []),
        ]
        environment = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [root, environment.get("PYTHONPATH")])
        )
        logger.info("checking the plan in a separate process: %s", " ".join(command))
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=environment, check=False
        )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProfilingError(f"checking the plan in a separate process failed: {detail}")
    data: dict[str, Any] = json.loads(lines[-1])
    if "error" in data:
        kind = getattr(errors, str(data.get("error_type")), None)
        if kind in (PlanCheckError, errors.PlanMismatchError, errors.PlanFileError):
            raise kind(data["error"])
        if kind is errors.ModelFileError:
            raise errors.ModelFileError(f"checking the plan failed: {data['error']}")
        raise ProfilingError(f"checking the plan failed: {data['error']}")
    data["differences"] = tuple(data["differences"])
    return PlanCheck(**data)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a plan and the unplanned step; print JSON.")
    parser.add_argument("model_path")
    parser.add_argument("plan_path")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--debug", action="store_true")
    arguments = parser.parse_args(argv)
    try:
        result = run_check(
            arguments.model_path,
            arguments.plan_path,
            device=arguments.device,
            seed=arguments.seed,
            debug=arguments.debug,
        )
    except PlannerError as error:
        print(json.dumps({"error": str(error), "error_type": type(error).__name__}))
        return 0
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
