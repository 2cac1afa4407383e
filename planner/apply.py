"""Apply a plan to a live model: wrap the chosen submodules in activation checkpointing.

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
* **Through wrappers, by fingerprint.** A plan names modules of the model it was made for.
  Given a model whose fingerprint is not the plan's, ``apply_plan`` looks for the one
  submodule whose fingerprint is: that covers every wrapper that holds the model as a
  submodule (``torch.compile``'s ``OptimizedModule._orig_mod``, DDP's ``module``, a peft
  model's ``get_base_model()``, a LightningModule's attribute) with one rule and no list of
  wrapper classes to keep up to date. A model found twice is an error (which one trains?).
  Modules sharded by FSDP are refused whatever their fingerprint: a recomputation run
  outside FSDP's hooks would not find its parameters gathered; plans go on before sharding.
* **A guard on the first training forward.** The first forward with grad enabled after
  ``apply_plan`` compares what it sees with what the plan was made for (the shapes and
  dtypes of the batch's tensors it is passed, matched by name or by position, whichever
  of them it is passed; the parameters' dtypes), looks for a Hugging Face cache asked for in
  the call and for the model's own gradient checkpointing (Hugging Face's
  ``gradient_checkpointing``), and logs one warning line for each difference, with the fix;
  a call none of whose inputs can be matched to the plan's batch is one line too. A
  parallel layout other than the plan's (sharded by FSDP2 or not, inside DDP's forward or
  not) is an error instead: ``apply_plan`` runs before sharding and wrapping, so this is
  the first point that can see them. Then it removes itself: no cost on later steps.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import itertools
import json
import logging
import math
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from planner.core.errors import PlanFileError, PlanMismatchError
from planner.measure.tracking import iter_tensors
from planner.measure.workload import describe_tensor, flag_names, own_checkpointing_flags
from planner.model_switches import RoutingWatcher, switch_off_caches
from planner.plan.plan_file import CheckpointMethod, ModuleDecision, Plan, load_plan
from planner.plan.policies import is_attention_op

logger = logging.getLogger(__name__)

__all__ = [
    "apply_plan",
    "is_cached_op",
    "is_wrapped",
    "model_fingerprint",
    "observing_recomputation",
    "remove_plan",
    "selective_contexts",
    "step_differences",
    "wrapped_modules",
]

_STATE_ATTRIBUTE = "_ckpt_plan_decision"
_ORIGINAL_ATTRIBUTE = "_ckpt_plan_instance_forward"

# Set only by planner.check.compare while it runs a plan: it sees every checkpointed function (a
# module's forward, or one checkpoint_sequential segment) and each of its runs (the
# forward, then the recomputation), to compare the two op by op.
_recompute_observer: Any = None


@contextlib.contextmanager
def observing_recomputation(observer: Any) -> Iterator[None]:
    """Route every checkpointed function through ``observer.region(name, function)``,
    which returns the function to run (used by :mod:`planner.check.compare`)."""
    global _recompute_observer
    previous, _recompute_observer = _recompute_observer, observer
    try:
        yield
    finally:
        _recompute_observer = previous


def _observed(name: str, function: Any, cached_ops: frozenset[str] = frozenset()) -> Any:
    """``function``, routed through the recomputation observer if one is installed.
    ``cached_ops`` are the ops a selective policy may hand back instead of running again
    (the observer sees them in the forward only)."""
    if _recompute_observer is None:
        return function
    return _recompute_observer.region(name, function, cached_ops)


def model_fingerprint(model: torch.nn.Module) -> dict[str, Any]:
    """Module names and parameter shapes/dtypes, and a digest of them.

    Tied weights are listed once (under their first name), as ``named_parameters()`` does.
    """
    modules = [name for name, _ in model.named_modules() if name]
    parameters = [
        [name, list(parameter.shape), str(parameter.dtype).removeprefix("torch.")]
        for name, parameter in model.named_parameters()
    ]
    canonical = json.dumps({"modules": modules, "parameters": parameters}, separators=(",", ":"))
    return {
        "digest": hashlib.sha256(canonical.encode()).hexdigest(),
        "module_count": len(modules),
        "parameter_count": sum(int(p.numel()) for p in model.parameters()),
        "modules": modules,
        "parameters": parameters,
    }


def _describe_mismatch(expected: dict[str, Any], actual: dict[str, Any]) -> str:
    expected_parameters = {row[0]: row for row in expected.get("parameters", [])}
    actual_parameters = {row[0]: row for row in actual["parameters"]}
    differences = []
    for name, row in expected_parameters.items():
        other = actual_parameters.get(name)
        if other is None:
            differences.append(f"parameter {name} is not in the model")
        elif other != row:
            differences.append(
                f"{name} is {other[1]} {other[2]} in the model but {row[1]} {row[2]} in the plan"
            )
    for name in actual_parameters.keys() - expected_parameters.keys():
        differences.append(f"parameter {name} is not in the plan's model")
    expected_modules = set(expected.get("modules", []))
    for name in expected_modules ^ set(actual["modules"]):
        where = "plan's model" if name in actual["modules"] else "model"
        differences.append(f"module {name} is not in the {where}")
    if not differences:
        return "its fingerprint differs"
    more = f" (and {len(differences) - 3} more)" if len(differences) > 3 else ""
    return "; ".join(sorted(differences)[:3]) + more


def _checkpointed_forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    decision: ModuleDecision = module.__dict__[_STATE_ATTRIBUTE]
    original = type(module).forward.__get__(module)
    if _ORIGINAL_ATTRIBUTE in module.__dict__:
        original = module.__dict__[_ORIGINAL_ATTRIBUTE]
    if not torch.is_grad_enabled():
        return original(*args, **kwargs)
    if decision.method is CheckpointMethod.CHECKPOINT_SEQUENTIAL:
        assert not kwargs and len(args) == 1, "checkpoint_sequential takes one input"
        return _checkpoint_sequential(module, decision, args[0])
    function = _observed(decision.module_name, original, _cached_ops(decision))
    if decision.restore_buffers:
        function = _restoring_buffers_on_recompute(module, function, decision.restore_buffers)
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
            _observed(f"{decision.module_name}[{start}:{end + 1}]", segment),
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


def _wrap(module: torch.nn.Module, decision: ModuleDecision) -> None:
    existing = module.__dict__.get("forward")
    if existing is not None and not isinstance(existing, _BoundCheckpointedForward):
        module.__dict__[_ORIGINAL_ATTRIBUTE] = existing
    module.__dict__[_STATE_ATTRIBUTE] = decision
    module.__dict__["forward"] = _BoundCheckpointedForward(module)


def _unwrap(module: torch.nn.Module) -> None:
    module.__dict__.pop(_STATE_ATTRIBUTE, None)
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
    _FirstForwardGuard.remove(model)


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
    :class:`PlanMismatchError`.

    Hugging Face models inside it get ``config.use_cache`` turned off, with one log line: a
    plan is made with the cache off, as Hugging Face's own gradient checkpointing trains
    (the plan's ``switches``).

    Guarantees: ``state_dict`` keys are unchanged; applying the same plan twice is the same as
    once; on any error (:class:`PlanFileError`, :class:`PlanMismatchError`) the model is left
    exactly as it was. Returns ``model`` for chaining.

    With ``guard`` (the default) the first training forward logs a warning for each way its
    step differs from the plan's (another batch shape or dtype, a Hugging Face cache passed,
    parameters cast since, the model's own gradient checkpointing on; see
    :func:`step_differences`), then costs nothing.
    It raises :class:`PlanMismatchError` where the model does not run in the plan's parallel
    layout (sharded by FSDP2 or not, inside DDP or not; :func:`layout_mismatch`): a rank's
    memory is not what the plan was made for.
    """
    plan = plan_or_path if isinstance(plan_or_path, Plan) else load_plan(plan_or_path)
    _check_world_size(plan)
    planned = _planned_model(model, plan)
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
    for module, decision in targets.values():
        if module.__dict__.get(_STATE_ATTRIBUTE) != decision:
            if is_wrapped(module):
                _unwrap(module)
            _wrap(module, decision)
    switched = switch_off_caches(planned)
    if switched:
        # Every plan is made with the cache off (planner.measure.workload); so must it train.
        logger.warning(
            "ckpt-plan: turned off config.use_cache in %s for training, as the plan assumes "
            "(a cache holds every layer's keys and values through the step; generate() "
            "still uses one)",
            ", ".join(name or type(planned).__name__ for name in switched),
        )
    _FirstForwardGuard.remove(planned)
    if guard:
        _FirstForwardGuard.install(planned, plan)
    return model


