"""Lay out the fake step's outputs as the real kernels do, where torch's fake kernels do not.

A fake tensor's strides come from the op's fake (meta) kernel. For most ops that is the
real kernel's own layout rule (structured kernels share it); for some it is a Python
decomposition into elementwise ops, whose outputs follow their inputs' strides while the
real kernel allocates its output in a layout of its own choosing. The sizes are the same,
but a later ``reshape``/``contiguous`` then copies on one side only, and the fake step
records storages the real step never allocates (or misses ones it does). Swin's last stage
was 0.14% over-predicted so: ``native_layer_norm_backward`` returned its gradient in the
incoming gradient's transposed strides on fake tensors, the real kernel returns it
contiguous, and five reshapes of it copied on fake tensors only.

``benchmarks/fake_fidelity.py`` records a real and a fake step of each model, compares their
storages, and names the ops whose outputs were laid out otherwise given inputs laid out
alike. Over the zoo and the Hugging Face sweep's 300 types (torch 2.13) it found the ops
below; each rule is the real kernels' (CPU and CUDA alike: the same allocation in both, or a
structured kernel's shared meta function). ``tests/test_kernel_layouts.py`` checks each
against the CPU kernel at the layouts that set torch's fake kernel apart (and against the
CUDA kernel where there is one).

* ``native_layer_norm`` and its backward: the output, and the input's gradient, contiguous
  (both kernels make the input contiguous and allocate like it; the fake kernels follow the
  input's, or the incoming gradient's, strides).
* ``native_batch_norm_backward``: the input's gradient in the input's memory format (the
  fake kernel follows the incoming gradient's).
* ``softplus_backward``: a TensorIterator op of (grad_output, self), which orders its output
  by its operands' strides in that order; the decomposition's ``where`` puts a contiguous
  condition first (Qwen3-Next's and Qwen3.5's gates).
* ``upsample_{nearest,bilinear,bicubic}2d``: the output in the input's memory format as ATen
  reads it, where a size-1 dimension's stride counts (the fake kernel's Python test skips
  those, and ``.contiguous(memory_format=...)`` keeps strides a size-1 dimension leaves
  ambiguous).
* ``_log_softmax_backward_data``: contiguous (the structured kernel's output; the fake
  kernel follows the incoming gradient, transposed where a CTC loss took (time, batch,
  vocabulary) log-probabilities).
* ``col2im`` (``nn.Fold``, ConvBERT's span convolution): both kernels allocate the output
  like the input and resize it to the output's shape, so a smaller output keeps the input's
  storage (9 times its own size in ConvBERT); the fake kernel allocates the output alone.
* ``mse_loss``, ``smooth_l1_loss``, ``binary_cross_entropy``, ``soft_margin_loss`` reduced
  to a scalar (``mean``, ``sum``): each kernel writes the loss of every element into its
  output, sized like the input (the broadcast of input and target), reduces it and resizes
  the output to a scalar, which keeps that storage; the fake kernels make a scalar of its
  own size. The loss a diffusion model's training step returns (``F.mse_loss`` of its noise
  prediction) held 16 KiB for 4 bytes in a small UNet, live from the loss to the end of the
  backward: the step's peak. (``l1_loss``, ``huber_loss`` and the rest reduce into a new
  tensor, as the fake kernels do.)
* ``view``/``_unsafe_view``: a size-1 dimension's stride as ATen's ``computeStride`` gives
  it (torch's Python view gives another). It moves nothing, but ATen's memory-format tests
  read it: PVT's stages ``upsample`` a view whose batch of 1 has such a stride, and their
  backward then copied on one side only.

Some rules are one device's kernel's alone, applied only where the step is planned for
that device (:data:`_CPU_RULES`, :data:`_CUDA_RULES`):

* ``native_batch_norm``: the output contiguous where the input is contiguous (a size-1
  dimension's stride aside), else channels-last where the input is that, else contiguous
  (the fake kernel follows the input's strides). BEiT's and Data2Vec's segmentation heads
  pool features to 1 x 1 and batch-normalize them: their strides are both, the CPU kernel's
  output contiguous, the fake one's channels-last, and every upsampled map after it copied
  on one side only (0.58 MiB, 4.5% of the step).
* ``native_group_norm`` and its backward, where a 16-bit input meets a float32 weight (a
  float32 GroupNorm under CPU autocast: every diffusers U-Net's and VAE's): the statistics in
  float32 and the input's gradient in the input's dtype, as the CPU kernel makes them. The
  fake kernels made the statistics 16-bit and the gradient float32, which autograd then
  copied back: an SD U-Net under bf16 autocast was 7,680 bytes under its real step, a VAE
  467,206 bytes (0.88%) over.
* ``mkldnn_rnn_layer`` (an LSTM layer, oneDNN's): the workspace its backward reads, whose
  size is oneDNN's own (its gates and states, padded, in whole pages); the fake kernel makes
  it empty. Measured by running the real kernel once per shape on zeros. A small LSTM's
  step (three layers, 8 x 64 tokens of 64) was 6,057,984 bytes, 58%, under its real peak:
  2,019,328 bytes a layer.
* ``native_layer_norm``'s saved mean and reciprocal deviation, a float per row: the fake
  kernel makes them in the input's dtype on a CPU tensor (in float32 on a CUDA one). The CPU
  kernel makes them in float32 where the input is 16-bit and the weight or bias float32
  (``is_mixed_type``: a float32 LayerNorm under autocast, whose input a bf16 layer made),
  else in the input's dtype; the CUDA kernel (``layer_norm_cuda``) in the input's accumulate
  type, float32 for a 16-bit input, always. Both differ from the fake kernel's on the fake
  CPU tensors that emulate CUDA (:mod:`planner.measure.cuda_emulation`): a bf16 GPT-2's two
  LayerNorms a layer, or BERT's under autocast on the CPU (512 bytes in the sweep's small
  BERT).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._prims_common import compute_elementwise_output_strides
from torch.utils._python_dispatch import _disable_current_modes

from planner.dispatch import DispatchWatcher

__all__ = ["KernelLayouts", "aten_memory_format", "positional_arguments"]

aten = torch.ops.aten
Strides = tuple[int, ...]


@dataclass(frozen=True)
class Allocation:
    """An output as the real kernel makes it: its strides, and where the kernel's storage
    holds more than the tensor spans, the storage's size in elements."""

    strides: Strides
    storage_elements: int | None = None
    dtype: torch.dtype | None = None  # None: the fake kernel's


