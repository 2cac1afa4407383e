"""CUDA's autocast lists on the CPU autocast that emulates it (planner/measure/cuda_autocast.py).

A CUDA step planned on this CPU runs on fake CPU tensors, where `torch.autocast("cuda")`
becomes CPU autocast; CPU's lists are not CUDA's (a bf16 `pow`, `softmax` or LayerNorm stays
bf16 on CPU, is float32 on CUDA), so the emulation casts as CUDA's lists do.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from planner.measure.cuda_autocast import CUDA_LISTS, CudaAutocastLists


def _registered(key: str) -> set[str]:
    return {
        name.removeprefix("aten::")
        for name in torch._C._dispatch_get_registrations_for_dispatch_key(key)
        if name.startswith("aten::")
    }


def test_the_lists_name_every_op_cuda_autocast_casts() -> None:
    listed = [name for names in CUDA_LISTS.values() for name in names]
    assert len(listed) == len(set(listed))
    assert set(listed) == _registered("AutocastCUDA")


def test_the_policies_are_those_of_torch_s_header() -> None:
    """Each list as ATen/autocast_mode.h declares it, where this torch ships its headers."""
    header = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if not header.exists():
        pytest.skip("this torch has no C++ headers")
    text = header.read_text()

    def declared(macro: str) -> set[str]:
        body = text.split(f"#define {macro}(_)", 1)[1].split("#define", 1)[0].split("#else")[0]
        return {
            f"{name}.{overload}" if overload else name
            for name, overload in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", body)
        }

    assert declared("AT_FORALL_FP32") == set(CUDA_LISTS["fp32"])
    assert declared("AT_FORALL_FP32_SET_OPT_DTYPE") == set(CUDA_LISTS["fp32_set_opt_dtype"])
    assert declared("AT_FORALL_PROMOTE") == set(CUDA_LISTS["promote"])
    lower = set(CUDA_LISTS["lower"]) - {"cudnn_convolution", "cudnn_convolution_transpose"}
    assert declared("AT_FORALL_LOWER_PRECISION_FP") == lower


_X = torch.randn(4, 8).bfloat16().requires_grad_()
_W = torch.randn(8, requires_grad=True)
_A = torch.randn(8, 8, requires_grad=True)
_LABELS = torch.tensor([1, 2, 3, 4])

CASES: dict[str, Any] = {
    # name: (what runs, its dtype on CUDA, on CPU)
    "layer_norm": (lambda: F.layer_norm(_X, [8], _W, None), torch.float32, torch.bfloat16),
    "rms_norm": (lambda: F.rms_norm(_X, [8]), torch.float32, torch.bfloat16),
    "softmax": (lambda: F.softmax(_X, -1), torch.float32, torch.bfloat16),
    "softmax_dtype_given": (
        lambda: F.softmax(_X, -1, dtype=torch.bfloat16),
        torch.bfloat16,
        torch.bfloat16,
    ),
    "pow": (lambda: _X.pow(3), torch.float32, torch.bfloat16),
    "exp": (lambda: _X.exp(), torch.float32, torch.bfloat16),
    "sum": (lambda: _X.sum(-1), torch.float32, torch.bfloat16),
    "norm": (lambda: torch.norm(_X, 2, -1), torch.float32, torch.bfloat16),
    "mm": (lambda: torch.mm(_A, _A), torch.bfloat16, torch.bfloat16),
    "linear": (lambda: F.linear(_X.float(), _A), torch.bfloat16, torch.bfloat16),
    "addcmul": (lambda: torch.addcmul(_X, _A[:4], _X), torch.float32, torch.float32),
    "cross_entropy": (lambda: F.cross_entropy(_X, _LABELS), torch.float32, torch.float32),
}


def _dtype(case: str, device: str = "cpu") -> torch.dtype:
    run = CASES[case][0]
    with torch.autocast(device, dtype=torch.bfloat16):
        result = run()
    assert isinstance(result, torch.Tensor)
    return result.dtype


@pytest.mark.parametrize("case", list(CASES))
def test_cpu_autocast_casts_as_cuda_s_while_open_and_as_its_own_after(case: str) -> None:
    _, on_cuda, on_cpu = CASES[case]
    assert _dtype(case) == on_cpu
    with CudaAutocastLists():
        assert _dtype(case) == on_cuda
    assert _dtype(case) == on_cpu


def test_an_op_cuda_bans_under_autocast_raises_its_error() -> None:
    probabilities, targets = torch.rand(4, 8), torch.rand(4, 8)
    banned = r"binary_cross_entropy and torch\.nn\.BCELoss are unsafe to autocast"
    with (
        CudaAutocastLists(),
        torch.autocast("cpu", dtype=torch.bfloat16),
        pytest.raises(RuntimeError, match=banned),
    ):
        F.binary_cross_entropy(probabilities, targets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        F.binary_cross_entropy(probabilities, targets)  # CPU's autocast allows it


def test_the_emulated_step_notes_cuda_s_lists() -> None:
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from tests.models import model_file

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(64, 64)
            self.norm = torch.nn.LayerNorm(64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.up(x)).sum()

    def step(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(x)

    file = model_file(Block, lambda: torch.randn(32, 64), training_step=step, name="amp-cuda")
    workload, session = build_fake_workload(file, "cuda", emulate=True)
    record_memory(workload, session=session)
    session.release()
    notes = " ".join(session.assumptions)
    assert "casting as CUDA's lists cast" in notes


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_the_emulation_casts_as_cuda_does(case: str) -> None:
    _, on_cuda, _ = CASES[case]
    moved = {"_X": _X.cuda(), "_W": _W.cuda(), "_A": _A.cuda(), "_LABELS": _LABELS.cuda()}
    globals_before = {name: globals()[name] for name in moved}
    globals().update(moved)
    try:
        assert _dtype(case, "cuda") == on_cuda
    finally:
        globals().update(globals_before)


@pytest.mark.hf
def test_an_emulated_cuda_plan_under_autocast_peaks_where_predicted(tmp_path: Path) -> None:
    """GPT-2 with float32 weights under bf16 autocast (`--autocast`), planned for a GPU on
    fake CPU tensors: the recomputations run under CUDA's lists too (checkpoint re-enters
    the forward's autocast), and the planned step peaks at the prediction, to the byte."""
    pytest.importorskip("transformers")
    import dataclasses

    from benchmarks.hf_sweep_models import write_hf_config
    from planner.apply import apply_plan
    from planner.core.records import Unit
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from planner.measure.source import WorkloadSource
    from planner.measure.workload import load_model_file
    from planner.solve.planning import build_plan

    written = WorkloadSource.parse(write_hf_config("causal-lm", "gpt2", tmp_path))
    model_file = load_model_file(str(dataclasses.replace(written, autocast="bfloat16")))
    workload, session = build_fake_workload(model_file, "cuda", emulate=True)
    profile = record_memory(workload, session=session)
    session.release()
    assert any("casting as CUDA's lists cast" in line for line in session.assumptions)
    plan = build_plan(profile, [Unit(b) for b in profile.block_names], 0, strategy="test")
    planned, session = build_fake_workload(model_file, "cuda", emulate=True)
    apply_plan(planned.model, plan, guard=False)
    measured = record_memory(planned, session=session)
    session.release()
    assert measured.measured_peak_bytes == plan.predicted_peak_bytes < profile.measured_peak_bytes


