"""Find a model's repeated blocks, the ones a user checkpoints by hand ("every block"):
:func:`find_blocks` (the ``blocks.*`` of a GPT, the layers of a hybrid stack, every residual
block of a CNN), and tell ``torch.nn``'s own leaf layers, which are never checkpointed alone
(:func:`_is_torch_layer`).
"""

from __future__ import annotations

import itertools
import sys
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from planner.core.records import MemoryTimeline, ModuleCall

__all__ = ["find_block_stacks", "find_blocks"]


_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)


def _is_block(module: torch.nn.Module) -> bool:
    """Whether a module can be one block of a stack: it has submodules, or it is a model's
    own layer holding its parameters itself and computing with ``torch`` functions (not one
    of ``torch.nn``'s layers: a run of ``nn.Linear`` is a stack of layers, not of blocks)."""
    if any(True for _ in module.children()):
        return True
    return not _is_torch_layer(module) and any(True for _ in module.parameters(recurse=False))


def _is_torch_layer(module: torch.nn.Module) -> bool:
    """One of ``torch.nn``'s own layers with no submodules (Linear, LayerNorm, Dropout, GELU):
    checkpointed alone it frees a few bytes per element at most (a mask, a norm's
    statistics: its input is kept as the checkpoint's) for a checkpoint call each (about
    0.2 ms on the CPU machine), and a module holding it recomputes it anyway. Not a
    candidate. A model's own leaf layers (a functional block, Hugging Face's activations
    and norms, which run several ops) are judged by what they free, like any module, and so
    are ``torch.nn``'s recurrent layers (LSTM, GRU, RNN: a whole sequence's gates and
    states, oneDNN's workspace on the CPU, several times their input)."""
    return (
        type(module).__module__.startswith("torch.nn.")
        and not isinstance(module, torch.nn.RNNBase)
        and not any(True for _ in module.children())
    )


class _Chains:
    """Which containers' entries ran as a chain in the recorded step: each entry's first
    forward call in registration order, from the same caller, taking a tensor the entry
    before it returned (the hidden states going down a stack). Without a timeline, none."""

    def __init__(self, timeline: MemoryTimeline | None) -> None:
        self._calls = timeline.calls if timeline is not None else ()
        self._made = [s.alloc_event for s in timeline.storages] if timeline is not None else []
        self._index: dict[str, int] = {}
        for index, call in enumerate(self._calls):
            self._index.setdefault(call.module_name, index)

    @property
    def recorded(self) -> bool:
        """Whether there is a recorded step to read."""
        return bool(self._calls)

    def first(self, name: str) -> ModuleCall | None:
        """The first forward call of the module ``name``; None where it never ran."""
        index = self._index.get(name)
        return None if index is None else self._calls[index]

    def index(self, name: str) -> int:
        """The index of that call in the timeline's calls (-1 where it never ran)."""
        return self._index.get(name, -1)

    def called_by(self, index: int) -> list[ModuleCall]:
        """The calls the call at ``index`` made itself (its children's, not theirs)."""
        return [call for call in self._calls if call.parent_call == index]

    def follows(self, before: ModuleCall, after: ModuleCall) -> bool:
        """Whether ``after`` ran once ``before`` had returned, on a tensor made since
        ``before`` started: its output, or one computed from it (a U-Net's up block
        concatenates the skip connection to it before its next residual block)."""
        return after.forward_start_event >= before.forward_end_event and any(
            self._made[storage] >= before.forward_start_event for storage in after.input_storages
        )

    def ran_in_turn(self, name: str, module: torch.nn.Module) -> bool:
        """Whether the entries of ``module`` ran one after the other, each on what the one
        before made (:meth:`follows`; looser than :meth:`ran`: HiDream's single-stream
        blocks each take the one before's output joined to more text)."""
        calls = [self.first(f"{name}.{child}") for child, _ in module.named_children()]
        ran = [call for call in calls if call is not None]
        return len(ran) == len(calls) > 0 and all(
            self.follows(before, after) for before, after in itertools.pairwise(ran)
        )

    def ran(self, name: str, module: torch.nn.Module) -> bool:
        prefix = f"{name}." if name else ""
        calls = []
        for child, _ in module.named_children():
            call = self.first(prefix + child)
            if call is None:  # never called: not a chain the step ran
                return False
            calls.append(call)
        if not calls:
            return False
        for before, after in itertools.pairwise(calls):
            if (
                after.forward_start_event < before.forward_end_event
                or after.parent_call != before.parent_call
                or not set(before.output_storages) & set(after.input_storages)
            ):
                return False
        return True


