"""The fake step lays out each op's outputs as the real kernels do: each rule of
planner/measure/kernel_layouts.py against the CPU kernel, at the layouts that set torch's
fake kernels apart (transposed gradients, channels-last, a size-1 batch's stride)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from planner.measure import kernel_layouts
from planner.measure.kernel_layouts import KernelLayouts, aten_memory_format, aten_view_strides

aten = torch.ops.aten


def _outputs_strides(value: Any) -> list[tuple[tuple[int, ...], int]]:
    """Each output's strides and its storage's size."""
    values = value if isinstance(value, (tuple, list)) else [value]
    return [
        (tuple(v.stride()), v.untyped_storage().nbytes())
        for v in values
        if isinstance(v, torch.Tensor)
    ]


def _fake_strides(op: Callable[..., Any], args: tuple[Any, ...], *, corrected: bool) -> list[Any]:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
    used: set[str] = set()
    with mode:
        if corrected:
            with KernelLayouts(used):
                return _outputs_strides(op(*fake_args))
        return _outputs_strides(op(*fake_args))


def _transposed(*shape: int) -> torch.Tensor:
    """A tensor of ``shape`` whose last two dimensions are swapped in memory."""
    return torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)


def _layer_norm_backward(grad: torch.Tensor) -> tuple[Any, ...]:
    x = torch.randn(grad.shape)
    weight, bias = torch.randn(grad.shape[-1]), torch.randn(grad.shape[-1])
    _, mean, rstd = aten.native_layer_norm(x, [grad.shape[-1]], weight, bias, 1e-5)
    return (grad, x, [grad.shape[-1]], mean, rstd, weight, bias, [True, True, True])


def _batch_norm_backward(x: torch.Tensor, grad: torch.Tensor) -> tuple[Any, ...]:
    channels = x.shape[1]
    weight, mean, var = torch.randn(channels), torch.zeros(channels), torch.ones(channels)
    _, saved_mean, invstd = aten.native_batch_norm(x, weight, None, mean, var, True, 0.1, 1e-5)
    return (grad, x, weight, mean, var, saved_mean, invstd, True, 1e-5, [True, True, True])


def _channels_last(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(memory_format=torch.channels_last)


CASES = {
    "layer_norm": (
        aten.native_layer_norm,
        (_transposed(2, 6, 8), [8], torch.randn(8), torch.randn(8), 1e-5),
    ),
    "layer_norm_backward": (
        aten.native_layer_norm_backward,
        _layer_norm_backward(_transposed(4, 7, 16)),
    ),
    "batch_norm_backward_channels_last_grad": (
        aten.native_batch_norm_backward,
        _batch_norm_backward(torch.randn(4, 8, 3, 3), _channels_last(4, 8, 3, 3)),
    ),
    "batch_norm_backward_channels_last_input": (
        aten.native_batch_norm_backward,
        _batch_norm_backward(_channels_last(4, 8, 3, 3), torch.randn(4, 8, 3, 3)),
    ),
    "softplus_backward": (
        aten.softplus_backward,
        (_transposed(4, 64, 2), torch.randn(4, 64, 2), 1.0, 20.0),
    ),
    "layer_norm_batch1": (
        aten.native_layer_norm,
        (
            torch.empty_strided((4, 1, 512), (512, 1, 1)).normal_(),
            [512],
            torch.randn(512),
            torch.randn(512),
            1e-5,
        ),
    ),
    **{
        f"{name}_{layout}": (getattr(aten, name), (tensor, size, *extra))
        for name, extra in [
            ("upsample_nearest2d", ()),
            ("upsample_bilinear2d", (False,)),
            ("upsample_bicubic2d", (False,)),
        ]
        for layout, tensor, size in [
            ("channels_last", _channels_last(2, 8, 4, 4), [8, 8]),
            ("batch1", torch.empty_strided((1, 8, 2, 2), (8, 1, 16, 8)).normal_(), [4, 4]),
            ("1x1", torch.empty_strided((1, 8, 1, 1), (8, 1, 8, 8)).normal_(), [1, 1]),
        ]
    },
    "log_softmax_backward": (
        aten._log_softmax_backward_data,
        (
            _transposed(4, 32, 198).transpose(1, 2).transpose(0, 1),
            torch.randn(198, 4, 32),
            -1,
            torch.float32,
        ),
    ),
    "log_softmax_backward_channels_last": (
        aten._log_softmax_backward_data,
        (_channels_last(2, 8, 3, 3), _channels_last(2, 8, 3, 3), 1, torch.float32),
    ),
    "col2im_smaller": (
        aten.col2im,
        (_transposed(4, 288, 64), [64, 1], [9, 1], [1, 1], [4, 0], [1, 1]),
    ),
    "col2im_larger": (aten.col2im, (torch.randn(2, 4, 9), [6, 6], [2, 2], [1, 1], [0, 0], [2, 2])),
    "view_batch1_channels_last": (aten.view, (_channels_last(1, 64, 8, 8), [1, 64, 64])),
    # reduced losses keep the storage of their elements' losses (1 = mean, 2 = sum)
    "mse_loss_mean": (aten.mse_loss, (torch.randn(4, 4, 8, 8), torch.randn(4, 4, 8, 8), 1)),
    "mse_loss_sum_broadcast": (aten.mse_loss, (torch.randn(4, 1, 8), torch.randn(3, 8), 2)),
    "mse_loss_promoted": (
        aten.mse_loss,
        (torch.randn(4, 8).bfloat16(), torch.randn(4, 8), 1),
    ),
    "mse_loss_unreduced": (aten.mse_loss, (_transposed(4, 6, 8), torch.randn(4, 6, 8), 0)),
    "mse_loss_empty": (aten.mse_loss, (torch.randn(0, 8), torch.randn(0, 8), 1)),
    "smooth_l1_loss": (aten.smooth_l1_loss, (torch.randn(4, 6, 8), torch.randn(4, 6, 8), 1, 1.0)),
    "smooth_l1_loss_beta0": (
        aten.smooth_l1_loss,
        (torch.randn(4, 6, 8), torch.randn(4, 6, 8), 2, 0.0),
    ),
    "binary_cross_entropy": (
        aten.binary_cross_entropy,
        (torch.rand(4, 6, 8)[:, ::2], torch.rand(4, 3, 8), None, 1),
    ),
    "soft_margin_loss": (
        aten.soft_margin_loss,
        (torch.randn(4, 6, 8).bfloat16(), torch.randn(4, 6, 8).sign().bfloat16(), 2),
    ),
    "view_inferred": (aten.view, (torch.randn(1, 4, 8).permute(0, 2, 1), [1, 8, 1, -1])),
}


def _batch_norm(x: torch.Tensor) -> tuple[Any, ...]:
    channels = x.shape[1]
    weight, mean, var = torch.randn(channels), torch.zeros(channels), torch.ones(channels)
    return (x, weight, torch.randn(channels), mean, var, True, 0.1, 1e-5)


CPU_CASES = {
    f"batch_norm_{layout}": (aten.native_batch_norm, _batch_norm(x))
    for layout, x in [
        # pooled to 1 x 1 (BEiT's segmentation head): contiguous and channels-last at once
        ("1x1", torch.empty_strided((4, 64, 1, 1), (64, 1, 64, 64)).normal_()),
        ("channels_last", _channels_last(4, 8, 3, 3)),
        ("channels_last_3d", torch.randn(2, 3, 4, 5, 8).permute(0, 4, 1, 2, 3)),
        ("neither", torch.randn(4, 3, 3, 8).permute(0, 3, 2, 1)),
        ("transposed_1d", _transposed(4, 6, 8)),  # BatchNorm1d over (batch, time, channels)
        ("transposed_2d", torch.randn(8, 4).t()),
    ]
} | {
    # a float32 LayerNorm under autocast, given a bf16 layer's output: float32 statistics
    "layer_norm_mixed": (
        aten.native_layer_norm,
        (torch.randn(2, 6, 8).bfloat16(), [8], torch.randn(8), torch.randn(8), 1e-5),
    ),
    "layer_norm_bf16": (
        aten.native_layer_norm,
        (torch.randn(2, 6, 8).bfloat16(), [8], torch.randn(8).bfloat16(), None, 1e-5),
    ),
    # a float32 GroupNorm given a bf16 input (under autocast): float32 statistics, and
    # the input's gradient in bf16
    "group_norm_mixed": (
        aten.native_group_norm,
        (torch.randn(2, 8, 4, 4).bfloat16(), torch.randn(8), torch.randn(8), 2, 8, 16, 4, 1e-5),
    ),
    "group_norm_backward_mixed": (
        aten.native_group_norm_backward,
        (
            torch.randn(2, 8, 4, 4).bfloat16(),
            torch.randn(2, 8, 4, 4).bfloat16(),
            torch.randn(2, 4),
            torch.rand(2, 4) + 0.5,
            torch.randn(8),
            2,
            8,
            16,
            4,
            [True, True, True],
        ),
    ),
    # an LSTM layer (mode 2) of 16 steps, batch 3, 8 features to 12: oneDNN's workspace
    "mkldnn_rnn_layer": (
        aten.mkldnn_rnn_layer,
        (
            torch.randn(16, 3, 8),
            torch.randn(48, 8),
            torch.randn(48, 12),
            torch.randn(48),
            torch.randn(48),
            torch.randn(3, 12),
            torch.randn(3, 12),
            False,
            [16, 16, 16],
            2,
            12,
            1,
            True,
            False,
            False,
            True,
        ),
    ),
}
"""The CPU kernels' own rules (planned for the CPU only)."""


