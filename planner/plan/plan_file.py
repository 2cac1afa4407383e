"""The plan: which modules to checkpoint and how, and its versioned JSON file.

Pure Python (no torch). The JSON contract is fixed in docs/architecture.md ("Plan JSON";
every field: docs/formats.md, "Plan file"): a new field is fine, a renamed one needs a
``schema_version`` bump. :func:`load_plan` rejects files it cannot trust (missing, empty,
corrupt, written by a newer schema) with a :class:`PlanFileError` that says what to do.
"""

from __future__ import annotations

import enum
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from planner.core.errors import LoopShapeError, ParallelLayoutError, PlanFileError
from planner.core.fileio import atomic_write_text
from planner.core.loop import PLAIN_LOOP, LoopShape, loop_from_dict, loop_to_dict
from planner.core.parallel import ParallelLayout, parallel_from_dict, parallel_to_dict
from planner.core.records import Note, Unit, note_from_line
from planner.core.switches import NO_SWITCHES, StepSwitches, switches_from_dict, switches_to_dict
from planner.plan.policies import NESTED, OFFLOAD, OFFLOAD_AT_USE

__all__ = [
    "OFFLOAD_SCHEMA_VERSION",
    "PLAN_SCHEMA_VERSION",
    "CheckpointMethod",
    "ModuleDecision",
    "Plan",
    "load_plan",
    "plan_from_dict",
    "plan_to_dict",
    "save_plan",
]

PLAN_SCHEMA_VERSION = 2
"""The newest plan schema this reads. Version 2 added the ``offload`` method; a plan with
no offloaded module is still written as version 1 (:data:`OFFLOAD_SCHEMA_VERSION`), so
that an older ckpt-plan reads it as before, and one that offloads says it needs a newer
one instead of failing on a method it does not know."""

OFFLOAD_SCHEMA_VERSION = 2
"""The schema a plan with an offloaded module is written in (older plans: 1)."""


class CheckpointMethod(str, enum.Enum):
    """How a module is wrapped at training time."""

    CHECKPOINT = "checkpoint"
    """``torch.utils.checkpoint.checkpoint`` around the module's whole forward."""
    CHECKPOINT_SEQUENTIAL = "checkpoint_sequential"
    """``torch.utils.checkpoint.checkpoint_sequential`` over an ``nn.Sequential``'s children."""
    OFFLOAD = "offload"
    """No recomputation: the tensors the module saves for backward go to host memory when
    its forward ends and come back when its backward begins (:mod:`planner.apply.offload`)."""


@dataclass(frozen=True)
class ModuleDecision:
    """One wrapped submodule, by qualified name (as in ``named_modules()``).

    ``preserve_rng_state`` is True for modules that run random ops (dropout), so that
    recomputation draws the same numbers; modules without random ops skip the RNG stash.
    ``segments`` is set only for ``checkpoint_sequential``. ``policy`` names a selective
    checkpointing policy (:mod:`planner.plan.policies`), or None for full recomputation;
    with a policy, ``saved_ops`` are the ops whose outputs it saves (``"aten.mm.default"``)
    and ``alternating_ops`` those of which it saves every other call (the 1st, 3rd, ...).
    ``restore_buffers`` names buffers (relative to the module) that its forward changes in
    place (BatchNorm running statistics): recomputation restores them, so they change once
    per step, as unplanned.
    ``saving_bytes`` and ``recompute_ms`` are the profile's figures for this module (all
    its calls). ``nested_in`` names the checkpointed module this one is checkpointed inside
    (nesting: the outer decision carries the cost and the saving of both).
    With the ``offload`` method, ``offload_min_bytes`` is the smallest saved storage it
    sends to host memory (as the allocator counts it: whole 512-byte blocks on CUDA),
    ``host_bytes`` what it holds there (all calls), and
    ``recompute_ms`` the transfer time the compute does not hide (nothing is recomputed),
    and ``prefetch_module`` the module at whose backward its tensors start back (the next
    block; None, or absent from the file: at its own backward).
    """

    module_name: str
    method: CheckpointMethod = CheckpointMethod.CHECKPOINT
    preserve_rng_state: bool = True
    segments: int | None = None
    policy: str | None = None
    saved_ops: tuple[str, ...] = ()
    alternating_ops: tuple[str, ...] = ()
    restore_buffers: tuple[str, ...] = ()
    saving_bytes: int = 0
    recompute_ms: float = 0.0
    nested_in: str | None = None
    offload_min_bytes: int = 0
    host_bytes: int = 0
    prefetch_module: str | None = None

    @property
    def how(self) -> str:
        """How it is checkpointed, in a few words, for tables: ``whole``, ``3 segments``,
        ``save-matmuls``, ``inside blocks.0``, ``offload``."""
        if self.method is CheckpointMethod.OFFLOAD:
            return OFFLOAD
        if self.method is CheckpointMethod.CHECKPOINT_SEQUENTIAL:
            return f"{self.segments} segments"
        if self.nested_in is not None:
            return f"inside {self.nested_in}"
        return self.policy or "whole"


