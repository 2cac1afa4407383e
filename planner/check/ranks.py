"""Check a plan for a ``torchrun`` job on real ranks: every rank within the budget, every
rank's step unchanged (docs/architecture.md, "On more than one machine").

:func:`check_plan_on_ranks` launches ``python -m torch.distributed.run --standalone
--nproc-per-node N -m planner.check.ranks ...`` (gloo on CPU, NCCL on GPUs: one GPU per
rank). Each rank runs :func:`run_rank`: the unplanned step and the planned one, each made
the way training makes it (a fresh seeded model; ``apply_plan`` for the planned one; then
the model file's ``parallelize`` or the default layout; then the optimizer; two warm-up
steps: DDP rebuilds its buckets after its first; a step of a ``--no-sync`` plan is its
whole accumulation cycle, every micro-batch, where the recording ran a shortened one),
measures the peak of the next step as
:func:`planner.measure.step.measure_step` does, and compares loss, its gradient shards and
its buffers with the unplanned step's, bit for bit. DDP's gradient buckets are held by its
Reducer, out of the tracker's sight: the rank's DDP all-reduces through
:func:`planner.measure.ddp.keep_bucket_buffers` (the default hook's arithmetic, in
Python), which hands the bucket buffers to the tracker, counted from the step's start. With
``cross_check`` each rank also measures its planned step by the CPU allocator's accounting.
Every rank answers in its own JSON file (:mod:`planner.check.child`); the caller reads them
all.

Design note: a peak another thread held
---------------------------------------
A ``gloo`` worker thread runs each collective, wakes the rank's thread, and only then
finishes its bookkeeping and drops its reference to the collective's tensors. When the
ranks share the machine's cores the woken rank can run on for milliseconds before the
worker does: a buffer the step has let go of (FSDP2 frees the last block's all-gather
output at the end of the forward) then lives on into the backward: a planned step of
898.74 KiB measured 930.74 KiB on one rank (that 49.6 KiB buffer, still held when the loss's
gradients took 2 x 32 KiB) in 2 of 6 launches on 2 shared cores. That is the scheduler's,
not the plan's, and the simulated rank (collectives that complete at once) cannot predict
it. So where a rank's measured peak counted a storage another thread freed later
(:attr:`~planner.measure.step.StepMeasurement.peak_held_by_other_threads`), every rank
measures the step again (all together: the steps run collectives), up to
:data:`REMEASURED_STEPS` times, and keeps its lowest peak: a peak no other thread held is
the step's own, and a held one is never below it. The compared loss, gradients and buffers
are the first measured step's. Every step a rank runs (the steps measured again and the
allocator's cross-check too) routes a mixture-of-experts model as the plan assumed
(:func:`~planner.model_switches.routing_as_planned`): a step measured again under the real
routing, lighter than the plan's ``--expert-load 2``, once kept its lower peak (4,384,068
bytes on both ranks of a tiny eager Mixtral, predicted 4,486,436; 1 of 4 launches).

Design note: a rank that fails
------------------------------
A rank that raises (anything, not only a :class:`PlannerError`) writes its exception's one
line and traceback to its result and exits non-zero, so torchrun stops the other ranks at
once: they may be waiting for it in a collective, and gloo would wait 30 minutes. The
caller names the first rank to fail (a peer's "Connection closed by peer" came after it) and
logs its traceback at INFO (``--verbose``). A rank that dies without writing (a signal, or
a failure before its check began) is found in torchrun's summary of the job, named with its
exit code or signal and the last exception its own lines (``--tee``: each prefixed with its
rank) printed. Before this, only the last line of torchrun's output that held "Error" was
shown, which is torchrun's own ``ChildFailedError:`` whatever the rank said.

Design note: a rank's exit
--------------------------
Once FSDP2 has sharded a model over a gloo group, the group's threads (two
``pt_gloo_runloop`` and a ``gloo_tcp_loop`` per rank) outlive ``destroy_process_group()``
(for a group that only all-reduced, it ends them): something FSDP2 or its device mesh keeps
still holds the group (seen in the rank check after a ``gc.collect()``). They are
still running when the interpreter finalizes and C++ destroys its static objects, and a
rank can then abort after its work is done ("terminate called without an active
exception", SIGABRT): torchrun reports the job failed. A script that trains FSDP2 on 2 gloo
ranks, calls ``destroy_process_group()`` and returns aborted so in 8 of 40 launches here;
ended with ``os._exit`` instead, in none of 40. The rank check has the same threads at its
exit; this is the likely cause of issue #32's intermittent failure, which torchrun showed
only as ``ChildFailedError:`` (here the rank check itself passed all of about 130 launches
before the change). A rank therefore ends with ``os._exit`` once its result
is written and its output flushed (:func:`_exit_without_finalizing`), as ``multiprocessing``
ends its children: it has nothing left to finalize.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from planner.check.child import ChildFailure, answer, log_output, read_reply, run_child
from planner.check.compare import compare_steps
from planner.check.result import Difference, PlanCheck
from planner.core import errors
from planner.core.devices import device_type
from planner.core.errors import ProfilingError
from planner.plan.plan_file import Plan, load_plan, save_plan

if TYPE_CHECKING:
    from planner.measure.source import WorkloadSource
    from planner.measure.step import StepMeasurement
    from planner.measure.workload import Workload

__all__ = ["RankCheck", "RanksCheck", "check_plan_on_ranks", "run_rank", "torchrun_failure"]

logger = logging.getLogger(__name__)

# More steps a rank measures while a peak counted a storage another thread held (see the
# design note): each is a fresh draw of the scheduler.
REMEASURED_STEPS = 4


@dataclass(frozen=True)
class RankCheck:
    """One rank's result: its peaks (planned and unplanned, bytes, DDP's buckets included)
    and whether its planned step equals its unplanned step bit for bit."""

    rank: int
    budget_bytes: int
    predicted_peak_bytes: int
    measured_peak_bytes: int
    unplanned_peak_bytes: int
    loss_equal: bool
    gradients_equal: bool
    buffers_equal: bool
    differences: tuple[Difference, ...] = field(default_factory=tuple)
    allocator_peak_bytes: int | None = None

    @property
    def within_budget(self) -> bool:
        return self.measured_peak_bytes <= self.budget_bytes

    @property
    def training_unchanged(self) -> bool:
        return self.loss_equal and self.gradients_equal and self.buffers_equal

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankCheck:
        """The rank's check as :func:`dataclasses.asdict` and JSON left it (its answer)."""
        return cls(**{**data, "differences": tuple(map(Difference.from_json, data["differences"]))})


