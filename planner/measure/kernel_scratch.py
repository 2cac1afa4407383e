"""Scratch memory CUDA kernels take while they run, which no tensor returned shows.

Some CUDA kernels allocate buffers from PyTorch's caching allocator for the length of one
op (a reduction's partial sums, attention backward's accumulators) and free them before
the op returns: the dispatcher never sees them, but ``torch.cuda.max_memory_allocated()``
counts them. A step recorded on fake tensors, or emulated on CPU, misses them; at the peak
they put a plan over its budget (``reports/benchmarks/cuda_gaps.md``: a ``sum`` took up to
4 MiB, ``_softmax_backward_data`` 2 MiB; one emulated ``gpt`` plan predicted 131.07 MiB
against a 131.61 MiB budget and measured 132.83 MiB). :func:`scratch_bytes` gives, per op
and shapes, the scratch its CUDA kernel takes (0 for the ops not listed), and
:class:`KernelScratch` charges it in a recorded CUDA step as a transient storage at the op
(made after the op's outputs, freed at once: the timeline, the memory model and the
solver all see it) and tallies what it charged, for the profile's assumptions.

Design notes: where each rule comes from
----------------------------------------
Every figure named is from ``reports/benchmarks/cuda_gaps.md`` (H100 80GB, torch 2.11;
``benchmarks/cuda_gaps.py`` measures, per op of a real step, the allocator's peak during
the op beyond its inputs and outputs). Sizes are charged in whole 512-byte blocks, as the
allocator hands them out, each buffer apart.

1. **Reductions** (``sum``, ``mean``, ``amax``, ``amin``, ``prod``): ATen's reduction
   kernel (``Reduce.cuh``, ``setReduceConfig``) splits a long reduction across thread
   blocks and then allocates ``global_memory_size()`` bytes of partial results plus
   ``semaphore_size()`` (4 bytes per block column), both from the caching allocator.
   :func:`_reduction_scratch_bytes` is that code's arithmetic, with the device's
   multiprocessor count taken as unbounded (it only lowers the split: an upper bound).
   It reproduces every recorded figure to the byte: ``sum`` over the rows of (1024, 128)
   and (1024, 512) fp32 (gpt's bias gradients) 1 MiB + 512 B and 4 MiB + 512 B, of
   (8, 128, 128) fp32 over its first two dims (hf_llama's norm weights) 1 MiB + 512 B, of
   (2, 2048, 2048) bf16 (llama_medium) 64 MiB + 512 B, and none for hf_gpt2's (512, N)
   (too few rows per thread to split).
2. **Softmax backward** (``_softmax_backward_data``): one buffer of its gradient's size,
   in all three recorded models (gpt, hf_llama (8, 4, 128, 128) fp32: 2 MiB; hf_gpt2
   (4, 4, 128, 128): 1 MiB).
3. **Attention backward** (``_scaled_dot_product_{flash,cudnn,efficient}_attention_backward``):
   flash attention 2's backward allocates a float32 accumulator for the query gradient and
   one float per query row (``softmax_d``), and, when the keys have fewer heads than the
   queries, key and value gradients at the query heads' count (``dk_expanded``,
   ``dv_expanded``, in the inputs' dtype). For llama_medium's (2, 16, 2048, 128) queries
   and (2, 4, 2048, 128) keys in bf16 that is 64 MiB + 256 KiB, plus one 512-byte block (as
   the forward's, point 4): the figure recorded for cuDNN's backward there to the byte.
   The memory-efficient kernel's workspace keeps
   float32 accumulators for all three gradients where its tiles need them: charged as
   float32 key and value gradients at the query heads' count instead (an upper bound; not
   recorded).
4. **Attention forward** (``_scaled_dot_product_{flash,cudnn,efficient}_attention``):
   512 bytes (recorded for cuDNN's forward: its seed and offset).
5. **Embedding backward** (``embedding_dense_backward``): up to 3072 indices (without
   ``scale_grad_by_freq``) the kernel adds rows in place, with no scratch (none recorded
   for gpt's, hf_gpt2's and hf_llama's 1024 and 512). Above, a float32 partial sum per
   index and embedding element (``grad_weight_per_segment``), and the index sort's and
   segment buffers, charged as 1 KiB per index (llama_medium, 4096 indices of 2048
   elements: 35.4 MiB recorded, 36 MiB charged).
6. **Cumulative sums** (``cumsum``): one buffer of the result's size (int64 positions in
   hf_gpt2, hf_llama and llama_medium: 4096, 8192 and 32768 bytes).

cuBLAS's and cuBLASLt's workspaces are not scratch: they stay allocated for the whole run
(``DeviceSpec.workspace_bytes``, a resident storage in every predicted peak). What the
caching allocator charges beyond a block's rounded size (``cuda_gaps.md``'s second table:
a freed 2.5 MiB block reused, unsplit, for a 2 MiB tensor) is not modelled: a CUDA plan
assumes ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, under which the allocator
always splits a block down to the request rounded to 512 bytes (``should_split``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from planner.core.units import format_bytes
from planner.measure.tracking import allocated_bytes

__all__ = ["KernelScratch", "scratch_bytes"]

# Reduce.cuh's constants: threads per block (512, 256 for complex double), the vector
# widths, and the values a thread sums before the reduction is split across blocks.
_MAX_THREADS = 512
_WARP = 32
_INPUT_VECTOR = 4
_MIN_VALUES_PER_THREAD = 16
_MAX_VALUES_PER_THREAD = 256
_INT32_BYTES = 4


def _last_pow2(n: int) -> int:
    """Reduce.cuh's ``last_pow2``: the largest power of two <= n (at least 1)."""
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _accumulator_bytes(op: str, dtype: torch.dtype) -> int:
    """The size of the reduction's accumulator (``arg_t``): ``opmath`` (float for
    half/bf16/float, double for double, int64 for integers) for sums, means and products,
    the element itself for minimum and maximum."""
    if op in ("amax", "amin"):
        return torch.empty((), dtype=dtype, device="meta").element_size()
    if dtype.is_complex:
        return 16 if dtype == torch.complex128 else 8
    if dtype.is_floating_point:
        return 8 if dtype == torch.float64 else 4
    return 8


