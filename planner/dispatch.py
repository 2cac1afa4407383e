"""The base of every ``TorchDispatchMode`` here: one that sees higher-order operators.

A higher-order operator is an op of tensors and callables. The one a training step runs
eagerly is FlexAttention (``torch.nn.attention.flex_attention``): its forward is the
``flex_attention`` operator and its backward ``flex_attention_backward``, each one fused
kernel on the device. A dispatch mode that does not declare
``supports_higher_order_operators`` stops the step at the first one, and most models
written for long sequences use it (torchtitan's document masking, Hugging Face's
``attn_implementation="flex_attention"``).

:class:`DispatchWatcher` declares it, and every mode here derives from it. Such a mode
sees the operator whole, with no schema, tags or overload packet
(:func:`is_higher_order`). The modes here run it below themselves, as one op whose outputs
are what its fused kernel allocates. Its interior (the unfused reference implementation on
a CPU) is out of their sight.

``flex_attention`` called outside ``torch.compile`` compiles its operator itself with
``fullgraph=True``. TorchDynamo compiles nothing while a user dispatch mode is active, so
that call fails under any of these modes. While one is entered, FlexAttention's own switch
for running the operator uncompiled (``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG``) is on:
the operator runs as the compiled call would, without the compile. Run so, its autograd
function first traces its ``score_mod`` into forward and backward graphs
(``create_fw_bw_graph``) on fake example tensors, which a compiled call does once, at
compile time. What that tracing makes is the operator's bookkeeping, no memory of the
step: the memory watcher leaves it out (:func:`tracing_an_operator`). Both go back as they
were when the last mode exits.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["DispatchWatcher", "is_higher_order", "tracing_an_operator"]


def is_higher_order(func: Any) -> bool:
    """Whether a dispatched op is a higher-order operator (see the module's notes)."""
    return isinstance(func, torch._ops.HigherOrderOperator)


_TRACING = [0]  # how deep in an operator's graph tracing the step is


def tracing_an_operator() -> bool:
    """Whether a higher-order operator is tracing its graphs now (see the module's notes):
    what it makes then is not memory of the step."""
    return _TRACING[0] > 0


def _out_of_sight(trace: Callable[..., Any]) -> Callable[..., Any]:
    """``trace`` marked as an operator's graph tracing (:func:`tracing_an_operator`)."""

    @functools.wraps(trace)
    def traced(*args: Any, **kwargs: Any) -> Any:
        _TRACING[0] += 1
        try:
            return trace(*args, **kwargs)
        finally:
            _TRACING[0] -= 1

    return traced


class _FlexUncompiled:
    """FlexAttention run uncompiled, its graph tracing out of sight, while any
    :class:`DispatchWatcher` is entered (see the module's notes)."""

    def __init__(self) -> None:
        self.depth = 0
        self.restore: list[tuple[Any, str, Any]] = []  # (module, name, original value)

    def _set(self, module_name: str, name: str, value: Callable[[Any], Any]) -> None:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a torch without FlexAttention
            return
        original = getattr(module, name, None)
        if original is None:  # laid out otherwise in this torch: left as it is
            return
        self.restore.append((module, name, original))
        setattr(module, name, value(original))

    def enter(self) -> None:
        self.depth += 1
        if self.depth > 1:
            return
        self._set(
            "torch.nn.attention.flex_attention",
            "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG",
            lambda _original: True,
        )
        self._set("torch._higher_order_ops.flex_attention", "create_fw_bw_graph", _out_of_sight)

    def exit(self) -> None:
        self.depth -= 1
        if self.depth:
            return
        for module, name, original in reversed(self.restore):
            setattr(module, name, original)
        self.restore.clear()


_FLEX = _FlexUncompiled()


class DispatchWatcher(TorchDispatchMode):
    """A dispatch mode that sees higher-order operators (see the module's notes)."""

    supports_higher_order_operators = True

    def __enter__(self) -> Any:
        _FLEX.enter()
        try:
            return super().__enter__()
        except BaseException:
            _FLEX.exit()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            _FLEX.exit()