def test_attention_with_values_narrower_than_keys_runs_cuda_s_memory_efficient_kernel() -> None:
    """DeepSeek-V2's multi-head latent attention: queries and keys of 96, values of 64, in
    bf16. CUDA's flash kernel takes one head size for all three, so CUDA runs the
    memory-efficient kernel; the emulation ran flash, which gave its output the queries'
    head size, and the layer after it failed (DeepSeek-V2's o_proj: "a and b must have same
    reduction dim"; here the reshape)."""
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory
    from tests.models import model_file

    class Latent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qk = torch.nn.Linear(64, 2 * 4 * 96, dtype=torch.bfloat16)
            self.v = torch.nn.Linear(64, 4 * 64, dtype=torch.bfloat16)
            self.out = torch.nn.Linear(4 * 64, 64, dtype=torch.bfloat16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch, length, _ = x.shape
            q, k = self.qk(x).view(batch, length, 2, 4, 96).transpose(1, 3).unbind(2)
            v = self.v(x).view(batch, length, 4, 64).transpose(1, 2)
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, 4, T, 64)
            return self.out(attended.transpose(1, 2).reshape(batch, length, 4 * 64)).sum()

    file = model_file(Latent, lambda: torch.randn(2, 16, 64).bfloat16(), name="latent")
    workload, session = build_fake_workload(file, "cuda", emulate=True)
    assert record_memory(workload, session=session).measured_peak_bytes > 0
    session.release()
    kernels = [line for line in session.assumptions if "scaled_dot_product_attention" in line]
    assert kernels == [
        "scaled_dot_product_attention: CUDA's memory-efficient kernel (its saved tensors)"
    ]