@dataclass(frozen=True)
class Plan:
    """A checkpointing decision for one model, batch and device, with its predictions.

    ``predicted_overhead`` is the recompute time as a fraction of one unplanned step.
    ``measured_peak_bytes`` is filled in once the plan has been run and measured, and
    ``checked`` once that run also showed the training step unchanged; a plan made for a
    device that is not here (``target``) stays unchecked until ``ckpt-plan verify`` runs
    it there. ``memory_source`` and ``cost_source`` say how the profile's figures were
    obtained (``fake`` or ``real`` memory; ``measured`` or ``roofline`` times), and
    ``assumptions`` what the profile assumed about the device; ``notes`` say how the plan
    was searched for and why it was not run (both by topic:
    :class:`~planner.core.records.Note`). ``model_file`` is the
    profile's: the model file's path, or a Hugging Face workload's source
    (``hf:CONFIG?batch_size=...``), which ``ckpt-plan verify PLAN`` rebuilds; None in plans
    written before it was recorded. ``loop`` is the training loop's shape the step was
    measured in (:mod:`planner.core.loop`; a file without it was made for the plain loop).
    ``parallel`` is the ``torchrun`` job layout the plan is for, each rank applying it before
    sharding (:mod:`planner.core.parallel`: world size, strategy, mesh shape, TP degree;
    None, or absent from the file: one process). ``switches`` are the model's switches the
    step was planned with (:mod:`planner.core.switches`: Hugging Face caches turned off,
    routing assumed). ``host_budget_bytes`` bounds the host memory offloaded modules hold at
    once (None: the plan offloads nothing, or was made before offloading existed), and
    ``predicted_host_peak_bytes`` is what they hold at most.
    """

    budget_bytes: int
    predicted_peak_bytes: int
    baseline_peak_bytes: int
    predicted_overhead: float
    recompute_ms: float
    step_ms: float
    static_bytes: int
    modules: tuple[ModuleDecision, ...]
    fingerprint: dict[str, Any]
    batch: dict[str, Any]
    device: str
    torch_version: str
    model_name: str
    strategy: str = "optimal"
    measured_peak_bytes: int | None = None
    schema_version: int = PLAN_SCHEMA_VERSION
    notes: tuple[Note, ...] = field(default_factory=tuple)
    memory_source: str = "real"
    cost_source: str = "measured"
    target: str | None = None
    checked: bool = False
    assumptions: tuple[Note, ...] = field(default_factory=tuple)
    model_file: str | None = None
    loop: LoopShape = PLAIN_LOOP
    parallel: ParallelLayout | None = None
    switches: StepSwitches = NO_SWITCHES
    host_budget_bytes: int | None = None
    predicted_host_peak_bytes: int = 0

    def __post_init__(self) -> None:
        # The schema it is written in: 2 where a module offloads (PLAN_SCHEMA_VERSION).
        object.__setattr__(self, "schema_version", OFFLOAD_SCHEMA_VERSION if self.offloads else 1)

    @property
    def module_names(self) -> tuple[str, ...]:
        return tuple(decision.module_name for decision in self.modules)

    @property
    def units(self) -> tuple[Unit, ...]:
        """The plan as the memory model reads it: one unit per decision not nested in
        another (a nesting module's unit has the option ``nested``)."""
        outers = {d.nested_in for d in self.modules if d.nested_in is not None}
        return tuple(
            Unit(d.module_name, segments=d.segments)
            if d.method is CheckpointMethod.CHECKPOINT_SEQUENTIAL
            else Unit(d.module_name, option=OFFLOAD if d.prefetch_module else OFFLOAD_AT_USE)
            if d.method is CheckpointMethod.OFFLOAD
            else Unit(d.module_name, option=NESTED if d.module_name in outers else d.policy)
            for d in self.modules
            if d.nested_in is None
        )

    @property
    def offloads(self) -> bool:
        """Whether any module's saved tensors go to host memory (schema 2)."""
        return any(d.method is CheckpointMethod.OFFLOAD for d in self.modules)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    data = asdict(plan)
    data["modules"] = [
        {
            **{
                key: value
                for key, value in asdict(decision).items()
                # Only where a module is prefetched (plans without it read as before).
                if key != "prefetch_module" or value is not None
            },
            "method": decision.method.value,
            "restore_buffers": list(decision.restore_buffers),
            "saved_ops": list(decision.saved_ops),
            "alternating_ops": list(decision.alternating_ops),
        }
        for decision in plan.modules
    ]
    # Notes are written as they print (``times: ...``), and read back by their first words.
    data["notes"] = [str(note) for note in plan.notes]
    data["assumptions"] = [str(note) for note in plan.assumptions]
    data["loop"] = loop_to_dict(plan.loop)
    data["parallel"] = parallel_to_dict(plan.parallel)
    data["switches"] = switches_to_dict(plan.switches)
    # Version 2 only where it matters (see PLAN_SCHEMA_VERSION); first, so a person opening
    # the file sees it.
    return {"schema_version": data.pop("schema_version"), **data}


