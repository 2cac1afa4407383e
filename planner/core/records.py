"""Immutable records passed between stages: the measured timeline and the profile.

Everything here is plain data (no torch), keyed by module qualified name, with sizes in
``*_bytes`` (int), times in ``*_ms`` (float) and positions on the step's timeline in
``*_event`` (int). An *event* is one observation made during the instrumented step, in
order: a storage allocated or freed, a module forward entered or left, a saved tensor packed
or unpacked. Events order things; they are not a clock.

Two words are kept apart: *saved* is what autograd saves for backward (``saved_bytes``,
``saved_tensors``); *saving* (docs/architecture.md, "The memory model") or *freed* is what
checkpointing a module frees between its forward and its backward
(``checkpoint_saving_bytes``, a plan's ``saving_bytes``, reports' ``freed_bytes_*``).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from planner.core.loop import PLAIN_LOOP, LoopShape
from planner.core.parallel import ParallelLayout
from planner.core.switches import NO_SWITCHES, StepSwitches

__all__ = [
    "PROFILE_SCHEMA_VERSION",
    "CostSource",
    "MemorySource",
    "MemoryTimeline",
    "ModuleCall",
    "ModuleProfile",
    "Name",
    "Note",
    "NoteTopic",
    "OpCost",
    "OptionCost",
    "Phase",
    "Profile",
    "SavedTensor",
    "StorageKind",
    "StorageLifetime",
    "Unit",
    "forward_totals_by_call",
    "general_notes",
    "note_from_line",
]

PROFILE_SCHEMA_VERSION = 1


class MemorySource(str, enum.Enum):
    """How the memory timeline was recorded (docs/architecture.md, "Where each figure comes
    from")."""

    FAKE = "fake"
    """On fake tensors (``FakeTensorMode``): exact sizes and lifetimes, no storage."""
    REAL = "real"
    """By running the unplanned step for real (it must fit the machine)."""


class CostSource(str, enum.Enum):
    """Where the modules' recomputation times come from."""

    NONE = "none"
    """Not yet known (a memory-only profile)."""
    MEASURED = "measured"
    """Timed on this device, in steps that fit the budget."""
    ROOFLINE = "roofline"
    """Estimated for a target device from each op's FLOPs and bytes (``Profile.target``)."""


class Name(str, enum.Enum):
    """A word of the profile's vocabulary: equal to, hashed as and printed as its string, so
    JSON files and dictionaries keyed by the plain word keep working."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return format(str(self.value), format_spec)


class StorageKind(Name):
    """What a storage of the instrumented step holds."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"
    WORKSPACE = "workspace"
    """Memory a device's libraries hold for the whole step (cuBLAS on CUDA)."""
    BATCH = "batch"
    OTHER = "other"
    """Tensors held as plain module attributes when the step started."""
    ACTIVATION = "activation"
    """Everything made during the step that is not one of the above: activations,
    temporaries, gradients of activations, the loss."""


# Memory no plan can remove: present for the whole step whatever is checkpointed.
STATIC_KINDS = frozenset(
    {
        StorageKind.PARAMETER,
        StorageKind.BUFFER,
        StorageKind.GRADIENT,
        StorageKind.OPTIMIZER_STATE,
        StorageKind.WORKSPACE,
    }
)


@dataclass(frozen=True, slots=True)
class Unit:
    """What a plan checkpoints, as the memory model and the solver name it: a module
    (``Unit("blocks.3")``: wrap it in ``checkpoint``); with ``segments``,
    ``checkpoint_sequential`` over the children of ``module`` in that many segments; with
    ``option``, ``checkpoint`` under a selective policy (:mod:`planner.plan.policies`) or
    nested checkpointing (``"nested"``). Never both.

    Printed as ``blocks.3``, ``blocks#3`` and ``blocks.3@save-matmuls``, for people (tables,
    logs, the trade-off CSV). Units sort as they print, the order plans list their modules
    in."""

    module: str
    segments: int | None = None
    option: str | None = None

    def __post_init__(self) -> None:
        if self.segments is not None and self.option is not None:
            raise ValueError(f"a unit has segments or an option, not both: {self!r}")

    def __str__(self) -> str:
        if self.option is not None:
            return f"{self.module}@{self.option}"
        return self.module if self.segments is None else f"{self.module}#{self.segments}"

    def __lt__(self, other: Unit) -> bool:
        return str(self) < str(other)

    def __le__(self, other: Unit) -> bool:
        return str(self) <= str(other)

    def __gt__(self, other: Unit) -> bool:
        return str(self) > str(other)

    def __ge__(self, other: Unit) -> bool:
        return str(self) >= str(other)


class NoteTopic(Name):
    """What a note of a profile or a plan is about (:class:`Note`)."""

    GENERAL = "general"
    """How the step was recorded or modelled: the device, the optimizer, the workload."""
    TIMES = "times"
    """How the times were taken; a profile has one, replaced when times are taken again."""
    OWN_CHECKPOINTING = "own-checkpointing"
    """Checkpointing the model does itself: switched off to plan, or counted by the plan."""
    SOLVER = "solver"
    """How the plan was searched for."""
    UNCHECKED = "unchecked"
    """Why the plan was not run here, and the command that runs it where it can be."""


# The words a note on each topic begins with, on screen and in files: ``str(note)`` is
# ``lead + text``, and :func:`note_from_line` reads a file's line back by them.
_NOTE_LEADS = {
    NoteTopic.GENERAL: "",
    NoteTopic.TIMES: "times: ",
    NoteTopic.OWN_CHECKPOINTING: "the model checkpoints ",
    NoteTopic.SOLVER: "solver: ",
    NoteTopic.UNCHECKED: "unchecked: ",
}


@dataclass(frozen=True, slots=True)
class Note:
    """One line a profile or a plan says about itself (``Profile.assumptions``,
    ``Plan.notes``), by topic, so that code picks notes by topic, never by their words.

    ``text`` goes on from the words the topic's notes begin with, which ``str(note)``
    puts in front: ``Note(NoteTopic.TIMES, "measured here in 5 step(s) ...")`` prints as
    ``times: measured here in 5 step(s) ...``; ``Note(NoteTopic.OWN_CHECKPOINTING,
    "itself (grad_checkpointing on) ...")`` as ``the model checkpoints itself ...``."""

    topic: NoteTopic
    text: str

    def __str__(self) -> str:
        return _NOTE_LEADS[self.topic] + self.text


def general_notes(lines: Iterable[str]) -> tuple[Note, ...]:
    """``lines`` as notes on the general topic, one each."""
    return tuple(Note(NoteTopic.GENERAL, line) for line in lines)


def note_from_line(line: str) -> Note:
    """A note back from its line in a plan or profile file (``str(note)``): by the words
    its topic's notes begin with; a line that begins with none is a general note. For the
    file readers only: code reads ``Note.topic``."""
    for topic, lead in _NOTE_LEADS.items():
        if lead and line.startswith(lead):
            return Note(topic, line[len(lead) :])
    return Note(NoteTopic.GENERAL, line)


class Phase(Name):
    """The parts of a training step, each ending at an event (``phase_end_events``)."""

    FORWARD = "forward"
    """Ends when the loss is computed."""
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True, slots=True)
class StorageLifetime:
    """One tensor storage seen during the instrumented step.

    ``alloc_event`` is -1 for a storage already live when the step started; ``free_event``
    equals the timeline's ``event_count`` for a storage still live when it ended.
    ``alloc_call`` is the index (into ``MemoryTimeline.calls``) of the innermost module
    forward running when the storage was made, or -1.
    """

    size_bytes: int
    alloc_event: int
    free_event: int
    alloc_call: int
    kind: StorageKind
    # The op whose output it is (``"aten.mm.default"``; "" when made outside an op or before
    # the step), and whether a later op wrote it in place (``relu_``, ``bernoulli_``): a
    # selective policy may keep an op's output only if nothing writes it afterwards.
    alloc_op: str = ""
    written_in_place: bool = False
    # A saved copy of a parameter in another dtype (a cast of a leaf tensor that requires
    # grad: what autocast keeps in its cache until the outermost autocast exits). An
    # offloaded module leaves it on the device, as it does the parameter.
    leaf_cast: bool = False


