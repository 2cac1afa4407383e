"""The tensors inside a value (a batch, a module's output, a cache), and a batch's tensors
described as a plan records them (``"batch"``: shape and dtype under each key), which the
first-forward guard compares with the batch a training step passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["describe_batch", "describe_tensor", "iter_tensors"]


def iter_tensors(
    value: Any, *, _depth: int = 0, _seen: set[int] | None = None
) -> Iterator[torch.Tensor]:
    """Yield every tensor inside ``value``: tensors, mappings (``ModelOutput`` is one),
    lists, tuples, and the attributes of plain objects such as Hugging Face caches."""
    if _seen is None:
        _seen = set()
    if id(value) in _seen or _depth > 6:
        return
    if isinstance(value, torch.Tensor):
        _seen.add(id(value))
        yield value
        return
    if isinstance(value, (str, bytes, int, float, bool, type(None), torch.nn.Module)):
        return
    _seen.add(id(value))
    if isinstance(value, Mapping):
        children: Iterable[Any] = value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        children = value
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        children = vars(value).values()
    else:
        return
    for child in children:
        yield from iter_tensors(child, _depth=_depth + 1, _seen=_seen)


def describe_tensor(tensor: torch.Tensor) -> dict[str, object]:
    """A tensor's shape and dtype as the plan file records them (``{"shape": [4, 128],
    "dtype": "int64"}``)."""
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch.")}


def describe_batch(batch: Any) -> dict[str, object]:
    """Shapes and dtypes of the batch's tensors, for the plan file and mismatch warnings."""
    if isinstance(batch, dict):
        items = list(batch.items())
    elif isinstance(batch, (list, tuple)):
        items = [(str(index), value) for index, value in enumerate(batch)]
    else:
        items = [("0", batch)]
    described: dict[str, object] = {}
    for key, value in items:
        tensors = list(iter_tensors(value))
        if isinstance(value, torch.Tensor):
            described[key] = describe_tensor(value)
        elif tensors:
            described[key] = [describe_tensor(t) for t in tensors]
        else:
            described[key] = repr(value)[:80]
    return described
