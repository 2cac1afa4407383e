"""The whole ``profile`` job as one library call: measure, solve, check by running, re-plan.

Rule one: no pass of the job needs more memory than the budget. The memory timeline is
recorded on fake tensors (:mod:`planner.measure.fake`); times are measured in steps with a timing
plan applied that fits the budget (:mod:`planner.measure.timing`), chosen by solving the fake
profile with provisional roofline costs; the plan's check runs only the planned step. Where
fake execution cannot run the step, a real step is recorded instead, stopped if its live
memory passes the budget. With a ``target`` device spec nothing runs for real at all: times
come from a roofline (:mod:`planner.plan.targets`), and the plan is left unchecked.

Rule two: a plan is returned only after it has been run in a separate process with its peak
within the budget and its training step unchanged (:mod:`planner.check.compare`: every recomputation
bit-identical to its forward, buffers and RNG as without the plan). If the measured peak
overshoots, the solver aims lower by the overshoot and tries again; a module whose
recomputation differs is excluded and the plan solved again.

Before that run, every candidate's recomputation is tried once on fake tensors
(:func:`planner.check.safety.find_recompute_mismatches`: a module that fills a cache in forward and
reads it back when recomputed, say; for a profile recorded for real, only the modules a
plan chose, on a real step). Any found are excluded from the profile, with the reason, and
the plan is solved again.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from planner.check.compare import CheckReference, check_plan
from planner.check.ranks import check_plan_on_ranks
from planner.check.safety import exclude_modules, find_recompute_mismatches
from planner.checked_plan import CheckedPlan
from planner.core.devices import device_type
from planner.core.errors import (
    InfeasibleBudgetError,
    ParallelLayoutError,
    PlanCheckError,
    ProfileFileError,
    ProfilingError,
)
from planner.core.loop import PLAIN_LOOP, LoopShape
from planner.core.parallel import ParallelLayout
from planner.core.records import CostSource, MemorySource, Note, NoteTopic, Profile, Unit
from planner.core.units import format_bytes, format_bytes_apart
from planner.measure.distributed import record_rank_memory
from planner.measure.fake import FakeExecutionError, build_fake_workload
from planner.measure.model_file import ModelFile
from planner.measure.profiler import ProgressCallback, record_memory
from planner.measure.source import WorkloadSource, workload_in_command
from planner.measure.timing import measure_costs, with_measured_costs
from planner.measure.tracking import MemoryLimitExceeded
from planner.measure.workload import build_workload, load_model_file
from planner.plan.memory_model import MemoryModel
from planner.plan.plan_file import CheckpointMethod, Plan
from planner.plan.targets import (
    DeviceSpec,
    check_budget_fits,
    provisional_costs,
    roofline_costs,
    with_offload_options,
)
from planner.solve import Solver
from planner.solve.planning import (
    build_plan,
    plan_for_budget,
    recomputed_modules,
    unit_cost_ms,
)

__all__ = [
    "MAX_CHECKED_RANKS",
    "CheckedPlan",
    "estimated_costs",
    "marked_unchecked",
    "measure_profile_costs",
    "plan_checked",
    "profile_and_plan",
    "profile_model_file",
    "record_step_memory",
]


def _cuda_workspace_bytes(device: str) -> int:
    """cuBLAS's workspaces on this CUDA device, as ``max_memory_allocated`` counts them. A
    linear layer with a bias, in fp32 and bf16, forward (this thread) and backward
    (autograd's thread), makes each workspace cuBLAS and cuBLASLt keep. Existing workspaces
    are released first, so the measure holds whatever ran before."""
    import torch

    from planner.measure.tracking import allocated_bytes

    torch.cuda.synchronize(device)
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        torch._C._cuda_clearCublasWorkspaces()
    before = torch.cuda.memory_allocated(device)
    kept = []
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.ones(256, 256, device=device, dtype=dtype, requires_grad=True)
        weight = torch.ones(256, 256, device=device, dtype=dtype, requires_grad=True)
        bias = torch.ones(256, device=device, dtype=dtype, requires_grad=True)
        torch.nn.functional.linear(x, weight, bias).sum().backward()
        kept += [x, weight, bias, x.grad, weight.grad, bias.grad]
    torch.cuda.synchronize(device)
    alive = sum(
        allocated_bytes(t.untyped_storage().nbytes(), "cuda") for t in kept if t is not None
    )
    workspace = torch.cuda.memory_allocated(device) - before - alive
    del kept
    return max(0, workspace)


def record_step_memory(
    model_file: ModelFile,
    *,
    device: str,
    seed: int,
    memory: MemorySource,
    budget_bytes: int | None,
    target: DeviceSpec | None,
    loop: LoopShape,
    progress: ProgressCallback | None,
    expert_load: float = 1.0,
) -> Profile:
    """The memory half of a profile (times not yet taken: ``cost_source`` ``none``): on fake
    tensors by default, falling back to a real step only where it fits ``budget_bytes``.
    ``expert_load``: the routing assumed where memory depends on it
    (:func:`planner.model_switches.assumed_routing`)."""
    if loop.no_sync:
        raise ParallelLayoutError(
            "--no-sync is for data-parallel ranks, where gradients are synced: plan one rank "
            "with --world-size N --parallel ddp or fsdp2 (one process syncs nothing, so its "
            "loop is --grad-accum alone)"
        )
    device_type = target.device_type if target is not None else device
    workspace = 0
    if device_type == "cuda":
        workspace = target.workspace_bytes if target is not None else _cuda_workspace_bytes(device)
    if memory is MemorySource.FAKE:
        try:
            if progress:
                progress("building the model on fake tensors", 0, 0)
            workload, session = build_fake_workload(
                model_file, device_type, seed, loop=loop, expert_load=expert_load
            )
            try:
                return record_memory(
                    workload,
                    session=session,
                    seed=seed,
                    workspace_bytes=workspace,
                    progress=progress,
                )
            finally:
                session.release()
        except FakeExecutionError as error:
            if target is not None:
                raise ProfilingError(
                    f"{error}; a plan for {target.name} needs the step to run on fake tensors: "
                    "avoid that op in the training step, or plan on that device"
                ) from error
            fake_error = error
        logger.warning("%s; recording a real step instead", fake_error)
        if progress:
            progress("recording a real step (fake tensors cannot run this one)", 0, 0)
    workload = build_workload(model_file, device=device, seed=seed, loop=loop)
    limit = budget_bytes if memory is MemorySource.FAKE else None
    try:
        return record_memory(
            workload, seed=seed, limit_bytes=limit, workspace_bytes=workspace, progress=progress
        )
    except MemoryLimitExceeded as over:
        assert budget_bytes is not None
        raise ProfilingError(
            f"{fake_error}; a real unplanned step instead needs more than the budget "
            f"{format_bytes(budget_bytes)} (stopped at {format_bytes(over.reached_bytes)}): "
            "avoid that op in the training step, or plan with --memory real on a machine "
            "where the unplanned step fits"
        ) from over


def profile_model_file(
    model_file: ModelFile,
    *,
    device: str = "cpu",
    seed: int = 0,
    memory: MemorySource = MemorySource.FAKE,
    budget_bytes: int | None = None,
    target: DeviceSpec | None = None,
    timing_steps: int = 5,
    loop: LoopShape = PLAIN_LOOP,
    parallel: ParallelLayout | None = None,
    progress: ProgressCallback | None = None,
    expert_load: float = 1.0,
    host_link_bytes_per_s: float = 0.0,
) -> Profile:
    """A complete profile of the model file's training step (see the module docstring).
    ``expert_load``: the mixture-of-experts routing to plan for where memory depends on it
    (the busiest expert's tokens over the balanced share; :mod:`planner.core.switches`).

    ``memory``: record on fake tensors (default) or by running the unplanned step for real
    (``real``: it must fit the machine). ``budget_bytes`` bounds every real pass: the timing
    plan is solved to fit it, and real steps stop if they pass it (CPU); without it, times
    are taken on the unplanned step. ``target``: estimate times for that device instead of
    measuring them here (nothing runs for real). ``timing_steps`` real steps are timed, after
    two untimed ones (the median is kept: see ``benchmarks/plan_stability.py``). ``loop``: the
    training loop's shape (:class:`~planner.core.loop.LoopShape`: where gradients are zeroed,
    how many micro-batches are accumulated); every step recorded, timed or checked runs in
    it, and the profile records it. ``parallel``: profile ONE rank of that ``torchrun`` job
    instead, simulated here (:func:`planner.measure.distributed.record_rank_memory`); its
    recomputation times are then estimated from its ops (a roofline of this device), not
    timed: a timing step of one rank needs the job's other ranks. ``host_link_bytes_per_s``:
    where times are measured on a CUDA device here, the host link measured on it
    (:func:`planner.measure.host_link.measure_host_link`); candidates are then offered
    offloading, costed at it (:func:`~planner.plan.targets.with_offload_options`). 0: not
    offered (a ``target`` has its own link)."""
    if parallel is not None:
        if memory is not MemorySource.FAKE:
            raise ParallelLayoutError(
                "--world-size/--parallel plan on simulated ranks: use them without --memory real"
            )
        if target is not None:
            # One rank of a job on the target's devices: emulated on fake tensors, timed by
            # the target's roofline.
            workspace = target.workspace_bytes
        else:
            workspace = _cuda_workspace_bytes(device) if device.startswith("cuda") else 0
        profile = record_rank_memory(
            model_file,
            parallel,
            device_type=target.device_type if target is not None else device_type(device),
            seed=seed,
            loop=loop,
            budget_bytes=budget_bytes,
            workspace_bytes=workspace,
            progress=progress,
            expert_load=expert_load,
        )
        if target is not None:
            return roofline_costs(profile, target)
        return estimated_costs(profile, device)
    profile = record_step_memory(
        model_file,
        device=device,
        seed=seed,
        memory=memory,
        budget_bytes=budget_bytes,
        target=target,
        loop=loop,
        progress=progress,
        expert_load=expert_load,
    )
    if note := profile.excluded_blocks_note():
        logger.warning("%s", note)
    if target is not None:
        return roofline_costs(profile, target)
    try:
        measured = measure_profile_costs(
            model_file,
            profile,
            device=device,
            seed=seed,
            budget_bytes=budget_bytes,
            timing_steps=timing_steps,
            progress=progress,
            host_link_bytes_per_s=host_link_bytes_per_s,
        )
    except InfeasibleBudgetError as error:
        error.profile = profile  # memory only (no times): `solve` times it at a budget that fits
        raise
    return measured


def _timing_plan(provisional: Profile, budget_bytes: int) -> Plan:
    """The plan the times are measured with: whole modules only where that fits the
    budget. Its recomputations are timed against their forwards (the ratio every module's
    time is scaled by); under a selective policy they would be the policy's, cheaper by
    what it saves, and every whole module's cost would be scaled down by that too."""
    try:
        plan, _ = plan_for_budget(
            provisional, budget_bytes, solver=Solver(provisional, options=False, nesting=False)
        )
    except InfeasibleBudgetError:
        plan, _ = plan_for_budget(provisional, budget_bytes)
    return plan


def estimated_costs(profile: Profile, device: str) -> Profile:
    """``profile`` with its recomputation times estimated for this ``device`` from its
    recorded ops (FLOPs and bytes), not timed; ``cost_source`` ``roofline``."""
    estimated = provisional_costs(profile, device)
    note = Note(
        NoteTopic.GENERAL,
        "recomputation times estimated from each op's FLOPs and bytes (not timed here)",
    )
    return dataclasses.replace(
        estimated, cost_source=CostSource.ROOFLINE, assumptions=(*estimated.assumptions, note)
    )


def measure_profile_costs(
    model_file: ModelFile,
    profile: Profile,
    *,
    device: str = "cpu",
    seed: int = 0,
    budget_bytes: int | None = None,
    timing_steps: int = 5,
    progress: ProgressCallback | None = None,
    host_link_bytes_per_s: float = 0.0,
) -> Profile:
    """``profile`` (its memory recorded, its times not: ``cost_source`` ``none``) with its
    times measured here, in real steps with a timing plan that fits ``budget_bytes`` (see
    the module docstring). Raises :class:`InfeasibleBudgetError` (with the smallest budget
    that fits) before anything real is allocated where no plan fits the budget.
    ``host_link_bytes_per_s``: on a CUDA device, its host link measured here; candidates
    are then offered offloading, costed at it
    (:func:`~planner.plan.targets.with_offload_options`; 0: not offered)."""
    provisional = provisional_costs(profile, device)
    if budget_bytes is None:
        timing_plan = build_plan(provisional, [], 0, strategy="timing")
    else:
        timing_plan = _timing_plan(provisional, budget_bytes)
    costs = measure_costs(
        model_file,
        profile,
        timing_plan,
        device=device,
        seed=seed,
        limit_bytes=budget_bytes,
        timing_steps=timing_steps,
        progress=progress,
    )
    measured = with_measured_costs(profile, costs, timing_plan.units, unit_cost_ms)
    if host_link_bytes_per_s > 0:
        return with_offload_options(measured, host_link_bytes_per_s)
    return measured


logger = logging.getLogger(__name__)


def _probe_names(profile: Profile, plan: Plan) -> list[str]:
    """The modules to try for recomputation: each wrapped module (nested ones too), and for
    ``checkpoint_sequential`` the children it runs in checkpointed segments; not an
    offloaded module, which is never recomputed."""
    names: list[str] = []
    for decision in plan.modules:
        if decision.method is CheckpointMethod.OFFLOAD:
            continue
        if decision.method is CheckpointMethod.CHECKPOINT_SEQUENTIAL:
            unit = Unit(decision.module_name, segments=decision.segments)
            names.extend(
                child
                for child in recomputed_modules(profile, unit)
                if any(True for m in profile.modules if m.module_name.startswith(child + "."))
                or profile.module(child).is_candidate
            )
        else:
            names.append(decision.module_name)
    return names


def _probe(
    profile: Profile,
    names: list[str],
    *,
    model_path: WorkloadSource | str | Path,
    device: str,
    seed: int,
) -> dict[str, str]:
    """Try the recomputation of ``names`` on fake tensors (no memory); for a profile
    recorded for real because fake tensors cannot run the step, on a real step."""
    model_file = load_model_file(model_path)
    if profile.memory_source is MemorySource.FAKE:
        workload, session = build_fake_workload(model_file, device_type(device), seed)
        return find_recompute_mismatches(workload, names, seed=seed, session=session)
    workload = build_workload(model_file, device=device, seed=seed)
    return find_recompute_mismatches(workload, names, seed=seed)


def _workload_here(source: WorkloadSource | str | Path) -> bool:
    """Whether a profile's workload can be built here: a Hugging Face source, or a model
    file that exists."""
    workload = WorkloadSource.of(source)
    return workload.is_hugging_face or workload.path.is_file()


def _timed(
    profile: Profile,
    budget_bytes: int,
    *,
    model_path: WorkloadSource | str | Path | None,
    seed: int,
    progress: ProgressCallback | None,
) -> Profile:
    source = model_path if model_path is not None else profile.model_file
    if not _workload_here(source):
        raise ProfileFileError(
            f"this profile holds no times (it was saved when no plan fit its budget) and its "
            f"model file {source} is not there: pass the model file (--check MODEL.py) to time it"
        )
    return measure_profile_costs(
        load_model_file(source),
        profile,
        device=profile.device,
        seed=seed,
        budget_bytes=budget_bytes,
        progress=progress,
    )


def with_times(
    profile: Profile,
    *,
    model_path: WorkloadSource | str | Path | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
) -> Profile:
    """``profile`` with times, for a trade-off curve: as it is where it has them; else (saved
    when no plan fit its budget) timed here in steps under the smallest budget any plan fits,
    the least memory a timing pass can take; where its model file is not here, estimated
    from its recorded ops (``cost_source`` ``roofline``), which the profile's assumptions
    say."""
    if profile.cost_source is not CostSource.NONE:
        return profile
    source = model_path if model_path is not None else profile.model_file
    if _workload_here(source):
        floor = Solver(profile).lowest_peak()[1]
        return _timed(profile, floor, model_path=source, seed=seed, progress=progress)
    estimated = estimated_costs(profile, profile.device)
    note = Note(
        NoteTopic.GENERAL,
        f"times estimated, not measured: the model file {source} is not here to time it",
    )
    return dataclasses.replace(estimated, assumptions=(*estimated.assumptions, note))


def _both(first: bool | None, second: bool | None) -> bool | None:
    """Two comparisons' verdict: False if either differs, True if both are equal, else None
    (not compared)."""
    if first is False or second is False:
        return False
    return True if first and second else None


def plan_checked(
    profile: Profile,
    budget_bytes: int,
    *,
    model_path: WorkloadSource | str | Path | None,
    device: str = "cpu",
    seed: int = 0,
    max_attempts: int = 3,
    reference: CheckReference = CheckReference.RECOMPUTATION,
    progress: ProgressCallback | None = None,
    offload: bool = True,
    host_budget_bytes: int | None = None,
) -> CheckedPlan:
    """Solve for ``budget_bytes`` and, if ``model_path`` is given, check the plan by running
    it (against ``reference``; on CPU the run is stopped if it passes the budget).
    ``offload``: whether modules may offload their saved tensors to host memory (where
    the profile offers it: times for a device with a host link), holding at most
    ``host_budget_bytes`` there together (None: no bound).

    Against the unplanned step, a step that differs (or two unplanned steps that differ, so
    nothing was compared) is run again against the recomputation: the modules whose
    recomputation differs from their forward (values fake tensors cannot see) are excluded
    and the plan is made again, as for the probe's.

    A profile without times (``cost_source`` ``none``: saved by ``profile`` when no plan fit
    its budget) is timed first, within ``budget_bytes``, on ``model_path`` or else the model
    file the profile names."""
    if profile.cost_source is CostSource.NONE:
        profile = _timed(profile, budget_bytes, model_path=model_path, seed=seed, progress=progress)

    def solver_for(profile: Profile, memory: MemoryModel | None = None) -> Solver:
        return Solver(profile, memory, offload=offload, host_budget_bytes=host_budget_bytes)

    solver = solver_for(profile)
    target = budget_bytes
    probed: set[str] = set()
    attempt = 0
    while attempt < max_attempts:
        attempt += 1
        try:
            plan, solution = plan_for_budget(
                profile, budget_bytes, solver=solver, plan_budget_bytes=target
            )
        except InfeasibleBudgetError as error:
            if attempt == 1:
                error.profile = profile
                raise
            budget_text, target_text = format_bytes_apart(budget_bytes, target)
            raise PlanCheckError(
                f"plans predicted to fit {budget_text} measured over it, and no "
                f"plan fits the corrected target {target_text}; try a larger budget"
            ) from None
        if model_path is None:
            return CheckedPlan(profile, plan, solution, None, attempt)
        # On fake tensors trying every candidate costs one step and no memory, and the
        # exclusions then do not depend on which plan came first (plans stay stable).
        wanted = (
            [record.module_name for record in profile.candidates]
            if profile.memory_source is MemorySource.FAKE and not probed
            else _probe_names(profile, plan)
        )
        untried = [name for name in wanted if name not in probed]
        if untried:
            if progress:
                progress(f"trying the recomputation of {len(untried)} modules", 0, 1)
            mismatches = _probe(profile, untried, model_path=model_path, device=device, seed=seed)
            probed.update(untried)
            if mismatches:
                logger.warning(
                    "excluding %d modules whose recomputation differs from their forward: %s",
                    len(mismatches),
                    ", ".join(sorted(mismatches)),
                )
                profile = exclude_modules(profile, mismatches)
                solver = solver_for(profile, solver.memory)
                attempt -= 1  # not a measured attempt
                continue
        if progress:
            progress(f"checking the plan by running it (attempt {attempt})", 0, 1)
        if plan.parallel is not None:
            check = check_plan_on_ranks(model_path, plan, device=device, seed=seed).combined()
        else:
            check = check_plan(
                model_path,
                plan,
                device=device,
                seed=seed,
                reference=reference,
                limit_bytes=budget_bytes if device == "cpu" else None,
            )
        undecided = check.loss_equal is None and check.recomputation_equal is None
        against_unplanned = reference is CheckReference.UNPLANNED and plan.parallel is None
        if against_unplanned and (not check.training_unchanged or undecided):
            # The steps differ, or could not be compared (two unplanned steps differ: the
            # model draws its own seeds). Comparing each recomputation with its forward
            # names the modules to blame, so they are excluded as below; a difference it
            # cannot pin on one is still an error.
            diagnosis = check_plan(
                model_path,
                plan,
                device=device,
                seed=seed,
                reference=CheckReference.RECOMPUTATION,
                limit_bytes=budget_bytes if device == "cpu" else None,
            )
            check = dataclasses.replace(
                check,
                recomputation_equal=diagnosis.recomputation_equal,
                recomputed_ops=diagnosis.recomputed_ops,
                buffers_equal=_both(check.buffers_equal, diagnosis.buffers_equal),
                recompute_mismatches=diagnosis.recompute_mismatches,
                mismatch_reasons=diagnosis.mismatch_reasons,
                differences=(*check.differences, *diagnosis.differences),
            )
        if check.recompute_mismatches:
            reasons = dict(
                zip(check.recompute_mismatches, map(str, check.mismatch_reasons), strict=True)
            )
            logger.warning("excluding %s: %s", ", ".join(reasons), "; ".join(reasons.values()))
            profile = exclude_modules(profile, reasons)
            solver = solver_for(profile, solver.memory)
            attempt -= 1  # not a memory attempt
            continue
        if not check.training_unchanged:
            raise PlanCheckError(
                "the plan changes the training step ("
                + "; ".join(map(str, check.differences[:3]))
                + "); please report this with your model file"
            )
        if not check.state_dict_keys_equal:
            raise PlanCheckError("internal error: applying the plan changed state_dict keys")
        if check.within_budget:
            plan = dataclasses.replace(
                plan, measured_peak_bytes=check.measured_peak_bytes, checked=True
            )
            return CheckedPlan(profile, plan, solution, check, attempt)
        overshoot = check.measured_peak_bytes - budget_bytes
        logger.warning(
            "plan measured %d bytes over the budget (predicted %d, measured %d); re-planning",
            overshoot,
            plan.predicted_peak_bytes,
            check.measured_peak_bytes,
        )
        target = min(target, plan.predicted_peak_bytes) - overshoot - max(1, budget_bytes // 200)
    raise PlanCheckError(
        f"after {max_attempts} attempts no plan measured within {format_bytes(budget_bytes)}; "
        "try a larger budget"
    )


def profile_and_plan(
    model_path: WorkloadSource | str | Path,
    budget_bytes: int,
    *,
    device: str = "cpu",
    seed: int = 0,
    check: bool = True,
    memory: MemorySource = MemorySource.FAKE,
    target: DeviceSpec | None = None,
    loop: LoopShape = PLAIN_LOOP,
    parallel: ParallelLayout | None = None,
    progress: ProgressCallback | None = None,
    expert_load: float = 1.0,
    offload: bool = True,
    host_budget_bytes: int | None = None,
    host_link_bytes_per_s: float = 0.0,
) -> CheckedPlan:
    """Load the model file, profile one step, solve for the budget, check the plan (see
    the module docstring). With ``parallel`` the plan is for one rank of that ``torchrun``
    job (its budget is each rank's peak); it is checked on that many real ranks here where
    ``check`` and the world size is at most :data:`MAX_CHECKED_RANKS`, else left unchecked
    (``ckpt-plan verify --nproc N`` runs it on the job's machines). With ``target`` the plan
    is for that device and is not run.
    ``loop`` is the training loop's shape (:class:`~planner.core.loop.LoopShape`): the
    step is profiled, timed and checked in it, and the plan records it. ``expert_load``: the
    routing planned for where a mixture-of-experts step's memory depends on it.
    ``offload`` and ``host_budget_bytes``: see :func:`plan_checked` (a profile offers
    offloading for a ``target`` with a host link, or on a CUDA device here given the
    ``host_link_bytes_per_s`` measured on it: see :func:`profile_model_file`).

    ``model_path`` is a model file's path or any workload's source
    (:class:`~planner.measure.source.WorkloadSource`, or its text); it travels to every
    stage."""
    model_file = load_model_file(model_path)
    if target is not None:
        check_budget_fits(target, budget_bytes)
        device = target.device_type
    if parallel is not None and parallel.pipeline is not None:
        from planner.pipeline_stages import plan_pipeline

        if memory is not MemorySource.FAKE or loop != PLAIN_LOOP or expert_load != 1.0:
            raise ParallelLayoutError(
                "pipeline stages are planned on fake tensors in the plain loop "
                "(without --memory real, --zero-grad-after-forward, --grad-accum or "
                "--expert-load)"
            )
        return plan_pipeline(
            model_file,
            budget_bytes,
            parallel,
            device=device,
            seed=seed,
            check=check,
            target=target,
            progress=progress,
            offload=offload,
            host_budget_bytes=host_budget_bytes,
        )
    profile = profile_model_file(
        model_file,
        device=device,
        seed=seed,
        memory=memory,
        budget_bytes=budget_bytes,
        target=target,
        loop=loop,
        parallel=parallel,
        progress=progress,
        expert_load=expert_load,
        host_link_bytes_per_s=host_link_bytes_per_s if offload and target is None else 0.0,
    )
    runnable_here = ranks_run_here(parallel, device)
    result = plan_checked(
        profile,
        budget_bytes,
        model_path=model_file.source if check and target is None and runnable_here else None,
        device=device,
        seed=seed,
        progress=progress,
        offload=offload,
        host_budget_bytes=host_budget_bytes,
    )
    if target is not None:
        result = marked_unchecked(result, target, model_file.source)
    elif parallel is not None and check and not runnable_here:
        result = marked_unchecked_ranks(result, parallel, model_file.source)
    return result


def ranks_run_here(parallel: ParallelLayout | None, device: str) -> bool:
    """Whether a plan for ``parallel`` is checked on this machine: one process always; ranks
    up to :data:`MAX_CHECKED_RANKS`, any number on CPU, one GPU each."""
    if parallel is None:
        return True
    if parallel.world_size > MAX_CHECKED_RANKS:
        return False
    if not device.startswith("cuda"):
        return True
    import torch

    return torch.cuda.device_count() >= parallel.world_size


def marked_unchecked_ranks(
    result: CheckedPlan, parallel: ParallelLayout, source: WorkloadSource
) -> CheckedPlan:
    """``result`` with a note that its plan for more ranks than run here is not checked, and
    the command that checks it on the job's machines."""
    command = f"ckpt-plan verify {workload_in_command(source)} PLAN"
    note = Note(
        NoteTopic.UNCHECKED,
        f"made for {parallel.world_size} ranks, more than are launched here; "
        f"run `{command} --nproc {parallel.world_size}` on the job's machines before "
        "training",
    )
    plan = dataclasses.replace(result.plan, notes=(*result.plan.notes, note))
    return dataclasses.replace(result, plan=plan)


MAX_CHECKED_RANKS = 4
"""The most ranks ``profile`` launches on this machine to check a plan for a parallel job."""


def marked_unchecked(
    result: CheckedPlan, target: DeviceSpec, source: WorkloadSource
) -> CheckedPlan:
    """``result`` with its plan noted as unchecked: made for ``target``, which is not here,
    to be run by ``ckpt-plan verify`` on the workload of ``source`` there before training."""
    note = Note(
        NoteTopic.UNCHECKED,
        f"made for {target.name}, which is not here; run `ckpt-plan verify "
        f"{workload_in_command(source)} PLAN` on it before training",
    )
    plan = dataclasses.replace(result.plan, notes=(*result.plan.notes, note))
    return dataclasses.replace(result, plan=plan)