@pytest.mark.parametrize("case", [*CASES, *CPU_CASES])
def test_each_corrected_op_lays_out_its_outputs_as_the_cpu_kernel(case: str) -> None:
    op, args = CASES[case] if case in CASES else CPU_CASES[case]
    real = _outputs_strides(op(*args))
    assert _fake_strides(op, args, corrected=True) == real


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_each_corrected_op_lays_out_its_outputs_as_the_cuda_kernel(case: str) -> None:
    op, args = CASES[case]
    on_cuda = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
    assert _fake_strides(op, on_cuda, corrected=True) == _outputs_strides(op(*on_cuda))


def test_torch_fake_kernels_lay_some_of_them_out_otherwise() -> None:
    """What the rules are for (torch 2.13): without them, these cases differ."""
    cases = [
        "layer_norm_batch1",
        "layer_norm_backward",
        "batch_norm_backward_channels_last_grad",
        "softplus_backward",
        "upsample_bilinear2d_1x1",
        "log_softmax_backward_channels_last",
        "col2im_smaller",
        "view_batch1_channels_last",
        "mse_loss_mean",
        "smooth_l1_loss",
        "binary_cross_entropy",
        "soft_margin_loss",
        "batch_norm_1x1",
        "batch_norm_transposed_1d",
        "layer_norm_mixed",
        "mkldnn_rnn_layer",
        "group_norm_mixed",
        "group_norm_backward_mixed",
    ]
    for case in cases:
        op, args = CASES[case] if case in CASES else CPU_CASES[case]
        assert _fake_strides(op, args, corrected=False) != _outputs_strides(op(*args)), case


