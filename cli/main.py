"""``ckpt-plan``: the command-line front of the planner library.

Thin by design: each command parses its options, calls one library function and prints
results on stdout (diagnostics and progress on stderr). Every :class:`PlannerError` becomes
one line and an exit code from :data:`EXIT_CODES`; a traceback appears only with --verbose.
"""

from __future__ import annotations

import functools
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from planner.core import errors
from planner.core.loop import ZeroGrad
from planner.core.records import CostSource, MemorySource, Profile
from planner.core.units import format_bytes
from planner.measure.source import workload_in_command

from .boundary import (
    configure_logging,
    errors_to_exit_codes,
    fail,
    progress_line,
    stderr,
    stdout,
    warn,
)
from .options import (
    AutocastOption,
    BatchSizeOption,
    BudgetOption,
    ChoicesOption,
    ClipsOption,
    Device,
    DeviceOption,
    DtypeOption,
    ExpertLoadOption,
    GradAccumOption,
    HfOption,
    HostBudgetOption,
    ImagesOption,
    LoraOption,
    MeshOption,
    MicrobatchesOption,
    NoSyncOption,
    OffloadOption,
    ParallelOption,
    PpOption,
    ProfileArgument,
    ReferenceChoice,
    ScheduleOption,
    SeqLenOption,
    TargetOption,
    TpOption,
    VerboseOption,
    WorldSizeOption,
    ZeroGradOption,
    given_host_budget,
    host_budget,
    loop_shape,
    parallel_layout,
    parse_budget,
    require_device,
    target_and_device,
    workload_source,
)

if TYPE_CHECKING:
    from planner.core.parallel import ParallelLayout
    from planner.core.records import Profile
    from planner.plan.plan_file import Plan
    from planner.plan.targets import DeviceSpec

from .render import (
    print_device_spec,
    print_fit,
    print_plan_summary,
    print_verification,
    warn_own_checkpointing,
)


def _plan_path(model_name: str, file_name: str = "plan.json") -> Path:
    """Where a command writes a plan when not told: ``profiles/<model name>/plan.json`` (the
    profile beside it)."""
    return Path("profiles") / model_name / file_name


def _world_size(layout: ParallelLayout | None) -> int:
    """The ranks of the job a plan is one rank of (1: one process)."""
    return 1 if layout is None else layout.world_size


def _host_line(plan: Plan) -> str:
    """The host memory a plan that offloads holds, and its host budget."""
    text = format_bytes(plan.predicted_host_peak_bytes)
    if plan.host_budget_bytes is not None:
        text += f" of a {format_bytes(plan.host_budget_bytes)} host budget"
    return text