def _output_vector(outputs: int) -> int:
    """``get_output_vec_size`` for an aligned, contiguous output: 4, 2 or 1 by what divides
    the number of outputs."""
    size = 4
    while outputs % size:
        size //= 2
    return size


def _reduction_scratch_bytes(
    outputs: int, inputs_per_output: int, accumulator: int, *, on_fastest: bool, vectorized: bool
) -> int:
    """``global_memory_size()`` and ``semaphore_size()`` of ``setReduceConfig`` (design
    notes, point 1), each rounded to whole blocks: 0 where the reduction is not split
    across thread blocks. ``on_fastest``: the reduced dims include the input's fastest-
    moving one (block x reduces); else the outputs are (vectorized along the output)."""
    output_vector = 1
    if on_fastest:
        dim0, dim1 = inputs_per_output, outputs
        if vectorized and dim0 > 128:
            dim0 //= _INPUT_VECTOR
    else:
        dim0, dim1 = outputs, inputs_per_output
        output_vector = _output_vector(outputs)
        dim0 //= output_vector
    max_threads = _MAX_THREADS // output_vector
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(dim0_pow2, _WARP)
    height = min(dim1_pow2, max_threads // width)
    width = min(dim0_pow2, max_threads // height)
    step_input = step_output = 1
    if on_fastest:
        step_input *= width  # input_mult[0]: block x reduces
    else:
        step_output *= width
    split_across_warps = False
    values = _div_up(inputs_per_output, step_input)
    if values >= height * 16 or values >= _MAX_VALUES_PER_THREAD:
        step_input *= height
        split_across_warps = True
    else:
        step_output *= height
    values = _div_up(inputs_per_output, step_input)
    if not split_across_warps or values < _MAX_VALUES_PER_THREAD:
        return 0
    # ctas_per_output = max(min(blocks to fill the device, values / 16), values / 256):
    # with the device taken as large enough, the min is values / 16.
    ctas = max(_div_up(values, _MIN_VALUES_PER_THREAD), _div_up(values, _MAX_VALUES_PER_THREAD))
    if ctas <= 1:
        return 0
    buffer = accumulator * outputs * ctas
    if not on_fastest:
        buffer *= width * output_vector
    grid_columns = _div_up(outputs // output_vector, step_output)
    return allocated_bytes(buffer, "cuda") + allocated_bytes(_INT32_BYTES * grid_columns, "cuda")


def _reduced_dims(tensor: torch.Tensor, dims: Any) -> list[int]:
    if dims is None or (isinstance(dims, Sequence) and len(dims) == 0):
        return list(range(tensor.dim()))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % max(tensor.dim(), 1) for d in dims})


def _reduction(op: str, args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    tensor = args[0]
    if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0 or tensor.dim() == 0:
        return 0
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if op in ("sum", "mean") and len(args) > 1 and not isinstance(args[1], (int, Sequence)):
        dims = None  # sum(input, dtype)
    reduced = [d for d in _reduced_dims(tensor, dims) if tensor.shape[d] > 1]
    kept = [d for d in range(tensor.dim()) if d not in reduced and tensor.shape[d] > 1]
    inputs_per_output = math.prod(tensor.shape[d] for d in reduced)
    outputs = math.prod(tensor.shape[d] for d in kept)
    if inputs_per_output <= 1:
        return 0
    # TensorIterator orders dims by stride: the reduction is on the fastest-moving dim
    # when the smallest-stride dim of size > 1 is reduced (or every dim is).
    sizes = [d for d in range(tensor.dim()) if tensor.shape[d] > 1]
    strides = tensor.stride()
    fastest = min(sizes, key=lambda d: abs(strides[d]))
    on_fastest = not kept or fastest in reduced
    # Input vectorization needs the reduced dims to coalesce into one contiguous run.
    vectorized = on_fastest and tensor.is_contiguous() and reduced == sizes[-len(reduced) :]
    dtype = kwargs.get("dtype") or tensor.dtype
    return _reduction_scratch_bytes(
        outputs,
        inputs_per_output,
        _accumulator_bytes(op, dtype),
        on_fastest=on_fastest,
        vectorized=vectorized,
    )


def _attention_backward(op: str, args: Sequence[Any]) -> int:
    """Design notes, point 3. Arguments: (grad_out, query, key, value, ...), in
    (batch, heads, sequence, head size)."""
    tensors = [a for a in args[:4] if isinstance(a, torch.Tensor)]
    if len(tensors) < 4 or any(t.dim() != 4 for t in tensors):
        return 0
    _, query, key, _ = tensors
    batch, heads, queries, head_size = query.shape
    keys = key.shape[-2]
    dq_accumulator = allocated_bytes(4 * batch * heads * queries * head_size, "cuda")
    row_sums = allocated_bytes(4 * batch * heads * queries, "cuda")
    if "efficient" in op:
        expanded = 2 * allocated_bytes(4 * batch * heads * keys * head_size, "cuda")
    elif key.shape[1] != heads:
        gradient_bytes = key.element_size() * batch * heads * keys * head_size
        expanded = 2 * allocated_bytes(gradient_bytes, "cuda")
    else:
        expanded = 0
    return dq_accumulator + row_sums + expanded + allocated_bytes(1, "cuda")


def _first_bytes(args: Sequence[Any]) -> int:
    tensor = args[0] if args else None
    if not isinstance(tensor, torch.Tensor):
        return 0
    return allocated_bytes(tensor.numel() * tensor.element_size(), "cuda")


_EMBEDDING_INDEX_BYTES = 1024
# Up to this many indices (and no scaling by frequency) the CUDA kernel adds each gradient
# row into the weight's gradient directly, with no sort and no scratch.
_EMBEDDING_DIRECT_INDICES = 3072


def _embedding_backward(args: Sequence[Any]) -> int:
    """Design notes, point 5. Arguments: (grad_output, indices, num_weights, padding_idx,
    scale_grad_by_freq)."""
    grad, indices = args[0], args[1]
    if not isinstance(grad, torch.Tensor) or not isinstance(indices, torch.Tensor):
        return 0
    count = indices.numel()
    scale_by_frequency = bool(args[4]) if len(args) > 4 else False
    if count <= _EMBEDDING_DIRECT_INDICES and not scale_by_frequency:
        return 0
    width = grad.shape[-1] if grad.dim() else 1
    return allocated_bytes(4 * count * width, "cuda") + allocated_bytes(
        _EMBEDDING_INDEX_BYTES * count, "cuda"
    )


def _cumsum(outputs: Sequence[torch.Tensor]) -> int:
    if not outputs:
        return 0
    return allocated_bytes(outputs[0].numel() * outputs[0].element_size(), "cuda")


_REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "prod"})
_ATTENTION_FORWARD = frozenset(
    {
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_efficient_attention",
    }
)
_ATTENTION_BACKWARD = frozenset(f"{name}_backward" for name in _ATTENTION_FORWARD)