@dataclass(frozen=True)
class RanksCheck:
    """Every rank's :class:`RankCheck`, and their verdict as one :class:`PlanCheck` (the
    highest peaks; equal where every rank's step is)."""

    ranks: tuple[RankCheck, ...]

    @property
    def passed(self) -> bool:
        return all(rank.within_budget and rank.training_unchanged for rank in self.ranks)

    def combined(self) -> PlanCheck:
        ranks = self.ranks
        return PlanCheck(
            budget_bytes=ranks[0].budget_bytes,
            measured_peak_bytes=max(rank.measured_peak_bytes for rank in ranks),
            unplanned_peak_bytes=max(rank.unplanned_peak_bytes for rank in ranks),
            loss_equal=all(rank.loss_equal for rank in ranks),
            gradients_equal=all(rank.gradients_equal for rank in ranks),
            buffers_equal=all(rank.buffers_equal for rank in ranks),
            max_gradient_difference=0.0,
            differences=tuple(
                difference.on_rank(rank.rank) for rank in ranks for difference in rank.differences
            ),
            state_dict_keys_equal=True,
        )


def _local(tensor: Any) -> Any:
    """A rank's own part of a tensor (a ``DTensor``'s local shard), copied to the CPU."""
    to_local = getattr(tensor, "to_local", None)
    local = to_local() if callable(to_local) else tensor
    return local.detach().to("cpu", copy=True)


