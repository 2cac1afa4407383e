"""The solver on synthetic profiles: plans are antichains, optimal under the memory model
(checked against brute force on random small trees), and infeasible budgets are explained.

Profiles are built by hand: a timeline (hand-written, or simulated below from a random
module tree) plus one ModuleProfile per module, as ``planner.measure.profiler._module_profiles``
fills them. No torch.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace

import pytest

from planner.core.errors import InfeasibleBudgetError
from planner.core.records import (
    PROFILE_SCHEMA_VERSION,
    MemoryTimeline,
    ModuleCall,
    ModuleProfile,
    Profile,
    StorageLifetime,
    Unit,
)
from planner.plan.memory_model import MemoryModel
from planner.solve import Solver, lowest_peak, solve
from planner.solve.planning import plan_for_budget
from planner.solve.tree_dp import Incompatible
from tests.test_memory_model import timeline_a, timeline_b


# -- building profiles -----------------------------------------------------------------
def _module_profile(name: str, forward_ms: float, excluded_reason: str = "") -> ModuleProfile:
    return ModuleProfile(
        module_name=name,
        module_type="Block",
        depth=name.count(".") + 1 if name else 0,
        call_count=1,
        parameter_bytes=0,
        saved_bytes=0,
        checkpoint_saving_bytes=0,
        input_bytes=0,
        output_bytes=0,
        recompute_peak_bytes=0,
        forward_ms=forward_ms,
        uses_rng=False,
        excluded_reason=excluded_reason,
    )


def _profile(
    timeline: MemoryTimeline,
    forward_ms: dict[str, float],
    *,
    parameter_bytes: int = 0,
    block_names: tuple[str, ...] = (),
) -> Profile:
    """A profile whose candidates are the modules in ``forward_ms``; the root is excluded."""
    modules = [_module_profile("", sum(forward_ms.values()) + 1.0, "the root module")]
    modules += [_module_profile(name, ms) for name, ms in forward_ms.items()]
    return Profile(
        schema_version=PROFILE_SCHEMA_VERSION,
        model_name="synthetic",
        model_file="synthetic.py",
        device="cpu",
        torch_version="test",
        fingerprint={},
        batch={},
        step_ms=100.0,
        measured_peak_bytes=MemoryModel(timeline).peak_bytes(),
        parameter_bytes=parameter_bytes,
        buffer_bytes=0,
        gradient_bytes=0,
        optimizer_state_bytes=0,
        modules=tuple(modules),
        timeline=timeline,
        block_names=block_names,
    )


@dataclass
class _Simulator:
    """Simulates the timeline of one step of a random module tree.

    Each module's forward runs its children and one or two ops of its own in random order,
    threading one tensor through. An op may make a temporary, makes an output, and may save
    its output and/or its input for backward. A storage dies when both its Python reference
    is gone and every saved use of it has been unpacked. Backward unpacks in reverse packing
    order, making and freeing gradient storages on the way.
    """

    rng: random.Random
    event: int = 0
    storages: list[dict] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    packs: list[tuple[int, int]] = field(default_factory=list)

    def tick(self) -> int:
        self.event += 1
        return self.event

    def alloc(self, call: int, kind: str = "activation", before_step: bool = False) -> int:
        size = self.rng.choice([8, 16, 24, 40, 64, 96, 128, 200])
        self.storages.append(
            {
                "size": size,
                "alloc": -1 if before_step else self.tick(),
                "free": None,
                "call": call,
                "kind": kind,
                "dropped": False,
                "pending": 0,
            }
        )
        return len(self.storages) - 1

    def drop(self, index: int) -> None:
        record = self.storages[index]
        record["dropped"] = True
        if record["pending"] == 0 and record["free"] is None:
            record["free"] = self.tick()

    def pack(self, call: int, index: int) -> None:
        self.calls[call]["saved"].append(index)
        self.storages[index]["pending"] += 1
        self.packs.append((call, index))

    def forward(
        self, name: str, children: dict, parent: int, x: int, shared: int | None = None
    ) -> int:
        """``shared``: with it, the root makes one more storage (a mask, say) and hands it to
        every top-level module as a second input; their ops may save it."""
        call = len(self.calls)
        inputs = (x,) if shared is None or name == "" else (x, shared)
        self.calls.append(
            {"name": name, "parent": parent, "start": self.tick(), "inputs": inputs, "saved": []}
        )
        if name == "" and shared is not None:
            shared = self.alloc(call)
        steps = list(children.items()) + [None] * self.rng.randint(1, 2)
        self.rng.shuffle(steps)
        current = x
        for step in steps:
            if step is not None:
                new = self.forward(step[0], step[1], call, current, shared if name == "" else None)
            else:
                if shared is not None and name != "" and self.rng.random() < 0.5:
                    self.pack(call, shared)
                temporary = self.alloc(call) if self.rng.random() < 0.5 else None
                new = self.alloc(call)
                if temporary is not None:
                    self.drop(temporary)
                if self.rng.random() < 0.7:
                    self.pack(call, new)
                if self.rng.random() < 0.4:
                    self.pack(call, current)
            if current != x:
                self.drop(current)
            current = new
        if name == "" and shared is not None:
            self.drop(shared)
        self.calls[call]["end"] = self.tick()
        self.calls[call]["outputs"] = (current,)
        return current

    def run(self, tree: dict, shared_input: bool = False) -> MemoryTimeline:
        self.alloc(-1, kind="parameter", before_step=True)
        x = self.alloc(-1, kind="batch", before_step=True)
        out = self.forward("", tree, -1, x, -1 if shared_input else None)
        gradient = self.alloc(-1)
        self.drop(out)
        unpacks: dict[int, list[int]] = {}
        for call, index in reversed(self.packs):
            if self.rng.random() < 0.5:
                new_gradient = self.alloc(-1)
                self.drop(gradient)
                gradient = new_gradient
            unpacks.setdefault(call, []).append(self.tick())
            record = self.storages[index]
            record["pending"] -= 1
            if record["pending"] == 0 and record["dropped"]:
                record["free"] = self.tick()
        self.alloc(-1, kind="gradient")
        self.drop(gradient)
        event_count = self.event + 1
        storages = tuple(
            StorageLifetime(
                size_bytes=s["size"],
                alloc_event=s["alloc"],
                free_event=event_count if s["free"] is None else s["free"],
                alloc_call=s["call"],
                kind=s["kind"],
            )
            for s in self.storages
        )
        calls = tuple(
            ModuleCall(
                module_name=c["name"],
                parent_call=c["parent"],
                forward_start_event=c["start"],
                forward_end_event=c["end"],
                first_unpack_event=min(unpacks.get(i, [-1])),
                last_unpack_event=max(unpacks.get(i, [-1])),
                input_storages=c["inputs"],
                output_storages=c["outputs"],
                saved_storages=tuple(dict.fromkeys(c["saved"])),
                uses_rng=False,
                mutated_buffers=(),
                devices=("cpu",),
            )
            for i, c in enumerate(self.calls)
        )
        return MemoryTimeline(event_count=event_count, storages=storages, calls=calls)


def _random_tree(rng: random.Random, max_modules: int = 8) -> dict:
    """A nested dict name -> children, at most ``max_modules`` modules below the root."""
    count = 0

    def children(prefix: str, depth: int) -> dict:
        nonlocal count
        result = {}
        for index in range(rng.randint(1, 3) if depth == 0 else rng.randint(0, 2)):
            if count >= max_modules:
                break
            count += 1
            name = f"{prefix}{index}" if not prefix else f"{prefix}.{index}"
            result[name] = children(name, depth + 1) if depth < 2 else {}
        return result

    tree = {}
    for index in range(rng.randint(2, 4)):
        if count >= max_modules:
            break
        count += 1
        name = f"layers.{index}"
        tree[name] = children(name, 1)
    return tree


def _names(tree: dict) -> list[str]:
    return [name for name, sub in tree.items() for name in [name, *_names(sub)]]


def random_profile(seed: int, exclude_some: bool = False, shared_input: bool = False) -> Profile:
    """A random tree of at most 8 modules and its simulated step. With ``exclude_some``, a
    third of the modules (same tree and timeline) are not candidates; with
    ``shared_input``, one storage is an input of every top-level module."""
    rng = random.Random(seed)
    tree = _random_tree(rng)
    timeline = _Simulator(rng).run(tree, shared_input)
    forward_ms = {name: round(rng.uniform(0.5, 5.0), 2) for name in _names(tree)}
    profile = _profile(timeline, forward_ms, block_names=tuple(tree))
    if exclude_some:
        other = random.Random(-seed - 1)
        modules = tuple(
            replace(m, excluded_reason="checkpointing it frees nothing")
            if m.module_name and other.random() < 1 / 3
            else m
            for m in profile.modules
        )
        profile = replace(profile, modules=modules)
    return profile


def _is_ancestor(ancestor: str, name: str) -> bool:
    return name.startswith(ancestor + ".")


def _antichains(names: list[str]) -> list[tuple[Unit, ...]]:
    return [
        tuple(Unit(name) for name in subset)
        for size in range(len(names) + 1)
        for subset in itertools.combinations(names, size)
        if not any(
            _is_ancestor(a, b) or _is_ancestor(b, a) for a, b in itertools.combinations(subset, 2)
        )
    ]


def _brute_force(profile: Profile) -> list[tuple[float, int, tuple[Unit, ...]]]:
    """(cost, peak, plan) of every antichain of candidates, with a fresh memory model."""
    memory = MemoryModel(profile.timeline)
    names = [m.module_name for m in profile.candidates]
    cost = {m.module_name: m.forward_ms for m in profile.candidates}
    return [
        (sum(cost[u.module] for u in plan), memory.peak_bytes(plan), plan)
        for plan in _antichains(names)
    ]


def _assert_antichain(units: tuple[Unit, ...]) -> None:
    for a, b in itertools.permutations((unit.module for unit in units), 2):
        assert not _is_ancestor(a, b), f"{a} is wrapped together with its descendant {b}"


# -- the simulator itself makes sensible timelines --------------------------------------
def test_random_profiles_are_well_formed_and_interesting() -> None:
    reducible = 0
    for seed in range(50):
        profile = random_profile(seed)
        timeline = profile.timeline
        assert 1 <= len(profile.candidates) <= 8
        for storage in timeline.storages:
            assert storage.alloc_event < storage.free_event <= timeline.event_count
        for call in timeline.calls:
            assert call.forward_start_event < call.forward_end_event
            if call.saved_storages:
                assert call.first_unpack_event > call.forward_end_event
        peaks = [peak for _, peak, _ in _brute_force(profile)]
        reducible += min(peaks) < peaks[0]  # peaks[0] is the empty plan's
    # Most cases have a plan that lowers the peak, else the property test below is empty.
    assert reducible >= 40


# -- hand-written profiles ------------------------------------------------------------
@pytest.fixture
def chain_profile() -> Profile:
    """Timeline A of tests/test_memory_model.py: two blocks, one saved activation each.
    Peaks: {} 1370, {blocks.0} 1270, {blocks.1} 1390, {blocks.0, blocks.1} 1290."""
    return _profile(
        timeline_a(),
        {"blocks.0": 2.0, "blocks.1": 3.0},
        parameter_bytes=1000,
        block_names=("blocks.0", "blocks.1"),
    )


def test_chain_profile_peaks(chain_profile: Profile) -> None:
    memory = MemoryModel(chain_profile.timeline)
    assert memory.peak_bytes() == 1370
    assert memory.peak_bytes([Unit("blocks.0")]) == 1270
    assert memory.peak_bytes([Unit("blocks.1")]) == 1390
    assert memory.peak_bytes([Unit("blocks.0"), Unit("blocks.1")]) == 1290


@pytest.mark.parametrize("budget_bytes", [1370, 1371, 10**12])
def test_budget_at_or_above_the_unplanned_peak_gives_the_empty_plan(
    chain_profile: Profile, budget_bytes: int
) -> None:
    solution = solve(chain_profile, budget_bytes)
    assert solution.units == ()
    assert solution.predicted_peak_bytes == 1370
    assert solution.recompute_ms == 0.0
    assert solution.proven_optimal


@pytest.mark.parametrize("budget_bytes", [1270, 1290, 1369])
def test_chain_budget_below_the_unplanned_peak(chain_profile: Profile, budget_bytes: int) -> None:
    # Only plans containing blocks.0 fit; blocks.0 alone is the cheapest.
    solution = solve(chain_profile, budget_bytes)
    assert solution.units == (Unit("blocks.0"),)
    assert solution.predicted_peak_bytes == 1270
    assert solution.recompute_ms == 2.0
    assert solution.proven_optimal


def test_infeasible_budget_says_the_smallest_budget(chain_profile: Profile) -> None:
    with pytest.raises(InfeasibleBudgetError) as raised:
        solve(chain_profile, 1269)
    error = raised.value
    assert error.budget_bytes == 1269
    assert error.min_budget_bytes == 1270
    assert "1270 bytes" in str(error)
    # The static part is mentioned too (1000 bytes of parameters).
    assert "1000 B" in str(error)
    assert lowest_peak(chain_profile) == 1270
    assert solve(chain_profile, error.min_budget_bytes).units == (Unit("blocks.0"),)


def test_a_budget_a_few_bytes_short_prints_two_different_sizes() -> None:
    # Timeline A in MiB: the smallest budget is 1270 MiB; 5 bytes under it rounds to the
    # same 1270.00 MiB, so the message must print enough to tell them apart.
    timeline = timeline_a()
    storages = tuple(
        replace(storage, size_bytes=storage.size_bytes * 2**20) for storage in timeline.storages
    )
    profile = _profile(
        replace(timeline, storages=storages),
        {"blocks.0": 2.0, "blocks.1": 3.0},
        parameter_bytes=1000 * 2**20,
    )
    budget = 1270 * 2**20 - 5
    with pytest.raises(InfeasibleBudgetError) as raised:
        solve(profile, budget)
    assert raised.value.min_budget_bytes == 1270 * 2**20
    message = str(raised.value)
    fits = message.split("no checkpointing plan fits ")[1].split(":")[0]
    smallest = message.split("the smallest budget that fits is ")[1].split(" (")[0]
    assert fits != smallest, message
    assert (fits, smallest) == (f"{budget:,} bytes", f"{1270 * 2**20:,} bytes")


def test_nested_candidates_are_never_chosen_with_their_ancestor() -> None:
    # Every reachable budget of 30 random trees (up to three levels of nesting).
    rng = random.Random(1234)
    nested_plans = 0
    for _ in range(30):
        profile = random_profile(rng.randrange(10**6))
        solver = Solver(profile)
        for budget_bytes in sorted({peak for _, peak, _ in _brute_force(profile)}):
            solution = solver.solve(budget_bytes)
            _assert_antichain(solution.units)
            nested_plans += any("." in n.removeprefix("layers.") for n in solution.module_names)
    assert nested_plans > 0  # some plans pick a nested module, so the check had teeth


def test_solver_picks_the_child_when_only_the_child_helps() -> None:
    # Timeline B of tests/test_memory_model.py: wrapping "block" raises the peak (1270 ->
    # 1330, its recompute spike), wrapping "block.inner" lowers it to 1190.
    timeline = timeline_b()
    profile = _profile(timeline, {"block": 1.0, "block.inner": 5.0}, parameter_bytes=1000)
    solution = solve(profile, 1200)
    assert solution.units == (Unit("block.inner"),)
    assert solution.predicted_peak_bytes == 1190
    assert solve(profile, 1270).units == ()
    with pytest.raises(InfeasibleBudgetError) as raised:
        solve(profile, 1189)
    assert raised.value.min_budget_bytes == 1190


# -- the property: optimal under the memory model -----------------------------------------
def _budgets(rng: random.Random, peaks: list[int]) -> list[int]:
    lowest, highest = min(peaks), max(peaks)
    distinct = sorted(set(peaks))
    return sorted({rng.choice(distinct), rng.choice(distinct), rng.randint(lowest, highest)})


@pytest.mark.parametrize("seed", range(50))
def test_solver_matches_brute_force(seed: int) -> None:
    profile = random_profile(seed, exclude_some=seed % 2 == 1)
    plans = _brute_force(profile)
    unplanned_peak = MemoryModel(profile.timeline).peak_bytes()
    solver = Solver(profile)
    rng = random.Random(seed)
    for budget_bytes in _budgets(rng, [peak for _, peak, _ in plans]):
        feasible = [cost for cost, peak, _ in plans if peak <= budget_bytes]
        if not feasible:
            with pytest.raises(InfeasibleBudgetError):
                solver.solve(budget_bytes)
            continue
        solution = solver.solve(budget_bytes)
        _assert_antichain(solution.units)
        assert solution.predicted_peak_bytes <= budget_bytes
        assert solution.predicted_peak_bytes == MemoryModel(profile.timeline).peak_bytes(
            solution.units
        )
        assert solution.recompute_ms == pytest.approx(
            sum(profile.module(n).forward_ms for n in solution.module_names)
        )
        assert solution.proven_optimal
        assert solution.recompute_ms == pytest.approx(min(feasible), abs=1e-9), (
            f"seed {seed}, budget {budget_bytes}: solver picked {solution.module_names}"
        )
        if budget_bytes >= unplanned_peak:
            assert solution.module_names == ()


@pytest.mark.parametrize("seed", range(50))
def test_infeasible_budget_reports_a_budget_that_then_solves(seed: int) -> None:
    profile = random_profile(seed)
    true_lowest = min(peak for _, peak, _ in _brute_force(profile))
    with pytest.raises(InfeasibleBudgetError) as raised:
        solve(profile, true_lowest - 1)
    error = raised.value
    assert error.budget_bytes == true_lowest - 1
    assert error.min_budget_bytes >= true_lowest
    assert f"{error.min_budget_bytes} bytes" in str(error)
    solution = solve(profile, error.min_budget_bytes)
    assert solution.predicted_peak_bytes <= error.min_budget_bytes


@pytest.mark.parametrize("seed", range(0, 300, 7))
def test_infeasible_budget_reports_the_true_smallest_budget(seed: int) -> None:
    profile = random_profile(seed)
    plans = _brute_force(profile)
    if not plans:
        pytest.skip("no candidates")
    true_lowest = min(peak for _, peak, _ in plans)
    with pytest.raises(InfeasibleBudgetError) as raised:
        solve(profile, true_lowest - 1)
    assert raised.value.min_budget_bytes == true_lowest
    assert solve(profile, true_lowest).predicted_peak_bytes == true_lowest


def test_search_cut_short_does_not_declare_a_feasible_budget_infeasible() -> None:
    profile = random_profile(43)
    lowest = min(peak for _, peak, _ in _brute_force(profile))
    assert solve(profile, lowest).proven_optimal  # default search: finished
    # Cut the exhaustive search short: the integer program must still find the optimum.
    solution = solve(profile, lowest, max_evaluations=1)
    assert solution.predicted_peak_bytes <= lowest
    assert solution.recompute_ms == solve(profile, lowest).recompute_ms


@pytest.mark.parametrize("seed", range(40))
def test_the_large_tree_path_matches_brute_force(seed: int) -> None:
    """Force the large-tree path (no exhaustive search: the tree program, or the integer
    program where a row is not of prefix form) on small trees we can enumerate."""
    profile = random_profile(seed)
    plans = _brute_force(profile)
    solver = Solver(profile, exhaustive_evaluations=0)
    lowest_names, lowest = solver.lowest_peak()
    assert lowest == min(peak for _, peak, _ in plans)
    _assert_antichain(lowest_names)
    peaks = sorted({peak for _, peak, _ in plans})
    for budget in peaks[:: max(1, len(peaks) // 6)]:
        best = min(cost for cost, peak, _ in plans if peak <= budget)
        solution = solver.solve(budget)
        assert solution.proven_optimal
        assert solution.predicted_peak_bytes <= budget
        _assert_antichain(solution.units)
        # Exact at the cost resolution (10 microseconds per unit).
        assert solution.recompute_ms == pytest.approx(
            best, abs=0.005 * len(solution.module_names) + 1e-9
        )


@pytest.mark.parametrize("seed", range(40))
def test_the_integer_program_matches_brute_force(seed: int) -> None:
    profile = random_profile(seed)
    plans = _brute_force(profile)
    solver = Solver(profile, exhaustive_evaluations=0)
    program = solver.integer_program()
    lowest_names = program.lowest_peak()
    assert solver.peak(lowest_names) == min(peak for _, peak, _ in plans)
    assert program.lowest_bound_bytes == solver.peak(lowest_names)  # proven
    _assert_antichain(lowest_names)
    peaks = sorted({peak for _, peak, _ in plans})
    for budget in peaks[:: max(1, len(peaks) // 6)]:
        best = min(cost for cost, peak, _ in plans if peak <= budget)
        names, proven = program.solve(budget)
        assert proven and names is not None
        assert solver.peak(names) <= budget
        _assert_antichain(names)
        assert solver.cost(names) == pytest.approx(best, abs=0.005 * len(names) + 1e-9)


@pytest.mark.parametrize("seed", range(40))
def test_a_stalled_lowest_peak_search_keeps_a_true_bound_and_agrees_with_solve(
    seed: int,
) -> None:
    """Where the integer program's lowest-peak bound stops rising (blocks of one shape can
    keep it still for hundreds of rounds), the search stops with the best plan found and
    the bound proven so far; a budget below that plan is refused, naming both."""
    profile = random_profile(seed)
    plans = _brute_force(profile)
    true_lowest = min(peak for _, peak, _ in plans)
    solver = Solver(profile, exhaustive_evaluations=0, nesting=False)
    program = solver.integer_program()
    program.stall_rounds = 0  # stop at the first round that proves nothing
    names = program.lowest_peak()
    _assert_antichain(names)
    assert program.lowest_bound_bytes <= true_lowest <= solver.peak(names)
    # Through the solver: a plan that fits at the found lowest, and no plan below it.
    solver = Solver(profile, exhaustive_evaluations=0, nesting=False)
    solver._integer_program = program
    solver._tree_program = None
    solver.tree_program = _incompatible  # type: ignore[method-assign]
    _, found = solver.lowest_peak()
    assert found == solver.peak(names) and solver.lowest_bound_bytes == program.lowest_bound_bytes
    assert solver.solve(found).predicted_peak_bytes <= found
    if found > 0:
        with pytest.raises(InfeasibleBudgetError) as refused:
            solver.solve(found - 1)
        assert refused.value.min_budget_bytes == found
        if solver.lowest_bound_bytes < found:
            assert "the lowest found, and no plan peaks below" in str(refused.value)


def test_an_integer_program_cut_short_keeps_a_true_bound() -> None:
    """Where HiGHS stops at its node limit (here at once: no node at all), the answer is a
    plan that fits (the fitting plan it was given, where it finds nothing cheaper), and
    ``cost_bound_ms`` is a true lower bound: no plan that fits costs less. Proven means the
    cheapest. The lowest-peak search cut short keeps a true bound too."""
    unproven = bounded = 0
    for seed in range(40):
        profile = random_profile(seed)
        plans = _brute_force(profile)
        solver = Solver(profile, exhaustive_evaluations=0)
        program = solver.integer_program()
        program.max_nodes = 0
        # The cost resolution: half a quantum per unit, at most every unit.
        slack = program.quantum_ms / 2 * len(solver.names) + 1e-9
        lowest_names = program.lowest_peak()
        true_lowest = min(peak for _, peak, _ in plans)
        assert program.lowest_bound_bytes <= true_lowest <= solver.peak(lowest_names)
        peaks = sorted({peak for _, peak, _ in plans})
        for budget in peaks[:: max(1, len(peaks) // 6)]:
            fitting = [(cost, plan) for cost, peak, plan in plans if peak <= budget]
            best = min(cost for cost, _ in fitting)
            given_cost, given = max(fitting)  # the dearest plan that fits
            names, proven = program.solve(budget, given)
            assert names is not None and solver.peak(names) <= budget
            _assert_antichain(names)
            assert solver.cost(names) <= given_cost + slack
            assert program.cost_bound_ms <= best + slack
            if proven:
                assert solver.cost(names) == pytest.approx(best, abs=slack)
            else:
                unproven += 1
                bounded += program.cost_bound_ms > 0
    assert unproven and bounded  # the property is not empty


def test_a_solution_cut_short_says_what_it_proved() -> None:
    """Through the solver: ``lower_bound_ms`` is the cost when proven, and otherwise a true
    lower bound of the cheapest plan that fits; the plan's note says the gap."""
    gaps = 0
    for seed in range(20):
        profile = random_profile(seed)
        plans = _brute_force(profile)
        solver = Solver(profile, exhaustive_evaluations=0, nesting=False)
        solver.tree_program = _incompatible  # type: ignore[method-assign]
        solver.integer_program().max_nodes = 0
        slack = solver.integer_program().quantum_ms / 2 * len(solver.names) + 1e-9
        _, lowest = solver.lowest_peak()
        for budget in sorted({peak for _, peak, _ in plans if peak >= lowest}):
            best = min(cost for cost, peak, _ in plans if peak <= budget)
            plan, solution = plan_for_budget(profile, budget, solver=solver)
            assert solution.predicted_peak_bytes <= budget
            assert solution.lower_bound_ms <= solution.recompute_ms
            assert solution.lower_bound_ms <= best + slack
            if solution.proven_optimal:
                assert solution.lower_bound_ms == solution.recompute_ms
                assert solution.recompute_ms == pytest.approx(best, abs=slack)
                assert "(search finished)" in plan.notes[0].text
            elif solution.lower_bound_ms > 0:
                gap_ms = solution.recompute_ms - solution.lower_bound_ms
                assert f"at most {gap_ms:.2f} ms" in plan.notes[0].text
                gaps += 1
    assert gaps  # the property is not empty