def plan_from_dict(data: Any, source: str = "plan") -> Plan:
    """Validate a decoded plan JSON object and build the :class:`Plan`."""
    if not isinstance(data, dict):
        raise PlanFileError(f"{source} is not a ckpt-plan plan (expected a JSON object)")
    version = data.get("schema_version")
    if not isinstance(version, int):
        raise PlanFileError(f"{source} has no schema_version; is it a ckpt-plan plan file?")
    if version > PLAN_SCHEMA_VERSION:
        raise PlanFileError(
            f"{source} uses plan schema {version}, newer than this ckpt-plan reads "
            f"({PLAN_SCHEMA_VERSION}); upgrade ckpt-plan or re-create the plan"
        )
    known = {f.name for f in fields(Plan)}
    missing = sorted(name for name in _REQUIRED_PLAN_FIELDS if name not in data)
    if missing:
        raise PlanFileError(f"{source} is missing fields {', '.join(missing)}; re-create the plan")
    for name, kinds in _FIELD_TYPES.items():
        value = data.get(name)
        if name in data and (
            not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
        ):
            expected = " or ".join(kind.__name__ for kind in kinds)
            raise PlanFileError(
                f"{source}: field {name!r} should be {expected}, not {type(value).__name__}; "
                "re-create the plan"
            )
    try:
        modules = tuple(
            ModuleDecision(
                module_name=str(item["module_name"]),
                method=CheckpointMethod(item.get("method", "checkpoint")),
                preserve_rng_state=bool(item.get("preserve_rng_state", True)),
                segments=None if item.get("segments") is None else int(item["segments"]),
                policy=None if item.get("policy") is None else str(item["policy"]),
                saved_ops=tuple(str(op) for op in item.get("saved_ops", ())),
                alternating_ops=tuple(str(op) for op in item.get("alternating_ops", ())),
                restore_buffers=tuple(str(name) for name in item.get("restore_buffers", ())),
                saving_bytes=int(item.get("saving_bytes", 0)),
                recompute_ms=float(item.get("recompute_ms", 0.0)),
                nested_in=None if item.get("nested_in") is None else str(item["nested_in"]),
                offload_min_bytes=int(item.get("offload_min_bytes", 0)),
                host_bytes=int(item.get("host_bytes", 0)),
                prefetch_module=None
                if item.get("prefetch_module") is None
                else str(item["prefetch_module"]),
            )
            for item in data["modules"]
        )
        values = {name: data[name] for name in known if name in data}
        values["modules"] = modules
        values["notes"] = tuple(note_from_line(str(line)) for line in values.get("notes", ()))
        values["assumptions"] = tuple(
            note_from_line(str(line)) for line in values.get("assumptions", ())
        )
        values["loop"] = loop_from_dict(data.get("loop"))  # absent: the plain loop
        values["parallel"] = parallel_from_dict(data.get("parallel"))  # absent: one process
        values["switches"] = switches_from_dict(data.get("switches"))  # absent: none
        plan = Plan(**values)
    except (KeyError, TypeError, ValueError, LoopShapeError, ParallelLayoutError) as error:
        raise PlanFileError(
            f"{source} has a malformed entry ({error}); re-create the plan"
        ) from error
    return plan


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "budget_bytes": (int,),
    "predicted_peak_bytes": (int,),
    "baseline_peak_bytes": (int,),
    "static_bytes": (int,),
    "predicted_overhead": (int, float),
    "recompute_ms": (int, float),
    "step_ms": (int, float),
    "fingerprint": (dict,),
    "batch": (dict,),
    "modules": (list,),
    "device": (str,),
    "torch_version": (str,),
    "model_name": (str,),
    "strategy": (str,),
    "memory_source": (str,),
    "cost_source": (str,),
    "checked": (bool,),
    "model_file": (str, type(None)),
    "host_budget_bytes": (int, type(None)),
    "predicted_host_peak_bytes": (int,),
}

_REQUIRED_PLAN_FIELDS = frozenset(
    f.name for f in fields(Plan) if f.default is MISSING and f.default_factory is MISSING
)


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write the plan as JSON, atomically. Returns the path written."""
    target = Path(path)
    atomic_write_text(target, json.dumps(plan_to_dict(plan), indent=2) + "\n")
    return target


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file."""
    source = Path(path)
    if not source.is_file():
        raise PlanFileError(
            f"plan file {source} does not exist; "
            "create one with `ckpt-plan profile MODEL.py --budget B`"
        )
    text = source.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise PlanFileError(f"plan file {source} is empty; re-create it with `ckpt-plan profile`")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise PlanFileError(
            f"plan file {source} is not valid JSON (line {error.lineno}: {error.msg}); "
            "re-create it with `ckpt-plan profile`"
        ) from error
    return plan_from_dict(data, source=f"plan file {source}")
