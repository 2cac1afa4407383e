"""Wrap the submodules a plan names in activation checkpointing: :func:`apply_plan` and
:func:`remove_plan`.

Design notes
------------
* **In place, same keys.** We do not insert wrapper modules (that would rename every
  ``state_dict`` key, as ``checkpoint_wrapper`` does). Instead each chosen module gets an
  instance-level ``forward`` that calls the class's forward through
  ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``. Parameters, buffers,
  hooks and ``state_dict`` keys are untouched; removing the instance attribute undoes it.
* **All or nothing.** Every check (fingerprint, names, methods) runs before the first
  module is touched; wrapping itself cannot fail half-way.
* **Idempotent.** Applying a plan makes the model's wrapped set exactly the plan's:
  modules already wrapped the same way are left alone, others are re-wrapped or unwrapped.
* **No grad, no checkpoint.** Under ``torch.no_grad()`` (evaluation) the original forward
  runs directly: there is nothing to save, so nothing to recompute.
* **Offload, the third answer.** A module the plan offloads is not checkpointed: its
  forward runs once, under saved-tensor hooks that send what it saves to host memory
  until its backward (:mod:`planner.apply.offload`). It composes with checkpointing
  elsewhere in the model; never on the same path (a plan that nests one in the other is
  refused). Its copy back starts at the backward of the plan's ``prefetch_module`` (the
  next block), which gets a pair of forward hooks (:class:`~planner.apply.offload.PrefetchWatch`);
  checkpoints take the active prefetch triggers along to their recomputation.
* **Recomputed under the forward's emulation.** The autograd engine runs a checkpoint's
  recomputation (in the unpack hook) without the Python torch-function modes the forward
  ran under. A mode that is part of the step itself, the emulation of a device
  (:class:`RecomputedUnder`: :mod:`planner.measure.cuda_emulation`), is entered again
  around the recomputation, so it runs the forward's kernels and saves what it saved. A
  step without one (every real step) runs the checkpoint exactly as before.
* **Found, then guarded.** The plan goes on the model it was made for, found inside any
  wrapper (:mod:`planner.apply.locate`); the first training forward then compares its step
  with the plan's (:mod:`planner.apply.guard`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from planner.apply.cuda_allocator import warn_if_allocator_differs
from planner.apply.guard import FirstForwardGuard
from planner.apply.locate import check_world_size, planned_model
from planner.apply.observe import Region, observed
from planner.apply.offload import (
    OffloadedCall,
    PrefetchWatch,
    fire_at_recomputation,
    model_storage_keys,
)
from planner.core.errors import PlanFileError, PlanMismatchError
from planner.model_switches import switch_off_caches
from planner.plan.plan_file import CheckpointMethod, ModuleDecision, Plan, load_plan
from planner.plan.policies import is_attention_op

logger = logging.getLogger(__name__)

__all__ = [
    "RecomputedUnder",
    "apply_plan",
    "is_cached_op",
    "is_wrapped",
    "remove_plan",
    "selective_contexts",
    "stage_plan_of",
    "wrapped_modules",
]

_STATE_ATTRIBUTE = "_ckpt_plan_decision"
_ORIGINAL_ATTRIBUTE = "_ckpt_plan_instance_forward"
# The planned model an offloaded module is part of: its parameters and buffers stay.
_ROOT_ATTRIBUTE = "_ckpt_plan_root"
# The module at whose backward an offloaded module's tensors start back.
_PREFETCH_ATTRIBUTE = "_ckpt_plan_prefetch_at"


class RecomputedUnder(TorchFunctionMode):
    """A torch-function mode that a checkpoint's recomputation runs under where the forward
    did (see the module's design notes): the emulation of a device, whose kernels the
    recomputation must run as the forward ran them."""


def _under_forward_modes(function: Any) -> Any:
    """``function``, run under the :class:`RecomputedUnder` modes active now, entered again
    (outermost first) wherever it runs without them: the recomputation. ``function`` itself
    where none is active."""
    modes = [
        mode for mode in _get_current_function_mode_stack() if isinstance(mode, RecomputedUnder)
    ]
    if not modes:
        return function

    def run(*args: Any, **kwargs: Any) -> Any:
        active = _get_current_function_mode_stack()
        with contextlib.ExitStack() as stack:
            for mode in modes:
                if not any(mode is other for other in active):
                    stack.enter_context(mode)
            return function(*args, **kwargs)

    return run


def _checkpointed_forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    decision: ModuleDecision = module.__dict__[_STATE_ATTRIBUTE]
    original = type(module).forward.__get__(module)
    if _ORIGINAL_ATTRIBUTE in module.__dict__:
        original = module.__dict__[_ORIGINAL_ATTRIBUTE]
    if not torch.is_grad_enabled():
        return original(*args, **kwargs)
    if decision.method is CheckpointMethod.OFFLOAD:
        root = module.__dict__.get(_ROOT_ATTRIBUTE, module)
        call = OffloadedCall(
            decision.offload_min_bytes,
            model_storage_keys(root),
            module.__dict__.get(_PREFETCH_ATTRIBUTE),
        )
        with call.hooks():
            output = original(*args, **kwargs)
        call.finish_forward(args, kwargs, output)
        return output
    if decision.method is CheckpointMethod.CHECKPOINT_SEQUENTIAL:
        assert not kwargs and len(args) == 1, "checkpoint_sequential takes one input"
        return _checkpoint_sequential(module, decision, args[0])
    region = Region(decision.module_name, preserves_rng=decision.preserve_rng_state)
    function = observed(region, original, _cached_ops(decision))
    if decision.restore_buffers:
        function = _restoring_buffers_on_recompute(module, function, decision.restore_buffers)
    function = fire_at_recomputation(_under_forward_modes(function))
    if decision.policy is not None:
        return checkpoint(
            function,
            *args,
            use_reentrant=False,
            preserve_rng_state=decision.preserve_rng_state,
            context_fn=functools.partial(selective_contexts, decision),
            **kwargs,
        )
    return checkpoint(
        function,
        *args,
        use_reentrant=False,
        preserve_rng_state=decision.preserve_rng_state,
        **kwargs,
    )


_OP_NAMES: dict[Any, str] = {}


def _cached_ops(decision: ModuleDecision) -> frozenset[str]:
    """The op names (``"aten.mm.default"``) whose outputs a decision's policy may keep and
    hand back to its recomputation: its saved and alternating ops (see
    :func:`is_cached_op` for attention)."""
    if decision.policy is None:
        return frozenset()
    return frozenset(decision.saved_ops) | frozenset(decision.alternating_ops)


def is_cached_op(op: str, cached_ops: frozenset[str]) -> bool:
    """Whether a policy saving ``cached_ops`` saves calls of ``op``. Fused attention is
    matched by kind, not by name: the device picks its kernel (a plan made on CPU names
    the CPU one)."""
    return op in cached_ops or (
        is_attention_op(op) and any(is_attention_op(saved) for saved in cached_ops)
    )


def selective_contexts(decision: ModuleDecision) -> tuple[Any, Any]:
    """The two contexts of one checkpointed call under the decision's selective policy
    (:mod:`planner.plan.policies`): outputs of ``saved_ops`` are kept, and of
    ``alternating_ops`` every other call's (the 1st, 3rd, ... of this call's forward); all
    else is recomputed (attention matched by kind, :func:`is_cached_op`)."""
    saved = frozenset(decision.saved_ops)
    alternating = frozenset(decision.alternating_ops)
    alternation = 0

    def policy(context: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        nonlocal alternation
        name = _OP_NAMES.get(func)
        if name is None:
            name = _OP_NAMES[func] = str(func)
        if is_cached_op(name, saved):
            return CheckpointPolicy.MUST_SAVE
        if name in alternating and not context.is_recompute:
            alternation += 1
            if alternation % 2 == 1:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _run_segment(functions: list[torch.nn.Module], start: int, end: int) -> Any:
    def forward(value: Any) -> Any:
        for index in range(start, end + 1):
            value = functions[index](value)
        return value

    return forward


def _checkpoint_sequential(module: torch.nn.Module, decision: ModuleDecision, value: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint_sequential(module, segments, value,
    use_reentrant=False)``, step for step (its segments, its last segment run plainly), with
    each segment function visible to a recomputation observer."""
    functions = list(module.children())
    segments = decision.segments or 1
    segment_size = len(functions) // segments
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        segment = _run_segment(functions, start, end)
        value = checkpoint(
            fire_at_recomputation(
                _under_forward_modes(
                    observed(
                        Region(
                            decision.module_name,
                            start,
                            end + 1,
                            preserves_rng=decision.preserve_rng_state,
                        ),
                        segment,
                    )
                )
            ),
            value,
            use_reentrant=False,
            preserve_rng_state=decision.preserve_rng_state,
        )
    return _run_segment(functions, end + 1, len(functions) - 1)(value)