def _stack_class(module: torch.nn.Module, *, at_least: int = 2) -> type | None:
    """The class of the blocks ``module`` stacks: a ``ModuleList``/``Sequential`` whose
    ``at_least`` or more children are all of one class and blocks (:func:`_is_block`; a run
    of Linear and ReLU is not a stack of blocks). None for anything else."""
    if not isinstance(module, _CONTAINERS):
        return None
    children = list(module.children())
    if len(children) < at_least or len({type(child) for child in children}) != 1:
        return None
    if not _is_block(children[0]):
        return None
    return type(children[0])


def _is_stack(name: str, module: torch.nn.Module, chains: _Chains) -> bool:
    """Whether ``module`` holds a stack of two or more blocks: of one class
    (:func:`_stack_class`), or a ``ModuleList`` of blocks of several classes that ran as a
    chain (a hybrid model's layers: Jamba's Mamba and attention layers). A ``Sequential`` of
    several classes is not one: it is often a whole model (stem, body, head)."""
    if _stack_class(module) is not None:
        return True
    children = list(module.children())
    return (
        isinstance(module, torch.nn.ModuleList)
        and len(children) >= 2
        and all(_is_block(child) for child in children)
        and chains.ran(name, module)
    )


def _is_chain_of_blocks(name: str, module: torch.nn.Module, chains: _Chains) -> bool:
    """Whether ``module`` is a chain of blocks of one class: an ``nn.Sequential``, which runs
    its children one after the other, or a ``ModuleList`` whose entries ran so (a Hugging
    Face ConvNeXt stage's layers). A ``ModuleList`` whose entries did not (experts of a
    mixture, each on its own tokens) is not a chain to descend into."""
    if _stack_class(module, at_least=1) is None:
        return False
    return isinstance(module, torch.nn.Sequential) or chains.ran(name, module)


def _stage_entries(
    name: str, module: torch.nn.Module, chains: _Chains
) -> list[tuple[str, torch.nn.Module]]:
    """The blocks a stage ran itself, one after the other, from its ``ModuleList`` children
    of blocks of one class: those holding two or more, and those whose entries ran between
    theirs; in the order they ran, each on what the one before made (:meth:`_Chains.follows`).
    A diffusers U-Net's down block: ``resnets.0``, ``attentions.0``, ``resnets.1``,
    ``attentions.1`` (its ``downsamplers`` run after them; an up block's ``upsamplers`` too).
    Empty where there are none, where they did not run so (experts each on their own rows,
    heads each on the same input), or where the stage ran other modules between them (a
    transformer layer of two attention and two MLP sublayers, with norms and experts
    between them, stays one block)."""
    stage_index = chains.index(name)
    if stage_index < 0:
        return []
    lists: list[list[tuple[ModuleCall, str, torch.nn.Module]]] = []
    for child_name, child in module.named_children():
        if (
            not isinstance(child, torch.nn.ModuleList)
            or _stack_class(child, at_least=1) is None
            or not any(True for _ in child[0].children())  # a norm per sublayer: no block
        ):
            continue
        entries = []
        for entry_name, entry in child.named_children():
            call = chains.first(f"{name}.{child_name}.{entry_name}")
            if call is None or call.parent_call != stage_index:
                break
            entries.append((call, f"{name}.{child_name}.{entry_name}", entry))
        else:
            lists.append(entries)
    main = [entries for entries in lists if len(entries) >= 2]
    if not main:
        return []
    start = min(call.forward_start_event for entries in main for call, _, _ in entries)
    end = max(call.forward_end_event for entries in main for call, _, _ in entries)
    ran = sorted(
        (
            entry
            for entries in lists
            if entries in main
            or all(start < call.forward_start_event < end for call, _, _ in entries)
            for entry in entries
        ),
        key=lambda entry: entry[0].forward_start_event,
    )
    if not all(chains.follows(before[0], after[0]) for before, after in itertools.pairwise(ran)):
        return []
    chosen = {id(call) for call, _, _ in ran}
    first, last = ran[0][0].forward_start_event, ran[-1][0].forward_end_event
    if any(
        first < call.forward_start_event < last and id(call) not in chosen
        for call in chains.called_by(stage_index)
    ):
        return []  # the stage ran more between them (LongCat-Flash's layer: its experts)
    return [(entry_name, entry) for _, entry_name, entry in ran]