def _planned_model(model: torch.nn.Module, plan: Plan) -> torch.nn.Module:
    """``model`` if it is the model the plan was made for, else the one submodule that is
    (see "Through wrappers" in the module's notes). Raises :class:`PlanMismatchError` with
    what differs, or what to do, where there is none, or more than one."""
    sharded = _sharded_module_names(model)
    if sharded:
        raise PlanMismatchError(
            f"this model is already sharded by FSDP (fully_shard or FullyShardedDataParallel "
            f"on {_name_list(sharded)}), and a recomputation would run without FSDP gathering "
            "its parameters: call apply_plan(model, plan) before sharding the model"
        )
    expected = plan.fingerprint
    digest = expected.get("digest")
    if model_fingerprint(model)["digest"] == digest:
        return model
    module_count = expected.get("module_count")
    found = [
        (name, module)
        for name, module in model.named_modules()
        if name
        and (module_count is None or sum(1 for _ in module.modules()) - 1 == module_count)
        and model_fingerprint(module)["digest"] == digest
    ]
    if len(found) == 1:
        name, module = found[0]
        logger.info("applying the plan to %s, the planned model inside this %s", name, _kind(model))
        return module
    if found:
        names = [name for name, _ in found]
        raise PlanMismatchError(
            f"the plan's model ({plan.model_name}) is in this {_kind(model)} {len(found)} "
            f"times ({_name_list(names)}): apply it to the one that trains, e.g. "
            f"apply_plan(model.{names[0]}, plan)"
        )
    inner, hint = _unwrapped(model)
    raise PlanMismatchError(
        f"this plan was made for another model ({plan.model_name}): "
        f"{_describe_mismatch(expected, model_fingerprint(inner))}{hint}; re-run "
        "`ckpt-plan profile` for this model"
    )


