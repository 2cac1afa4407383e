"""``ckpt-plan``: the command-line front of the planner library.

Thin by design: each command parses its options, calls one library function and prints
results on stdout (diagnostics and progress on stderr). Every :class:`PlannerError` becomes
one line and an exit code from :data:`EXIT_CODES`; a traceback appears only with --verbose.
"""

from __future__ import annotations

import enum
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from planner import errors
from planner.units import format_bytes, parse_bytes

app = typer.Typer(
    name="ckpt-plan",
    help="Plan activation checkpointing for PyTorch training under a memory budget.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

# Exit codes: documented in the README ("Exit codes"); tests rely on them.
EXIT_CODES: dict[type[errors.PlannerError], int] = {
    errors.BudgetError: 2,
    errors.InfeasibleBudgetError: 3,
    errors.ModelFileError: 4,
    errors.ProfilingError: 4,
    errors.PlanCheckError: 5,
    errors.PlanFileError: 6,
    errors.ProfileFileError: 6,
    errors.PlanMismatchError: 6,
}
EXIT_INTERRUPTED = 130
EXIT_INTERNAL = 1


class Device(str, enum.Enum):
    cpu = "cpu"
    cuda = "cuda"


# -- shared options ---------------------------------------------------------------------
BudgetOption = Annotated[
    str,
    typer.Option(
        "--budget",
        "-b",
        help="Peak memory allowed for one training step, e.g. 12GB, 11.5GiB, 800MiB "
        "(GB/MB: powers of 10; GiB/MiB: powers of 2; a bare number is bytes).",
        show_default=False,
    ),
]
DeviceOption = Annotated[Device, typer.Option("--device", help="Device to profile and check on.")]
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Log details to stderr; show tracebacks on errors.")
]


def _fail(message: str, code: int) -> NoReturn:
    stderr.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    raise typer.Exit(code)


@contextmanager
def _errors_to_exit_codes(verbose: bool) -> Iterator[None]:
    """The boundary where typed library errors become one line and an exit code."""
    try:
        yield
    except errors.PlannerError as error:
        if verbose:
            stderr.print_exception()
        code = next((c for kind, c in EXIT_CODES.items() if isinstance(error, kind)), EXIT_INTERNAL)
        _fail(str(error), code)
    except KeyboardInterrupt:
        _fail("interrupted; no plan was written", EXIT_INTERRUPTED)


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@contextmanager
def _progress() -> Iterator[Callable[[str, int, int], None]]:
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr, transient=True) as progress:
        task = progress.add_task("loading the model file", total=None)

        def update(what: str, done: int, total: int) -> None:
            progress.update(task, description=what, completed=done, total=total or None)

        yield update


def _budget(text: str) -> int:
    try:
        return parse_bytes(text)
    except errors.BudgetError as error:
        _fail(f"--budget: {error}", EXIT_CODES[errors.BudgetError])


def _print_plan_summary(result: Any, wrote: list[Path]) -> None:
    plan, profile = result.plan, result.profile
    table = Table(title=f"checkpointed modules of {profile.model_name}", title_justify="left")
    table.add_column("module")
    table.add_column("type")
    table.add_column("calls", justify="right")
    table.add_column("saved (MiB)", justify="right")
    table.add_column("recompute (ms)", justify="right")
    table.add_column("RNG replay")
    for decision in plan.modules:
        record = profile.module(decision.module_name)
        table.add_row(
            decision.module_name,
            record.module_type,
            str(record.call_count),
            f"{decision.saving_bytes / 2**20:.2f}",
            f"{decision.recompute_ms:.1f}",
            "yes" if decision.preserve_rng_state else "no",
        )
    if plan.modules:
        stdout.print(table)
    else:
        stdout.print("No checkpointing needed: the unplanned step already fits the budget.")
    rows = [
        ("budget", format_bytes(plan.budget_bytes)),
        ("unplanned peak (measured)", format_bytes(plan.baseline_peak_bytes)),
        ("predicted peak with plan", format_bytes(plan.predicted_peak_bytes)),
    ]
    if plan.measured_peak_bytes is not None:
        rows.append(("measured peak with plan", format_bytes(plan.measured_peak_bytes)))
    rows += [
        ("static (params+grads+optimizer)", format_bytes(plan.static_bytes)),
        (
            "recompute per step",
            f"{plan.recompute_ms:.1f} ms = {plan.predicted_overhead:+.1%} "
            f"of a {plan.step_ms:.1f} ms step",
        ),
    ]
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column()
    for key, value in rows:
        summary.add_row(key, value)
    stdout.print(summary)
    if result.check is not None:
        stdout.print(
            "checked by running it in a separate process: loss, gradients and buffers equal "
            "the unplanned step's; state_dict keys unchanged"
        )
    for path in wrote:
        stdout.print(f"wrote {path}")


@app.command()
def profile(
    model: Annotated[
        Path,
        typer.Argument(
            help="Python model file defining build_model() and sample_batch() "
            "(optionally training_step, loss_fn, build_optimizer).",
            show_default=False,
            metavar="MODEL.py",
        ),
    ],
    budget: BudgetOption,
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
        typer.Option(help="Folder for charts.", show_default="reports/<model name>/"),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for the model, batch and random ops.")] = 0,
    verbose: VerboseOption = False,
) -> None:
    """Measure one training step, choose the cheapest checkpointing plan that fits BUDGET,
    check it by running it, and write the plan, the profile and a memory chart."""
    _configure_logging(verbose)
    budget_bytes = _budget(budget)
    with _errors_to_exit_codes(verbose):
        if device is Device.cuda:
            import torch

            if not torch.cuda.is_available():
                _fail("--device cuda: no CUDA device is available here; use --device cpu", 2)
        from planner.fileio import atomic_path
        from planner.pipeline import profile_and_plan
        from planner.plan import save_plan
        from planner.profile_io import save_profile, save_profile_table
        from planner.report import memory_timeline_figure

        with _progress() as progress:
            result = profile_and_plan(
                model, budget_bytes, device=device.value, seed=seed, progress=progress
            )
        name = result.profile.model_name
        plan_path = out or Path("profiles") / name / "plan.json"
        charts = report_dir or Path("reports") / name
        wrote = [
            save_profile(result.profile, plan_path.parent / "profile.json"),
            save_profile_table(result.profile, plan_path.parent / "profile.csv"),
        ]
        chart_path = charts / "memory_timeline.png"
        with atomic_path(chart_path) as temp_path:
            memory_timeline_figure(result.profile, result.plan).savefig(
                temp_path, dpi=120, format="png"
            )
        wrote.append(chart_path)
        wrote.append(save_plan(result.plan, plan_path))  # last: a plan file means a complete run
        _print_plan_summary(result, wrote)


@app.callback()
def main() -> None:
    """ckpt-plan: measure a model, pick the modules to checkpoint, apply in one line."""


if __name__ == "__main__":
    app()