def _inner_blocks(
    name: str, module: torch.nn.Module, chains: _Chains, *, top: bool = True
) -> list[str]:
    """The residual blocks inside one block of a stack, where it is a stage of them: a stage
    that is itself an ``nn.Sequential`` of blocks (``stages.0`` -> ``stages.0.1``), a stage
    module holding one chain of blocks (:func:`_is_chain_of_blocks`; timm's ``stages.0`` ->
    ``stages.0.blocks.1``, Hugging Face's ``stages.0`` -> ``stages.0.layers.1``), or, for
    an entry of the stack itself (``top``), a stage that ran the blocks of its
    ``ModuleList`` children itself, one after the other (:func:`_stage_entries`; a
    diffusers U-Net's ``down_blocks.0`` -> ``down_blocks.0.resnets.0``,
    ``down_blocks.0.attentions.0``, ...). Not that last inside a stage: a residual block
    there may run its own layers so (HGNet-V2's convolutions, joined at its end), and it
    stays one block. Otherwise ``[name]``."""
    stage: list[tuple[str, torch.nn.Module]]
    if isinstance(module, torch.nn.Sequential) and _stack_class(module, at_least=1):
        stage = [(name, module)]
    elif top and (entries := _stage_entries(name, module, chains)):
        return [
            block
            for entry_name, entry in entries
            for block in _inner_blocks(entry_name, entry, chains, top=False)
        ]
    else:
        stage = [
            (f"{name}.{child_name}", child)
            for child_name, child in module.named_children()
            if _is_chain_of_blocks(f"{name}.{child_name}", child, chains)
        ]
        if len(stage) != 1:
            return [name]
    stage_name, stage_module = stage[0]
    return [
        block
        for child_name, child in stage_module.named_children()
        for block in _inner_blocks(f"{stage_name}.{child_name}", child, chains, top=False)
    ]


def _twin_stacks(
    model: torch.nn.Module, name: str, stack: torch.nn.Module, chains: _Chains
) -> list[tuple[str, torch.nn.Module]]:
    """The stack ``name`` and its twins, in registration order: the ``ModuleList`` stacks at
    the same path in the siblings of its parent (an encoder-decoder's two stacks: T5's
    ``encoder.block`` and ``decoder.block``, BART's ``model.encoder.layers`` and
    ``model.decoder.layers``, whose layers are of two classes). Only ``stack`` itself for an
    ``nn.Sequential``, a stack at the root or a stack whose parent is the root."""
    parent_name, _, leaf = name.rpartition(".")
    if not parent_name or not isinstance(stack, torch.nn.ModuleList):
        return [(name, stack)]
    holder_name, _, _ = parent_name.rpartition(".")
    holder = model.get_submodule(holder_name)
    stacks: list[tuple[str, torch.nn.Module]] = []
    for sibling_name, sibling in holder.named_children():
        path = f"{holder_name}.{sibling_name}" if holder_name else sibling_name
        twin = getattr(sibling, leaf, None) if path != parent_name else stack
        if isinstance(twin, torch.nn.ModuleList) and (
            twin is stack or _is_stack(f"{path}.{leaf}", twin, chains)
        ):
            stacks.append((f"{path}.{leaf}", twin))
    return stacks


class _Span(NamedTuple):
    """A module's (or a ``ModuleList``'s entries') first calls in a recorded step."""

    caller: int  # the index of the call that made them
    first: ModuleCall  # the first to start
    last: ModuleCall  # the last to end


def _span(name: str, module: torch.nn.Module, chains: _Chains) -> _Span | None:
    """The first calls of a ``ModuleList``'s entries, all by one caller, or of another
    module. None where something did not run, or where the entries had several callers."""
    names = [f"{name}.{child}" for child, _ in module.named_children()]
    if not isinstance(module, torch.nn.ModuleList):
        names = [name]
    calls = [call for call in map(chains.first, names) if call is not None]
    if not calls or len(calls) < len(names) or len({call.parent_call for call in calls}) != 1:
        return None
    first = min(calls, key=lambda call: call.forward_start_event)
    last = max(calls, key=lambda call: call.forward_end_event)
    return _Span(first.parent_call, first, last)


