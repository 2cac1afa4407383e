"""``ckpt-plan fit``: the largest batch size (or, for a Hugging Face workload, sequence
length) for which some plan fits a budget, and the size with the highest predicted
throughput among those that fit.

How it searches
---------------
Whether *any* plan fits a size is a memory question: the solver's lowest predicted peak
(every useful module checkpointed, :meth:`Solver.lowest_peak`) must be within the budget.
That needs only the memory half of a profile, recorded on fake tensors (no storage, so a
size that would never fit costs no memory to try; each costs a fake step's time, seconds
for a large model). The lowest peak grows with the size along a line (a batch size), a
parabola (a sequence length, where attention scores are held), or pieces of such curves (as
the moment of the peak moves), so the search (:func:`largest_fitting`) guesses the edge
from the curve through the sizes it recorded last: it grows from ``smallest`` (doubling
once, then to the first size the line through the last two says will not fit, at most 4x a
step, at least 2x after the line fell short) until a size does not fit; then it tries the
size the curve through the last three says is the last to fit (or the first not to, after
a size that fit), bisecting twice where a guess came out other than it said. Whatever the
shape, the answer ``largest`` comes with its neighbour ``largest + 1`` shown not to fit
(unless ``max_size``, or a sequence length the config's positions cap, stopped the search
first): the answer doubling and bisection gave. ``benchmarks/fit_search.py`` compares the
two: tiny-llama's sequence length in 9 fake steps instead of 16, Llama-3-8B's in 19 instead
of 26 (101 s instead of 136 s); its batch size of 6 in 7 instead of 6 (the sizes timed for
throughput, powers of two, are recorded too).

Which size is fastest
---------------------
A bigger batch with more recomputation is often faster per sample. For the sizes that fit
(the powers of two from ``largest / 8`` up, and ``largest``), the step is
timed here (in steps that fit the budget, as ``profile`` times it) or estimated for a
``--target`` device (roofline), the cheapest plan at the budget is solved, and the
predicted throughput is ``size / (step + recomputation)``: samples per second for a batch
size, tokens per sequence per second for a sequence length.

The plan returned is the one for ``largest``, checked by running it (as ``profile`` checks
its plan) unless it is made for a target device that is not here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from planner.core.devices import device_type
from planner.core.errors import InfeasibleBudgetError, ModelFileError, ParallelLayoutError
from planner.core.loop import PLAIN_LOOP, LoopShape
from planner.core.parallel import ParallelLayout
from planner.core.records import MemorySource, Profile
from planner.core.units import format_bytes
from planner.measure.distributed import record_rank_memory
from planner.measure.hf import InputKind, input_kind, max_seq_len, min_seq_len
from planner.measure.model_file import ModelFile, takes_batch_size
from planner.measure.profiler import ProgressCallback
from planner.measure.source import WorkloadSource
from planner.measure.workload import load_model_file, with_batch_size
from planner.pipeline import (
    CheckedPlan,
    estimated_costs,
    marked_unchecked,
    marked_unchecked_ranks,
    measure_profile_costs,
    plan_checked,
    ranks_run_here,
    record_step_memory,
)
from planner.plan.targets import DeviceSpec, check_budget_fits, roofline_costs
from planner.solve import Solver
from planner.solve.planning import plan_for_budget

__all__ = ["DIMENSIONS", "FitPoint", "FitResult", "fit_largest", "largest_fitting"]

logger = logging.getLogger(__name__)

DIMENSIONS = ("batch_size", "seq_len")
"""What ``fit`` can grow: the batch size (any workload whose batch can be resized), or the
sequence length of a Hugging Face workload."""


@dataclass(frozen=True)
class FitPoint:
    """One size tried (``size`` holds the batch size or the sequence length, as the
    search's ``dimension`` says; ``source``: the workload at that size, as
    :func:`~planner.measure.workload.load_model_file` reads it). ``lowest_peak_bytes``: the
    smallest budget any plan fits (predicted); ``unplanned_peak_bytes``: the peak without
    checkpointing. For sizes that fit and were timed: ``step_ms`` (the unplanned step),
    ``recompute_ms`` (what the cheapest plan at the budget adds), ``plan_modules`` (how
    many modules it wraps) and ``host_peak_bytes`` (the host memory its offloaded tensors
    hold at once; 0 where it offloads nothing)."""

    size: int
    source: WorkloadSource
    lowest_peak_bytes: int
    unplanned_peak_bytes: int
    step_ms: float | None = None
    recompute_ms: float | None = None
    plan_modules: int | None = None
    host_peak_bytes: int = 0

    @property
    def steps_per_second(self) -> float | None:
        if self.step_ms is None or self.recompute_ms is None:
            return None
        return 1000.0 / (self.step_ms + self.recompute_ms)

    @property
    def throughput(self) -> float | None:
        """Predicted samples (batch size) or tokens per sequence (sequence length) per
        second: the size times the steps per second."""
        steps = self.steps_per_second
        return None if steps is None else self.size * steps


@dataclass(frozen=True)
class FitResult:
    """The search's outcome: every size tried (ascending), the largest that fits, the
    fastest among the timed ones, and the plan for the largest (a :class:`CheckedPlan`,
    checked where it was run). ``capped``: the search stopped at ``max_size`` with that size
    still fitting."""

    budget_bytes: int
    dimension: str
    points: tuple[FitPoint, ...]
    largest: int
    fastest: int
    capped: bool
    planned: CheckedPlan

    @property
    def source(self) -> WorkloadSource:
        """The workload at the largest size (the plan's)."""
        return self.point(self.largest).source

    def point(self, size: int) -> FitPoint:
        return next(point for point in self.points if point.size == size)


def _resized(model_file: ModelFile, dimension: str, size: int) -> ModelFile:
    if dimension == "batch_size":
        return with_batch_size(model_file, size)
    return load_model_file(model_file.source.with_seq_len(size))


GROWTH = 4
"""The most a size grows in one step of the search before a size fails to fit."""
BISECTIONS = 2
"""Bisection steps after the curve's guess came out other than it said."""


def _last_on_curve(
    sizes: tuple[int, ...], lowest: Callable[[int], int], budget_bytes: int
) -> int | None:
    """The largest size whose peak the curve through ``sizes``' lowest peaks (a line
    through two, a parabola through three) puts within the budget (floor), or None where it
    does not rise there."""
    points = sorted((size, lowest(size)) for size in set(sizes))
    (x0, y0), (x1, y1) = points[0], points[-1]
    if len(points) == 3:  # y = y0 + b (x - x0) + c (x - x0)(x - x1), solved for y = budget
        xm, ym = points[1]
        first, second = (ym - y0) / (xm - x0), (y1 - ym) / (x1 - xm)
        c = (second - first) / (x1 - x0)
        b = (y1 - y0) / (x1 - x0)
        # y0 + (b - c (x1 - x0)) t + c t^2 = budget, t = x - x0
        linear, constant = b - c * (x1 - x0), y0 - budget_bytes
        if c > 0 and linear**2 - 4 * c * constant >= 0:
            t = (-linear + (linear**2 - 4 * c * constant) ** 0.5) / (2 * c)
            return x0 + math.floor(t + 1e-9)
    if y1 <= y0:
        return None
    return x0 + (budget_bytes - y0) * (x1 - x0) // (y1 - y0)


def largest_fitting(
    smallest: int, max_size: int, lowest: Callable[[int], int], budget_bytes: int
) -> tuple[int, int | None]:
    """The largest size from ``smallest`` (which fits) up to ``max_size`` whose
    ``lowest(size)`` (the lowest predicted peak, non-decreasing in the size; each call
    records a step, so the caller caches it) is within ``budget_bytes``, and the size just
    above it, shown not to fit (None where ``max_size`` fits). The module docstring says
    how: curves through the sizes recorded guess, a bound on growth and bisection guard, and
    whatever the shape of ``lowest``, the answer is the largest size that fits, its
    neighbour recorded."""

    def fits(size: int) -> bool:
        return lowest(size) <= budget_bytes

    fitting, failing, before = smallest, None, None  # before: the size that fit before
    guess: int | None
    fell_short = False  # the line's last guess fitted: it under-predicts, so grow 2x at least
    while failing is None and fitting < max_size:
        guess = None if before is None else _last_on_curve((before, fitting), lowest, budget_bytes)
        if guess is None:
            size = 2 * fitting
        else:  # the first size the line says will not fit, within the bounds on growth
            size = min(max(guess + 1, fitting + 1), GROWTH * fitting)
            if fell_short:
                size = max(size, 2 * fitting)
        size = min(size, max_size)
        if fits(size):
            fell_short = guess is not None and size == guess + 1
            before, fitting = fitting, size
        else:
            failing = size
    if failing is None:
        return fitting, None
    # The curve through the last three sizes recorded guesses the edge: after a size that
    # fit, the first it says will not fit is tried, after one that did not, the last it says
    # will. Where a guess comes out other than it said, two bisection steps follow before
    # the curve guesses again.
    last: tuple[int, ...] = (fitting, failing)  # the sizes recorded last (up to 3)
    bisections = 0
    while failing - fitting > 1:
        guess = None
        if bisections == 0:
            guess = _last_on_curve(last, lowest, budget_bytes)
        if guess is None:
            size = (fitting + failing) // 2
            bisections = max(bisections - 1, 0)
        else:
            size = min(max(guess + (last[-1] == fitting), fitting + 1), failing - 1)
        fitted = fits(size)
        if fitted:
            fitting = size
        else:
            failing = size
        if guess is not None and fitted != (size <= guess):
            bisections = BISECTIONS
        last = (*last[-2:], size)
    return fitting, failing


def fit_largest(
    model_file: ModelFile,
    budget_bytes: int,
    *,
    dimension: str = "batch_size",
    device: str = "cpu",
    seed: int = 0,
    target: DeviceSpec | None = None,
    max_size: int = 1 << 16,
    timing_steps: int = 3,
    loop: LoopShape = PLAIN_LOOP,
    parallel: ParallelLayout | None = None,
    check: bool = True,
    progress: ProgressCallback | None = None,
    expert_load: float = 1.0,
    offload: bool = True,
    host_budget_bytes: int | None = None,
    host_link_bytes_per_s: float = 0.0,
) -> FitResult:
    """Search the largest ``dimension`` (see the module docstring) up to ``max_size``.
    Raises :class:`InfeasibleBudgetError` where not even size 1 fits (with the smallest
    budget that does), and :class:`~planner.core.errors.ModelFileError` where the model
    file's ``sample_batch`` takes no ``size``. ``timing_steps``: real steps timed per
    size (the median is kept). ``loop``: the training loop's shape, as for ``profile``.
    ``parallel``: fit one rank of that ``torchrun`` job (the budget is each rank's peak), on
    simulated ranks, with recomputation times estimated from the ops (as ``profile`` does
    for a rank); the plan is checked on real ranks where they run here. ``expert_load``: the
    mixture-of-experts routing every size is planned for where its memory depends on
    routing, as for ``profile`` (the plan records it, and its check runs under it).
    ``offload`` and ``host_budget_bytes``: whether plans may offload saved tensors to host
    memory (where the device has a host link: ``target``'s, or on a CUDA device here
    ``host_link_bytes_per_s``, measured once by the caller:
    :func:`planner.measure.host_link.measure_host_link`), within that much host memory at
    once (None: no bound), for every timed size as for its plan. The search for the largest
    size plans without offloading (its profiles have no costs yet)."""
    if dimension not in DIMENSIONS:
        raise ValueError(f"dimension must be one of {DIMENSIONS}, not {dimension!r}")
    if (
        dimension == "batch_size"
        and not model_file.source.is_hugging_face
        and not takes_batch_size(model_file.sample_batch)
    ):
        raise ModelFileError(
            f"sample_batch() in {model_file.path} takes no batch size: define it as "
            "sample_batch(batch_size=...) so that fit can try other sizes"
        )
    if dimension == "seq_len":
        if not model_file.source.is_hugging_face:
            raise ModelFileError(
                "only a Hugging Face workload (--hf CONFIG) has a sequence length to fit; "
                "fit the batch size of a model file"
            )
        kind = input_kind(model_file.source)
        if kind is not InputKind.TOKENS:  # a clip's length: its feature encoder needs some to run
            raise ModelFileError(
                f"{model_file.source.path}: the model takes {kind.value}, and fit fits the "
                "sequence length of token ids only; fit its batch size"
            )
        max_size = min(max_size, max_seq_len(model_file.source) or max_size)
        smallest = min_seq_len(model_file.source)  # a vision-language model's images, and text
    else:
        smallest = 1
    if target is not None:
        if parallel is not None:
            raise ParallelLayoutError(
                "--world-size/--parallel plan on simulated ranks: use them without --target"
            )
        check_budget_fits(target, budget_bytes)
        device = target.device_type
    what = dimension.replace("_", " ")
    memory: dict[int, tuple[ModelFile, Profile, int]] = {}

    def solver_for(profile: Profile) -> Solver:
        return Solver(profile, offload=offload, host_budget_bytes=host_budget_bytes)

    def lowest_at(size: int) -> int:
        """The lowest predicted peak at ``size``, its step recorded once."""
        if size not in memory:
            if progress:
                progress(f"{what} {size}: recording the step on fake tensors", 0, 0)
            sized = _resized(model_file, dimension, size)
            if parallel is not None:
                profile = record_rank_memory(
                    sized,
                    parallel,
                    device_type=device_type(device),
                    seed=seed,
                    loop=loop,
                    budget_bytes=budget_bytes,
                    expert_load=expert_load,
                )
            else:
                profile = record_step_memory(
                    sized,
                    device=device,
                    seed=seed,
                    memory=MemorySource.FAKE,
                    budget_bytes=budget_bytes,
                    target=target,
                    loop=loop,
                    progress=None,
                    expert_load=expert_load,
                )
            lowest = solver_for(profile).lowest_peak()[1]
            memory[size] = (sized, profile, lowest)
            logger.info(
                "%s %d: lowest peak %s, unplanned %s",
                what,
                size,
                format_bytes(lowest),
                format_bytes(profile.measured_peak_bytes),
            )
        return memory[size][2]

    def fits(size: int) -> bool:
        return lowest_at(size) <= budget_bytes

    if not fits(smallest):
        lowest = memory[smallest][2]
        raise InfeasibleBudgetError(
            f"no {what} fits {format_bytes(budget_bytes)}: even {what} {smallest} needs "
            f"{format_bytes(lowest)} with every useful module checkpointed; use a budget of "
            f"at least {lowest} bytes",
            budget_bytes=budget_bytes,
            min_budget_bytes=lowest,
        )
    largest, failing = largest_fitting(smallest, max_size, lowest_at, budget_bytes)

    # Throughput is timed for the powers of two from largest / 8 up, and largest: smaller
    # batches rarely win, and each timing runs real steps.
    powers = (1 << bit for bit in range(largest.bit_length()))
    timed_sizes = sorted(
        {p for p in powers if 8 * p >= largest and p >= smallest and fits(p)} | {largest}
    )
    points: dict[int, FitPoint] = {
        size: FitPoint(size, sized.source, lowest, profile.measured_peak_bytes)
        for size, (sized, profile, lowest) in memory.items()
    }
    timed: dict[int, Profile] = {}
    for index, size in enumerate(timed_sizes):
        if progress:
            progress(f"timing {what} {size}", index, len(timed_sizes))
        sized, profile, _ = memory[size]
        if target is not None:
            costed = roofline_costs(profile, target)
        elif parallel is not None:
            costed = estimated_costs(profile, device)  # a rank's step is not timed alone
        else:
            costed = measure_profile_costs(
                sized,
                profile,
                device=device,
                seed=seed,
                budget_bytes=budget_bytes,
                timing_steps=timing_steps,
                host_link_bytes_per_s=host_link_bytes_per_s if offload else 0.0,
            )
        plan, _ = plan_for_budget(costed, budget_bytes, solver=solver_for(costed))
        timed[size] = costed
        points[size] = dataclasses.replace(
            points[size],
            step_ms=costed.step_ms,
            recompute_ms=plan.recompute_ms,
            plan_modules=len(plan.modules),
            host_peak_bytes=plan.predicted_host_peak_bytes,
        )
    fastest = max(timed_sizes, key=lambda size: points[size].throughput or 0.0)

    sized = memory[largest][0]
    runnable_here = ranks_run_here(parallel, device)
    planned = plan_checked(
        timed[largest],
        budget_bytes,
        model_path=sized.source if check and target is None and runnable_here else None,
        device=device,
        seed=seed,
        progress=progress,
        offload=offload,
        host_budget_bytes=host_budget_bytes,
    )
    if target is not None:
        planned = marked_unchecked(planned, target, sized.source)
    elif parallel is not None and check and not runnable_here:
        planned = marked_unchecked_ranks(planned, parallel, sized.source)
    return FitResult(
        budget_bytes=budget_bytes,
        dimension=dimension,
        points=tuple(points[size] for size in sorted(points)),
        largest=largest,
        fastest=fastest,
        capped=failing is None,
        planned=planned,
    )