def _check_world_size(plan: Plan) -> None:
    """Refuse a plan made for another world size than the running process group's: one
    rank's memory depends on it (shards are 1/N; DDP adds its buckets)."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or not (distributed.is_available() and distributed.is_initialized()):
        return
    running = distributed.get_world_size()
    planned = plan.parallel.world_size if plan.parallel is not None else 1
    if running == planned:
        return
    made_for = (
        f"one rank of {planned} ({plan.parallel.strategy.value})"
        if plan.parallel is not None
        else "a single process"
    )
    strategy = plan.parallel.strategy.value if plan.parallel is not None else "ddp|fsdp2"
    raise PlanMismatchError(
        f"this plan was made for {made_for}, but this process is one rank of {running}: a "
        f"rank's memory depends on the world size; make the plan for this job with "
        f"`ckpt-plan profile MODEL.py --budget B --world-size {running} --parallel {strategy}`"
    )


def _kind(model: torch.nn.Module) -> str:
    return type(model).__name__


def _name_list(names: list[str]) -> str:
    shown = ", ".join(name or "the model itself" for name in names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _sharded_module_names(model: torch.nn.Module) -> list[str]:
    """The modules of ``model`` that FSDP shards (none if FSDP was never imported)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kinds = tuple(
        kind
        for kind in (
            getattr(fsdp, "FSDPModule", None),  # fully_shard (FSDP2)
            getattr(fsdp, "FullyShardedDataParallel", None),
        )
        if isinstance(kind, type)
    )
    if not kinds:
        return []
    return [name for name, module in model.named_modules() if isinstance(module, kinds)]