@dataclass(frozen=True, slots=True)
class ModuleCall:
    """One forward call of one module during the instrumented step.

    ``saved_storages``, ``first_unpack_event`` and ``last_unpack_event`` cover only the
    tensors saved while this call was the innermost module running (children keep their
    own); ``planner.plan.memory_model`` aggregates them over a subtree. Unpack events are when
    backward first/last read one of those tensors, or -1 when nothing was saved. Storages are
    indices into ``MemoryTimeline.storages``.
    """

    module_name: str
    parent_call: int
    forward_start_event: int
    forward_end_event: int
    first_unpack_event: int
    last_unpack_event: int
    input_storages: tuple[int, ...]
    output_storages: tuple[int, ...]
    saved_storages: tuple[int, ...]
    uses_rng: bool
    mutated_buffers: tuple[str, ...]
    devices: tuple[str, ...]
    # Bytes of the mutated buffers: a plan snapshots them while recomputing this call.
    mutated_buffer_bytes: int = 0
    # Of ``input_storages``, those passed by keyword: a checkpoint holds these by reference
    # (not as saved tensors), so an enclosing checkpoint cannot drop them.
    keyword_input_storages: tuple[int, ...] = ()
    # Arguments (``"past_key_values (DynamicCache)"``) that hold tensors after the call that
    # they did not hold before it: the forward stored tensors into an object it was given,
    # such as a key/value cache. Recomputing the call would store them again.
    updated_arguments: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SavedTensor:
    """One tensor saved for backward: its storage, the innermost module call running when it
    was saved (-1 for none), the last event at which backward read it (-1: never), and the
    last event before autograd let go of it (the node that saved it has run; -1: not seen,
    in profiles written before it was recorded, or held to the end of the step)."""

    storage: int
    call: int
    pack_event: int
    last_unpack_event: int
    release_event: int = -1