def _measured_host_link(
    device: Device,
    budget_bytes: int,
    *,
    offload: bool,
    spec: DeviceSpec | None,
    layout: ParallelLayout | None,
) -> float:
    """The rate offloading is costed at where a command times a step on a GPU here (`profile`,
    `fit`): the host link of the CUDA device, measured now with copies that fit a quarter of
    the budget (see `calibrate`), and a line on stderr says what it found. 0 (nothing
    measured, offloading not offered this way) without --offload, with --target (its spec
    has a link), off CUDA, or for one rank of a torchrun job (estimated, not timed)."""
    if not offload or spec is not None or device is not Device.cuda or layout is not None:
        return 0.0
    from planner.measure.host_link import DEFAULT_COPY_BYTES, measure_host_link

    link = measure_host_link(
        device.value, size_bytes=max(1, min(DEFAULT_COPY_BYTES, budget_bytes // 4))
    )
    stderr.print(
        f"host link of {link.device_name}: {link.bytes_per_s / 1e9:.1f} GB/s each way "
        f"(measured; offloading is costed at it)"
    )
    return link.bytes_per_s


def _report_folder(model_name: str) -> Path:
    """Where a command writes a report when not told: ``reports/<model name>/``."""
    return Path("reports") / model_name


app = typer.Typer(
    name="ckpt-plan",
    help="Plan activation checkpointing for PyTorch training under a memory budget.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def profile(
    budget: BudgetOption,
    model: Annotated[
        Path | None,
        typer.Argument(
            help="Python model file defining build_model() and sample_batch() "
            "(optionally training_step, loss_fn, build_optimizer); or --hf CONFIG instead.",
            show_default=False,
            metavar="MODEL.py",
        ),
    ] = None,
    hf: HfOption = None,
    batch_size: BatchSizeOption = None,
    seq_len: SeqLenOption = None,
    images: ImagesOption = None,
    clips: ClipsOption = None,
    choices: ChoicesOption = None,
    lora: LoraOption = None,
    autocast: AutocastOption = None,
    dtype: DtypeOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Where to write the plan JSON (the profile is saved beside it).",
            show_default="profiles/<model name>/plan.json",
        ),
    ] = None,
    device: DeviceOption = Device.cpu,
    report_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder for the report (charts and summary.md).",
            show_default="reports/<model name>/",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for the model, batch and random ops.")] = 0,
    target: TargetOption = None,
    memory: Annotated[
        MemorySource,
        typer.Option(
            "--memory",
            help="fake: record the step on fake tensors (no memory used); real: run the "
            "unplanned step for real (it must fit this machine), as a cross-check.",
        ),
    ] = MemorySource.FAKE,
    zero_grad: ZeroGradOption = ZeroGrad.BEFORE_FORWARD,
    grad_accum: GradAccumOption = 1,
    no_sync: NoSyncOption = False,
    world_size: WorldSizeOption = None,
    parallel: ParallelOption = None,
    mesh: MeshOption = None,
    tp: TpOption = None,
    pp: PpOption = None,
    microbatches: MicrobatchesOption = None,
    schedule: ScheduleOption = "1f1b",
    expert_load: ExpertLoadOption = 1.0,
    offload: OffloadOption = True,
    host_budget_text: HostBudgetOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Profile one training step, choose the cheapest checkpointing plan that fits BUDGET,
    check it by running it, and write the plan, the profile and a report with charts.

    No pass needs more memory than BUDGET (with the default --memory fake): the step is
    recorded on fake tensors, times are taken in steps that fit, and the check runs only
    the planned step. With --world-size N --parallel ddp|fsdp2 the plan is for one rank of a
    torchrun job (BUDGET per rank), simulated here and checked on N real ranks where N <= 4;
    with --pp S a plan for each pipeline stage (BUDGET per stage's rank), in one file."""
    configure_logging(verbose)
    budget_bytes = parse_budget(budget)
    with errors_to_exit_codes(verbose):
        layout = parallel_layout(world_size, parallel, mesh, tp, pp, microbatches, schedule)
        source = workload_source(
            model,
            hf,
            batch_size,
            seq_len,
            dtype,
            images=images,
            clips=clips,
            choices=choices,
            lora=lora,
            autocast=autocast,
        )
        if source is None:
            fail("pass a model file (MODEL.py) or --hf CONFIG", 2)
        spec, device = target_and_device(target, device)
        host_budget_bytes = host_budget(host_budget_text, offload, spec, _world_size(layout))
        # On a GPU here, offloading is costed at the host link measured now.
        link_bytes_per_s = _measured_host_link(
            device, budget_bytes, offload=offload, spec=spec, layout=layout
        )
        from planner.pipeline import profile_and_plan
        from planner.plan.plan_file import save_plan
        from planner.plan.profile_file import save_profile, save_profile_table
        from planner.report import write_report

        try:
            with progress_line() as progress:
                result = profile_and_plan(
                    source,
                    budget_bytes,
                    device=device.value,
                    seed=seed,
                    memory=memory,
                    target=spec,
                    loop=loop_shape(zero_grad, grad_accum, no_sync),
                    parallel=layout,
                    progress=progress,
                    expert_load=expert_load,
                    offload=offload,
                    host_budget_bytes=host_budget_bytes,
                    host_link_bytes_per_s=link_bytes_per_s,
                )
        except errors.InfeasibleBudgetError as error:
            # Keep what was measured: re-solving at a budget that fits needs no new profile.
            if isinstance(error.profile, Profile) and layout is not None and layout.pipeline:
                # One stage's profile: re-solving it alone would not plan the pipeline.
                stdout.print(
                    "re-plan the pipeline with a budget that fits this stage: --budget "
                    f"{error.min_budget_bytes} or more"
                )
            elif isinstance(error.profile, Profile):
                warn_own_checkpointing(error.profile)
                plan_path = out or _plan_path(error.profile.model_name)
                saved = save_profile(error.profile, plan_path.parent / "profile.json")
                stdout.print(f"wrote {saved} (the profile; no plan, none fits the budget)")
                run_with = (
                    ""
                    if spec is not None
                    else f" {workload_in_command(source)}"
                    if hf is not None
                    else f" --check {shlex.quote(str(source))}"
                )
                stdout.print(
                    "re-solve it without profiling again: ckpt-plan solve "
                    f"{shlex.quote(str(saved))} --budget {error.min_budget_bytes}{run_with}"
                )
            raise
        warn_own_checkpointing(result.profile)
        name = result.profile.model_name
        plan_path = out or _plan_path(name)
        charts = report_dir or _report_folder(name)
        if result.stages:
            wrote = _write_stages(result, plan_path, charts, offload, host_budget_bytes)
            wrote.append(save_plan(result.plan, plan_path))  # last, as below
            print_plan_summary(result, wrote)
            return
        wrote = [
            save_profile(result.profile, plan_path.parent / "profile.json"),
            save_profile_table(result.profile, plan_path.parent / "profile.csv"),
        ]
        # A check against the unplanned step measured it too: a point on the charts.
        check = result.check
        measured = (
            {"none": check.unplanned_peak_bytes}
            if check is not None and check.unplanned_peak_bytes is not None
            else {}
        )
        wrote += write_report(
            result.profile,
            result.plan,
            charts,
            measured=measured,
            frontier_points=20,
            offload=offload,
            host_budget_bytes=host_budget_bytes,
        )
        wrote.append(save_plan(result.plan, plan_path))  # last: a plan file means a complete run
        print_plan_summary(result, wrote)


def _write_stages(
    result: Any, plan_path: Path, charts: Path, offload: bool, host_budget_bytes: int | None
) -> list[Path]:
    """A pipeline's outputs: each stage's profile beside the plan, its report in
    ``stage<N>/``, and the page over the stages (``stages.md``, ``stages.png``)."""
    from planner.plan.profile_file import save_profile
    from planner.report import write_report, write_stages_report

    wrote: list[Path] = []
    for index, stage in enumerate(result.stages):
        wrote.append(save_profile(stage.profile, plan_path.parent / f"profile-stage{index}.json"))
        wrote += write_report(
            stage.profile,
            stage.plan,
            charts / f"stage{index}",
            frontier_points=20,
            offload=offload,
            host_budget_bytes=host_budget_bytes,
        )
    return wrote + write_stages_report(result.plan, charts)


@app.command()
def fit(
    budget: BudgetOption,
    model: Annotated[
        Path | None,
        typer.Argument(
            help="Model file whose sample_batch takes batch_size (sample_batch(batch_size=8)); "
            "or --hf CONFIG instead.",
            show_default=False,
            metavar="MODEL.py",
        ),
    ] = None,
    hf: HfOption = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            min=1,
            help="With --hf: hold the batch size and fit the sequence length instead.",
            show_default=False,
        ),
    ] = None,
    seq_len: Annotated[
        int | None,
        typer.Option(
            "--seq-len",
            min=1,
            help="With --hf: the sequence length at which to fit the batch size.",
            show_default=False,
        ),
    ] = None,
    images: ImagesOption = None,
    clips: ClipsOption = None,
    choices: ChoicesOption = None,
    lora: LoraOption = None,
    autocast: AutocastOption = None,
    dtype: DtypeOption = None,
    zero_grad: ZeroGradOption = ZeroGrad.BEFORE_FORWARD,
    grad_accum: GradAccumOption = 1,
    no_sync: NoSyncOption = False,
    max_size: Annotated[int, typer.Option(min=1, help="Stop the search at this size.")] = 1 << 16,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Where to write the plan for the largest size.",
            show_default="profiles/<model name>/plan-batch<N>.json (plan-seq<N>.json)",
        ),
    ] = None,
    device: DeviceOption = Device.cpu,
    seed: Annotated[int, typer.Option(help="Seed for the model, batch and random ops.")] = 0,
    target: TargetOption = None,
    world_size: WorldSizeOption = None,
    parallel: ParallelOption = None,
    mesh: MeshOption = None,
    tp: TpOption = None,
    expert_load: ExpertLoadOption = 1.0,
    offload: OffloadOption = True,
    host_budget_text: HostBudgetOption = None,
    verbose: VerboseOption = False,
) -> None:
    """The largest batch size for which a checkpointing plan fits BUDGET, with its plan, and
    the batch size with the highest predicted samples per second among those that fit.
    With --hf, give --seq-len to fit the batch size, or --batch-size to fit the sequence
    length (an image classifier's: neither; its batch size is fitted).

    Sizes are tried on fake tensors (no memory used), growing and then narrowing in on the
    largest that fits; the sizes that fit are timed to predict their throughput with their
    cheapest plan. With
    --world-size N --parallel ddp|fsdp2 the size is fitted for one rank of a torchrun job
    (BUDGET per rank; times estimated from the ops, not timed). Plans may offload saved
    tensors to host memory within --host-budget where the device has a host link: a
    --target's, or with --device cuda the GPU's, measured once as profile measures it."""
    configure_logging(verbose)
    budget_bytes = parse_budget(budget)
    with errors_to_exit_codes(verbose):
        layout = parallel_layout(world_size, parallel, mesh, tp)
        dimension = "batch_size"
        give_one = (
            "with --hf give one of --seq-len (to fit the batch size) or --batch-size "
            "(to fit the sequence length)"
        )
        if hf is not None:
            if batch_size is not None and seq_len is not None:
                fail(give_one, 2)
            dimension = "batch_size" if batch_size is None else "seq_len"
        elif batch_size is not None:
            fail("--batch-size is what fit searches for a model file; leave it out", 2)
        if hf is not None:  # the searched one starts at 1; fit_largest resizes it
            batch_size = batch_size or 1
            seq_len = 1 if dimension == "seq_len" else seq_len
        source = workload_source(
            model,
            hf,
            batch_size,
            seq_len,
            dtype,
            images=images,
            clips=clips,
            choices=choices,
            lora=lora,
            autocast=autocast,
        )
        if source is None:
            fail("pass a model file (MODEL.py) or --hf CONFIG", 2)
        if hf is not None and dimension == "seq_len":  # the search starts at the shortest
            from planner.measure.hf import min_seq_len

            source = source.with_seq_len(min_seq_len(source))
        if hf is not None and (source.seq_len is None or dimension == "seq_len"):
            from planner.measure.hf import InputKind, input_kind

            kind = input_kind(source)
            if kind is InputKind.TOKENS and source.seq_len is None:
                fail(give_one, 2)
            clip = {  # the length its batch needs beside the batch size
                InputKind.AUDIO: " and give --seq-len, the clips' length,",
                InputKind.IMAGE_TEXT: " and give --seq-len, the tokens of each image's text,",
                InputKind.IMAGE_CAPTIONS: " and give --seq-len, the tokens of each caption,",
            }.get(kind, "")
            if kind is not InputKind.TOKENS and (dimension == "seq_len" or clip):
                fail(
                    f"--hf {hf}: the model takes {kind.value}, and fit fits its batch size only; "
                    f"leave out --batch-size{clip} to fit it",
                    2,
                )
        spec, device = target_and_device(target, device)
        host_budget_bytes = host_budget(host_budget_text, offload, spec, _world_size(layout))
        # On a GPU here, offloading is costed at the host link measured now, once.
        link_bytes_per_s = _measured_host_link(
            device, budget_bytes, offload=offload, spec=spec, layout=layout
        )
        from planner.fit import fit_largest
        from planner.measure.workload import load_model_file
        from planner.plan.plan_file import save_plan

        with progress_line() as progress:
            result = fit_largest(
                load_model_file(source),
                budget_bytes,
                dimension=dimension,
                device=device.value,
                seed=seed,
                target=spec,
                max_size=max_size,
                loop=loop_shape(zero_grad, grad_accum, no_sync),
                parallel=layout,
                progress=progress,
                expert_load=expert_load,
                offload=offload,
                host_budget_bytes=host_budget_bytes,
                host_link_bytes_per_s=link_bytes_per_s,
            )
        print_fit(result)
        name = result.planned.profile.model_name
        short = "batch" if dimension == "batch_size" else "seq"
        plan_path = out or _plan_path(name, f"plan-{short}{result.largest}.json")
        print_plan_summary(result.planned, [save_plan(result.planned.plan, plan_path)])


