"""The memory timeline chart: its data, and that it renders."""

from __future__ import annotations

import io

from planner.planning import baseline_every_block
from planner.profiler import profile_workload
from planner.report import memory_timeline_figure, timeline_frame
from planner.workload import build_workload
from tests.models import stack_file


def test_timeline_data_and_chart() -> None:
    profile = profile_workload(build_workload(stack_file(depth=3), seed=0), timing_passes=1)
    plan = baseline_every_block(profile, budget_bytes=profile.measured_peak_bytes)
    data = timeline_frame(profile, plan)
    forward_end = profile.timeline.phase_end_events["forward"]
    # At the end of forward the plan holds fewer activations than the unplanned step.
    assert data["planned_mib"][forward_end] < data["unplanned_mib"][forward_end]
    assert data["unplanned_mib"].max() * 2**20 == profile.measured_peak_bytes
    assert len(data["event"]) == len(data["planned_mib"]) == profile.timeline.event_count + 1
    buffer = io.BytesIO()
    memory_timeline_figure(profile, plan).savefig(buffer, format="png")
    assert buffer.getvalue()[:4] == b"\x89PNG" and len(buffer.getvalue()) > 10_000