def _laid_out_workload(model_path: str, plan: Plan, *, planned: bool, device: str, seed: int):  # type: ignore[no-untyped-def]
    """A fresh workload made as training makes it: seeded, the plan applied (if
    ``planned``), laid out for the plan's job, its optimizer over the shards. Returns it, the
    module inside DDP (or the model), DDP's bucket buffers as they are kept (see
    :func:`~planner.measure.ddp.keep_bucket_buffers`) and the bytes of buckets that
    could not be kept (a hook of the model file's own: counted by size)."""
    import torch

    from planner.apply import apply_plan
    from planner.core.parallel import ParallelStrategy
    from planner.measure.ddp import ddp_bucket_bytes, keep_bucket_buffers
    from planner.measure.distributed import parallelized
    from planner.measure.workload import build_workload, load_model_file

    assert plan.parallel is not None
    workload = build_workload(load_model_file(model_path), device=device, seed=seed, loop=plan.loop)
    workload.full_cycle = True  # the loop as it trains: every micro-batch of a no_sync cycle
    pipeline = plan.parallel.pipeline
    if pipeline is not None:
        # A stage is made first, the plan applied to it, then its schedule (the recipe's
        # order); one stage per rank.
        import torch.distributed as dist

        from planner.measure.pipeline_stage import pipeline_stage, split_into_stage

        stage = plan.parallel.stage_of_rank(dist.get_rank())
        boundaries = split_into_stage(workload, pipeline, stage)
        if planned:
            apply_plan(workload.model, plan)
        pipeline_stage(workload, plan.parallel, stage, boundaries)
        return workload, workload.model, [], 0
    if planned:
        apply_plan(workload.model, plan)
    parallelized(workload, plan.parallel)
    model = workload.model
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    kept = keep_bucket_buffers(model)
    unkept = 0
    if kept is None and plan.parallel.strategy is ParallelStrategy.DDP:
        unkept = ddp_bucket_bytes(model)
    return workload, inner, kept if kept is not None else [], unkept


def _rank_step(
    model_path: str, plan: Plan, *, planned: bool, device: str, seed: int
) -> tuple[int, StepMeasurement]:
    """The peak bytes of one measured step on this rank, and the step with this rank's
    gradient shards and buffers."""
    from planner.measure.step import measure_step

    workload, inner, kept, unkept = _laid_out_workload(
        model_path, plan, planned=planned, device=device, seed=seed
    )
    measured = measure_step(workload, seed=seed, warmup_steps=2, copy_state=False, resident=kept)
    gradients = {
        name: _local(parameter.grad)
        for name, parameter in inner.named_parameters()
        if parameter.grad is not None
    }
    buffers = {name: _local(buffer) for name, buffer in inner.named_buffers()}
    peak = _own_peak_bytes(workload, measured, seed=seed, resident=kept)
    return peak + unkept, dataclasses.replace(measured, gradients=gradients, buffers=buffers)


def _any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank of the running process group."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([int(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _own_peak_bytes(
    workload: Workload, measured: StepMeasurement, *, seed: int, resident: list[Any]
) -> int:
    """The peak of the step ``measured`` measured, measured again on every rank while any
    rank's peak counted a storage another thread held (see the module's design note); the
    lowest of this rank's peaks. Call it on every rank, after reading what is compared."""
    import torch.distributed as dist

    from planner.measure.step import measure_step

    peak = measured.peak_bytes
    held = measured.peak_held_by_other_threads
    for _ in range(REMEASURED_STEPS):
        if not _any_rank(held):
            return peak
        again = measure_step(
            workload, seed=seed, warmup_steps=0, copy_state=False, resident=resident
        )
        peak, held = min(peak, again.peak_bytes), again.peak_held_by_other_threads
    if held:
        logger.warning(
            "rank %d: %d steps measured a storage another thread held at their peak; "
            "keeping the lowest peak, %d bytes",
            dist.get_rank(),
            REMEASURED_STEPS + 1,
            peak,
        )
    return peak


