"""The recomputation observer: one hook through which a plan check sees every checkpointed
function run.

A checkpointed function is a module's forward or one ``checkpoint_sequential`` segment; it
runs in the forward and again, recomputed, during backward. :func:`observing_recomputation`
installs an observer for a block of code (:mod:`planner.check.compare` compares the two runs
op by op; :mod:`planner.measure.timing` times them); :func:`observed` routes a function
through it, named by its :class:`Region`. With none installed, the checkpointed forward runs
the function as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Region", "observed", "observing_recomputation"]


@dataclass(frozen=True)
class Region:
    """One checkpointed function: the forward of the module named ``module``, or, with
    ``start`` and ``stop``, the segment of that ``nn.Sequential``'s children ``start`` up to
    ``stop`` (exclusive) that ``checkpoint_sequential`` runs as one. ``str()`` names it as
    messages do: ``layers``, ``layers[0:4]``. ``preserves_rng``: whether its recomputation
    replays the forward's RNG state and then puts the step's back (``checkpoint``'s
    ``preserve_rng_state``), so that it cannot move the step's RNG; not part of its name."""

    module: str
    start: int | None = None
    stop: int | None = None
    preserves_rng: bool = field(default=True, compare=False)

    def __str__(self) -> str:
        if self.start is None:
            return self.module
        return f"{self.module}[{self.start}:{self.stop}]"


# Set only inside observing_recomputation: the observer sees every checkpointed function and
# each of its runs (the forward, then the recomputation).
_recompute_observer: Any = None


@contextlib.contextmanager
def observing_recomputation(observer: Any) -> Iterator[None]:
    """Route every checkpointed function through ``observer.region(region, function,
    cached_ops)`` (its :class:`Region`), which returns the function to run."""
    global _recompute_observer
    previous, _recompute_observer = _recompute_observer, observer
    try:
        yield
    finally:
        _recompute_observer = previous


def observed(region: Region, function: Any, cached_ops: frozenset[str] = frozenset()) -> Any:
    """``function``, routed through the recomputation observer if one is installed.
    ``cached_ops`` are the ops a selective policy may hand back instead of running again
    (the observer sees them in the forward only)."""
    if _recompute_observer is None:
        return function
    return _recompute_observer.region(region, function, cached_ops)