def scratch_bytes(
    op: str, args: Sequence[Any], kwargs: dict[str, Any], outputs: Sequence[torch.Tensor]
) -> int:
    """The scratch, in allocator blocks, that CUDA's kernel for ``op`` (an overload
    packet's name: ``sum``, ``_softmax_backward_data``) takes while it runs on these
    arguments; 0 for an op with no rule (see the module's design notes)."""
    if op in _REDUCTIONS:
        return _reduction(op, args, kwargs)
    if op == "_softmax_backward_data":
        return _first_bytes(args)
    if op in _ATTENTION_BACKWARD:
        return _attention_backward(op, args)
    if op in _ATTENTION_FORWARD:
        return allocated_bytes(1, "cuda")
    if op == "embedding_dense_backward":
        return _embedding_backward(args)
    if op == "cumsum":
        return _cumsum(outputs)
    return 0


@dataclass
class KernelScratch:
    """Charges CUDA kernels' scratch in a recorded step (see the module docstring) and
    tallies it by op: calls charged and the largest charge."""

    calls: dict[str, int] = field(default_factory=dict)
    largest_bytes: dict[str, int] = field(default_factory=dict)

    def charge(
        self, func: Any, args: Sequence[Any], kwargs: dict[str, Any], outputs: Sequence[Any]
    ) -> int:
        """The scratch of one op (0 for most), tallied."""
        packet = getattr(func, "overloadpacket", None)
        name = getattr(packet, "__name__", "")
        if not name:
            return 0
        size = scratch_bytes(name, args, kwargs, outputs)
        if size:
            self.calls[name] = self.calls.get(name, 0) + 1
            self.largest_bytes[name] = max(self.largest_bytes.get(name, 0), size)
        return size

    def assumptions(self) -> tuple[str, ...]:
        """What was charged, one line: the profile lists it among its assumptions."""
        if not self.calls:
            return ()
        charged = ", ".join(
            f"{name} x{self.calls[name]} (up to {format_bytes(self.largest_bytes[name])})"
            for name in sorted(self.calls, key=lambda n: -self.largest_bytes[n])
        )
        return (
            "CUDA kernels' scratch charged as a transient at each op "
            f"(planner.measure.kernel_scratch): {charged}",
        )
