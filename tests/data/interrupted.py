"""A model file whose forward raises KeyboardInterrupt on its INTERRUPT_ON_CALL-th call, as if
the user pressed Ctrl-C then (the 3rd call is in profiling's timing pass, before any file is
written). Otherwise the same as small_cnn.py."""

from small_cnn import build_model as build_small_cnn
from small_cnn import sample_batch, training_step  # noqa: F401  (part of the contract)
from torch import nn

INTERRUPT_ON_CALL = 3
calls = 0


def _count_calls(module: nn.Module, args: object) -> None:
    global calls
    calls += 1
    if calls == INTERRUPT_ON_CALL:
        raise KeyboardInterrupt


def build_model() -> nn.Module:
    model = build_small_cnn()
    model.register_forward_pre_hook(_count_calls)
    return model