def test_the_cpu_kernels_rules_are_left_out_where_the_step_is_planned_for_cuda() -> None:
    op, args = CPU_CASES["batch_norm_1x1"]
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
    used: set[str] = set()
    with mode, KernelLayouts(used, cpu=False):
        assert op(*fake_args)[0].stride() == (64, 1, 64, 64)  # the fake kernel's, as it was
    assert not used


def test_layer_norm_statistics_are_float32_for_a_16_bit_input_where_cuda_is_planned() -> None:
    """CUDA's kernel keeps them in the input's accumulate type (float32) whatever the
    weight's; the fake kernel on the CPU tensors that emulate CUDA keeps them in bf16."""
    op, args = CPU_CASES["layer_norm_bf16"]
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
    used: set[str] = set()
    with mode:
        assert [t.dtype for t in op(*fake_args)][1:] == [torch.bfloat16] * 2  # torch's
        with KernelLayouts(used, cpu=False):
            output, mean, rstd = op(*fake_args)
    assert (output.dtype, mean.dtype, rstd.dtype) == (torch.bfloat16, *[torch.float32] * 2)
    assert used == {"native_layer_norm: outputs laid out as its real kernel lays them out"}


@pytest.mark.cuda
def test_layer_norm_statistics_are_float32_on_cuda() -> None:
    op, args = CPU_CASES["layer_norm_bf16"]
    on_cuda = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
    assert [t.dtype for t in op(*on_cuda)] == [torch.bfloat16, torch.float32, torch.float32]


@pytest.mark.parametrize(
    ("shape", "strides", "expected"),
    [
        ((1, 8, 2, 2), (8, 1, 16, 8), torch.contiguous_format),  # the batch's stride counts
        ((2, 8, 2, 2), (32, 1, 16, 8), torch.channels_last),
        ((2, 8, 2, 2), (32, 4, 2, 1), torch.contiguous_format),
        ((2, 1, 2, 2), (4, 4, 2, 1), torch.contiguous_format),  # ambiguous: contiguous
    ],
)
def test_the_memory_format_is_atens(shape, strides, expected) -> None:  # type: ignore[no-untyped-def]
    assert aten_memory_format(torch.empty_strided(shape, strides)) is expected


def test_view_strides_are_atens_or_none_where_no_view_exists() -> None:
    source = torch.randn(4, 6).t()
    assert aten_view_strides((6, 4), source.stride(), (24,)) is None
    for tensor, new in [
        (_channels_last(1, 64, 8, 8), (1, 64, 64)),
        (torch.randn(2, 3, 4), (6, 1, 4)),
        (torch.randn(0, 3), (3, 0)),
    ]:
        shape = tuple(tensor.shape)
        assert aten_view_strides(shape, tensor.stride(), new) == tensor.view(new).stride()


def test_the_fidelity_benchmark_finds_what_the_rules_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/fake_fidelity.py on a model with a block for three of the rules: the same
    storages with them; without them, the copies each side made alone, and the three ops."""
    from benchmarks.fake_fidelity import check_model

    model = Path(__file__).resolve().parent / "data" / "kernel_layouts.py"
    row = check_model(model)
    assert row["storages"] == "" and not row["found"].ops
    monkeypatch.setattr(kernel_layouts, "_RULES", {})
    row = check_model(model)
    assert "fake only: aten.clone.default 12,288 B x1" in row["storages"]  # LayerNorm's
    assert "fake only: aten.clone.default 4,608 B x1" in row["storages"]  # BatchNorm's
    assert "real only: aten.clone.default 18,432 B x1" in row["storages"]  # softplus'
    assert set(row["found"].ops) == {
        "aten.native_layer_norm_backward.default",
        "aten.native_batch_norm_backward.default",
        "aten.softplus_backward.default",
    }