def _main_path(
    model: torch.nn.Module, name: str, stack: torch.nn.Module, chains: _Chains
) -> list[tuple[str, torch.nn.Module]]:
    """The stack ``name`` and the ``ModuleList`` stacks beside it (children of its parent,
    :func:`_is_stack`, whose entries ran each on what the one before made) that the same
    caller ran before or after it, each on what the one before made
    (:meth:`_Chains.follows`), in the order they ran, with any module it ran between two
    of them that holds blocks of its own: a diffusers U-Net's ``down_blocks``,
    ``mid_block`` and ``up_blocks``; Flux's double-stream ``transformer_blocks`` and
    single-stream ``single_transformer_blocks``. Only ``stack`` where there are none, or
    without a recorded step."""
    own = _span(name, stack, chains)
    if own is None or not isinstance(stack, torch.nn.ModuleList):
        return [(name, stack)]
    parent_name, _, _ = name.rpartition(".")
    stacks: list[tuple[_Span, str, torch.nn.Module]] = []
    others: list[tuple[_Span, str, torch.nn.Module]] = []
    for child_name, child in model.get_submodule(parent_name).named_children():
        child_path = f"{parent_name}.{child_name}" if parent_name else child_name
        span = _span(child_path, child, chains)
        if span is None or span.caller != own.caller:
            continue
        if child is stack or (
            isinstance(child, torch.nn.ModuleList)
            and _is_stack(child_path, child, chains)
            and chains.ran_in_turn(child_path, child)
        ):
            stacks.append((span, child_path, child))
        elif not isinstance(child, _CONTAINERS):
            others.append((span, child_path, child))
    stacks.sort(key=lambda item: item[0].first.forward_start_event)
    # The run of stacks around ``stack``, each run on what the one before made.
    start = end = next(index for index, item in enumerate(stacks) if item[2] is stack)
    while start > 0 and chains.follows(stacks[start - 1][0].last, stacks[start][0].first):
        start -= 1
    while end + 1 < len(stacks) and chains.follows(stacks[end][0].last, stacks[end + 1][0].first):
        end += 1
    stacks = stacks[start : end + 1]
    if len(stacks) < 2:
        return [(name, stack)]
    others.sort(key=lambda item: item[0].first.forward_start_event)
    path = [(stacks[0][1], stacks[0][2])]
    for (before, _, _), (after, after_name, after_stack) in itertools.pairwise(stacks):
        path += [
            (other_name, other)
            for span, other_name, other in others
            if before.last.forward_end_event <= span.first.forward_start_event
            and span.last.forward_end_event <= after.first.forward_start_event
            and len(_inner_blocks(other_name, other, chains)) > 1
        ]
        path.append((after_name, after_stack))
    return path


def _own_checkpointing_layers(
    model: torch.nn.Module, chains: _Chains
) -> tuple[tuple[str, ...], ...]:
    """The layers transformers' own gradient checkpointing wraps in a recorded step: the
    outermost ``GradientCheckpointingLayer`` instances that ran, one stack per module holding
    them, in the order they ran (a vision-language model's vision tower layers, then its
    language model's). Empty without a recorded step, for a model with none (not a
    transformers model, or one of its classes from before those layers) or where transformers
    is not imported."""
    modeling = sys.modules.get("transformers.modeling_layers")
    layer_class = getattr(modeling, "GradientCheckpointingLayer", None)
    if layer_class is None or not chains.recorded:
        return ()
    outermost: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, layer_class) and not any(
            name.startswith(f"{outer}.") for outer in outermost
        ):
            outermost.append(name)
    stacks: dict[str, list[tuple[int, str]]] = {}
    for name in outermost:
        call = chains.first(name)
        if call is not None:
            stacks.setdefault(name.rpartition(".")[0], []).append((call.forward_start_event, name))
    ordered = sorted(stacks.values(), key=min)
    return tuple(tuple(name for _, name in sorted(stack)) for stack in ordered)


def find_blocks(model: torch.nn.Module, timeline: MemoryTimeline | None = None) -> tuple[str, ...]:
    """The model's repeated blocks, the ones a user checkpoints by hand ("every block"): the
    blocks of :func:`find_block_stacks`, one stack after the other."""
    return tuple(block for stack in find_block_stacks(model, timeline) for block in stack)


