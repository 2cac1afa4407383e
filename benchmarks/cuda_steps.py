"""Per-step allocator peaks of the unplanned step in a fresh process (run on a GPU), and the
op at which each step's peak is reached: is the second step (the one ``measure_step`` and
``ckpt-plan verify`` measure) the steady state?

    python benchmarks/cuda_steps.py benchmarks/models/llama_medium.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from planner.measure.workload import build_workload, load_model_file, run_training_step  # noqa: E402


class PeakOp(TorchDispatchMode):
    """The op during which the allocator's running peak last rose."""

    def __init__(self) -> None:
        super().__init__()
        self.index = 0
        self.peak = 0
        self.where = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        before = torch.cuda.memory_allocated()
        out = func(*args, **(kwargs or {}))
        peak = torch.cuda.max_memory_allocated()
        if peak > self.peak:
            self.peak = peak
            self.where = f"op {self.index} {func} (allocated before it {before})"
        self.index += 1
        return out


def main(path: str, steps: int = 5) -> None:
    workload = build_workload(load_model_file(path), device="cuda", seed=0)
    for step in range(steps):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        with PeakOp() as peak_op:
            run_training_step(workload, seed=step)
        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats()
        print(
            f"step {step}: start {start} peak {stats['allocated_bytes.all.peak']} "
            f"requested peak {stats['requested_bytes.all.peak']} at {peak_op.where}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1])