def _restoring_buffers_on_recompute(
    module: torch.nn.Module, forward: Any, buffer_names: tuple[str, ...]
) -> Any:
    """``forward`` for one checkpointed call: its first run (the real forward) is plain; any
    later run is the recomputation during backward, which must not update buffers (BatchNorm
    running statistics) a second time, so they are put back as they were before it."""
    buffers = dict(module.named_buffers())
    targets = [buffers[name] for name in buffer_names]
    runs = 0

    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal runs
        runs += 1
        if runs == 1:
            return forward(*args, **kwargs)
        before = [buffer.detach().clone() for buffer in targets]
        try:
            return forward(*args, **kwargs)
        finally:
            with torch.no_grad():
                for buffer, value in zip(targets, before, strict=True):
                    buffer.copy_(value)

    return run


class _BoundCheckpointedForward:
    """``module.forward`` replacement; a class (not a lambda) so models stay picklable."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _checkpointed_forward(self.module, *args, **kwargs)


def _wrap(
    module: torch.nn.Module,
    decision: ModuleDecision,
    root: torch.nn.Module,
    prefetch_at: torch.nn.Module | None,
) -> None:
    existing = module.__dict__.get("forward")
    if existing is not None and not isinstance(existing, _BoundCheckpointedForward):
        module.__dict__[_ORIGINAL_ATTRIBUTE] = existing
    module.__dict__[_STATE_ATTRIBUTE] = decision
    if decision.method is CheckpointMethod.OFFLOAD:
        module.__dict__[_ROOT_ATTRIBUTE] = root
        if prefetch_at is not None:
            module.__dict__[_PREFETCH_ATTRIBUTE] = prefetch_at
    module.__dict__["forward"] = _BoundCheckpointedForward(module)


def _unwrap(module: torch.nn.Module) -> None:
    module.__dict__.pop(_STATE_ATTRIBUTE, None)
    module.__dict__.pop(_ROOT_ATTRIBUTE, None)
    module.__dict__.pop(_PREFETCH_ATTRIBUTE, None)
    original = module.__dict__.pop(_ORIGINAL_ATTRIBUTE, None)
    if original is not None:
        module.__dict__["forward"] = original
    else:
        module.__dict__.pop("forward", None)


def is_wrapped(module: torch.nn.Module) -> bool:
    return _STATE_ATTRIBUTE in module.__dict__


def wrapped_modules(model: torch.nn.Module) -> dict[str, ModuleDecision]:
    """The modules of ``model`` currently wrapped by ckpt-plan, by qualified name."""
    return {
        name: module.__dict__[_STATE_ATTRIBUTE]
        for name, module in model.named_modules()
        if is_wrapped(module)
    }


def remove_plan(model: torch.nn.Module) -> None:
    """Undo :func:`apply_plan`: every wrapped module gets its own forward back."""
    for module in model.modules():
        if is_wrapped(module):
            _unwrap(module)
        PrefetchWatch.remove(module)
    FirstForwardGuard.remove(model)


def stage_plan_of(model: torch.nn.Module, plan: Plan) -> Plan:
    """The plan of the pipeline stage ``model`` is, found by its modules and parameters
    (each stage's plan has its stage's fingerprint). Raises :class:`PlanMismatchError` for a
    module that is none of the plan's stages."""
    for stage in plan.stages:
        try:
            planned_model(model, stage)
        except PlanMismatchError:
            continue
        return stage
    raise PlanMismatchError(
        f"this module is none of the plan's {len(plan.stages)} pipeline stages (its modules "
        "and parameters match no stage's): make the stage first "
        "(planner.measure.pipeline_stage.split_into_stage, or the pipeline recipe), then "
        "apply_plan(stage_module, plan)"
    )


