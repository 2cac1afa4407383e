"""fit's search (:func:`planner.fit.largest_fitting`) on peaks of many shapes: always the
largest size that fits and the next shown not to, never a size past the bounds, and in
fewer recorded steps than doubling and bisection where the peak is near a line."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from benchmarks.fit_search import doubling_and_bisection
from planner.fit import largest_fitting

SHAPES: dict[str, Callable[[int], float]] = {
    "linear": lambda size: 3_000_000 + 41_000 * size,
    "quadratic (eager attention)": lambda size: 5_000_000 + 9_000 * size + 37 * size**2,
    "square root": lambda size: 1_000_000 + 4_000_000 * math.sqrt(size),
    "steps of 64": lambda size: 2_000_000 + 1_000_000 * (size // 64),
    "flat then steep": lambda size: 1_000_000 if size < 700 else 1_000_000 + 10**9 * size,
    "exponential": lambda size: 1_000 * 2 ** min(size, 200),
}


def _check(peak: Callable[[int], float], smallest: int, max_size: int, budget: int) -> int:
    """Runs the search on ``peak``; asserts its answer; returns the steps it recorded."""
    recorded: dict[int, int] = {}

    def lowest(size: int) -> int:
        assert smallest <= size <= max_size, size
        recorded[size] = int(peak(size))
        return recorded[size]

    assert lowest(smallest) <= budget  # as fit_largest does before the search
    largest, failing = largest_fitting(smallest, max_size, lowest, budget)
    expected = max(s for s in range(smallest, max_size + 1) if int(peak(s)) <= budget)
    assert largest == expected
    assert recorded[largest] <= budget
    if largest == max_size:
        assert failing is None
    else:
        assert failing == largest + 1 and recorded[failing] > budget
    return len(recorded)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("smallest", [1, 3, 260])
def test_the_search_finds_the_largest_size_that_fits_whatever_the_peaks_shape(
    shape: str, smallest: int
) -> None:
    peak = SHAPES[shape]
    for budget_size in (smallest, smallest + 1, 5 * smallest + 7, 1000, 2048, 5000):
        budget = int(peak(budget_size))
        for max_size in (budget_size, 1 << 16):
            if max_size >= smallest:
                _check(peak, smallest, max_size, budget)


def test_random_non_decreasing_peaks() -> None:
    generator = random.Random(7)
    for _ in range(300):
        cumulative = [0]
        for _ in range(3000):
            cumulative.append(cumulative[-1] + generator.choice([0, 0, 1, 5, 200]))
        smallest = generator.randint(1, 40)
        budget = cumulative[generator.randint(smallest, 2999)]
        _check(cumulative.__getitem__, smallest, 3000, budget)


@pytest.mark.parametrize("shape", ["linear", "quadratic (eager attention)"])
def test_near_a_line_or_a_parabola_it_records_half_the_steps(shape: str) -> None:
    """A batch size's peaks are near a line, a sequence length's near a parabola (attention
    scores): the curve's guesses end the search in about half the steps doubling and
    bisection take."""
    peak = SHAPES[shape]
    for edge in (148, 1000, 3333):
        budget = int(peak(edge)) + 5
        steps = _check(peak, 1, 1 << 16, budget)
        before = {1}  # the sizes the search fit made before records, the first's too

        def lowest(size: int, peak=peak, before=before) -> int:  # type: ignore[no-untyped-def]
            before.add(size)
            return int(peak(size))

        doubling_and_bisection(1, 1 << 16, lowest, budget)
        assert 2 * steps <= len(before) + 2, (edge, steps, len(before))
