"""Selective checkpointing options: which op outputs a checkpointed module keeps.

Pure Python (no torch). ``torch.utils.checkpoint`` with
``context_fn=partial(create_selective_checkpoint_contexts, policy_fn)`` recomputes a
module's forward in backward like whole-module checkpointing, except that the outputs of
the ops the policy marks ``MUST_SAVE`` are kept from the forward (in the checkpoint's cache)
and handed back during recomputation instead of being computed again. Each option trades
memory (what it keeps) for time (what it still recomputes); the solver weighs them by cost.

Design notes
------------
* **Named, stable policies, concrete op lists.** A policy is a rule over op *families*
  (:class:`SelectivePolicy`); the ops it saves in one module are the family's ops that the
  profile saw in that module's forward (``addmm`` for a Linear with a bias, ``mm`` without,
  ``_scaled_dot_product_flash_attention_for_cpu`` for CPU attention). A rule written for
  other op names (torchtitan's list names ``aten.mm`` only) would save nothing on a model
  whose Linears have biases. The plan JSON records the concrete list.
* **What a policy keeps is measured, not assumed.** It keeps *every* output of every op it
  marks, whether backward needs it or not: the memory model replays exactly those
  storages (:func:`kept_storages`), alive from their op until the module's recomputation.
* **Never a cached output that is written later.** ``torch.utils.checkpoint`` checks that a
  cached output is unchanged when it hands it back and raises if not; an op whose output is
  later written in place (``relu_``, dropout's ``bernoulli_``) is left out of the list, so a
  plan never fails a step. Random ops and everything else are recomputed (with the RNG
  state replayed, as whole-module checkpointing does).
* **torchtitan's rule** saves attention and every other matrix multiply (the 1st, 3rd, ...
  in the module's forward), counting ``mm`` and ``addmm`` together so that it means the
  same with biases as without.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from planner.core.records import Name, StorageLifetime, Unit

__all__ = [
    "MATMUL_OPS",
    "NESTED",
    "OFFLOAD",
    "OFFLOAD_AT_USE",
    "OFFLOAD_MIN_BYTES",
    "OFFLOAD_OPTIONS",
    "PolicyRule",
    "SelectivePolicy",
    "is_attention_op",
    "is_matmul_op",
    "kept_storages",
    "option_summary",
    "policy_rules",
    "unit_how",
]


NESTED = "nested"
"""The option that nests: ``Unit("blocks.0", option=NESTED)`` checkpoints ``blocks.0`` and,
inside it, its candidate children (:mod:`planner.plan.memory_model`, point 6)."""


OFFLOAD = "offload"
"""The option that offloads: ``Unit("blocks.0", option=OFFLOAD)`` copies the tensors
``blocks.0`` saves for backward (those of at least :data:`OFFLOAD_MIN_BYTES`, not its inputs
or outputs, not parameters) to host memory when its forward ends, and back when its
backward begins (:mod:`planner.plan.memory_model`, point 7; :mod:`planner.apply.offload`).
Nothing is recomputed; the cost is the transfer time the compute does not hide. The copy
back starts one module early, at the backward of the next block (point 8), so that the
compute of that backward hides it."""

OFFLOAD_AT_USE = "offload-at-use"
"""Offload with the copy back at the module's own backward (not prefetched): the device
holds its tensors for less time than under :data:`OFFLOAD` (not during the backward of the
module before it), and the copy back is paid in full. A plan's offload decision without a
``prefetch_module`` is this option."""

OFFLOAD_OPTIONS = frozenset({OFFLOAD, OFFLOAD_AT_USE})
"""The options that offload."""

OFFLOAD_MIN_BYTES = 2**20
"""The smallest saved storage an offloaded module sends to host memory (1 MiB): a smaller
one costs a copy's fixed latency for little memory."""


class SelectivePolicy(Name):
    """The selective checkpointing options a candidate module may get."""

    SAVE_MATMULS = "save-matmuls"
    """Outputs of matrix multiplies (``mm``, ``addmm``, ``bmm``, ``baddbmm``) saved;
    everything else recomputed."""
    SAVE_ATTENTION = "save-attention"
    """Outputs of fused attention (``scaled_dot_product_attention``'s kernels) saved."""
    SAVE_MATMULS_AND_ATTENTION = "save-matmuls-and-attention"
    """Both of the above."""
    TORCHTITAN = "torchtitan"
    """torchtitan's "selective op" rule: attention saved, and every other matrix multiply."""