@app.command()
def report(
    source: Annotated[
        Path,
        typer.Argument(
            help="A plan.json (its profile.json is read from beside it) or a profile.json, "
            "both written by `ckpt-plan profile`.",
            show_default=False,
            metavar="PLAN_OR_PROFILE.json",
        ),
    ],
    profile_path: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="The profile the plan was made from, if not profile.json beside the plan.",
            show_default="profile.json beside the plan",
        ),
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            "-b",
            help="Only with a profile: plan for this budget (solved, not run), e.g. 800MiB. "
            "Without it a profile is reported as it is, with no plan.",
            show_default=False,
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out-dir",
            "-o",
            help="Folder for the charts and summary.md.",
            show_default="reports/<model name>/",
        ),
    ] = None,
    svg: Annotated[bool, typer.Option("--svg", help="Also write the charts as SVG.")] = False,
    offload: OffloadOption = True,
    host_budget_text: HostBudgetOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Write the charts (trade-off, modules, memory timeline) and summary.md for a plan or a
    profile, without profiling again. The trade-off curve's plans (and a plan solved for
    --budget) may offload where the profile offers it, within --host-budget; the host
    memory of those that do is on the chart's right axis and in summary.md."""
    configure_logging(verbose)
    budget_bytes = parse_budget(budget) if budget is not None else None
    given_host_budget(host_budget_text, offload)  # a bad --host-budget fails first
    with errors_to_exit_codes(verbose):
        from planner.report import load_report_inputs, write_report

        @functools.cache
        def host_budget_of_job(world_size: int) -> int | None:  # the default read once
            return host_budget(host_budget_text, offload, None, world_size)

        def host_budget_of(profile: Profile) -> int | None:
            return host_budget_of_job(_world_size(profile.parallel))

        loaded, plan = load_report_inputs(
            source,
            profile_path=profile_path,
            budget_bytes=budget_bytes,
            offload=offload,
            host_budget_bytes=host_budget_of,
        )
        host_budget_bytes = host_budget_of(loaded)
        folder = out_dir or _report_folder(loaded.model_name)
        with progress_line() as progress:
            progress("solving budgets for the trade-off curve and drawing", 0, 0)
            wrote = write_report(
                loaded,
                plan,
                folder,
                formats=("png", "svg") if svg else ("png",),
                offload=offload,
                host_budget_bytes=host_budget_bytes,
            )
        if plan.offloads:
            stdout.print(f"host memory (offloaded tensors): {_host_line(plan)}")
        for path in wrote:
            stdout.print(f"wrote {path}")