def _allocator_peak(model_path: str, plan: Plan, *, device: str, seed: int) -> int | None:
    """The planned step's peak by the CPU allocator's own accounting
    (:class:`~planner.measure.tracking.AllocatorPeakTracker`), beside the tracker's: the same
    step made again, measured from the other side (it sees what the dispatcher does not, and
    FSDP2's resizes as the allocator's frees). Only on CPU in a loop whose step begins by
    releasing the gradients (the tracker needs them released before the step: the plain
    loop, and an accumulation cycle without syncing that zeroes before its first forward);
    None elsewhere."""
    from planner.core.loop import ZeroGrad
    from planner.core.records import StorageKind
    from planner.measure.tracking import AllocatorPeakTracker, workload_tensors
    from planner.measure.workload import run_training_step

    releases_first = plan.loop.starts_a_cycle and plan.loop.zero_grad is ZeroGrad.BEFORE_FORWARD
    if not device.startswith("cpu") or not releases_first:
        return None
    workload, _, kept, unkept = _laid_out_workload(
        model_path, plan, planned=True, device=device, seed=seed
    )
    for step in range(2):
        run_training_step(workload, seed=seed + 1000 + step)
    workload.optimizer.zero_grad(set_to_none=True)  # as the step does first
    existing = workload_tensors(workload.model, workload.optimizer, workload.batch)
    existing[StorageKind.GRADIENT] = [*existing[StorageKind.GRADIENT], *kept]
    tracker = AllocatorPeakTracker(existing)
    del existing
    with tracker:
        run_training_step(workload, seed=seed)
    return tracker.peak_bytes + unkept


def run_rank(
    model_path: str,
    plan_path: str,
    *,
    device: str = "cpu",
    seed: int = 0,
    cross_check: bool = False,
) -> RankCheck:
    """This rank's check (see the module docstring), inside a running process group. With
    ``cross_check`` the planned step is also measured by the CPU allocator
    (``RankCheck.allocator_peak_bytes``)."""
    import torch.distributed as dist

    from planner.model_switches import routing_as_planned

    plan = load_plan(plan_path)
    rank = dist.get_rank()
    # Mixture-of-experts steps whose memory depends on routing run as the plan assumed:
    # every step a rank runs, the steps measured again and the allocator's included.
    with routing_as_planned(plan.switches.expert_load):
        unplanned_peak, unplanned = _rank_step(
            model_path, plan, planned=False, device=device, seed=seed
        )
        peak, planned = _rank_step(model_path, plan, planned=True, device=device, seed=seed)
        allocator_peak = (
            _allocator_peak(model_path, plan, device=device, seed=seed) if cross_check else None
        )
    steps = compare_steps(unplanned, planned)
    # a pipeline: this rank's stage's plan
    own = plan
    if plan.stages and plan.parallel is not None:
        own = plan.stage_plan(plan.parallel.stage_of_rank(rank))
    return RankCheck(
        rank=rank,
        allocator_peak_bytes=allocator_peak,
        budget_bytes=own.budget_bytes,
        predicted_peak_bytes=own.predicted_peak_bytes,
        measured_peak_bytes=peak,
        unplanned_peak_bytes=unplanned_peak,
        loss_equal=steps.loss_equal,
        gradients_equal=steps.gradients_equal,
        buffers_equal=steps.buffers_equal,
        differences=steps.differences[:8],
    )