def _unwrapped(model: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """The model inside the wrappers that hold one (to say what differs from the plan's
    model), and a hint where a wrapper changes what the plan must be made for."""
    hint = ""
    for _ in range(8):  # wrappers of wrappers: compile(DDP(peft model)), and no deeper
        get_base_model = getattr(model, "get_base_model", None)
        if isinstance(getattr(model, "peft_config", None), dict) and callable(get_base_model):
            hint = (
                f"; this is a peft model ({_kind(model)}), whose adapters add parameters and "
                "modules: make the plan for the model with its adapters (build_model() "
                "returning get_peft_model(model, config))"
            )
            inner = get_base_model()
        else:
            inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
            if inner is None and _kind(model) in ("DistributedDataParallel", "DataParallel"):
                inner = getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module) or inner is model:
            break
        model = inner
    return model, hint


class _FirstForwardGuard:
    """A forward pre-hook on the root module that runs once, on the first forward with grad
    enabled, raises where the parallel layout is not the plan's, warns where the step
    differs from the plan's, and removes itself. A class (not
    a closure) so that models stay picklable."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.handle: Any = None

    @classmethod
    def remove(cls, model: torch.nn.Module) -> None:
        for key, hook in list(model._forward_pre_hooks.items()):
            if isinstance(hook, cls):
                del model._forward_pre_hooks[key]
                model._forward_pre_hooks_with_kwargs.pop(key, None)

    @classmethod
    def install(cls, model: torch.nn.Module, plan: Plan) -> None:
        guard = cls(plan)
        guard.handle = model.register_forward_pre_hook(guard, with_kwargs=True)

    @torch.compiler.disable
    def __call__(self, model: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if not torch.is_grad_enabled():
            return None  # evaluation: nothing is saved, so nothing the plan decided matters
        self.handle.remove()
        mismatch = layout_mismatch(model, self.plan)
        if mismatch is not None:
            raise PlanMismatchError(mismatch)
        for warning in step_differences(model, self.plan, args, kwargs):
            logger.warning("ckpt-plan: %s", warning)
        if self.plan.switches.expert_load is not None:
            _RoutingCheck.around_this_forward(model, self.plan.switches.expert_load)
        return None


class _RoutingCheck:
    """For one forward: watches the routers' real picks (a
    :class:`~planner.model_switches.RoutingWatcher` entered by the first-forward guard) and,
    after the forward, warns once where an expert got more tokens than the plan assumed: a
    plan for eager experts sized their activations by that routing. A class so that models
    stay picklable."""

    def __init__(self, expert_load: float) -> None:
        self.expert_load = expert_load
        self.watcher = RoutingWatcher()
        self.handle: Any = None

    @classmethod
    def around_this_forward(cls, model: torch.nn.Module, expert_load: float) -> None:
        check = cls(expert_load)
        check.handle = model.register_forward_hook(check, always_call=True)
        check.watcher.__enter__()

    def __call__(self, model: torch.nn.Module, args: Any, output: Any) -> None:
        self.handle.remove()
        self.watcher.__exit__(None, None, None)
        busiest = self.watcher.busiest_load
        if busiest > self.expert_load * (1 + 1e-6):
            suggested = math.ceil(busiest * 10) / 10
            logger.warning(
                "ckpt-plan: the busiest expert got %.2fx its balanced share of tokens in this "
                "step, and the plan assumed %gx: its experts' activations are larger than "
                "planned; re-run `ckpt-plan profile` with --expert-load %g (or more)",
                busiest,
                self.expert_load,
                suggested,
            )


def layout_mismatch(model: torch.nn.Module, plan: Plan) -> str | None:
    """Why a forward call of ``model`` (the module the plan is on) does not run in the layout
    the plan was made for, one sentence with the fix, or None. Read during the forward:
    whether its parameters are sharded (FSDP2) and whether it runs inside
    ``DistributedDataParallel``'s forward; a single-process plan is for neither."""
    sharded = _is_fully_sharded(model)
    ddp = torch.nn.parallel.DistributedDataParallel
    in_ddp = getattr(ddp, "_active_ddp_module", None) is not None
    strategy = plan.parallel.strategy.value if plan.parallel is not None else None
    parallel = "fsdp2" if sharded else "ddp" if in_ddp else None
    if strategy == parallel:
        return None
    layouts = {
        None: "a single process",
        "ddp": "one rank of a DDP job",
        "fsdp2": "one rank of an FSDP2 job",
    }
    made_for, runs_as = layouts[strategy], layouts[parallel]
    how = {
        None: "train it as a single process",
        "ddp": "wrap it in DistributedDataParallel after apply_plan",
        "fsdp2": "apply fully_shard after apply_plan",
    }[strategy]
    profile = (
        f"`ckpt-plan profile MODEL.py --budget B --world-size N --parallel {parallel}`"
        if parallel is not None
        else "`ckpt-plan profile MODEL.py --budget B` (no --world-size)"
    )
    return (
        f"the plan was made for {made_for}, but the model runs as {runs_as} (a rank's memory "
        f"differs): {how}, or make the plan for how it trains with {profile}"
    )