@app.command()
def solve(
    profile_path: ProfileArgument,
    budget: BudgetOption,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Where to write the plan JSON.",
            show_default="plan.json beside the profile",
        ),
    ] = None,
    check: Annotated[
        Path | None,
        typer.Option(
            help="Also check the plan by running this model file (as `profile` does); "
            "--hf CONFIG to check it on a Hugging Face config instead."
        ),
    ] = None,
    hf: HfOption = None,
    batch_size: BatchSizeOption = None,
    seq_len: SeqLenOption = None,
    images: ImagesOption = None,
    clips: ClipsOption = None,
    choices: ChoicesOption = None,
    lora: LoraOption = None,
    autocast: AutocastOption = None,
    dtype: DtypeOption = None,
    offload: OffloadOption = True,
    host_budget_text: HostBudgetOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Re-plan for another BUDGET from a saved profile, without profiling again."""
    configure_logging(verbose)
    budget_bytes = parse_budget(budget)
    given_host_budget(host_budget_text, offload)  # a bad --host-budget fails first
    with errors_to_exit_codes(verbose):
        from planner.checked_plan import CheckedPlan
        from planner.plan.plan_file import save_plan
        from planner.plan.profile_file import load_profile, save_profile
        from planner.solve.planning import plan_for_budget

        loaded = load_profile(profile_path)
        host_budget_bytes = host_budget(
            host_budget_text, offload, None, _world_size(loaded.parallel)
        )
        source = workload_source(
            check,
            hf,
            batch_size,
            seq_len,
            dtype,
            images=images,
            clips=clips,
            choices=choices,
            lora=lora,
            autocast=autocast,
            model_option="--check MODEL.py",
            recorded=loaded.model_file,
        )
        if source is None and loaded.cost_source is not CostSource.NONE:
            # Solving alone is pure Python: no torch to import, nothing to run.
            from planner.solve import Solver

            solver = Solver(loaded, offload=offload, host_budget_bytes=host_budget_bytes)
            plan, solution = plan_for_budget(loaded, budget_bytes, solver=solver)
            result = CheckedPlan(loaded, plan, solution, None, 1)
        else:
            from planner.pipeline import plan_checked

            with progress_line() as progress:
                result = plan_checked(
                    loaded,
                    budget_bytes,
                    model_path=source,
                    device=loaded.device,
                    progress=progress,
                    offload=offload,
                    host_budget_bytes=host_budget_bytes,
                )
        wrote = []
        if loaded.cost_source is CostSource.NONE:
            # Timed now (it was saved when no plan fit): keep the times for the next solve.
            wrote.append(save_profile(result.profile, profile_path))
        plan_path = out or profile_path.parent / "plan.json"
        print_plan_summary(result, [*wrote, save_plan(result.plan, plan_path)])


@app.command()
def tradeoff(
    profile_path: ProfileArgument,
    points: Annotated[int, typer.Option(min=2, max=1000, help="How many budgets to solve.")] = 50,
    csv: Annotated[
        Path | None, typer.Option(help="Also write the frontier as CSV to this path.")
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="The profile's model file, where it has moved: a profile saved when no plan "
            "fit its budget holds no times, and is timed from it first.",
            show_default="the profile's own",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for timing a profile without times.")] = 0,
    offload: OffloadOption = True,
    host_budget_text: HostBudgetOption = None,
    verbose: VerboseOption = False,
) -> None:
    """The memory/time frontier: the cheapest plan at POINTS budgets from the smallest
    that fits to the unplanned peak, and the usual baselines for comparison. A profile saved
    when no plan fit its budget (exit 3) is timed first, under the smallest budget that fits
    (or its times estimated from its ops where the model file is gone), and saved. Plans may
    offload where the profile offers it (--target), within --host-budget; where any does,
    the table has a host_peak_mib column."""
    configure_logging(verbose)
    given_host_budget(host_budget_text, offload)  # a bad --host-budget fails first
    with errors_to_exit_codes(verbose):
        import time

        import pandas as pd

        from planner.core.fileio import atomic_path
        from planner.plan.policies import option_summary
        from planner.plan.profile_file import load_profile, save_profile
        from planner.solve import Solver
        from planner.solve.planning import baseline_plans, frontier

        loaded = load_profile(profile_path)
        host_budget_bytes = host_budget(
            host_budget_text, offload, None, _world_size(loaded.parallel)
        )
        with progress_line() as progress:
            if loaded.cost_source is CostSource.NONE:
                # Saved when no plan fit its budget: time it once, under the smallest budget
                # any plan fits, and keep the times for next time.
                from planner.pipeline import with_times

                loaded = with_times(loaded, model_path=model, seed=seed, progress=progress)
                save_profile(loaded, profile_path)
                stderr.print(f"timed {profile_path} ({loaded.cost_source.value} times); saved")
        started = time.perf_counter()
        with progress_line() as progress:
            progress(f"solving {points} budgets", 0, points)
            solver = Solver(loaded, offload=offload, host_budget_bytes=host_budget_bytes)
            plans = frontier(loaded, points, solver=solver)
        seconds = time.perf_counter() - started
        every = [*baseline_plans(loaded).values(), *plans]
        # The host column only where a plan offloads (other tables stay as they were).
        offloading = any(plan.offloads for plan in every)
        rows = [
            {
                "strategy": plan.strategy,
                "budget_mib": round(plan.budget_bytes / 2**20, 2) if plan.budget_bytes else "-",
                "predicted_peak_mib": round(plan.predicted_peak_bytes / 2**20, 2),
                **(
                    {"host_peak_mib": round(plan.predicted_host_peak_bytes / 2**20, 2)}
                    if offloading
                    else {}
                ),
                "recompute_ms": round(plan.recompute_ms, 2),
                "overhead_pct": round(100 * plan.predicted_overhead, 1),
                "units": len(plan.modules),
                "how": option_summary(plan.units),
            }
            for plan in every
        ]
        frame = pd.DataFrame(rows)
        table = Table(title=f"memory/time trade-off of {loaded.model_name}", title_justify="left")
        for column in frame.columns:
            table.add_column(column, justify="left" if column in ("strategy", "how") else "right")
        for row in frame.itertuples(index=False):
            table.add_row(*map(str, row))
        stdout.print(table)
        stdout.print(f"solved {len(plans)} budgets in {seconds:.2f} s")
        if offloading and host_budget_bytes is not None:
            bound = format_bytes(host_budget_bytes)
            stdout.print(f"host budget of the plans that offload: {bound}")
        if csv is not None:
            with atomic_path(csv) as temp_path:
                frame.to_csv(temp_path, index=False)
            stdout.print(f"wrote {csv}")


@app.command()
def verify(
    model: Annotated[
        Path | None,
        typer.Argument(
            help="The model file the plan was made for (or --hf CONFIG); without either, the "
            "one the plan records.",
            show_default=False,
            metavar="MODEL.py",
        ),
    ] = None,
    plan_path: Annotated[
        Path | None,
        typer.Argument(
            help="A plan.json written by `ckpt-plan profile`.", show_default=False, metavar="PLAN"
        ),
    ] = None,
    hf: Annotated[
        Path | None,
        typer.Option(
            "--hf",
            help="Verify on a Hugging Face config (a local config.json or a folder holding "
            "one) instead of a model file; --batch-size, --seq-len and --dtype default to the "
            "plan's.",
            metavar="CONFIG",
            show_default=False,
        ),
    ] = None,
    batch_size: BatchSizeOption = None,
    seq_len: SeqLenOption = None,
    images: ImagesOption = None,
    clips: ClipsOption = None,
    choices: ChoicesOption = None,
    lora: LoraOption = None,
    autocast: AutocastOption = None,
    dtype: DtypeOption = None,
    device: Annotated[
        Device | None,
        typer.Option("--device", help="Device to run on.", show_default="the plan's device"),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for the model, batch and random ops.")] = 0,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="Run the planned step under torch.utils.checkpoint's debug mode: if a "
            "recomputation differs from the forward, print both runs' operations.",
        ),
    ] = False,
    reference: Annotated[
        ReferenceChoice,
        typer.Option(
            "--reference",
            help="What the planned step is compared with. unplanned: run the unplanned step "
            "too and compare loss, gradients and buffers (needs its memory); recomputation: "
            "compare every recomputation with its forward, op by op (needs only the plan's "
            "memory); auto: unplanned where its peak fits the free memory here.",
        ),
    ] = ReferenceChoice.auto,
    nproc: Annotated[
        int | None,
        typer.Option(
            "--nproc",
            help="Run a plan made for a torchrun job (--world-size) on this many real ranks "
            "here under torchrun (gloo on CPU, NCCL on GPUs, one per rank): every rank within "
            "the budget, its loss, gradient shards and buffers equal the unplanned step's.",
            show_default="the plan's world size",
        ),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Run the planned step and show it trains exactly as the unplanned step would (see
    --reference), and that its peak is within the budget: exit 0 if so, 5 if not."""
    configure_logging(verbose)
    if plan_path is None:  # one path given: it is the plan
        model, plan_path = None, model
    if plan_path is None or plan_path.suffix == ".py":
        fail("pass the plan: ckpt-plan verify [MODEL.py] PLAN", 2)
    with errors_to_exit_codes(verbose):
        require_device(device)
        from planner.check.result import CheckReference
        from planner.check.verify import verify_plan
        from planner.plan.plan_file import load_plan

        recorded = load_plan(plan_path).model_file if hf is not None else None
        source = workload_source(
            model,
            hf,
            batch_size,
            seq_len,
            dtype,
            images=images,
            clips=clips,
            choices=choices,
            lora=lora,
            autocast=autocast,
            recorded=recorded,
        )

        try:
            with progress_line() as progress:
                progress("running the planned step and its reference", 0, 0)
                result = verify_plan(
                    source,
                    plan_path,
                    device=device.value if device else None,
                    seed=seed,
                    debug=debug,
                    reference=None
                    if reference is ReferenceChoice.auto
                    else CheckReference(reference.value),
                    on_warning=warn,
                    nproc=nproc,
                )
        except errors.PlanCheckError as error:
            # With --debug the error's trace is checkpoint's log of both runs.
            summary = str(error)
            if error.trace:
                stderr.out(error.trace, highlight=False)
            elif not debug:
                summary += "; run again with --debug to trace the recomputation"
            raise errors.PlanCheckError(summary) from error
        print_verification(result)
        failures = result.failures()
        if failures:
            raise errors.PlanCheckError("the plan failed verification: " + "; ".join(failures))
        stdout.print("verified: the plan fits its budget and leaves the training step unchanged")