MATMUL_OPS = frozenset(
    {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default"}
)
# torchtitan alternates over the 2-D matmuls only (its list names aten.mm); addmm added.
_ALTERNATING_MATMULS = frozenset({"aten.mm.default", "aten.addmm.default"})


def is_matmul_op(op: str) -> bool:
    return op in MATMUL_OPS


def is_attention_op(op: str) -> bool:
    """A fused attention kernel's forward (any backend ``scaled_dot_product_attention``
    picks: flash, efficient, cuDNN, math-for-CPU), or FlexAttention's (its higher-order
    operator, ``flex_attention``, which torchtitan's rule saves too)."""
    if op == "flex_attention":
        return True
    name = op.removeprefix("aten.")
    return (
        name.startswith(("_scaled_dot_product_", "_flash_attention_forward"))
        or name.startswith("_efficient_attention_forward")
    ) and "backward" not in name


@dataclass(frozen=True)
class PolicyRule:
    """One policy made concrete for one module: the ops whose outputs are always saved,
    and the ops of which every other call is saved (the 1st, 3rd, ...; counted together in
    the order they run). Both are op names as the profile records them
    (``"aten.addmm.default"``)."""

    policy: SelectivePolicy
    saved_ops: tuple[str, ...]
    alternating_ops: tuple[str, ...] = ()

    def saved_flags(self, ops: Iterable[str]) -> list[bool]:
        """For each op call of one forward, in order, whether the policy saves its output:
        every call of ``saved_ops``, and the 1st, 3rd, ... call of ``alternating_ops``
        (counted together)."""
        flags = []
        alternation = 0
        for op in ops:
            if op in self.alternating_ops:
                flags.append(alternation % 2 == 0)
                alternation += 1
            else:
                flags.append(op in self.saved_ops)
        return flags


def _family(policy: SelectivePolicy, ops: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    ops = sorted(set(ops))
    matmuls = tuple(op for op in ops if is_matmul_op(op))
    attention = tuple(op for op in ops if is_attention_op(op))
    if policy is SelectivePolicy.SAVE_MATMULS:
        return matmuls, ()
    if policy is SelectivePolicy.SAVE_ATTENTION:
        return attention, ()
    if policy is SelectivePolicy.SAVE_MATMULS_AND_ATTENTION:
        return tuple(sorted(matmuls + attention)), ()
    alternating = tuple(op for op in matmuls if op in _ALTERNATING_MATMULS)
    always = tuple(sorted(attention + tuple(op for op in matmuls if op not in alternating)))
    return always, alternating


def policy_rules(made_inside: Sequence[StorageLifetime]) -> list[PolicyRule]:
    """The policies that make sense for a module whose forward made these storages (every
    call's, in allocation order): each policy's op list is its family's ops among the
    storages' ops, less any op one of whose outputs is later written in place. A policy
    that would save nothing is left out, as is one that saves the same ops as an earlier
    one."""
    ops = {storage.alloc_op for storage in made_inside if storage.alloc_op}
    unsafe = {
        storage.alloc_op for storage in made_inside if storage.alloc_op and storage.written_in_place
    }
    rules: list[PolicyRule] = []
    seen: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
    for policy in SelectivePolicy:
        saved, alternating = _family(policy, ops - unsafe)
        key = (saved, alternating)
        if not (saved or alternating) or key in seen:
            continue
        seen.add(key)
        rules.append(PolicyRule(policy, saved, alternating))
    return rules


def kept_storages(made_inside: Sequence[StorageLifetime], rule: PolicyRule) -> list[int]:
    """Positions in ``made_inside`` (one call's storages, in allocation order) that
    ``rule`` keeps: the outputs of the ops it saves. Each op call makes its own output
    storage, so counting the outputs of the alternating ops counts their calls."""
    flags = rule.saved_flags(storage.alloc_op for storage in made_inside)
    return [position for position, saved in enumerate(flags) if saved]


def nested_recompute_ms(
    outer: str, inner_modules: Iterable[str], forward_ms: Callable[[str], float]
) -> float:
    """What nesting costs: the outer module's forward once more, and its inner modules'
    forwards once more again (they run three times: forward, the outer recomputation, and
    their own), by ``forward_ms`` of a module name (measured or estimated)."""
    return forward_ms(outer) + sum(forward_ms(name) for name in inner_modules)


def unit_how(unit: Unit) -> str:
    """How a unit checkpoints, in a word or two: ``"whole"`` (a whole module), ``"3
    segments"`` (``checkpoint_sequential``), or the option's name (``"save-matmuls"``,
    ``"nested"``)."""
    return unit.option or (f"{unit.segments} segments" if unit.segments else "whole")


def option_summary(units: Iterable[Unit]) -> str:
    """How a plan's units checkpoint, counted (:func:`unit_how`): ``"4 save-matmuls, 2
    whole"``, or ``"none"``."""
    counts: dict[str, int] = {}
    for unit in units:
        how = unit_how(unit)
        counts[how] = counts.get(how, 0) + 1
    return ", ".join(f"{count} {how}" for how, count in sorted(counts.items())) or "none"
