import contextlib
import resource
import sys

import pytest
import torch

from planner.core.records import NoteTopic
from planner.measure import host_allocator, timing
from planner.measure.host_allocator import steady_host_allocator

glibc = pytest.mark.skipif(host_allocator._glibc() is None, reason="needs Linux with glibc")


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


@glibc
def test_freed_memory_stays_for_reuse_inside_the_context_and_goes_back_after() -> None:
    size_bytes = 28 * 2**20  # below glibc's largest mmap threshold: from the heap
    # Heap pages that earlier tests in this process freed would hold the tensor unseen.
    host_allocator._glibc().malloc_trim(0)  # type: ignore[union-attr]
    with steady_host_allocator() as applied:
        before = _resident_bytes()
        tensor = torch.ones(size_bytes // 4)  # touches every page
        with_tensor = _resident_bytes()
        del tensor
        held = _resident_bytes()  # freed, and kept for the next step
    after = _resident_bytes()
    assert applied
    assert with_tensor - before > size_bytes // 2  # the tensor's pages did come in
    assert with_tensor - held < size_bytes // 10  # ... and stayed after its free
    assert held - after > size_bytes // 2  # ... until the context ended


def test_nothing_is_changed_off_cpu_or_without_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    with steady_host_allocator("cuda") as applied:
        assert not applied
    monkeypatch.setattr(sys, "platform", "darwin")
    with steady_host_allocator() as applied:
        assert not applied


@pytest.mark.slow
def test_timing_steps_run_on_the_steady_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from planner.measure.workload import load_model_file
    from planner.solve.planning import build_plan

    entered: list[str] = []
    open_now = [False]
    original = timing.steady_host_allocator

    @contextlib.contextmanager
    def spy(device_type: str = "cpu"):  # type: ignore[no-untyped-def]
        entered.append(device_type)
        with original(device_type) as applied:
            open_now[0] = True
            try:
                yield applied
            finally:
                open_now[0] = False

    original_timed_step = timing._timed_step

    def timed_step(*args, **kwargs):  # type: ignore[no-untyped-def]
        assert open_now[0], "a step was timed outside the steady allocator"
        return original_timed_step(*args, **kwargs)

    monkeypatch.setattr(timing, "steady_host_allocator", spy)
    monkeypatch.setattr(timing, "_timed_step", timed_step)
    model_file = load_model_file(Path(__file__).parent / "data" / "small_gpt.py")
    workload, session = build_fake_workload(model_file)
    profile = record_memory(workload, session=session)
    costs = timing.measure_costs(
        model_file, profile, build_plan(profile, [], 0, strategy="t"), timing_steps=1
    )
    assert entered == ["cpu"]
    assert costs.planned_step_ms > 0
    # ... and the profile says so, where it could be arranged.
    assert costs.steady_host_allocator is (host_allocator._glibc() is not None)
    timed = timing.with_measured_costs(profile, costs, (), lambda profile, unit: 0.0)
    how = next(note for note in timed.assumptions if note.topic is NoteTopic.TIMES)
    assert ("kept freed memory" in how.text) is costs.steady_host_allocator