@app.command()
def calibrate(
    device: Annotated[
        str, typer.Option("--device", help="The CUDA device to measure (cuda, cuda:1).")
    ] = "cuda",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Measure everything a device spec holds (memory, cuBLAS workspace, bandwidth, "
            "matmul FLOP/s per dtype, kernel efficiencies, host time per op, checkpointing's "
            "cost, the host link; under a minute) and write the spec to this .json, for "
            "--target.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="With --out: the spec's name, which plans made for it record (default: "
            "the GPU's name in lower case, as nvidia-h100-80gb-hbm3).",
            show_default=False,
        ),
    ] = None,
    size: Annotated[
        str,
        typer.Option("--size", help="Bytes per timed host-link copy (units as for --budget)."),
    ] = "256MiB",
    copies: Annotated[
        int,
        typer.Option(
            "--copies", min=1, help="Timed host-link copies each way (the median is kept)."
        ),
    ] = 5,
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="A device spec JSON (as --target takes) to write the measured link into "
            "(host_link_bytes_per_s), for plans made for this GPU elsewhere.",
            show_default=False,
        ),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Measure the link between this CUDA device and pinned host memory, each way: what
    offloaded tensors are copied at. `profile --device cuda` measures it itself (and then
    offers offloading); --spec writes it into a device spec for --target. With --out,
    measure everything a device spec holds and write one: `--target SPEC.json` then plans
    for this GPU from any machine."""
    configure_logging(verbose)
    size_bytes = parse_budget(size, "--size")
    if out is not None and spec is not None:
        fail("--out writes a whole spec, --spec the link into one: pass one of them", 2)
    if name is not None and out is None:
        fail("--name goes with --out (the spec it names)", 2)
    with errors_to_exit_codes(verbose):
        if out is not None:
            _calibrate_spec(device, out, name, size_bytes, copies)
            return
        from planner.measure.host_link import measure_host_link
        from planner.plan.targets import check_spec_file, write_host_link

        if spec is not None:
            check_spec_file(spec)  # before measuring: a bad file is known at once
        link = measure_host_link(device, size_bytes=size_bytes, copies=copies)
        stdout.print(
            f"host link of {link.device_name} ({link.device}), pinned host memory, median of "
            f"{link.copies} copies of {format_bytes(link.size_bytes)}: to the device "
            f"{link.to_device_bytes_per_s / 1e9:.1f} GB/s, to the host "
            f"{link.to_host_bytes_per_s / 1e9:.1f} GB/s; host_link_bytes_per_s "
            f"{link.bytes_per_s:.4g}"
        )
        if spec is not None:
            write_host_link(spec, link.bytes_per_s)
            stdout.print(f"wrote host_link_bytes_per_s into {spec}")


def _calibrate_spec(device: str, out: Path, name: str | None, size_bytes: int, copies: int) -> None:
    """`calibrate --out`: measure the device, write its spec, print what it holds."""
    from planner.measure.gpu_calibration import calibrate_device
    from planner.plan.calibration import spec_from_measurements
    from planner.plan.targets import check_spec_output, write_spec

    check_spec_output(out)  # before measuring: a path --target cannot take is known at once

    def progress(what: str, done: int, total: int) -> None:
        stderr.print(f"calibrating {device} ({done + 1}/{total}): {what}")

    measured = calibrate_device(
        device, host_link_bytes=size_bytes, host_link_copies=copies, progress=progress
    )
    written = spec_from_measurements(measured, name)
    write_spec(out, written)
    print_device_spec(written)
    stdout.print(f"wrote {out}; plan for this GPU with --target {out}")


@app.callback()
def main() -> None:
    """ckpt-plan: measure a model, pick the modules to checkpoint, apply in one line."""


if __name__ == "__main__":
    app()
