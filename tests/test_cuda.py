"""The CUDA path (skipped without a GPU): the tracker reports the allocator's peak."""

from __future__ import annotations

import pytest
import torch

from planner.tracking import PeakMemoryTracker


@pytest.mark.cuda
def test_cuda_tracker_reports_max_memory_allocated() -> None:
    device = torch.device("cuda")
    with PeakMemoryTracker(device) as tracker:
        x = torch.empty(1024, 1024, device=device)
        y = x * 2
        del x, y
    assert tracker.peak_bytes >= 2 * 1024 * 1024 * 4
    assert tracker.peak_bytes == torch.cuda.max_memory_allocated(device)
