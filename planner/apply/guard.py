"""The first-forward guard: on the first training forward after ``apply_plan``, compare the
step with the one the plan was made for.

Design notes
------------
* **Once, then gone.** :class:`FirstForwardGuard` is a forward pre-hook on the planned
  model. The first forward with grad enabled compares what it sees with what the plan was
  made for (:func:`step_differences`: the shapes and dtypes of the batch's tensors it is
  passed, matched by name or by position, whichever of them it is passed: under a
  pipeline, a stage's forward is given one micro-batch; the parameters' dtypes), looks for
  a Hugging Face cache asked for in the call and for the model's own gradient
  checkpointing (Hugging Face's ``gradient_checkpointing``), and logs one warning
  line for each difference, with the fix; a call none of whose inputs can be matched to the
  plan's batch is one line too. Then it removes itself: no cost on later steps.
* **Layout is an error.** A parallel layout other than the plan's (sharded by FSDP2 or not,
  inside DDP's forward or not; :func:`~planner.apply.locate.layout_mismatch`) is an error
  instead: ``apply_plan`` runs before sharding and wrapping, so this is the first point that
  can see them.
* **Routing.** A plan that assumed a mixture-of-experts routing watches the routers' real
  picks in that forward (:class:`~planner.model_switches.RoutingWatcher`) and warns where an
  expert got more tokens than planned.
* **Gradient sync.** Where a rank's memory depends on whether this forward's backward
  syncs gradients (FSDP2's unsharded gradients, DDP's with ``gradient_as_bucket_view``),
  the sync it will do (``set_requires_gradient_sync``, ``no_sync()``) is compared with the
  plan's loop: the first micro-batch of a ``--no-sync`` loop does not sync, of any other
  loop it does (:func:`_sync_difference`).
* **Autocast.** Autocast sets the dtype of every activation, so a forward under it saves
  other tensors than one without. A plan that recorded it (``switches.autocast``) compares
  it in that forward at the first call of a submodule, where the recorded step saw it:
  ``Trainer(bf16=True)`` (accelerate) enters autocast inside the model's ``forward``, after
  this hook, so the root's own pre-hook would see none (:class:`_AutocastCheck`).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
from collections.abc import Mapping
from typing import Any

import torch

from planner.apply.autocast import AutocastState
from planner.apply.locate import layout_mismatch, model_fingerprint
from planner.apply.tensors import describe_tensor, iter_tensors
from planner.core.errors import PlanMismatchError
from planner.core.switches import AUTOCAST_OFF
from planner.model_switches import RoutingWatcher, flag_names, own_checkpointing_flags
from planner.plan.plan_file import Plan

logger = logging.getLogger(__name__)

__all__ = ["FirstForwardGuard", "step_differences"]


class FirstForwardGuard:
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

    def __call__(self, model: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if torch.compiler.is_compiling():
            # Traced by torch.compile: the check runs eagerly, outside the graph. Disabled
            # here, not by a decorator: that imports TorchDynamo with this module, 1.1 s of
            # every process's start (each rank, each check), compiling or not.
            check = torch.compiler.disable(self._check, reason="ckpt-plan's one-time check")
            return check(model, args, kwargs)
        return self._check(model, args, kwargs)

    def _check(self, model: torch.nn.Module, args: Any, kwargs: Any) -> None:
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
        if self.plan.switches.autocast is not None:
            _AutocastCheck.around_this_forward(model, self.plan.switches.autocast)
        return None


class _AutocastCheck:
    """For one forward: at the first call of one of the model's submodules, compares the
    autocast it runs under with the plan's and warns where they differ (see the module
    docstring). A class so that models stay picklable."""

    def __init__(self, model: torch.nn.Module, planned: str) -> None:
        self.planned = planned
        self.modules = {id(module) for module in model.modules() if module is not model}
        self.handles: list[Any] = []

    @classmethod
    def around_this_forward(cls, model: torch.nn.Module, planned: str) -> None:
        check = cls(model, planned)
        check.handles = [
            torch.nn.modules.module.register_module_forward_pre_hook(check.first_call),
            model.register_forward_hook(check.done, always_call=True),
        ]

    def first_call(self, module: torch.nn.Module, args: Any) -> None:
        if id(module) not in self.modules:
            return
        self.done()
        running = AutocastState.now().dtype_name
        if running == self.planned:
            return
        if self.planned == AUTOCAST_OFF:
            logger.warning(
                "ckpt-plan: this forward runs under torch.autocast(%s), and the plan was made "
                "for one without autocast: its activations are other dtypes than planned; "
                "re-run `ckpt-plan profile` with --autocast %s (--hf), or with a "
                "training_step() that autocasts as training does (a model file)",
                running,
                running,
            )
        else:
            now = "without autocast" if running == AUTOCAST_OFF else f"under {running}"
            logger.warning(
                "ckpt-plan: the plan was made for a forward under torch.autocast(%s), and this "
                "one runs %s: its activations are other dtypes than planned; re-run "
                "`ckpt-plan profile` for the forward as training runs it (--autocast, or "
                "the training_step() of a model file)",
                self.planned,
                now,
            )

    def done(self, *_: Any) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


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
    planned_batch = _batch_of_one_forward(plan)
    received = _received_inputs(planned_batch, _positional_names(model), tuple(args), kwargs or {})
    batch = _batch_difference(planned_batch, received)
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
    sync = _sync_difference(model, plan)
    if sync is not None:
        found.append(sync)
    own = own_checkpointing_flags(model)
    if own:
        found.append(
            f"the model's own gradient checkpointing is on ({flag_names(own)}) as well as "
            "the plan: it recomputes more and frees nothing the plan does not; turn it off "
            "(model.gradient_checkpointing_disable(), or gradient_checkpointing=False in "
            "Hugging Face's TrainingArguments; a diffusers model's "
            "disable_gradient_checkpointing())"
        )
    return found


def _sync_difference(model: torch.nn.Module, plan: Plan) -> str | None:
    """Where this forward's backward syncs gradients across ranks otherwise than the plan's
    loop has its first micro-batch do (``--no-sync``: not; else: it does), and a rank's
    memory differs for it (FSDP2: unsharded gradients kept; DDP with
    ``gradient_as_bucket_view``: gradients outside the buckets), the sentence saying so;
    else None. Read from FSDP2's ``set_requires_gradient_sync`` state on the model's
    sharded modules, or the ``DistributedDataParallel`` whose forward this is."""
    syncs, sharded = _syncs_gradients(model)
    if syncs is None or syncs == (not plan.loop.no_sync):
        return None
    what = (
        "FSDP2 keeps every gradient unsharded until the micro-batch that syncs"
        if sharded
        else "DDP's gradients stay outside its buckets (gradient_as_bucket_view) until the "
        "micro-batch that syncs"
    )
    if syncs:
        return (
            "this forward's backward syncs gradients across ranks, but the plan was made for "
            f"accumulating {plan.loop.grad_accum} micro-batches without syncing before the "
            f"last (--no-sync), where {what}: it recomputes more than this loop needs; "
            "re-run `ckpt-plan profile` without --no-sync"
        )
    return (
        "this forward's backward does not sync gradients across ranks (DDP's no_sync(), "
        "FSDP2's set_requires_gradient_sync(False): gradient accumulation as Hugging Face's "
        f"Trainer and accelerate run it), but the plan was made for a loop that syncs every "
        f"backward; {what}, above the predicted peak: re-run `ckpt-plan profile` with "
        "--grad-accum N --no-sync"
    )


def _syncs_gradients(model: torch.nn.Module) -> tuple[bool | None, bool]:
    """Whether the backward of this forward of ``model`` syncs gradients where that changes a
    rank's memory (see :func:`_sync_difference`; None where it cannot differ), and whether
    FSDP2 shards the model."""
    if not torch.distributed.is_available():
        return None, False
    from torch.distributed.fsdp import FSDPModule

    try:  # FSDP2's own state (what set_requires_gradient_sync sets), read defensively: a
        # check must never stop a training step that runs without it
        groups = [
            module._get_fsdp_state()._fsdp_param_group
            for module in model.modules()
            if isinstance(module, FSDPModule)
        ]
        flags = [bool(group.reduce_grads) for group in groups if group is not None]
    except AttributeError:
        return None, True
    if flags:
        return all(flags), True
    ddp = getattr(torch.nn.parallel.DistributedDataParallel, "_active_ddp_module", None)
    if ddp is None or not getattr(ddp, "gradient_as_bucket_view", False):
        return None, False
    return bool(ddp.require_backward_grad_sync), False


# Keywords of a Hugging Face forward that pass a cache in (past key/values; Mamba's state):
# a training step given one keeps it, and what the forward adds to it, through the backward.
# transformers 5 renames past_key_values to ``cache``, a name too plain to trust alone: it
# counts only holding a transformers ``Cache`` (:func:`_asks_for_cache`).
_CACHE_ARGUMENTS = ("past_key_values", "past_key_value", "cache_params")


def _batch_of_one_forward(plan: Plan) -> dict[str, Any]:
    """The batch one forward of the planned module is given, as the plan's ``batch``
    describes it: the plan's batch, or under a pipeline one micro-batch of it (a stage's
    plan records the whole step's batch; the schedule splits every tensor's first dimension
    into ``microbatches`` equal parts, and the profile refused a batch that does not split
    evenly)."""
    pipeline = plan.parallel.pipeline if plan.parallel is not None else None
    if pipeline is None or pipeline.microbatches == 1:
        return plan.batch

    def split(description: Any) -> Any:
        if isinstance(description, list):
            return [split(item) for item in description]
        shape = description.get("shape") if isinstance(description, dict) else None
        if not shape:
            return description
        return {**description, "shape": [shape[0] // pipeline.microbatches, *shape[1:]]}

    return {key: split(value) for key, value in plan.batch.items()}


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
