"""Options shared by the commands, and their parsing (budgets, devices)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from cli.boundary import EXIT_CODES, fail
from planner.core import errors
from planner.core.loop import ZeroGrad
from planner.core.units import parse_bytes

__all__ = [
    "BudgetOption",
    "Device",
    "DeviceOption",
    "GradAccumOption",
    "ProfileArgument",
    "ReferenceChoice",
    "VerboseOption",
    "ZeroGradOption",
    "parse_budget",
    "require_device",
]


class Device(str, enum.Enum):
    cpu = "cpu"
    cuda = "cuda"


class ReferenceChoice(str, enum.Enum):
    auto = "auto"
    unplanned = "unplanned"
    recomputation = "recomputation"


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
ZeroGradOption = Annotated[
    ZeroGrad,
    typer.Option(
        "--zero-grad",
        help="Where the training loop calls optimizer.zero_grad(): before-forward (a plain "
        "loop) or after-forward (Lightning: last step's gradients are alive during the "
        "forward, so the peak is higher).",
    ),
]
GradAccumOption = Annotated[
    int,
    typer.Option(
        "--grad-accum",
        min=1,
        help="Micro-batches accumulated per optimizer step (gradient accumulation; 1: none). "
        "Plans the last micro-batch, whose forward and backward run with the accumulated "
        "gradients alive.",
    ),
]
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Log details to stderr; show tracebacks on errors.")
]
ProfileArgument = Annotated[
    Path,
    typer.Argument(
        help="A profile.json written by `ckpt-plan profile` (beside its plan).",
        show_default=False,
        metavar="PROFILE.json",
    ),
]


def require_device(device: Device | None) -> None:
    if device is Device.cuda:
        import torch

        if not torch.cuda.is_available():
            fail("--device cuda: no CUDA device is available here; use --device cpu", 2)


def parse_budget(text: str) -> int:
    try:
        return parse_bytes(text)
    except errors.BudgetError as error:
        fail(f"--budget: {error}", EXIT_CODES[errors.BudgetError])