@dataclass(frozen=True, slots=True)
class OpCost:
    """One op of the instrumented step, for cost estimates.

    ``call`` is the innermost module call running when it ran in forward (-1 in backward
    and the optimizer step, or outside every module); ``event`` is the timeline event just
    before it (so ``phase_end_events`` place it in a phase). ``flops`` counts as
    ``torch.utils.flop_counter`` does (0 for ops it does not count: elementwise ops);
    ``bytes_moved`` is the bytes of its tensor inputs and outputs (0 for views), ``dtype``
    the dtype it computes in (its first floating-point input or output).
    """

    op: str
    call: int
    event: int
    flops: int
    bytes_moved: int
    dtype: str


@dataclass(frozen=True)
class MemoryTimeline:
    """The measured memory history of one training step (forward, backward, optimizer)."""

    event_count: int
    storages: tuple[StorageLifetime, ...]
    calls: tuple[ModuleCall, ...]
    saved_tensors: tuple[SavedTensor, ...] = ()
    # Event at which each phase ended.
    phase_end_events: dict[Phase, int] = field(default_factory=dict)
    op_costs: tuple[OpCost, ...] = ()
    # Events at which torch.autocast cleared its cast cache (the outermost autocast region
    # exited): until then the cache holds each cast of a parameter (``leaf_cast``) that a
    # checkpointed module made, though nothing saved it.
    autocast_cache_clears: tuple[int, ...] = ()
    # The dtype the step's first call of a submodule ran under torch.autocast in, "off"
    # without autocast (core/switches.py: StepSwitches.autocast); None: no submodule called.
    forward_autocast: str | None = None


def forward_totals_by_call(
    timeline: MemoryTimeline, value: Callable[[OpCost], float]
) -> list[float]:
    """For each module call, the sum of ``value(op)`` over the ops of its forward, its
    children's included (an op counts for the innermost call running and all its parents).
    Integer values (FLOPs) sum as integers."""
    totals: list[float] = [0] * len(timeline.calls)
    forward_end = timeline.phase_end_events.get(Phase.FORWARD, timeline.event_count)
    for op in timeline.op_costs:
        if op.call < 0 or op.event > forward_end:
            continue
        amount = value(op)
        if not amount:
            continue
        call = op.call
        while call >= 0:
            totals[call] += amount
            call = timeline.calls[call].parent_call
    return totals


@dataclass(frozen=True, slots=True)
class OptionCost:
    """What one checkpointing option of a module costs (:mod:`planner.plan.policies` says
    which options a module has and what each keeps): the time of its recomputation, all
    calls (for a selective policy, the ops it does not save, plus the policy's own dispatch
    cost where measured; for nesting, its forward and its inner modules' forwards again),
    and the FLOPs it recomputes."""

    option: str
    recompute_ms: float
    recompute_flops: int
    # For nesting: the child modules checkpointed inside it (they run three times).
    inner_modules: tuple[str, ...] = ()
    # What it frees between the forward and the recomputation, all calls: the activations
    # it drops, less the outputs a policy keeps that would otherwise have been freed.
    freed_bytes: int = 0