def _incompatible() -> None:
    raise Incompatible(("point", 0, -1))


def _tree_program_cases(seed: int, shared_input: bool = False) -> tuple[int, int, int]:
    """Check the tree program alone against brute force on one random tree, at budgets from
    just below the lowest feasible peak up. Returns (budgets it solved, budgets tried): a
    budget whose rows are not of prefix form is left to the integer program. The third
    number: rows that count a shared input (its flag)."""
    profile = random_profile(seed, exclude_some=seed % 3 == 2, shared_input=shared_input)
    plans = _brute_force(profile)
    solver = Solver(profile, exhaustive_evaluations=0)
    program = solver.tree_program()
    if shared_input and not program.classes:
        return 0, 0, 0
    peaks = sorted({peak for _, peak, _ in plans})
    budgets = [peaks[0] - 1, *peaks[:: max(1, len(peaks) // 8)]]
    solved = 0
    for budget in budgets:
        try:
            names = program.solve(budget)
        except Incompatible:
            continue
        solved += 1
        feasible = [cost for cost, peak, _ in plans if peak <= budget]
        if not feasible:
            assert names is None, (seed, budget)
            continue
        assert names is not None, (seed, budget)
        _assert_antichain(names)
        assert solver.peak(names) <= budget
        assert solver.cost(names) == pytest.approx(
            min(feasible), abs=program.quantum_ms / 2 * len(names) + 1e-9
        ), (seed, budget, names)
    flagged = sum(1 for row in program.rows.values() if row is not None and row.shared.any())
    return solved, len(budgets), flagged


def test_the_tree_program_matches_brute_force() -> None:
    """On 100 random trees every budget the tree program answers is the brute-force optimum,
    and the property is not empty: it answers a good share of the cases itself (the rest
    need the integer program)."""
    solved = tried = 0
    for seed in range(100):
        s, t, _ = _tree_program_cases(seed)
        solved += s
        tried += t
    # The cases are seeded, so the counts are fixed: 450 of 957 when written. Fewer means
    # the program lost a form of row it took (dropping the "before" filters loses 11).
    assert tried == 957 and solved >= 450, (solved, tried)


def test_the_tree_program_with_inputs_shared_by_blocks_matches_brute_force() -> None:
    """One storage handed to every top-level module (a mask): it lives while any chosen
    one of them holds it, which the program tracks with a flag per holder class."""
    solved = tried = flagged = 0
    for seed in range(200):
        s, t, f = _tree_program_cases(seed, shared_input=True)
        solved += s
        tried += t
        flagged += f
    # Seeded: 187 of 353 answered and 9 rows with a flag when written; without the flags
    # the program answers 184 and keeps 5 such rows.
    assert tried == 353 and solved >= 187 and flagged >= 9, (solved, tried, flagged)


def test_the_tree_program_finds_the_lowest_peak() -> None:
    solved = 0
    for seed in range(60):
        profile = random_profile(seed)
        plans = _brute_force(profile)
        solver = Solver(profile, exhaustive_evaluations=0)
        try:
            names = solver.tree_program().lowest_peak()
        except Incompatible:
            continue  # rows not of prefix form: the integer program's case
        solved += 1
        assert solver.peak(names) == min(peak for _, peak, _ in plans), seed
        _assert_antichain(names)
    assert solved >= 15


def test_planning_from_a_saved_profile_imports_no_torch() -> None:
    """The solver, the memory model, plan and profile files and the reports' data are pure
    Python: ``ckpt-plan solve`` on a saved profile never pays torch's import."""
    import subprocess
    import sys

    modules = (
        "planner.core.records, planner.plan.memory_model, planner.plan.plan_file, "
        "planner.plan.profile_file, planner.plan.targets, planner.solve.planning, "
        "planner.report"
    )
    code = (
        f"import sys; import {modules}; import planner; "
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')); "
        "print(loaded[:3]); sys.exit(1 if loaded else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
