"""On fake tensors, two torch functions as on real ones: ``torch.tensor`` of a list holding
tensors, and ``one_hot``.

``torch.tensor([a, b])`` of zero-dimensional tensors reads their storages directly, under
no dispatch: on fake tensors, which have none, it fails ("its data is not allocated yet").
Models build small index tensors that way from values they computed: Qwen2-VL's multimodal
rotary positions end in ``torch.tensor(deltas)``, one ``positions.max() + 1 - length`` per
sequence. :class:`FakeTensorsAsData`, a torch-function mode in the fake session, hands such
a list's fake tensors over as their values (``tolist()``, which the shadows of small tensors
answer: :mod:`planner.measure.shadows`) before ``torch.tensor`` reads them; a value not known
fails there as any data-dependent op on fake tensors does.

``one_hot`` takes another path on a tensor subclass (fake tensors among them) than on a real
one: ``eq(self.unsqueeze(-1), arange(classes)).to(long)``, a bool tensor an eighth of the
output's size besides it, where the real kernel checks the values (``aminmax`` on CPU),
zero-fills the output and scatters ones into it. Gemma 4's vision pooler one-hots every
patch's pooling window (2520 x 280 an image): the fake step's storages differed from the real
step's there. On fake tensors it now runs the real kernel's ops (:func:`_one_hot`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from planner.apply.wrap import RecomputedUnder

__all__ = ["FakeTensorsAsData"]


def _one_hot(tensor: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """``one_hot`` of a fake tensor by the real kernel's ops (ATen's ``Onehot.cpp``): on CPU
    it checks the values' range with ``aminmax``, on CUDA only where it must read the number
    of classes from them; then ``zeros`` and ``scatter_``."""
    if tensor.device.type == "cpu":
        low, high = torch.aminmax(tensor)  # the value checks (not read here: no values)
        if num_classes == -1:
            num_classes = int(high.item()) + 1
        del low, high  # freed before the output is made, as the kernel frees them
    elif num_classes == -1:
        num_classes = int(tensor.max().item()) + 1
    out = torch.zeros((*tensor.shape, num_classes), dtype=tensor.dtype, device=tensor.device)
    return out.scatter_(-1, tensor.unsqueeze(-1), 1)


def _holds_fake(data: Any) -> bool:
    if isinstance(data, list | tuple):
        return any(type(item) is FakeTensor or _holds_fake(item) for item in data)
    return False


def _values(data: Any) -> Any:
    if type(data) is FakeTensor:
        return data.tolist()
    if isinstance(data, list | tuple):
        return [_values(item) for item in data]
    return data


class FakeTensorsAsData(RecomputedUnder):
    """The fake session's mode (module docstring); a checkpoint's recomputation runs under
    it too."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.tensor and args and _holds_fake(args[0]):
            args = (_values(args[0]), *args[1:])
        if (
            func is torch.nn.functional.one_hot
            and args
            and type(args[0]) is FakeTensor
            and args[0].dtype == torch.long
            and args[0].numel() > 0
        ):
            return _one_hot(*args, **kwargs)
        return func(*args, **kwargs)