def _contiguous_strides(shape: Sequence[int]) -> Strides:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _format_strides(shape: Sequence[int], memory_format: torch.memory_format) -> Strides:
    if memory_format is torch.contiguous_format or len(shape) not in (4, 5):
        return _contiguous_strides(shape)
    order = (1, 3, 2, 0) if memory_format is torch.channels_last else (1, 4, 3, 2, 0)
    strides = [0] * len(shape)
    step = 1
    for dim in order:
        strides[dim] = step
        step *= max(shape[dim], 1)
    return tuple(strides)


def _channels_last_strides(
    shape: Sequence[int], strides: Sequence[int], order: Sequence[int]
) -> bool:
    """ATen's ``is_channels_last_strides_{2,3}d``: strides increasing in channels-last order,
    a size-1 dimension's stride included, ambiguous cases read as contiguous."""
    if strides[1] == 0:
        return False
    smallest = 0
    for dim in order:
        if shape[dim] == 0 or strides[dim] < smallest:
            return False
        if dim == 0 and smallest == strides[1]:
            return False
        smallest = strides[dim] * (shape[dim] if shape[dim] > 1 else 1)
    return True


def aten_memory_format(tensor: torch.Tensor) -> torch.memory_format:
    """``Tensor::suggest_memory_format()`` as ATen computes it in C++ (torch's Python
    ``suggest_memory_format`` skips size-1 dimensions, ATen does not)."""
    shape, strides = tuple(tensor.shape), tuple(tensor.stride())
    if tensor.dim() == 4 and _channels_last_strides(shape, strides, (1, 3, 2, 0)):
        return torch.channels_last
    if tensor.dim() == 5 and _channels_last_strides(shape, strides, (1, 4, 3, 2, 0)):
        return torch.channels_last_3d
    return torch.contiguous_format