def check_plan_on_ranks(
    model_path: WorkloadSource | str | Path,
    plan: Plan,
    *,
    device: str = "cpu",
    seed: int = 0,
    nproc: int | None = None,
    cross_check: bool = False,
    timeout_s: float = 3600,
) -> RanksCheck:
    """Launch ``nproc`` ranks (default: the plan's world size) under ``torchrun`` on this
    machine and check ``plan`` on each (see the module docstring). ``device``: ``cpu`` (gloo)
    or ``cuda`` (NCCL, one GPU per rank). ``cross_check``: measure each rank's planned step
    by the CPU allocator too (:func:`_allocator_peak`). Where a rank fails, raises one line
    naming the first rank to fail and what it raised (its :class:`PlannerError` subclass, else
    :class:`ProfilingError`), or its exit code or signal where it died without saying; each
    failed rank's traceback and torchrun's output are logged at INFO (see the module's design
    note "a rank that fails")."""
    if plan.parallel is None:
        raise errors.ParallelLayoutError(
            "this plan is for a single process; check it with `ckpt-plan verify` without --nproc"
        )
    if plan.parallel.pipeline is not None and not plan.stages:
        raise errors.ParallelLayoutError(
            f"this plan is pipeline stage {plan.parallel.pipeline.stage}'s alone; the ranks run "
            "every stage: check the whole pipeline's plan (ckpt-plan profile ... "
            f"{plan.parallel.command_options()} writes one)"
        )
    nproc = nproc or plan.parallel.world_size
    if nproc != plan.parallel.world_size:
        raise errors.ParallelLayoutError(
            f"this plan is for {plan.parallel.world_size} ranks, not {nproc}: check it with "
            f"--nproc {plan.parallel.world_size}, or make a plan for {nproc} ranks"
        )
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-ranks-") as folder:
        plan_path = save_plan(plan, Path(folder) / "plan.json")
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            # each rank's output on our stderr, its lines prefixed with its rank; torchrun's
            # own log folder inside ours (by default it leaves one in /tmp per launch)
            "--tee=3",
            f"--log-dir={Path(folder) / 'logs'}",
            "-m",
            "planner.check.ranks",
            str(model_path),
            str(plan_path),
            "--out",
            folder,
            "--device",
            device_type(device),
            "--seed",
            str(seed),
            *(["--cross-check"] if cross_check else []),
        ]
        # The ranks share this machine's cores: one thread each.
        result = run_child(
            command,
            what=f"checking the plan on {nproc} ranks",
            output_of="torchrun",
            timeout_s=timeout_s,
            threads=1,
        )
        replies = {
            rank: reply
            for rank in range(nproc)
            if (reply := read_reply(_reply_path(folder, rank))) is not None
        }
    failed = sorted(
        ((rank, reply) for rank, reply in replies.items() if isinstance(reply, ChildFailure)),
        key=_failed_first,
    )
    silent = _silent_failures(result.stderr, set(replies))
    if failed or silent or result.returncode != 0 or len(replies) != nproc:
        log_output("torchrun", result.stderr)
    for rank, failure in failed:
        if failure.traceback:
            logger.info("rank %d's traceback:\n%s", rank, failure.traceback.rstrip())
    if silent:
        raise ProfilingError(
            f"checking the plan on {nproc} ranks failed: "
            f"{torchrun_failure(result.stderr, silent[0])} (re-run with --verbose for "
            "torchrun's output)"
        )
    if failed:
        rank, failure = failed[0]
        raise failure.rebuilt(f"checking the plan on rank {rank} failed: ")
    if result.returncode != 0 or len(replies) != nproc:
        written = ", after every rank had written its result" if len(replies) == nproc else ""
        raise ProfilingError(
            f"checking the plan on {nproc} ranks failed: {torchrun_failure(result.stderr)}"
            f"{written} (re-run with --verbose for torchrun's output)"
        )
    return RanksCheck(
        tuple(
            RankCheck.from_json(reply)
            for _, reply in sorted(replies.items())
            if not isinstance(reply, ChildFailure)
        )
    )


