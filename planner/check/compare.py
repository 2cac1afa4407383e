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
  compared. A recomputation that differs names its module, so the pipeline can exclude it.

A separate process means the measurement sees only what a training script would: the model
file, the plan JSON and ``apply_plan``. Every step runs in the training loop's shape the
plan records (``plan.loop``: where gradients are zeroed, how many micro-batches are
accumulated), which reaches the process in the plan file. ``limit_bytes`` stops a CPU run
whose live memory passes it, so checking a plan never uses more than its budget.

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
import contextlib
import enum
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.core import errors
from planner.core.errors import PlanCheckError, PlannerError, ProfilingError
from planner.plan.plan_file import Plan, save_plan

if TYPE_CHECKING:
    from planner.apply import Region
    from planner.measure.source import WorkloadSource

__all__ = ["CheckReference", "PlanCheck", "check_plan", "run_check"]


class CheckReference(str, enum.Enum):
    """What a planned step is compared with (see the module docstring)."""

    UNPLANNED = "unplanned"
    RECOMPUTATION = "recomputation"


logger = logging.getLogger(__name__)


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
    differences: tuple[str, ...]
    state_dict_keys_equal: bool
    reference: str = CheckReference.UNPLANNED.value
    recomputation_equal: bool | None = None
    recomputed_ops: int = 0
    recompute_mismatches: tuple[str, ...] = field(default_factory=tuple)
    # For each of ``recompute_mismatches``, in order: where its recomputation first differed.
    mismatch_reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def within_budget(self) -> bool:
        return self.measured_peak_bytes <= self.budget_bytes

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


def _summary(message: str) -> str:
    """The first paragraph of a (possibly multi-line) error message, on one line."""
    paragraph = message.strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines() if line.strip())


