"""Find the model a plan was made for, and check that it runs laid out as the plan assumed.

Design notes
------------
* **Through wrappers, by fingerprint.** A plan names modules of the model it was made for
  (:func:`model_fingerprint`: module names, parameter shapes and dtypes). Given a model whose
  fingerprint is not the plan's, :func:`planned_model` looks for the one submodule whose
  fingerprint is: that covers every wrapper that holds the model as a submodule
  (``torch.compile``'s ``OptimizedModule._orig_mod``, DDP's ``module``, a peft model's
  ``get_base_model()``, a LightningModule's attribute) with one rule and no list of wrapper
  classes to keep up to date. A model found twice is an error (which one trains?).
* **Before sharding.** Modules sharded by FSDP, and models whose parameters are already
  ``DTensor`` s (tensor parallelism), are refused whatever their fingerprint: a
  recomputation run outside FSDP's hooks would not find its parameters gathered; plans go on
  before sharding, as they are planned. The world size (:func:`check_world_size`) is checked
  when the plan is applied; the layout a forward runs in (:func:`layout_mismatch`: sharded
  by FSDP2 or not, tensor-parallel or not, inside DDP's forward or not) only by the
  first-forward guard, the first point that can see it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from typing import Any

import torch

from planner.core.errors import PlanMismatchError
from planner.plan.plan_file import Plan

logger = logging.getLogger(__name__)

__all__ = ["check_world_size", "layout_mismatch", "model_fingerprint", "planned_model"]


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


def planned_model(model: torch.nn.Module, plan: Plan) -> torch.nn.Module:
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
    if _dtensor_parameters(model):
        raise PlanMismatchError(
            "this model's parameters are already DTensors (laid out by tensor parallelism, "
            "parallelize_module), and a checkpointed module would recompute outside the "
            "layout's hooks: call apply_plan(model, plan) before laying the model out"
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
    inner, hint = _unwrapped(model, _has_adapters(expected))
    raise PlanMismatchError(
        f"this plan was made for another model ({plan.model_name}): "
        f"{_describe_mismatch(expected, model_fingerprint(inner))}{hint}; re-run "
        "`ckpt-plan profile` for this model"
    )


def check_world_size(plan: Plan) -> None:
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


def _has_adapters(fingerprint: dict[str, Any]) -> bool:
    """Whether a fingerprint is a peft model's with LoRA adapters (``--lora``)."""
    return any(".lora_A." in row[0] for row in fingerprint.get("parameters", []))