def find_block_stacks(
    model: torch.nn.Module, timeline: MemoryTimeline | None = None
) -> tuple[tuple[str, ...], ...]:
    """The model's repeated blocks, the ones a user checkpoints by hand ("every block"), by
    stack: one stack for every model but an encoder-decoder, whose encoder's and decoder's
    blocks are two.

    Given a recorded step of a transformers model: the layers its own gradient checkpointing
    wraps (:func:`_own_checkpointing_layers`). Otherwise, by the rules below.

    Start from the stack with the most parameters: the children of the
    ``ModuleList``/``Sequential`` holding two or more blocks of one class (``blocks.*`` of
    a GPT, ``model.layers.*`` of a Llama), or, given the ``timeline`` of a recorded step,
    of a ``ModuleList`` of blocks of several classes that ran as a chain, each entry on
    the one before's output (a hybrid model's layers: Jamba's ``model.layers.*``, Mamba and
    attention layers; what Hugging Face's gradient checkpointing checkpoints). On
    convolutional networks that stack is one stage, or a stack of stages, and checkpointing
    a whole stage saves little, so two rules make it every residual block instead:

    * Sibling stages: an ``nn.Sequential`` stack joins its siblings (same parent) that are
      ``nn.Sequential`` stacks of the same block class, in registration order (torchvision's
      ``layer1.0`` ... ``layer4.1``).
    * Nested stages: a block that is itself an ``nn.Sequential`` of blocks, or that holds
      exactly one chain of blocks of one class (an ``nn.Sequential``, or, given the
      timeline, a ``ModuleList`` whose entries ran one after the other), is replaced by
      those blocks, recursively (``stages.0.1``; timm's ``stages.0.blocks.1``; Hugging
      Face ConvNeXt's ``stages.0.layers.1``).

    Transformer stacks are ``ModuleList``s whose blocks hold no chain of blocks of one class
    (a mixture's experts each run on their own tokens), so neither rule changes them. A third
    rule joins an encoder-decoder's two stacks, as Hugging Face's gradient checkpointing
    checkpoints both:

    * Twin stacks: a ``ModuleList`` stack joins the ``ModuleList`` stacks at the same path in
      its parent's siblings, in registration order (T5's ``encoder.block.*`` and
      ``decoder.block.*``; BART's ``model.encoder.layers.*`` and ``model.decoder.layers.*``,
      layers of two classes); each is a stack of its own.

    Without a timeline (sharding a model before any step), the answer is the one-class rules
    alone.
    """
    chains = _Chains(timeline)
    own = _own_checkpointing_layers(model, chains)
    if own:
        return own
    best: tuple[int, str, torch.nn.Module | None] = (0, "", None)
    for name, module in model.named_modules():
        if not isinstance(module, _CONTAINERS) or not _is_stack(name, module, chains):
            continue
        size = sum(p.numel() for p in module.parameters()) + len(module)
        if size > best[0]:
            best = (size, name, module)
    _, name, stack = best
    if stack is None:
        return ()
    twins = _twin_stacks(model, name, stack, chains)
    if len(twins) > 1:
        return tuple(_stack_blocks([twin], chains) for twin in twins)
    path = _main_path(model, name, stack, chains)
    if len(path) > 1:
        return (_stack_blocks(path, chains),)
    stacks = [(name, stack)]
    if name and isinstance(stack, torch.nn.Sequential):
        parent_name, _, _ = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        stacks = [
            (f"{parent_name}.{sibling_name}" if parent_name else sibling_name, sibling)
            for sibling_name, sibling in parent.named_children()
            if sibling is stack
            or (
                isinstance(sibling, torch.nn.Sequential)
                and _stack_class(sibling, at_least=1) is _stack_class(stack)
            )
        ]
    return (_stack_blocks(stacks, chains),)


def _stack_blocks(stacks: list[tuple[str, torch.nn.Module]], chains: _Chains) -> tuple[str, ...]:
    """The blocks of ``stacks``, one after the other: each entry's inner blocks (a module
    between stacks, :func:`_main_path`'s, is a stage of its own)."""
    blocks: list[str] = []
    for stack_name, stack_module in stacks:
        if not isinstance(stack_module, _CONTAINERS):
            blocks += _inner_blocks(stack_name, stack_module, chains)
            continue
        for child_name, child in stack_module.named_children():
            name = f"{stack_name}.{child_name}" if stack_name else child_name
            blocks += _inner_blocks(name, child, chains)
    return tuple(blocks)