def apply_plan(
    model: torch.nn.Module, plan_or_path: Plan | str | Path, *, guard: bool = True
) -> torch.nn.Module:
    """Wrap the submodules a plan names in non-reentrant activation checkpointing, in place.

    ``plan_or_path`` is a :class:`Plan` or the path of a plan JSON file. The model must be
    the one the plan was made for: same module names and parameter shapes and dtypes (the
    plan's ``fingerprint``); the device may differ. Or it may hold that model as a submodule,
    once: a wrapper such as ``torch.compile``'s ``OptimizedModule``, DDP, a peft model or a
    LightningModule; the plan is then applied to the model inside (found by its
    fingerprint). Apply the plan before ``torch.compile`` and before sharding. Modules
    already sharded by FSDP are refused (:class:`PlanMismatchError`); a compiled model that
    has already run recompiles on its next call. Under ``torch.distributed`` (every rank of a
    ``torchrun`` job applies the same plan), the plan must be made for the job's world size
    (``ckpt-plan profile ... --world-size N --parallel ddp|fsdp2``; its ``parallel``), else
    :class:`PlanMismatchError`. A pipeline's plan (``stages``) is applied to one stage's
    module: the stage it holds the plan of is found by its modules (:func:`stage_plan_of`).

    Hugging Face models inside it get ``config.use_cache`` turned off, with one log line: a
    plan is made with the cache off, as Hugging Face's own gradient checkpointing trains
    (the plan's ``switches``).

    Guarantees: ``state_dict`` keys are unchanged; applying the same plan twice is the same as
    once; on any error (:class:`PlanFileError`, :class:`PlanMismatchError`) the model is left
    exactly as it was. Returns ``model`` for chaining.

    With ``guard`` (the default) the first training forward logs a warning for each way its
    step differs from the plan's (another batch shape or dtype, a Hugging Face cache passed,
    parameters cast since, the model's own gradient checkpointing on; see
    :func:`~planner.apply.guard.step_differences`), then costs nothing.
    It raises :class:`PlanMismatchError` where the model does not run in the plan's parallel
    layout (sharded by FSDP2 or not, inside DDP or not;
    :func:`~planner.apply.locate.layout_mismatch`): a rank's memory is not what the plan was
    made for.

    A CUDA plan assumes the caching allocator runs with
    ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (:mod:`planner.core.allocator`);
    where CUDA is here and it does not, one warning says what to set
    (:func:`~planner.apply.cuda_allocator.warn_if_allocator_differs`).
    """
    plan = plan_or_path if isinstance(plan_or_path, Plan) else load_plan(plan_or_path)
    check_world_size(plan)
    if plan.stages:
        plan = stage_plan_of(model, plan)
    planned = planned_model(model, plan)
    modules = dict(planned.named_modules())
    targets: dict[str, tuple[torch.nn.Module, ModuleDecision]] = {}
    for decision in plan.modules:
        module = modules.get(decision.module_name)
        if module is None or not decision.module_name:
            raise PlanMismatchError(
                f"the plan wraps {decision.module_name!r}, which is not a submodule of this model"
            )
        if decision.policy is not None and not (decision.saved_ops or decision.alternating_ops):
            raise PlanFileError(
                f"the plan's selective policy {decision.policy!r} on {decision.module_name} "
                "names no ops to save; re-create the plan"
            )
        if decision.nested_in is not None and not (
            decision.module_name.startswith(decision.nested_in + ".")
            and decision.nested_in in plan.module_names
        ):
            raise PlanFileError(
                f"the plan nests {decision.module_name} inside {decision.nested_in!r}, which "
                "is not a checkpointed module containing it; re-create the plan"
            )
        if decision.method is CheckpointMethod.OFFLOAD:
            others = [
                other.module_name
                for other in plan.modules
                if other.module_name != decision.module_name
                and (
                    other.module_name.startswith(decision.module_name + ".")
                    or decision.module_name.startswith(other.module_name + ".")
                )
            ]
            if others:
                raise PlanFileError(
                    f"the plan offloads {decision.module_name} and also wraps {others[0]}, "
                    "on the same path of the module tree; re-create the plan"
                )
            if decision.offload_min_bytes < 0:
                raise PlanFileError(
                    f"the plan's offload of {decision.module_name} has a negative "
                    "offload_min_bytes; re-create the plan"
                )
            if decision.prefetch_module is not None and (
                not decision.prefetch_module or decision.prefetch_module not in modules
            ):
                raise PlanMismatchError(
                    f"the plan prefetches {decision.module_name} at the backward of "
                    f"{decision.prefetch_module!r}, which is not a submodule of this model"
                )
        if decision.method is CheckpointMethod.CHECKPOINT_SEQUENTIAL:
            if not isinstance(module, torch.nn.Sequential):
                raise PlanMismatchError(
                    f"the plan uses checkpoint_sequential on {decision.module_name}, "
                    f"a {type(module).__name__}, not an nn.Sequential"
                )
            if decision.restore_buffers:
                raise PlanMismatchError(
                    f"the plan uses checkpoint_sequential on {decision.module_name} with "
                    "restore_buffers, which only the checkpoint method supports"
                )
            if not decision.segments or decision.segments < 1:
                raise PlanMismatchError(
                    f"the plan's checkpoint_sequential on {decision.module_name} "
                    "needs segments >= 1"
                )
        missing = set(decision.restore_buffers) - {name for name, _ in module.named_buffers()}
        if missing:
            raise PlanMismatchError(
                f"the plan restores buffers {sorted(missing)} of {decision.module_name}, "
                "which has no such buffers"
            )
        targets[decision.module_name] = (module, decision)

    # Checks done: from here on nothing can fail.
    for name, module in modules.items():
        if is_wrapped(module) and name not in targets:
            _unwrap(module)
        PrefetchWatch.remove(module)
    for module, decision in targets.values():
        if module.__dict__.get(_STATE_ATTRIBUTE) != decision:
            if is_wrapped(module):
                _unwrap(module)
            prefetch_at = (
                None if decision.prefetch_module is None else modules[decision.prefetch_module]
            )
            _wrap(module, decision, planned, prefetch_at)
    for name in {d.prefetch_module for d in plan.modules if d.prefetch_module is not None}:
        PrefetchWatch().register(modules[name])
    switched = switch_off_caches(planned)
    if switched:
        # Every plan is made with the cache off (planner.measure.workload); so must it train.
        logger.warning(
            "ckpt-plan: turned off config.use_cache in %s for training, as the plan assumes "
            "(a cache holds every layer's keys and values through the step; generate() "
            "still uses one)",
            ", ".join(name or type(planned).__name__ for name in switched),
        )
    FirstForwardGuard.remove(planned)
    if guard:
        FirstForwardGuard.install(planned, plan)
    warn_if_allocator_differs(plan, planned)
    return model