def _unwrapped(model: torch.nn.Module, planned_peft: bool) -> tuple[torch.nn.Module, str]:
    """The model inside the wrappers that hold one (to say what differs from the plan's
    model), and a hint where a wrapper changes what the plan must be made for.
    ``planned_peft``: the plan was made for a model with LoRA adapters (``--lora``)."""
    hint = (
        "; the plan is for LoRA fine-tuning (its model has peft's adapters): apply it to the "
        "model get_peft_model(model, config) returns, with the config it was made with"
        if planned_peft
        else ""
    )
    for _ in range(8):  # wrappers of wrappers: compile(DDP(peft model)), and no deeper
        get_base_model = getattr(model, "get_base_model", None)
        if isinstance(getattr(model, "peft_config", None), dict) and callable(get_base_model):
            if planned_peft:  # compared as it is: its adapters differ from the plan's
                return model, (
                    f"; this peft model's adapters ({_kind(model)}) are not the plan's: give "
                    "get_peft_model the LoRA config the plan was made with, or re-plan with "
                    "this one (--hf CONFIG --lora FOLDER, after "
                    "model.peft_config['default'].save_pretrained(FOLDER))"
                )
            hint = (
                f"; this is a peft model ({_kind(model)}), whose adapters add parameters and "
                "modules: make the plan for the model with its adapters (build_model() "
                "returning get_peft_model(model, config), or --hf CONFIG --lora)"
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


def layout_mismatch(model: torch.nn.Module, plan: Plan) -> str | None:
    """Why a forward call of ``model`` (the module the plan is on) does not run in the layout
    the plan was made for, one sentence with the fix, or None. Read during the forward:
    whether its parameters are sharded (FSDP2), whether they are ``DTensor`` s without FSDP2
    (tensor parallelism alone), whether it runs inside ``DistributedDataParallel``'s
    forward (a single-process plan is for none of these), and where the plan has tensor
    parallelism, the mesh its parameters are laid out on (:func:`_tensor_parallel_mismatch`)."""
    parallel = _running_strategy(model)
    strategy = plan.parallel.strategy.value if plan.parallel is not None else None
    if strategy == "pp" and parallel is None:  # a stage runs as one process does
        return None
    if strategy == "pp":
        strategy = None
    if strategy == parallel:
        return _tensor_parallel_mismatch(model, plan)
    layouts = {
        None: "a single process",
        "ddp": "one rank of a DDP job",
        "fsdp2": "one rank of an FSDP2 job",
        "tp": "one rank of a tensor-parallel job",
    }
    made_for, runs_as = layouts[strategy], layouts[parallel]
    how = {
        None: "train it as a single process",
        "ddp": "wrap it in DistributedDataParallel after apply_plan",
        "fsdp2": "apply fully_shard after apply_plan",
        "tp": "apply tensor parallelism (parallelize_module) after apply_plan",
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


def _running_strategy(model: torch.nn.Module) -> str | None:
    """How ``model`` runs, as a plan's strategy names it: ``fsdp2`` (``fully_shard`` laid
    it out), ``tp`` (``DTensor`` parameters without FSDP2: tensor parallelism alone),
    ``ddp`` (inside ``DistributedDataParallel``'s forward), or None (a single process)."""
    if _is_fully_sharded(model):
        return "fsdp2"
    if _dtensor_parameters(model):
        return "tp"
    ddp = torch.nn.parallel.DistributedDataParallel
    return "ddp" if getattr(ddp, "_active_ddp_module", None) is not None else None


def _dtensor_parameters(model: torch.nn.Module) -> list[Any]:
    return [p for p in model.parameters() if type(p).__name__ == "DTensor"]


def _tensor_parallel_mismatch(model: torch.nn.Module, plan: Plan) -> str | None:
    """Where ``model`` runs in the plan's strategy, whether tensor parallelism is there
    exactly where the plan has it, read from the mesh its ``DTensor`` parameters are on
    (FSDP2's shards are on the whole mesh: ``(dp, tp)`` with TP, ``(dp,)`` without). Only
    what is certain is an error: for a plan with TP, a mesh of more or fewer dimensions than
    the plan's; for a plan without, a mesh of more dimensions whose last one replicates a
    parameter (TP replicates its norms; FSDP2 shards every parameter over its last
    dimension, so HSDP under a one-dimensional FSDP2 plan passes, as it did before TP)."""
    layout = plan.parallel
    found = _dtensor_parameters(model)
    if layout is None or not found:
        return None
    shape = max((tuple(p.device_mesh.shape) for p in found), key=len)
    if len(shape) == len(layout.mesh_shape):
        return None
    if layout.tp == 1:
        from torch.distributed.tensor import Replicate

        tensor_parallel = any(
            p.device_mesh.ndim > len(layout.mesh_shape) and isinstance(p.placements[-1], Replicate)
            for p in found
        )
        if not tensor_parallel:
            return None
    mesh = "x".join(str(size) for size in shape)
    what = f"tensor parallelism of degree {layout.tp}" if layout.tp > 1 else "no tensor parallelism"
    return (
        f"the plan was made for {layout.describe()} ({what}), but the model's parameters are "
        f"laid out on a mesh of shape {mesh} (a rank's memory differs): lay it out on the "
        f"plan's mesh, or make the plan for how it trains (--tp T with --parallel fsdp2 for "
        "tensor parallelism)"
    )


def _is_fully_sharded(model: torch.nn.Module) -> bool:
    """Whether ``fully_shard`` laid ``model`` out: a module of it is an ``FSDPModule`` (its
    parameters may be gathered, no ``DTensor`` shards, during its forward)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(module, FSDPModule) for module in model.modules())
