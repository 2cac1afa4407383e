"""On fake tensors, give the backward of a view written in place the buffer the real
backward allocates.

Where training code writes in place into a view of a tensor that needs a gradient
(``embeddings += positions`` on a reshaped tensor, an in-place dropout on flattened
features), autograd rebuilds the view's backward. For a real tensor it becomes an
``as_strided`` of the base (``AsStridedBackward0``), whose backward scatters the incoming
gradient into a zeroed buffer spanning the base and the view (``new_zeros``) and hands that
on to the in-place op's ``CopySlices``; the incoming gradient can then be freed. For a tensor
subclass (a fake tensor is one) autograd replays the views instead, whose backward is a
view of the incoming gradient: no buffer, and the incoming gradient lives on. The fake step
recorded one storage fewer, of the base's size, than the real step (RoCBert, MobileNet v1
and v2, Swin v2: ``benchmarks/fake_fidelity.py``).

:class:`ViewWriteBuffers`, a torch-function mode in the fake session, notices each such
write (a view's version moves during a call) and hooks the last node of the replayed views'
backward: it returns the gradient in a fresh buffer of the size ``as_strided_backward``
gives (``new_zeros``, then the view of it laid out as the base), so the recorded storages,
their sizes and their lifetimes are the real step's. Only where the replayed views are
plain views (view, transpose, permute, squeeze, ...): a slice's or a select's backward
allocates a base-sized buffer of its own on fake tensors too, and where the replayed
backward already copied (a gradient that came in non-contiguous) into a buffer of that size,
nothing is added. Not where the base or the view overlaps itself (an expanded tensor): the
real backward then allocates more, counted by neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from planner.apply.wrap import RecomputedUnder

__all__ = ["ViewWriteBuffers"]

_PLAIN_VIEWS = frozenset(
    {
        "ViewBackward0",
        "UnsafeViewBackward0",
        "ReshapeAliasBackward0",
        "AliasBackward0",
        "TransposeBackward0",
        "TransposeBackward1",
        "PermuteBackward0",
        "TBackward0",
        "UnsqueezeBackward0",
        "UnsqueezeBackward1",
        "SqueezeBackward0",
        "SqueezeBackward1",
        "SqueezeBackward2",
    }
)
"""Backward nodes of views whose backward is a view of the incoming gradient (no buffer)."""


def _spanned(sizes: Sequence[int], strides: Sequence[int]) -> list[tuple[int, int]]:
    """(stride, size) of the dimensions that move through memory (size > 1, stride > 0)."""
    return sorted(
        (stride, size) for size, stride in zip(sizes, strides, strict=True) if size > 1 and stride
    )


def _overlaps(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """ATen's ``_maybe_overlapping_memory`` (as ``as_strided_backward`` tests it)."""
    reach = 0
    for stride, size in _spanned(sizes, strides):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def _min_storage(sizes: Sequence[int], strides: Sequence[int], offset: int) -> int:
    return offset + sum(stride * (size - 1) for stride, size in _spanned(sizes, strides)) + 1


def _tensors(args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The fake tensors among a call's arguments, and in its lists and tuples (a cheap scan:
    this runs for every torch function of the fake step)."""
    found: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()):
        if type(value) is FakeTensor:
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(item for item in value if type(item) is FakeTensor)
    return found


class ViewWriteBuffers(RecomputedUnder):
    """The fake session's mode (module docstring); a checkpoint's recomputation runs under it
    too."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if not torch.is_grad_enabled():
            return func(*args, **kwargs)
        views = [
            tensor
            for tensor in _tensors(args, kwargs)
            if tensor.requires_grad and tensor._is_view()
        ]
        if not views:
            return func(*args, **kwargs)
        versions = [view._version for view in views]
        output = func(*args, **kwargs)
        for view, version in zip(views, versions, strict=True):
            if view._version != version:
                self._hook(view)
        return output

    def _hook(self, view: torch.Tensor) -> None:
        base = view._base
        assert base is not None
        copy_slices = base.grad_fn
        node, last = view.grad_fn, None
        while node is not None and node is not copy_slices:
            if type(node).__name__ not in _PLAIN_VIEWS:
                return  # a slice or a select: its own backward allocates the buffer
            last, node = node, (node.next_functions[0][0] if node.next_functions else None)
        if last is None or node is not copy_slices:
            return
        sizes, strides = tuple(base.shape), tuple(base.stride())
        if 0 in sizes or 0 in view.shape:
            return  # as_strided_backward returns zeros of the base's shape: no buffer either
        if _overlaps(sizes, strides) or _overlaps(view.shape, view.stride()):
            return
        base_start, view_start = int(base.storage_offset()), int(view.storage_offset())
        shared = min(base_start, view_start)
        base_offset = base_start - shared
        span = max(
            _min_storage(sizes, strides, base_offset),
            _min_storage(view.shape, view.stride(), view_start - shared),
        )

        def as_strided_backward(grad_inputs: Any, grad_outputs: Any) -> Any:
            grad = grad_inputs[0]
            if grad is None:
                return None
            incoming = grad_outputs[0]
            copied = incoming is None or grad.untyped_storage() is not incoming.untyped_storage()
            if copied and grad.untyped_storage().nbytes() == span * grad.element_size():
                return None  # the replayed backward copied into a buffer of that size
            buffer = grad.new_zeros(span).as_strided(sizes, strides, base_offset)
            buffer.copy_(grad)
            return (buffer, *grad_inputs[1:])

        last.register_hook(as_strided_backward)