def _reply_path(folder: str | Path, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.json"


def _failed_first(item: tuple[int, ChildFailure]) -> tuple[float, int]:
    """Sort key of failed ranks: the first to fail (the others may have failed only because
    it left their collectives), then the lowest rank."""
    rank, failure = item
    return (failure.failed_at, rank)


# torchrun's summary of a failed job lists each failed rank ("rank : 1 (local_rank: 1)"),
# its exit code and, for a signal, which one ("traceback : Signal 9 (SIGKILL) received by
# PID ..."); the first it saw fail is under "Root Cause". A rank's own output comes before
# it, each line prefixed with ``[default<local rank>]:`` (``--tee``).
_SUMMARY_FIELD = re.compile(r"^\s*(?P<name>rank|exitcode|traceback)\s*:\s*(?P<value>.*)$")
_RANK_LINE = re.compile(r"^\[default(?P<rank>\d+)\]:(?P<line>.*)$")
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(?P<kind>\w+(?:Error|Exception|Interrupt))(?::|$)")
_STOPPED_BY_TORCHRUN = -15  # SIGTERM: torchrun stops the other ranks once one has failed


@dataclass(frozen=True)
class _TorchrunFailure:
    """One failed rank in torchrun's summary."""

    rank: int
    exit_code: int
    signal: str | None  # "Signal 9 (SIGKILL)", for a rank a signal ended
    root_cause: bool


def _torchrun_failures(stderr: str) -> list[_TorchrunFailure]:
    """The failed ranks torchrun's summary lists, its root cause first."""
    failures = []
    root_cause = False
    rank: int | None = None
    exit_code = 0
    for line in stderr.splitlines():
        if line.startswith("Root Cause"):
            root_cause = True
        field = _SUMMARY_FIELD.match(line)
        if field is None or _RANK_LINE.match(line):
            continue
        value = field["value"].strip()
        number = value.split(maxsplit=1)[0] if value else ""
        if field["name"] == "rank" and number.isdigit():
            rank = int(number)
        elif field["name"] == "exitcode" and rank is not None and number.lstrip("-").isdigit():
            exit_code = int(number)
        elif field["name"] == "traceback" and rank is not None:
            signal = value.split(" received", 1)[0] if value.startswith("Signal") else None
            failures.append(_TorchrunFailure(rank, exit_code, signal, root_cause))
            rank = None
    return sorted(failures, key=lambda failure: not failure.root_cause)


def _silent_failures(stderr: str, reported: set[int]) -> list[int]:
    """Ranks that failed without writing their result (killed, or failed before the check
    began) and were not merely stopped by torchrun, the root cause first: the errors of
    ranks that did write one may only say that this one left their collectives."""
    return [
        failure.rank
        for failure in _torchrun_failures(stderr)
        if failure.rank not in reported and failure.exit_code != _STOPPED_BY_TORCHRUN
    ]


def torchrun_failure(stderr: str, rank: int | None = None) -> str:
    """One line for a ``torchrun`` job that failed without a rank's result saying why: the
    failed ``rank`` (default: torchrun's root cause), its exit code or signal, and the last
    exception line that rank printed (or, where none is known to be its, the last printed
    above torchrun's own ``ChildFailedError``)."""
    exceptions: list[tuple[int | None, str]] = []
    for raw in stderr.splitlines():
        prefixed = _RANK_LINE.match(raw)
        printed_by, line = (int(prefixed["rank"]), prefixed["line"]) if prefixed else (None, raw)
        kind = _EXCEPTION_LINE.match(line.strip())
        if kind is not None and kind["kind"] != "ChildFailedError":
            exceptions.append((printed_by, line.strip()[:300]))
    failures = _torchrun_failures(stderr)
    failure = next((f for f in failures if f.rank == rank or (rank is None and f.root_cause)), None)
    parts = []
    if failure is not None:
        how = f"exited with code {failure.exit_code}"
        parts.append(
            f"rank {failure.rank} {how}" + (f" ({failure.signal})" if failure.signal else "")
        )
        own = [line for printed_by, line in exceptions if printed_by == failure.rank]
        exceptions = [(failure.rank, own[-1])] if own else exceptions
    if exceptions:
        parts.append(exceptions[-1][1])
    if not parts:
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        parts.append(lines[-1] if lines else "no output")
    return ": ".join(parts)


def _main(argv: list[str] | None = None) -> int:
    """One rank, launched by :func:`check_plan_on_ranks` under ``torch.distributed.run``
    (which sets the rank, the world size and the rendezvous in the environment)."""
    parser = argparse.ArgumentParser(description="Check a plan on this rank; write JSON.")
    parser.add_argument("model_path")
    parser.add_argument("plan_path")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cross-check", action="store_true")
    arguments = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    # A failed rank exits non-zero: torchrun then stops the others, which may be waiting in
    # a collective for it (gloo's timeout is 30 minutes).
    return answer(_reply_path(arguments.out, rank), lambda: _checked_rank(arguments))


def _checked_rank(arguments: argparse.Namespace) -> RankCheck:
    """This rank's check inside a process group started (and ended) here."""
    import torch
    import torch.distributed as dist

    device = arguments.device
    if device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    try:
        return run_rank(
            arguments.model_path,
            arguments.plan_path,
            device=device,
            seed=arguments.seed,
            cross_check=arguments.cross_check,
        )
    finally:
        dist.destroy_process_group()


def _exit_without_finalizing(code: int) -> NoReturn:
    """End this rank with ``code`` now, its output flushed, without the interpreter's
    finalization or C++'s static destructors, which can abort while gloo's threads run
    (see the module's design note "a rank's exit")."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_without_finalizing(_main())
