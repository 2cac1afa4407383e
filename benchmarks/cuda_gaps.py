"""Where a real CUDA step's allocator peak differs from the tracked storages (run on a GPU).

For each model: the steady-state step's ``max_memory_allocated`` and the allocator's peak of
requested bytes, against the fake-tensor prediction and a real recorded step; then, op by
op on the real step, what the allocator held beyond the op's inputs and outputs while the
op ran (kernel temporaries that no tensor returned shows), and by how much the allocator's
charge for an op's new outputs exceeded their 512-byte-rounded sizes (blocks not split).

    python benchmarks/cuda_gaps.py --models gpt hf_llama

Prints one table per model and writes reports/benchmarks/cuda_gaps.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The allocator setting CUDA plans assume (planner.core.allocator), before torch starts CUDA;
# run with PYTORCH_CUDA_ALLOC_CONF= (empty) to measure the default allocator instead.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from benchmarks.cuda_plans import MODELS  # noqa: E402
from planner.apply.tensors import iter_tensors  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.measure.tracking import allocated_bytes  # noqa: E402
from planner.measure.workload import build_workload, load_model_file, run_training_step  # noqa: E402
from planner.pipeline import profile_model_file  # noqa: E402


class OpGaps(TorchDispatchMode):
    """Per op: allocator bytes beyond max(before, after) while it ran, and the allocator's
    charge for its outputs beyond their rounded sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.transient: dict[str, list[int]] = defaultdict(list)
        self.unsplit: dict[str, list[int]] = defaultdict(list)
        self.examples: dict[str, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        inputs = {
            t.untyped_storage().data_ptr()
            for t in iter_tensors((args, kwargs))
            if t.device.type == "cuda"
        }
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **kwargs)
        peak = torch.cuda.max_memory_allocated()
        after = torch.cuda.memory_allocated()
        name = str(func.overloadpacket.__name__)
        extra = peak - max(before, after)
        if extra > 0:
            self.transient[name].append(extra)
            shapes = [tuple(t.shape) for t in iter_tensors(args)][:4]
            self.examples.setdefault(name, f"{shapes} -> {extra}")
        fresh = {}
        for t in iter_tensors(out):
            if t.device.type == "cuda":
                storage = t.untyped_storage()
                if storage.data_ptr() not in inputs:
                    fresh[storage.data_ptr()] = storage.nbytes()
        expected = sum(allocated_bytes(n, "cuda") for n in fresh.values())
        if after - before > expected:
            self.unsplit[name].append(after - before - expected)
        return out


def run(name: str, path: Path) -> str:
    model_file = load_model_file(path)
    lines = [f"## {name}", ""]
    profile = profile_model_file(model_file, device="cuda")
    workload = build_workload(model_file, device="cuda", seed=0)
    for step in range(2):
        run_training_step(workload, seed=step)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    run_training_step(workload, seed=5)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    measured = stats["allocated_bytes.all.peak"]
    requested = stats["requested_bytes.all.peak"]
    lines += [
        f"- predicted (fake profile, cuBLAS workspace {profile.workspace_bytes} B): "
        f"{profile.measured_peak_bytes} B",
        f"- measured max_memory_allocated: {measured} B "
        f"(gap {measured - profile.measured_peak_bytes} B, "
        f"{100 * (measured - profile.measured_peak_bytes) / measured:.2f}%)",
        f"- measured peak of requested bytes: {requested} B",
        f"- reserved peak: {stats['reserved_bytes.all.peak']} B",
    ]
    gaps = OpGaps()
    with gaps:
        run_training_step(workload, seed=6)
    torch.cuda.synchronize()
    lines += [
        "",
        "| op | calls with temporaries | max temporary B | example |",
        "|---|---|---|---|",
    ]
    for op, values in sorted(gaps.transient.items(), key=lambda kv: -max(kv[1])):
        lines.append(f"| {op} | {len(values)} | {max(values)} | {gaps.examples[op]} |")
    lines += [
        "",
        "| op | calls charged beyond outputs | max extra B | total B |",
        "|---|---|---|---|",
    ]
    for op, values in sorted(gaps.unsplit.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {op} | {len(values)} | {max(values)} | {sum(values)} |")
    # Is the unplanned step itself deterministic on this GPU?
    grads = []
    for _ in range(2):
        fresh = build_workload(model_file, device="cuda", seed=0)
        loss = run_training_step(fresh, seed=3)
        grads.append(
            (loss, [p.grad.clone() for p in fresh.model.parameters() if p.grad is not None])
        )
        del fresh
    (loss_a, grads_a), (loss_b, grads_b) = grads
    unequal = sum(not torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))
    lines += [
        "",
        f"- two unplanned steps from the same start: loss equal {torch.equal(loss_a, loss_b)}, "
        f"{unequal} of {len(grads_a)} gradients differ",
        "",
    ]
    del workload, grads
    torch.cuda.empty_cache()
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    arguments = parser.parse_args(argv)
    header = (
        f"Measured on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r}.\n\n"
    )
    text = header + "\n".join(run(name, MODELS[name]) for name in arguments.models)
    arguments.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(arguments.out / "cuda_gaps.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
