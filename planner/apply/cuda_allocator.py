"""The CUDA caching allocator setting a CUDA plan assumes, checked where the plan runs.

A CUDA plan assumes ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
(:mod:`planner.core.allocator`: why, and what it changes). :func:`warn_if_allocator_differs`
is what :func:`~planner.apply.wrap.apply_plan` calls: one warning per process, saying what to
set, where a CUDA plan is applied on a machine with CUDA and the allocator runs without it.
"""

from __future__ import annotations

import logging
import os

import torch

from planner.core.allocator import ALLOCATOR_VARIABLE, missing_setting_warning
from planner.core.devices import device_type
from planner.plan.plan_file import Plan

__all__ = ["allocator_settings", "warn_if_allocator_differs"]

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def allocator_settings() -> str:
    """The caching allocator's settings in effect, as ``PYTORCH_CUDA_ALLOC_CONF`` writes
    them: torch's own record (the environment read at start-up, or a later
    ``torch._C._accelerator_setAllocatorSettings``); on a torch without it, the variables
    torch reads (``PYTORCH_ALLOC_CONF`` first), the one place ckpt-plan reads them."""
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if getter is not None:
        return str(getter())
    return os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get(ALLOCATOR_VARIABLE, "")


def _runs_on_cuda(plan: Plan, model: torch.nn.Module | None) -> bool:
    if device_type(plan.device) != "cuda":
        return False
    if torch.cuda.is_available():
        return True
    return model is not None and any(p.device.type == "cuda" for p in model.parameters())


def warn_if_allocator_differs(plan: Plan, model: torch.nn.Module | None = None) -> str | None:
    """Log one warning (once per process and setting) where a CUDA plan runs, on a machine
    with CUDA, without the allocator setting it assumes; return its text (None where the
    plan is not for CUDA, no CUDA is here, or the setting is in effect)."""
    if not _runs_on_cuda(plan, model):
        return None
    settings = allocator_settings()
    message = missing_setting_warning(settings)
    if message is not None and settings not in _warned:
        _warned.add(settings)
        logger.warning("ckpt-plan: %s", message)
    return message
