"""The CLI's boundary with the user: the two consoles (results on stdout, diagnostics on
stderr), exit codes, typed errors turned into one line, logging and the progress line.
Imports only the library's errors and nothing from the commands."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from typing import NoReturn

import click
import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from planner.core import errors

__all__ = [
    "EXIT_CODES",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "ResultsConsole",
    "configure_logging",
    "errors_to_exit_codes",
    "fail",
    "progress_line",
    "stderr",
    "stdout",
    "warn",
]


class ResultsConsole(Console):
    """stdout: as wide as the terminal, or where stdout is not a terminal (a pipe, a file, a
    test's runner) without a width, so table rows are written whole: never wrapped at 80
    columns, names never split, headers never cut."""

    UNBOUNDED_WIDTH = 100_000

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(self.UNBOUNDED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


stdout = ResultsConsole(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


# Exit codes: documented in the README ("Exit codes"); tests rely on them.
EXIT_CODES: dict[type[errors.PlannerError], int] = {
    errors.BudgetError: 2,
    errors.TargetSpecError: 2,
    errors.LoopShapeError: 2,
    errors.ParallelLayoutError: 2,
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


def warn(message: str) -> None:
    stderr.print(f"[bold yellow]warning:[/] {escape(message)}", markup=True)


def fail(message: str, code: int) -> NoReturn:
    stderr.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
    raise typer.Exit(code)


@contextmanager
def errors_to_exit_codes(verbose: bool) -> Iterator[None]:
    """The boundary where typed library errors become one line and an exit code."""
    try:
        yield
    except errors.PlannerError as error:
        if verbose:
            stderr.print_exception()
        code = next((c for kind, c in EXIT_CODES.items() if isinstance(error, kind)), EXIT_INTERNAL)
        fail(str(error), code)
    except KeyboardInterrupt:
        fail("interrupted; no plan was written", EXIT_INTERRUPTED)
    except (typer.Exit, typer.Abort, click.ClickException):
        raise
    except Exception as error:  # a bug, not bad input: one line, the traceback on request
        if verbose:
            stderr.print_exception()
        fail(
            f"unexpected {type(error).__name__}: {error} (a ckpt-plan bug; re-run with "
            "--verbose for the traceback and report it)",
            EXIT_INTERNAL,
        )


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@contextmanager
def progress_line() -> Iterator[Callable[[str, int, int], None]]:
    """A progress line on stderr while the library works. The model file's code runs in
    here, so its own prints (nanoGPT prints its parameter count) go to stderr too: stdout
    holds only ckpt-plan's results."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with (
        redirect_stdout(sys.stderr),
        Progress(*columns, console=stderr, transient=True) as progress,
    ):
        task = progress.add_task("loading the model file", total=None)

        def update(what: str, done: int, total: int) -> None:
            progress.update(task, description=what, completed=done, total=total or None)

        yield update