@dataclass(frozen=True)
class ModuleProfile:
    """What checkpointing one module would free and cost, derived from the timeline.

    ``saved_bytes``: unique storages saved for backward inside the module (parameters
    excluded), summed over its calls. ``checkpoint_saving_bytes``: of those, the bytes that
    wrapping the module actually frees between its forward and its backward (its own
    activations, not its inputs or outputs). ``recompute_peak_bytes``: the transient peak
    of its forward above its inputs, which recomputation brings back during backward.
    ``mutated_buffers`` names (relative to the module) the buffers its forward changes in
    place, such as BatchNorm running statistics; a plan restores them after recomputation.
    ``excluded_reason`` is empty for a candidate the solver may choose.
    """

    module_name: str
    module_type: str
    depth: int
    call_count: int
    parameter_bytes: int
    saved_bytes: int
    checkpoint_saving_bytes: int
    input_bytes: int
    output_bytes: int
    recompute_peak_bytes: int
    forward_ms: float
    uses_rng: bool
    excluded_reason: str
    mutated_buffers: tuple[str, ...] = ()
    # FLOPs of its forward, all calls (torch.utils.flop_counter's count).
    forward_flops: int = 0
    # Its options besides whole-module checkpointing (selective policies, nesting), with
    # their costs; empty for a module that has none.
    options: tuple[OptionCost, ...] = ()

    def option_cost(self, option: str) -> OptionCost:
        for cost in self.options:
            if cost.option == option:
                return cost
        raise KeyError(f"{self.module_name} has no option {option!r}")

    @property
    def is_candidate(self) -> bool:
        return not self.excluded_reason


@dataclass(frozen=True)
class Profile:
    """Everything measured about one training step of one model on one device.

    ``memory_source`` and ``cost_source`` say how the timeline and the times were obtained;
    ``target`` names the device spec of a roofline estimate; ``assumptions`` says how a
    fake step modelled its device (see :mod:`planner.measure.fake`), how times were taken
    and what the model does itself, as notes by topic;
    ``loop`` is the training loop's shape the step was recorded in (:mod:`planner.core.loop`);
    ``parallel`` the job layout of which the step is one rank's (:mod:`planner.core.parallel`;
    None: one process).
    """

    schema_version: int
    model_name: str
    model_file: str
    device: str
    torch_version: str
    fingerprint: dict[str, object]
    batch: dict[str, object]
    step_ms: float
    measured_peak_bytes: int
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    modules: tuple[ModuleProfile, ...]
    timeline: MemoryTimeline
    block_names: tuple[str, ...] = ()
    # How many of block_names each stack holds, in order, where there are several (an
    # encoder-decoder's encoder and decoder blocks); () for one stack.
    block_stacks: tuple[int, ...] = ()
    memory_source: MemorySource = MemorySource.REAL
    cost_source: CostSource = CostSource.MEASURED
    target: str | None = None
    assumptions: tuple[Note, ...] = ()
    # Memory the device's libraries hold throughout (cuBLAS workspaces), in every peak.
    workspace_bytes: int = 0
    # The training loop's shape the step was recorded in (planner.core.loop).
    loop: LoopShape = PLAIN_LOOP
    # The job layout the step is one rank of (planner.core.parallel); None: one process.
    parallel: ParallelLayout | None = None
    # Checkpointing's own cost per checkpointed call (measured times only; 0 otherwise),
    # included once per call in each module's forward_ms: a checkpoint_sequential segment of
    # several children is one call, not one per child (planner.solve.tree).
    checkpoint_call_ms: float = 0.0
    # Switches in the model the step was recorded with (planner.core.switches): caches off,
    # the routing assumed for mixture-of-experts layers.
    switches: StepSwitches = NO_SWITCHES

    @property
    def static_bytes(self) -> int:
        """Parameters, gradients, optimizer state and buffers: memory no plan can remove."""
        return (
            self.parameter_bytes
            + self.buffer_bytes
            + self.gradient_bytes
            + self.optimizer_state_bytes
        )

    def module(self, name: str) -> ModuleProfile:
        return self._by_name[name]

    @functools.cached_property
    def _by_name(self) -> dict[str, ModuleProfile]:
        # Built once per (immutable) profile: plans look modules up thousands of times.
        return {record.module_name: record for record in self.modules}

    @property
    def candidates(self) -> tuple[ModuleProfile, ...]:
        return tuple(record for record in self.modules if record.is_candidate)

    def excluded_blocks_note(self) -> str:
        """One sentence on the repeated blocks that cannot be checkpointed and why (the
        first reason), or "" when every block is a candidate."""
        excluded = [
            self.module(name)
            for name in self.block_names
            if self._by_name.get(name) and not self.module(name).is_candidate
        ]
        if not excluded:
            return ""
        names = ", ".join(record.module_name for record in excluded[:3])
        more = ", ..." if len(excluded) > 3 else ""
        return (
            f"{len(excluded)} of {len(self.block_names)} blocks cannot be checkpointed "
            f"({names}{more}); {excluded[0].module_name}: {excluded[0].excluded_reason}"
        )
