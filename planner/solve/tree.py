"""The unit tree: what a plan may choose, and which choices exclude each other.

A unit (:class:`~planner.core.records.Unit`) is a candidate module (``blocks.3``: wrap it in
``checkpoint``); for a candidate ``nn.Sequential`` with at least three children,
``name#k``: ``checkpoint_sequential`` over its children in ``k`` segments; or one of a
candidate's options (``blocks.3@save-matmuls``: a selective policy,
:mod:`planner.plan.policies`; or nesting), each with its own cost. Every unit sits
on one node of the module tree; a plan uses at most one unit per root-to-leaf path (never a
module together with its ancestor: wrapping a parent already recomputes its children). Built
once per profile; read-only afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable

from planner.core.records import Profile, Unit
from planner.plan.memory_model import MemoryModel, sequential_segments
from planner.plan.policies import NESTED, OFFLOAD_OPTIONS

__all__ = ["UnitTree", "is_ancestor", "tree_key"]


def is_ancestor(ancestor: str, name: str) -> bool:
    return ancestor == "" or name.startswith(ancestor + ".")


def tree_key(name: str) -> tuple[object, ...]:
    """Sort key that puts a module right before its descendants, numbered children in order."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in name.split("."))


class UnitTree:
    """A profile's units in tree pre-order, their costs, and the tree of unit-bearing nodes.

    ``names``: the units, the alternatives of one node adjacent; ``cost_ms``: each unit's
    recompute time; ``node_of``: the module a unit sits on; ``skip_to[i]``: the first unit
    after unit ``i``'s node and its whole subtree; ``nodes`` (pre-order), ``node_units``,
    ``node_parent`` (None: the root), ``node_children``; ``plan_count``: how many plans
    (antichains of units) there are; ``host_bytes``: what each offload unit holds in host
    memory (0 for the others).
    """

    def __init__(
        self,
        profile: Profile,
        memory: MemoryModel,
        *,
        sequential: bool = True,
        options: bool = True,
        nesting: bool = True,
        offload: bool = True,
    ) -> None:
        memory.include_nesting(profile)
        candidates = sorted(profile.candidates, key=lambda m: tree_key(m.module_name))
        self.cost_ms: dict[Unit, float] = {}
        self.node_of: dict[Unit, str] = {}
        for record in candidates:
            whole = Unit(record.module_name)
            self.cost_ms[whole] = record.forward_ms
            self.node_of[whole] = record.module_name
            if options:
                for option in record.options:
                    if option.option == NESTED and not nesting:
                        continue
                    if option.option in OFFLOAD_OPTIONS and not offload:
                        continue
                    unit = Unit(record.module_name, option=option.option)
                    self.cost_ms[unit] = option.recompute_ms
                    self.node_of[unit] = record.module_name
            # checkpoint_sequential cannot restore buffers after recomputing (a wrapped
            # module can), so a Sequential whose forward changes buffers gets no segments.
            if sequential and record.module_type == "Sequential" and not record.mutated_buffers:
                for unit, cost in _sequential_units(profile, memory, record.module_name):
                    self.cost_ms[unit] = cost
                    self.node_of[unit] = record.module_name
        self.names: tuple[Unit, ...] = tuple(
            sorted(self.cost_ms, key=lambda u: (tree_key(self.node_of[u]), u))
        )
        self.host_bytes: dict[Unit, int] = {unit: memory.host_bytes(unit) for unit in self.names}
        self.index = {unit: i for i, unit in enumerate(self.names)}
        self.skip_to: list[int] = []
        for index, unit in enumerate(self.names):
            node = self.node_of[unit]
            end = index + 1
            while end < len(self.names) and (
                self.node_of[self.names[end]] == node
                or is_ancestor(node, self.node_of[self.names[end]])
            ):
                end += 1
            self.skip_to.append(end)
        # A node's parent: its nearest unit-bearing ancestor; children in pre-order.
        self.nodes: list[str] = sorted(set(self.node_of.values()), key=tree_key)
        self.node_units: dict[str, list[int]] = {node: [] for node in self.nodes}
        for index, unit in enumerate(self.names):
            self.node_units[self.node_of[unit]].append(index)
        self.node_parent: dict[str, str | None] = {}
        self.node_children: dict[str | None, list[str]] = {None: []}
        stack: list[str] = []
        for node in self.nodes:
            while stack and not is_ancestor(stack[-1], node):
                stack.pop()
            parent = stack[-1] if stack else None
            self.node_parent[node] = parent
            self.node_children[parent].append(node)
            self.node_children[node] = []
            stack.append(node)
        self.plan_count = self._count_plans()

    def _count_plans(self) -> float:
        """Per node, its own units plus the product over its child nodes; a product over
        the roots."""
        count: dict[str, float] = {}
        for node in reversed(self.nodes):  # children before parents
            product = 1.0
            for child in self.node_children[node]:
                product *= count[child]
            count[node] = len(self.node_units[node]) + product
        total = 1.0
        for node in self.node_children[None]:
            total *= count[node]
        return total

    def cost(self, units: Iterable[Unit]) -> float:
        return sum(self.cost_ms[unit] for unit in units)

    def host(self, units: Iterable[Unit]) -> int:
        """The host memory a plan's offloaded modules hold, at most: the sum of theirs
        (equal to the peak where every forward ends before any backward begins: one step
        of a plain loop)."""
        return sum(self.host_bytes[unit] for unit in units)

    def conflicts(self, first: Unit, second: Unit) -> bool:
        """Whether two units may not be chosen together (one node, or one path)."""
        a, b = self.node_of[first], self.node_of[second]
        return a == b or is_ancestor(a, b) or is_ancestor(b, a)


def _sequential_units(profile: Profile, memory: MemoryModel, name: str) -> list[tuple[Unit, float]]:
    """``checkpoint_sequential`` units for each distinct segmentation of a Sequential's
    children."""
    calls = memory.calls_of(name)
    counts = {len(memory.child_calls(call)) for call in calls}
    if len(counts) != 1:
        return []
    (count,) = counts
    units, seen = [], set()
    children = sorted(
        (
            m
            for m in profile.modules
            if m.module_name.startswith(name + ".") and "." not in m.module_name[len(name) + 1 :]
        ),
        key=lambda m: tree_key(m.module_name),
    )
    if count < 3 or len(children) != count:
        return []
    for segments in range(2, count + 1):
        spans = tuple(sequential_segments(count, segments))
        if not spans or spans in seen:
            continue
        seen.add(spans)
        members = [children[i].module_name for first, last in spans for i in range(first, last + 1)]
        units.append(
            (Unit(name, segments=segments), segments_cost_ms(profile, name, members, spans))
        )
    return units


def segments_cost_ms(
    profile: Profile, name: str, members: list[str], spans: tuple[tuple[int, int], ...]
) -> float:
    """The recomputation of ``checkpoint_sequential`` on Sequential ``name``: its checkpointed
    children's (``members``, in ``spans``) forward times, with checkpointing's own per-call
    cost once per segment and call of ``name`` instead of once per child's call (each
    child's ``forward_ms`` includes it as if it were checkpointed alone)."""
    total = sum(profile.module(child).forward_ms for child in members)
    child_calls = sum(profile.module(child).call_count for child in members)
    segment_calls = len(spans) * profile.module(name).call_count
    return total - profile.checkpoint_call_ms * max(0, child_calls - segment_calls)