def _is_fully_sharded(model: torch.nn.Module) -> bool:
    """Whether ``fully_shard`` laid ``model`` out: a module of it is an ``FSDPModule`` (during
    its forward FSDP2 has swapped the shards for the gathered parameters), or a parameter is
    a ``DTensor`` shard."""
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return True
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(module, FSDPModule) for module in model.modules())


def step_differences(
    model: torch.nn.Module, plan: Plan, args: Any = (), kwargs: Any = None
) -> list[str]:
    """How a forward call of ``model`` with ``args``/``kwargs`` differs from the step the
    plan was made for, one sentence each with the fix (empty: as planned). Compared: the
    tensors of the plan's batch that the call passes (:func:`_received_inputs`: by name, or
    by position; a call none of whose inputs match the batch gets one sentence saying so),
    a Hugging Face cache the call asks for, the parameters' dtypes and the model's own
    gradient checkpointing. (The parallel layout is not a difference to warn of but an
    error: :func:`layout_mismatch`.)"""
    found = []
    received = _received_inputs(plan.batch, _positional_names(model), tuple(args), kwargs or {})
    batch = _batch_difference(plan.batch, received)
    if batch is not None:
        found.append(batch)
    cache = [
        f"{name}=True" if name == "use_cache" else name
        for name in ("use_cache", *_CACHE_ARGUMENTS, "cache")
        if name not in plan.batch  # the plan's own batch passed it: planned with the cache
        and _asks_for_cache(name, received.get(name))
    ]
    if cache:
        found.append(
            f"this forward asks for a Hugging Face cache ({', '.join(cache)}), but the plan was "
            "made without one: the cache's stored tensors stay alive through the backward, "
            "above the predicted peak; drop the argument in training"
        )
    planned = {row[0]: row[2] for row in plan.fingerprint.get("parameters", [])}
    now = {row[0]: row[2] for row in model_fingerprint(model)["parameters"]}
    cast = sorted(
        {(planned[name], dtype) for name, dtype in now.items() if planned.get(name, dtype) != dtype}
    )
    if cast:
        pairs = ", ".join(f"{before} -> {after}" for before, after in cast)
        found.append(
            f"the parameters were cast after the plan was made ({pairs}): the plan was made "
            "for the other dtype; re-run `ckpt-plan profile` with build_model() returning the "
            "model as you train it"
        )
    own = own_checkpointing_flags(model)
    if own:
        found.append(
            f"the model's own gradient checkpointing is on ({flag_names(own)}) as well as "
            "the plan: it recomputes more and frees nothing the plan does not; turn it off "
            "(model.gradient_checkpointing_disable(), or gradient_checkpointing=False in "
            "Hugging Face's TrainingArguments)"
        )
    return found