class _RecomputeComparison:
    """Hashes every op output of each checkpointed function's runs (see the module
    docstring). Installed as a dispatch mode *below* the memory tracker, so the tracker
    neither sees nor counts the hashing, and as :mod:`planner.apply`'s recomputation
    observer, which tells it which function (region) and which run is executing."""

    def __init__(self, model: Any) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        comparison = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                if comparison._open:
                    comparison._record(func, out)
                return out

        self.mode = Mode()
        self.model = model
        self._buffer_storages = {b.untyped_storage().data_ptr() for b in model.buffers()}
        # (region, ops a selective policy may hand back, [ops of each run])
        self.regions: list[
            tuple[Region, frozenset[str], list[list[tuple[str, tuple[Any, ...]]]]]
        ] = []
        self._open: list[list[tuple[str, tuple[Any, ...]]]] = []
        self._state_after_forward: tuple[Any, ...] | None = None

    # -- what the planned step shows us ---------------------------------------------------
    def region(
        self, region: Region, function: Any, cached_ops: frozenset[str] = frozenset()
    ) -> Any:
        runs: list[list[tuple[str, tuple[Any, ...]]]] = []
        self.regions.append((region, cached_ops, runs))

        def run(*args: Any, **kwargs: Any) -> Any:
            runs.append([])
            self._open.append(runs[-1])
            try:
                return function(*args, **kwargs)
            finally:
                self._open.pop()

        return run

    def _record(self, func: Any, out: Any) -> None:
        import torch

        from planner.apply.tensors import iter_tensors
        from planner.measure.tracking import returns_view

        name = func._schema.name.removeprefix("aten::")
        if (
            name in _UNINITIALIZED
            or torch.Tag.nondeterministic_bitwise in func.tags
            or returns_view(func)
        ):
            # Uninitialized memory (empty, empty_like) means nothing; a view (detach, which
            # recomputation adds) computes nothing.
            return
        # A buffer's new value is not compared here: a recomputation starts from the buffer
        # the forward updated (BatchNorm's counter), and the plan restores it afterwards,
        # which the buffer check at the end of backward verifies.
        # A seeded op's integer outputs (SDPA's philox seed and offset) are RNG bookkeeping,
        # left uninitialized by some kernels when no dropout is drawn; its floating outputs
        # show any difference in what it drew.
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        digests = tuple(
            _digest(tensor)
            for tensor in iter_tensors(out)
            if tensor.untyped_storage().data_ptr() not in self._buffer_storages
            and not (seeded and not tensor.is_floating_point())
        )
        self._open[-1].append((str(func), digests))

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Observe checkpointed functions, hash their ops, and note the buffers and RNG
        state when backward starts (``torch.autograd.backward``, which ``loss.backward()``
        calls: the forward is done, no recomputation has run)."""
        import torch

        from planner.apply import observing_recomputation

        original = torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            if self._state_after_forward is None:
                self._state_after_forward = self._state()
            return original(*args, **kwargs)

        torch.autograd.backward = backward
        try:
            with observing_recomputation(self), self.mode:
                yield
        finally:
            torch.autograd.backward = original

    def _state(self) -> tuple[Any, ...]:
        import torch

        with torch._C._DisableTorchDispatch():
            buffers = tuple(_digest(buffer) for buffer in self.model.buffers())
            rng = _digest(torch.get_rng_state())
            cuda_rng = _digest(torch.cuda.get_rng_state()) if torch.cuda.is_available() else None
        return buffers, rng, cuda_rng

    # -- the verdict ------------------------------------------------------------------
    def compare(self) -> tuple[bool, bool, int, tuple[str, ...], list[str]]:
        """(recomputations equal, state equal, ops compared, modules that differ, why)."""
        from planner.apply import is_cached_op

        compared = 0
        mismatched: list[str] = []
        why: list[str] = []
        for region, cached_ops, runs in self.regions:
            if not runs:  # an enclosing recomputation stopped before it ran
                continue
            forward, *recomputations = runs
            for recomputed in recomputations:
                # A selective policy's cached outputs are handed back, not computed again:
                # the recomputation skips those ops of the forward.
                forward_ops = (
                    [entry for entry in forward if not is_cached_op(entry[0], cached_ops)]
                    if cached_ops
                    else forward
                )
                recomputed = (
                    [entry for entry in recomputed if not is_cached_op(entry[0], cached_ops)]
                    if cached_ops
                    else recomputed
                )
                for index, (op, digests) in enumerate(recomputed):
                    compared += 1
                    if index >= len(forward_ops) or forward_ops[index] != (op, digests):
                        original = forward_ops[index][0] if index < len(forward_ops) else "nothing"
                        module = region.module
                        if module not in mismatched:
                            mismatched.append(module)
                            why.append(
                                f"recomputation of {region} differs from its forward at op "
                                f"{index} ({op}; the forward ran {original})"
                            )
                        break
        state_equal = True
        if self._state_after_forward is not None:
            buffers_before, rng_before, cuda_before = self._state_after_forward
            buffers_after, rng_after, cuda_after = self._state()
            names = [name for name, _ in self.model.named_buffers()]
            for name, before, after in zip(names, buffers_before, buffers_after, strict=True):
                if before != after:
                    state_equal = False
                    why.append(f"buffer {name} changed during backward (recomputed twice)")
            if (rng_before, cuda_before) != (rng_after, cuda_after):
                state_equal = False
                why.append("backward changed the RNG state (a recomputation drew random numbers)")
        return not mismatched, state_equal, compared, tuple(mismatched), why


# Ops whose outputs are uninitialized memory (their values mean nothing until written).
_UNINITIALIZED = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}
)


def _digest(tensor: Any) -> tuple[Any, ...]:
    """A fingerprint of a tensor's values: shape, dtype, an xor hash and a float64 sum of
    its elements (bit-exact: equal tensors give equal digests)."""
    import torch

    shape = (tuple(tensor.shape), str(tensor.dtype))
    if tensor.numel() == 0 or tensor.layout != torch.strided:
        return shape
    values = tensor.detach()
    if values.device.type != "cpu":
        # Hash a host copy: hashing on the device would allocate device memory beside the
        # step, and the peak being checked is the device's.
        values = values.to("cpu")
    if values.is_complex():
        values = torch.view_as_real(values)
    if values.dtype == torch.bool:
        values = values.to(torch.uint8)
    hashed = (
        int(torch.hash_tensor(values).view(torch.int64)) if hasattr(torch, "hash_tensor") else 0
    )
    total = float(values.sum(dtype=torch.float64))
    return (*shape, hashed, total.hex())


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
    :class:`PlanCheckError`'s message is one line, a blank line, then the whole of torch's
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
    import torch
    from torch.utils.checkpoint import set_checkpoint_debug_enabled

    from planner.apply import apply_plan, remove_plan
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
    comparison = _RecomputeComparison(planned_workload.model)
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
            differences=(f"stopped: {error}",),
            state_dict_keys_equal=keys_before == keys_after,
            reference=reference.value,
        )
    except ProfilingError as error:
        # The unplanned step ran: the plan is what breaks it. The first paragraph says so on
        # one line; with debug, checkpoint's trace of both runs follows it.
        message = f"the planned step fails where the unplanned one runs: {_summary(str(error))}"
        if debug:
            message += "\n\n" + str(error.__cause__ or error)
        raise PlanCheckError(message) from error

    if reference_run is None:
        recomputation_equal, state_equal, compared, mismatched, why = comparison.compare()
        return PlanCheck(
            budget_bytes=plan_value.budget_bytes,
            measured_peak_bytes=planned.peak_bytes,
            unplanned_peak_bytes=None,
            loss_equal=None,
            gradients_equal=None,
            buffers_equal=state_equal,
            max_gradient_difference=0.0,
            differences=tuple(why[:20]),
            state_dict_keys_equal=keys_before == keys_after,
            reference=CheckReference.RECOMPUTATION.value,
            recomputation_equal=recomputation_equal,
            recomputed_ops=compared,
            recompute_mismatches=tuple(mismatched),
            mismatch_reasons=tuple(why),
        )

    loss_equal: bool | None
    gradients_equal: bool | None
    loss_equal, gradients_equal, max_difference, differences = _compare_steps(
        reference_run, planned
    )
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
        same_loss, same_gradients, spread, unplanned_apart = _compare_steps(reference_run, again)
        if not (same_loss and same_gradients):
            differing = sum(d.startswith("gradient of ") for d in unplanned_apart)
            differences = [
                "not compared bit for bit: two unplanned steps differ on this device "
                f"({differing} of {len(reference_run.gradients)} gradients, largest "
                f"difference {spread:.3g}; the planned step's is {max_difference:.3g}): "
                "its kernels are not deterministic; check with --reference recomputation",
                *differences,
            ]
            loss_equal = gradients_equal = None
    buffers_equal = True
    for name, buffer in reference_run.buffers.items():
        other = planned.buffers.get(name)
        if other is None or not torch.equal(buffer, other):
            buffers_equal = False
            differences.append(f"buffer {name}")
    return PlanCheck(
        budget_bytes=plan_value.budget_bytes,
        measured_peak_bytes=planned.peak_bytes,
        unplanned_peak_bytes=reference_run.peak_bytes,
        loss_equal=loss_equal,
        gradients_equal=gradients_equal,
        buffers_equal=buffers_equal,
        max_gradient_difference=max_difference,
        differences=tuple(differences[:20]),
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


def _compare_steps(reference: Any, planned: Any) -> tuple[bool, bool, float, list[str]]:
    """(loss equal, gradients equal, largest gradient difference, what differs) between two
    measured steps, bit for bit."""
    import torch

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
    return loss_equal, gradients_equal, max_difference, differences


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
    """Run :func:`run_check` in a fresh Python process and return its result.

    Errors raised there are raised here with the same :class:`PlannerError` subclass."""
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-check-") as folder:
        plan_path = save_plan(plan, Path(folder) / "plan.json")
        command = [
            sys.executable,
            "-m",
            "planner.check.compare",
            str(model_path),
            str(plan_path),
            "--device",
            device,
            "--seed",
            str(seed),
            "--reference",
            CheckReference(reference).value,
            *(["--limit-bytes", str(limit_bytes)] if limit_bytes is not None else []),
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
    data["recompute_mismatches"] = tuple(data.get("recompute_mismatches", ()))
    data["mismatch_reasons"] = tuple(data.get("mismatch_reasons", ()))
    return PlanCheck(**data)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a plan and the unplanned step; print JSON.")
    parser.add_argument("model_path")
    parser.add_argument("plan_path")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--reference", default=CheckReference.UNPLANNED.value)
    parser.add_argument("--limit-bytes", type=int, default=None)
    arguments = parser.parse_args(argv)
    try:
        # stdout carries the result line alone; the model file's own prints go to stderr.
        with contextlib.redirect_stdout(sys.stderr):
            result = run_check(
                arguments.model_path,
                arguments.plan_path,
                device=arguments.device,
                seed=arguments.seed,
                debug=arguments.debug,
                reference=CheckReference(arguments.reference),
                limit_bytes=arguments.limit_bytes,
            )
    except PlannerError as error:
        print(json.dumps({"error": str(error), "error_type": type(error).__name__}))
        return 0
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