def aten_view_strides(
    old_shape: Sequence[int], old_strides: Sequence[int], new_shape: Sequence[int]
) -> Strides | None:
    """ATen's ``computeStride``: the strides of a view of a tensor as ``new_shape``, or None
    where no view can have it. Torch's Python view (the fake kernel) gives a size-1
    dimension another stride, which ATen's memory-format tests read."""
    if not old_shape:
        return tuple(1 for _ in new_shape)
    new_strides = [0] * len(new_shape)
    if math.prod(old_shape) == 0:
        if tuple(old_shape) == tuple(new_shape):
            return tuple(old_strides)
        return _contiguous_strides(new_shape)
    view_dim = len(new_shape) - 1
    chunk_stride = old_strides[-1]
    tensor_numel = view_numel = 1
    for dim in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[dim]
        chunk_ends = dim == 0 or (
            old_shape[dim - 1] != 1 and old_strides[dim - 1] != tensor_numel * chunk_stride
        )
        if not chunk_ends:
            continue
        while view_dim >= 0 and (view_numel < tensor_numel or new_shape[view_dim] == 1):
            new_strides[view_dim] = view_numel * chunk_stride
            view_numel *= new_shape[view_dim]
            view_dim -= 1
        if view_numel != tensor_numel:
            return None
        if dim > 0:
            chunk_stride = old_strides[dim - 1]
            tensor_numel = view_numel = 1
    return tuple(new_strides) if view_dim == -1 else None