# Keywords of a Hugging Face forward that pass a cache in (past key/values; Mamba's state):
# a training step given one keeps it, and what the forward adds to it, through the backward.
# transformers 5 renames past_key_values to ``cache``, a name too plain to trust alone: it
# counts only holding a transformers ``Cache`` (:func:`_asks_for_cache`).
_CACHE_ARGUMENTS = ("past_key_values", "past_key_value", "cache_params")


def _asks_for_cache(name: str, value: Any) -> bool:
    """Whether a forward's argument ``name`` passed as ``value`` asks for a cache."""
    if name == "use_cache":
        return value is True
    if name == "cache":
        return any(kind.__name__ == "Cache" for kind in type(value).__mro__)
    return value is not None


def _positional_names(model: torch.nn.Module) -> tuple[str, ...]:
    """The names of the parameters ``model.forward`` takes by position, in order, up to a
    ``*args``; none where its signature cannot be read."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # a forward without a Python signature
        return ()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(
        parameter.name
        for parameter in itertools.takewhile(lambda p: p.kind in positional, parameters)
    )


def _received_inputs(
    batch: dict[str, Any], names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """What a forward call passes, keyed as the plan's ``batch`` is: for a dict batch (keys
    are names, the model was profiled as ``model(**batch)``) by name, positional arguments
    named by the forward's parameters (``names``) and a dict passed whole read by its keys;
    for a tuple or one-tensor batch (keys ``"0"``, ``"1"``...: ``model(*batch)``, or a
    training_step's ``model(batch[0])``) by position, keywords placed by ``names``. Keys of
    the call that are not the batch's are kept too: they may be a cache's."""
    received: dict[str, Any] = {}
    by_position = bool(batch) and all(key.isdigit() for key in batch)
    if by_position:
        received.update((str(index), value) for index, value in enumerate(args))
        received.update((str(names.index(key)), v) for key, v in kwargs.items() if key in names)
    else:
        for value in (*args, *kwargs.values()):
            if isinstance(value, Mapping):  # the batch passed as one dict
                received.update((str(key), item) for key, item in value.items())
        received.update(zip(names, args, strict=False))  # any more go to a *args
    received.update(kwargs)
    return received


def _batch_difference(batch: dict[str, Any], received: dict[str, Any]) -> str | None:
    """One sentence with the fix where the tensors the call passes (``received``, keyed as
    ``batch``) differ in shape or dtype from the plan's ``batch``, or where none of them can
    be matched to it; None where those passed are the plan's (a subset is: the batch without
    its attention mask is still compared) or the plan records no tensors."""
    planned = {key: value for key, value in batch.items() if isinstance(value, (dict, list))}
    if not planned:
        return None  # a plan that records no batch (written before it was) has nothing to say
    changed = []
    matched = 0
    for key, expected in planned.items():
        value = received.get(key)
        tensors = list(iter_tensors(value))
        if not tensors:
            continue  # not passed (or None): the batch without it is compared for the rest
        matched += 1
        actual: Any = (
            describe_tensor(value)
            if isinstance(value, torch.Tensor)
            else [describe_tensor(tensor) for tensor in tensors]
        )
        if isinstance(expected, dict):
            expected = {"shape": expected.get("shape"), "dtype": expected.get("dtype")}
        if actual != expected:
            changed.append(f"{key} is {_shown(actual)}, the plan's was {_shown(expected)}")
    if changed:
        return (
            "this batch is not the one the plan was made for ("
            + "; ".join(changed[:3])
            + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")
            + "): its memory prediction does not hold; re-run `ckpt-plan profile` with "
            "sample_batch() returning a batch of this shape"
        )
    if not matched:
        return (
            f"this forward's inputs could not be matched to the plan's batch "
            f"({', '.join(planned)}) by name or by position, so their shapes and dtypes were "
            "not compared with the plan's: the memory prediction holds only for that batch"
        )
    return None


def _shown(description: Any) -> str:
    """A tensor's description (:func:`describe_tensor`) as ``[4, 128] int64``; a list of
    them in parentheses."""
    if isinstance(description, dict):
        return f"{description.get('shape')} {description.get('dtype')}"
    return "(" + ", ".join(_shown(item) for item in description) + ")"
