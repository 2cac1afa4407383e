"""On fake tensors, ``torch.tensor`` of a list holding tensors: their values, as on real ones.

``torch.tensor([a, b])`` of zero-dimensional tensors reads their storages directly, under
no dispatch: on fake tensors, which have none, it fails ("its data is not allocated yet").
Models build small index tensors that way from values they computed: Qwen2-VL's multimodal
rotary positions end in ``torch.tensor(deltas)``, one ``positions.max() + 1 - length`` per
sequence. :class:`FakeTensorsAsData`, a torch-function mode in the fake session, hands such
a list's fake tensors over as their values (``tolist()``, which the shadows of small tensors
answer: :mod:`planner.measure.shadows`) before ``torch.tensor`` reads them; a value not known
fails there as any data-dependent op on fake tensors does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from planner.apply.wrap import RecomputedUnder

__all__ = ["FakeTensorsAsData"]


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
        return func(*args, **kwargs)
