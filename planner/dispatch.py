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
compile time. What that tracing runs is the operator's bookkeeping on fake example values,
no op of the step: every mode here passes it through untouched
(:func:`tracing_an_operator`; the memory watcher would count its tensors, the value
shadows compute on its uninitialized example values). Both go back as they were when the
last mode exits.

Uncompiled, the operator takes a tensor its ``score_mod`` captures (a learned bias) as a
constant: ``torch.compile`` lifts it into the operator's arguments, so its gradient flows.
A captured tensor that requires grad is therefore refused, with its name: the step recorded
would not be the one that trains.
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


def _captured_trainable(function: Any) -> str | None:
    """The name of a tensor requiring grad that ``function`` captures, or None."""
    names = getattr(getattr(function, "__code__", None), "co_freevars", ())
    for name, cell in zip(names, getattr(function, "__closure__", None) or (), strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # a free variable not bound yet
            continue
        if isinstance(value, torch.Tensor) and value.requires_grad:
            return str(name)
    return None


def _out_of_sight(trace: Callable[..., Any]) -> Callable[..., Any]:
    """``trace`` (``create_fw_bw_graph(score_mod, ...)``) marked as an operator's graph
    tracing (:func:`tracing_an_operator`); a ``score_mod`` capturing a tensor that requires
    grad refused (see the module's notes)."""

    @functools.wraps(trace)
    def traced(*args: Any, **kwargs: Any) -> Any:
        captured = _captured_trainable(args[0]) if args else None
        if captured is not None:
            raise NotImplementedError(
                f"FlexAttention's score_mod captures {captured!r}, a tensor that requires "
                "grad: ckpt-plan records FlexAttention uncompiled, where such a tensor gets "
                "no gradient, so it cannot plan this step yet"
            )
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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        own = cls.__dict__.get("__torch_dispatch__")
        if own is not None and not isinstance(own, classmethod):

            @functools.wraps(own)
            def dispatch(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                if tracing_an_operator():  # see the module's notes
                    return func(*args, **(kwargs or {}))
                return own(self, func, types, args, kwargs)

            cls.__torch_dispatch__ = dispatch  # type: ignore[method-assign]
        super().__init_subclass__(**kwargs)

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
