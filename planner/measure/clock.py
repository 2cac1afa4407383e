"""Time a model's module calls on its device: a clock (``perf_counter`` on CPU, CUDA events
on CUDA) and forward hooks on every module that time each call, telling the forward's calls
from recomputations during backward. The costs are measured with them
(:mod:`planner.measure.timing`), and so are the forward times of the all-real profile
(:func:`_time_forward`, for :func:`planner.measure.profiler.profile_workload`).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from planner.measure.workload import Workload, compute_loss, user_code_errors

if TYPE_CHECKING:
    from planner.measure.profiler import ProgressCallback

__all__ = [
    "Clock",
    "summed_ms",
    "timed_module_calls",
]


class Clock:
    """Milliseconds between two marks: ``perf_counter`` on CPU, CUDA events on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        if self.cuda:
            end.synchronize()
            return float(start.elapsed_time(end))
        return (end - start) * 1000.0


@contextlib.contextmanager
def timed_module_calls(
    model: torch.nn.Module, clock: Clock
) -> Iterator[list[tuple[str, bool, Any, Any]]]:
    """Hooks on every module of ``model`` while the context is open: yields the list they
    fill with ``(module name, called during backward, start mark, end mark)`` per call."""
    names = {id(module): name for name, module in model.named_modules()}
    starts: dict[int, list[Any]] = defaultdict(list)
    spans: list[tuple[str, bool, Any, Any]] = []

    def before(module: torch.nn.Module, args: Any) -> None:
        starts[id(module)].append(clock.mark())

    def after(module: torch.nn.Module, args: Any, output: Any) -> None:
        stack = starts[id(module)]
        if stack:
            in_backward = torch._C._current_graph_task_id() != -1
            spans.append((names[id(module)], in_backward, stack.pop(), clock.mark()))

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(before))
        handles.append(module.register_forward_hook(after, always_call=True))
    try:
        yield spans
    finally:
        for handle in handles:
            handle.remove()


_Name = TypeVar("_Name")  # a module's name, or a checkpointed function's Region


def summed_ms(
    spans: list[tuple[_Name, bool, Any, Any]], clock: Clock
) -> tuple[dict[_Name, float], dict[_Name, float]]:
    """Per module, the summed time of its calls in forward, and during backward."""
    forward_ms: dict[_Name, float] = defaultdict(float)
    backward_ms: dict[_Name, float] = defaultdict(float)
    for name, in_backward, start, stop in spans:
        (backward_ms if in_backward else forward_ms)[name] += clock.elapsed_ms(start, stop)
    return dict(forward_ms), dict(backward_ms)


def _time_forward(
    workload: Workload, passes: int, seed: int, progress: ProgressCallback | None
) -> dict[str, float]:
    """Per module, the median over ``passes`` forward passes of its summed forward time.

    Recomputation is a forward with grad enabled, so that is what we time: forward and loss
    only (the graph is dropped), about a third of a step, so medians are cheap.
    """
    clock = Clock(workload.device)
    names = [name for name, _ in workload.model.named_modules()]
    per_pass: list[dict[str, float]] = []
    with timed_module_calls(workload.model, clock) as spans:
        for index in range(passes):
            if progress:
                progress("timing module forwards", index, passes)
            spans.clear()
            torch.manual_seed(seed)
            with user_code_errors(workload):
                loss = compute_loss(workload.model_file, workload.model, workload.batch)
            del loss
            per_pass.append(summed_ms(spans, clock)[0])
    return {name: statistics.median(sample.get(name, 0.0) for sample in per_pass) for name in names}