def _view(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    source, shape = args[0], args[1]
    shape = _inferred(shape, source.numel())
    strides = aten_view_strides(tuple(source.shape), tuple(source.stride()), shape)
    return {} if strides is None else {0: Allocation(strides)}


def _inferred(shape: Sequence[int], numel: int) -> tuple[int, ...]:
    """``shape`` with its -1 (if any) worked out."""
    sizes = [int(size) for size in shape]
    if -1 in sizes:
        known = math.prod(size for size in sizes if size != -1)
        sizes[sizes.index(-1)] = numel // known if known else 0
    return tuple(sizes)


def _layer_norm_backward(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    return {0: Allocation(_contiguous_strides(args[1].shape))}


def _batch_norm_backward(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    source = args[1]
    return {0: Allocation(_format_strides(source.shape, aten_memory_format(source)))}


def _contiguous_like_first(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    return {0: Allocation(_contiguous_strides(args[0].shape))}


def _softplus_backward(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    return {0: Allocation(tuple(compute_elementwise_output_strides(args[0], args[1])))}


_VIEWS = {aten.view.default, aten._unsafe_view.default}
"""Ops whose outputs alias their input: re-strided as views of it, not allocated."""


def _upsample(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    return {0: Allocation(_format_strides(outputs[0].shape, aten_memory_format(args[0])))}


def _batch_norm_cpu(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    source = args[0]
    memory_format = torch.contiguous_format
    if source.is_contiguous():
        pass
    elif source.dim() == 4 and source.is_contiguous(memory_format=torch.channels_last):
        memory_format = torch.channels_last
    elif source.dim() == 5 and source.is_contiguous(memory_format=torch.channels_last_3d):
        memory_format = torch.channels_last_3d
    return {0: Allocation(_format_strides(outputs[0].shape, memory_format))}


def _layer_norm_stats(
    args: Sequence[Any], outputs: Sequence[Any], dtype: Any
) -> dict[int, Allocation]:
    """The output contiguous (as on every device), the mean and reciprocal deviation
    (outputs 1 and 2, one per row, contiguous) in ``dtype``."""
    made = _contiguous_like_first(args, outputs)
    for index in (1, 2):
        made[index] = Allocation(_contiguous_strides(outputs[index].shape), dtype=dtype)
    return made


_SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def _mixed_type(source: torch.Tensor, *params: Any) -> bool:
    """Whether a norm's 16-bit input meets a float32 weight or bias (a float32 norm under
    autocast, given a 16-bit layer's output): the CPU kernels' mixed-type path."""
    return source.dtype in _SIXTEEN_BIT and any(
        isinstance(param, torch.Tensor) and param.dtype == torch.float32 for param in params
    )


def _layer_norm_cpu(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    source = args[0]
    mixed = _mixed_type(source, args[2], args[3])
    return _layer_norm_stats(args, outputs, torch.float32 if mixed else source.dtype)


def _group_norm_cpu(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    """The mean and reciprocal deviation (outputs 1 and 2) in float32 where a 16-bit input
    meets a float32 weight or bias (a float32 GroupNorm under autocast), as the CPU kernel
    makes them; the fake kernel makes them in the input's dtype."""
    if not _mixed_type(args[0], args[1], args[2]):
        return {}
    return {
        index: Allocation(_contiguous_strides(outputs[index].shape), dtype=torch.float32)
        for index in (1, 2)
    }


def _group_norm_backward_cpu(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    """The input's gradient in the input's dtype, as the CPU kernel makes it; the fake
    kernel makes it in float32 where the statistics or the weight are (a 16-bit input of a
    float32 GroupNorm under autocast), and autograd then casts it back: a copy the real
    step never makes."""
    gradient, source = outputs[0], args[1]
    if not isinstance(gradient, torch.Tensor) or gradient.dtype == source.dtype:
        return {}
    return {0: Allocation(tuple(gradient.stride()), dtype=source.dtype)}


def _layer_norm_cuda(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    source = args[0]
    return _layer_norm_stats(
        args, outputs, torch.float32 if source.dtype in _SIXTEEN_BIT else source.dtype
    )


def _col2im(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    """Both kernels allocate the output like the input, then resize it to the output's
    shape: a smaller output keeps the input's storage."""
    output = outputs[0]
    elements = max(args[0].numel(), output.numel())
    return {0: Allocation(_contiguous_strides(output.shape), elements)}


def _reduced_loss(shape: Sequence[int], reduction: int, output: Any) -> dict[int, Allocation]:
    """A loss reduced to a scalar in the storage its kernel first wrote the loss of each
    element into (``shape``: those elements'); unreduced (reduction 0), as the fake kernel
    makes it."""
    if reduction == 0:
        return {}
    return {0: Allocation((), max(math.prod(shape), 1), output.dtype)}


def _pointwise_loss(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    """``mse_loss`` and ``smooth_l1_loss`` (structured: their meta function sizes the
    output as the broadcast of input and target, then resizes it to a scalar)."""
    shape = torch.broadcast_shapes(args[0].shape, args[1].shape)
    return _reduced_loss(shape, args[2], outputs[0])


def _binary_cross_entropy(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    """The loss made like the input, reduced into it (``resize_as_``)."""
    return _reduced_loss(args[0].shape, args[3], outputs[0])


def _soft_margin_loss(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    """The loss written into an output resized to the input's shape, then to a scalar."""
    return _reduced_loss(args[0].shape, args[2], outputs[0])


_RNN_WORKSPACE_BYTES: dict[tuple[Any, ...], int] = {}
"""oneDNN RNN workspaces measured, by the layer call's shapes, dtypes and flags."""


def _mkldnn_rnn_workspace(args: Sequence[Any], outputs: Sequence[Any]) -> dict[int, Allocation]:
    """An LSTM layer on the CPU (``mkldnn_rnn_layer``: oneDNN's) returns the workspace its
    backward reads, whose size is oneDNN's to choose (its gates and states, padded, in whole
    pages; it varies with the library's version and the CPU's instruction set). The fake
    kernel makes it empty. Measured once per shape: the real kernel run on zeros of the
    call's shapes, outside every mode (the probe holds the call's real memory while it runs,
    nothing after). Without grad mode the kernel returns no workspace (the fake kernel an
    empty one)."""
    if not torch.is_grad_enabled():
        return {}
    key = tuple(
        (tuple(arg.shape), arg.dtype) if isinstance(arg, torch.Tensor) else repr(arg)
        for arg in args
    )
    size = _RNN_WORKSPACE_BYTES.get(key)
    if size is None:
        with torch._C.DisableTorchFunction(), _disable_current_modes():
            real = [
                torch.zeros(arg.shape, dtype=arg.dtype) if isinstance(arg, torch.Tensor) else arg
                for arg in args
            ]
            size = aten.mkldnn_rnn_layer.default(*real)[3].untyped_storage().nbytes()
        _RNN_WORKSPACE_BYTES[key] = size
    return {3: Allocation(tuple(outputs[3].stride()), size)}


_Rule = Callable[[Sequence[Any], Sequence[Any]], dict[int, Allocation]]

_RULES: dict[Any, _Rule] = {
    aten.view.default: _view,
    aten._unsafe_view.default: _view,
    aten.native_layer_norm.default: _contiguous_like_first,
    aten.native_layer_norm_backward.default: _layer_norm_backward,
    aten.native_batch_norm_backward.default: _batch_norm_backward,
    aten.softplus_backward.default: _softplus_backward,
    aten.col2im.default: _col2im,
    aten._log_softmax_backward_data.default: _contiguous_like_first,
    aten.upsample_nearest2d.default: _upsample,
    aten.upsample_bilinear2d.default: _upsample,
    aten.upsample_bicubic2d.default: _upsample,
    aten.mse_loss.default: _pointwise_loss,
    aten.smooth_l1_loss.default: _pointwise_loss,
    aten.binary_cross_entropy.default: _binary_cross_entropy,
    aten.soft_margin_loss.default: _soft_margin_loss,
}

_CPU_RULES: dict[Any, _Rule] = {
    aten.native_batch_norm.default: _batch_norm_cpu,
    aten.native_layer_norm.default: _layer_norm_cpu,
    aten.mkldnn_rnn_layer.default: _mkldnn_rnn_workspace,
    aten.native_group_norm.default: _group_norm_cpu,
    aten.native_group_norm_backward.default: _group_norm_backward_cpu,
}
"""The CPU kernels' rules (module docstring), where the step is planned for the CPU."""

_CUDA_RULES: dict[Any, _Rule] = {aten.native_layer_norm.default: _layer_norm_cuda}
"""The CUDA kernels' rules (module docstring), where the step is planned for CUDA."""


def _as_made(tensor: torch.Tensor, allocation: Allocation) -> bool:
    if tuple(tensor.stride()) != allocation.strides:
        return False
    if allocation.dtype is not None and tensor.dtype != allocation.dtype:
        return False
    elements = allocation.storage_elements
    return elements is None or tensor.untyped_storage().nbytes() == elements * tensor.element_size()


def positional_arguments(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The op's arguments by position (keywords folded in, by the schema's order)."""
    values = list(args)
    for argument in func._schema.arguments[len(args) :]:
        if argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            break
    return values


class KernelLayouts(DispatchWatcher):
    """Above the fake mode: runs each op's fake kernel, then, for the ops in :data:`_RULES`,
    gives back outputs laid out as the real kernel lays them out (a fresh fake tensor of
    the same shape and dtype, the fake kernel's dropped before anything records it). Each
    op corrected is added to ``used`` (the session's assumptions). ``cpu``: the step is
    planned for the CPU, whose kernels' own rules (:data:`_CPU_RULES`) apply too, else for
    CUDA (:data:`_CUDA_RULES`)."""

    def __init__(self, used: set[str], *, cpu: bool = True) -> None:
        super().__init__()
        self.used = used
        self.rules = {**_RULES, **(_CPU_RULES if cpu else _CUDA_RULES)}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        output = func(*args, **kwargs)
        layout = self.rules.get(func)
        if layout is None:
            return output
        outputs = list(output) if isinstance(output, (tuple, list)) else [output]
        wanted = layout(positional_arguments(func, args, kwargs), outputs)
        changed = False
        for index, allocation in wanted.items():
            tensor = outputs[index]
            if not isinstance(tensor, torch.Tensor) or _as_made(tensor, allocation):
                continue
            strides = allocation.strides
            dtype = allocation.dtype or tensor.dtype
            if func in _VIEWS:
                outputs[index] = tensor.as_strided(tensor.shape, strides, tensor.storage_offset())
            elif allocation.storage_elements is not None:
                storage = torch.empty(
                    allocation.storage_elements, dtype=dtype, device=tensor.device
                )
                outputs[index] = storage.as_strided(tensor.shape, strides, 0)
            else:
                outputs[index] = torch.empty_strided(
                    tensor.shape, strides, dtype=dtype, device=tensor.device
                )
            changed = True
        if not changed:
            return output
        if func not in _VIEWS:  # a view's strides are ATen's arithmetic, no kernel's choice
            name = func.overloadpacket.__name__
            self.used.add(f"{name}: outputs laid out as its real kernel lays them out")
        return type(output)(outputs) if isinstance(output, (tuple, list)) else outputs[0]
