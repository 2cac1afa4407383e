"""Find a model's repeated blocks, the ones a user checkpoints by hand ("every block"):
:func:`find_blocks` (the ``blocks.*`` of a GPT, every residual block of a CNN), and tell
``torch.nn``'s own leaf layers, which are never checkpointed alone (:func:`_is_torch_layer`).
"""

from __future__ import annotations

import torch

__all__ = ["find_blocks"]


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
    and norms, which run several ops) are judged by what they free, like any module."""
    return type(module).__module__.startswith("torch.nn.") and not any(
        True for _ in module.children()
    )


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


def _inner_blocks(name: str, module: torch.nn.Module) -> list[str]:
    """The residual blocks inside one block of a stack, where it is a stage of them: a stage
    that is itself an ``nn.Sequential`` of blocks (``stages.0`` -> ``stages.0.1``), or a
    stage module holding one (timm's ``stages.0`` -> ``stages.0.blocks.1``). Only
    ``nn.Sequential`` counts, which runs its children one after the other: a ``ModuleList``
    inside a block (experts of a mixture) is not a chain of blocks. Otherwise ``[name]``."""
    if isinstance(module, torch.nn.Sequential) and _stack_class(module, at_least=1):
        stage = [(name, module)]
    else:
        stage = [
            (f"{name}.{child_name}", child)
            for child_name, child in module.named_children()
            if isinstance(child, torch.nn.Sequential) and _stack_class(child, at_least=1)
        ]
        if len(stage) != 1:
            return [name]
    stage_name, stage_module = stage[0]
    return [
        block
        for child_name, child in stage_module.named_children()
        for block in _inner_blocks(f"{stage_name}.{child_name}", child)
    ]


def find_blocks(model: torch.nn.Module) -> tuple[str, ...]:
    """The model's repeated blocks, the ones a user checkpoints by hand ("every block").

    Start from the stack with the most parameters: the children of the
    ``ModuleList``/``Sequential`` holding two or more blocks of one class
    (``blocks.*`` of a GPT, ``model.layers.*`` of a Llama). On convolutional networks that
    stack is one stage, or a stack of stages, and checkpointing a whole stage saves little,
    so two rules make it every residual block instead:

    * Sibling stages: an ``nn.Sequential`` stack joins its siblings (same parent) that are
      ``nn.Sequential`` stacks of the same block class, in registration order (torchvision's
      ``layer1.0`` ... ``layer4.1``).
    * Nested stages: a block that is itself an ``nn.Sequential`` of blocks, or that holds
      exactly one such ``nn.Sequential``, is replaced by those blocks, recursively
      (``stages.0.1``; timm's ``stages.0.blocks.1``).

    Transformer stacks are ``ModuleList``s whose blocks hold no ``nn.Sequential`` of blocks,
    so neither rule changes them; stacks in different parents (T5's encoder and decoder
    blocks) stay apart.
    """
    best: tuple[int, str, torch.nn.Module | None] = (0, "", None)
    for name, module in model.named_modules():
        if _stack_class(module) is None:
            continue
        size = sum(p.numel() for p in module.parameters()) + len(module)
        if size > best[0]:
            best = (size, name, module)
    _, name, stack = best
    if stack is None:
        return ()
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
    return tuple(
        block
        for stack_name, stack_module in stacks
        for child_name, child in stack_module.named_children()
        for block in _inner_blocks(
            f"{stack_name}.{child_name}" if stack_name else child_name, child
        )
    )
