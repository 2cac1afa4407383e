"""Reports: the data behind each chart, that each chart renders, the report files, and
`ckpt-plan report`."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from planner.cli.main import app
from planner.core.records import ModuleProfile, Profile, Unit
from planner.core.units import format_bytes
from planner.plan.plan_file import ModuleDecision, Plan, save_plan
from planner.plan.profile_file import save_profile
from planner.report import (
    CHOSEN,
    memory_timeline_figure,
    module_figure,
    module_frame,
    timeline_frame,
    tradeoff_figure,
    tradeoff_frame,
    write_report,
)
from planner.solve.planning import baseline_every_block, baseline_plans, build_plan, frontier


@pytest.fixture(scope="module")
def profile(stack_profile: Profile) -> Profile:
    return stack_profile


@pytest.fixture(scope="module")
def sweep(profile: Profile) -> list[Plan]:
    return frontier(profile, 12)


@pytest.fixture(scope="module")
def chosen(profile: Profile, sweep: list[Plan]) -> Plan:
    """A plan from the middle of the sweep, reported at the budget it was solved for."""
    return sweep[len(sweep) // 2]


def _png_bytes(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _assert_png(figure: Figure) -> None:
    data = _png_bytes(figure)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# -- memory timeline ---------------------------------------------------------------------


def test_timeline_data_and_chart(profile: Profile) -> None:
    plan = baseline_every_block(profile, budget_bytes=profile.measured_peak_bytes)
    data = timeline_frame(profile, plan)
    forward_end = profile.timeline.phase_end_events["forward"]
    # At the end of forward the plan holds fewer activations than the unplanned step.
    assert data["planned_mib"][forward_end] < data["unplanned_mib"][forward_end]
    assert data["unplanned_mib"].max() * 2**20 == profile.measured_peak_bytes
    assert len(data["event"]) == len(data["planned_mib"]) == profile.timeline.event_count + 1
    _assert_png(memory_timeline_figure(profile, plan))


# -- trade-off ---------------------------------------------------------------------------


def test_tradeoff_frame_frontier_is_monotone_and_holds_the_chosen_plan(
    profile: Profile, sweep: list[Plan], chosen: Plan
) -> None:
    baselines = baseline_plans(profile, chosen.budget_bytes)
    data = tradeoff_frame(profile, sweep, baselines, chosen=chosen)
    assert {
        "kind",
        "label",
        "budget_bytes",
        "predicted_peak_bytes",
        "measured_peak_bytes",
        "overhead_percent",
        "module_count",
        "on_frontier",
    } <= set(data.columns)
    # Baselines: the usual manual choices (the blocks sit in a ModuleList: no sqrt(n)),
    # and each selective option on every block (these blocks have policies and nesting).
    assert set(data.loc[data["kind"] == "baseline", "label"]) == {
        "none",
        "every-block",
        "every-2nd-block",
        "every-block-save-matmuls",
        "every-block-torchtitan",
        "every-block-nested",
    }
    assert set(data.loc[data["label"] == "every-block-torchtitan", "options"]) == {
        f"{len(profile.block_names)} torchtitan"
    }
    none = data[data["label"] == "none"].iloc[0]
    assert none["predicted_peak_bytes"] == profile.measured_peak_bytes
    assert none["overhead_percent"] == 0

    # Monotone: as the predicted peak decreases, the overhead does not decrease.
    line = data[data["on_frontier"]].sort_values("predicted_peak_bytes", ascending=False)
    assert len(line) >= 3
    assert line["overhead_percent"].is_monotonic_increasing
    assert line["predicted_peak_bytes"].is_unique
    # It spans the sweep: from the lowest feasible peak up to no checkpointing at all.
    searched = data[data["kind"] != "baseline"]
    assert line["predicted_peak_bytes"].min() == searched["predicted_peak_bytes"].min()
    assert line["overhead_percent"].min() == 0

    # The chosen plan is on the frontier: no plan with a peak as low is cheaper.
    row = data[data["kind"] == CHOSEN].iloc[0]
    assert row["on_frontier"]
    as_low = line[line["predicted_peak_bytes"] <= row["predicted_peak_bytes"]]
    assert as_low["overhead_percent"].min() == pytest.approx(row["overhead_percent"])
    assert row["overhead_percent"] == pytest.approx(chosen.predicted_overhead * 100)


def test_tradeoff_frame_drops_dominated_plans(
    profile: Profile, sweep: list[Plan], chosen: Plan
) -> None:
    # A made-up plan with the chosen plan's peak and more overhead than it, and one with a
    # higher peak and as much overhead: both are beaten by the chosen plan.
    slower = dataclasses.replace(
        chosen,
        modules=(*chosen.modules, ModuleDecision("made.up")),
        predicted_overhead=chosen.predicted_overhead + 0.5,
    )
    bigger = dataclasses.replace(
        chosen,
        modules=(*chosen.modules, ModuleDecision("made.up.too")),
        predicted_peak_bytes=chosen.predicted_peak_bytes + 1000,
    )
    data = tradeoff_frame(profile, [*sweep, slower, bigger], {}, chosen=chosen)
    made_up = data[data["units"].str.contains("made.up")]
    assert len(made_up) == 2 and not made_up["on_frontier"].any()
    assert data.loc[data["kind"] == CHOSEN, "on_frontier"].item()


def test_tradeoff_frame_measured_points(profile: Profile, sweep: list[Plan], chosen: Plan) -> None:
    baselines = baseline_plans(profile, chosen.budget_bytes)
    ran = dataclasses.replace(chosen, measured_peak_bytes=chosen.predicted_peak_bytes + 7)
    data = tradeoff_frame(profile, sweep, baselines, {"every-block": 123}, chosen=ran)
    measured = data.set_index("label")["measured_peak_bytes"]
    # The chosen plan brings its own measured peak; others come from the mapping.
    assert measured[CHOSEN] == chosen.predicted_peak_bytes + 7
    assert measured["every-block"] == 123
    assert measured.isna().sum() == len(data) - 2
    with pytest.raises(ValueError, match="no-such-plan"):
        tradeoff_frame(profile, sweep, baselines, {"no-such-plan": 1}, chosen=ran)


def test_tradeoff_chart_renders(profile: Profile, sweep: list[Plan], chosen: Plan) -> None:
    baselines = baseline_plans(profile, chosen.budget_bytes)
    figure = tradeoff_figure(profile, sweep, baselines, {"none": 1}, chosen=chosen)
    (axes,) = figure.axes
    assert "MiB" in axes.get_xlabel() and "%" in axes.get_ylabel()
    title = axes.get_title()
    assert profile.model_name in title and profile.device in title
    assert format_bytes(chosen.budget_bytes) in title
    _assert_png(figure)


# -- modules -----------------------------------------------------------------------------


def _record(name: str, module_type: str, saved: int, ms: float) -> ModuleProfile:
    return ModuleProfile(
        module_name=name,
        module_type=module_type,
        depth=name.count(".") + 1,
        call_count=1,
        parameter_bytes=0,
        saved_bytes=saved,
        checkpoint_saving_bytes=saved,
        input_bytes=0,
        output_bytes=0,
        recompute_peak_bytes=saved,
        forward_ms=ms,
        uses_rng=False,
        excluded_reason="",
    )


def test_module_frame_groups_a_48_block_model(profile: Profile, chosen: Plan) -> None:
    """Names that differ only by the block index collapse into one row per kind of module."""
    records = [_record("embed", "Embedding", 0, 0.1)]
    for index in range(48):
        records += [
            _record(f"blocks.{index}", "Block", 30 * 2**20, 10.0 + index % 2),
            _record(f"blocks.{index}.attn", "Attention", 20 * 2**20, 7.0),
            _record(f"blocks.{index}.mlp", "MLP", 10 * 2**20, 3.0),
        ]
    records.append(_record("head", "Linear", 2**20, 1.0))
    big = dataclasses.replace(profile, modules=tuple(records))
    wrapped = [*(f"blocks.{index}" for index in range(12)), "blocks.14", "blocks.20.mlp"]
    plan = dataclasses.replace(chosen, modules=tuple(ModuleDecision(n) for n in wrapped))

    data = module_frame(big, plan)
    assert list(data["group"]) == ["embed", "blocks.*", "blocks.*.attn", "blocks.*.mlp", "head"]
    rows = data.set_index("group")
    assert rows.loc["blocks.*", "count"] == 48
    assert rows.loc["blocks.*", "chosen_count"] == 13
    assert rows.loc["blocks.*", "chosen_indices"] == "0-11, 14"
    assert rows.loc["blocks.*.mlp", "chosen_indices"] == "20"
    assert rows.loc["blocks.*.attn", "chosen_count"] == 0
    assert rows.loc["blocks.*", "freed_bytes_mean"] == 30 * 2**20
    assert rows.loc["blocks.*", "recompute_ms_mean"] == pytest.approx(10.5)
    assert (rows.loc["blocks.*", "recompute_ms_min"], rows.loc["blocks.*", "recompute_ms_max"]) == (
        10.0,
        11.0,
    )
    assert rows["count"].sum() == len(records)

    figure = module_figure(big, plan)
    assert figure.get_size_inches()[1] < 6  # five rows, not 146
    _assert_png(figure)


def test_module_frame_keeps_each_module_of_a_small_model(profile: Profile, chosen: Plan) -> None:
    data = module_frame(profile, chosen)
    candidates = [record.module_name for record in profile.candidates]
    assert list(data["group"]) == candidates
    assert (data["count"] == 1).all()
    assert set(data.loc[data["chosen_count"] == 1, "group"]) == set(chosen.module_names)
    # Grouping on request: four blocks of one kind become one row.
    grouped = module_frame(profile, chosen, group_above=0).set_index("group")
    assert grouped.loc["blocks.*", "count"] == 4
    assert len(grouped) < len(data)


def test_module_chart_renders(profile: Profile, chosen: Plan) -> None:
    figure = module_figure(profile, chosen)
    freed_axes, time_axes = figure.axes[:2]
    assert "MiB" in freed_axes.get_xlabel() and "ms" in time_axes.get_xlabel()
    assert profile.model_name in figure.get_suptitle()
    _assert_png(figure)


# -- report files ------------------------------------------------------------------------


def test_write_report_writes_the_charts_and_a_summary_linking_them(
    profile: Profile, chosen: Plan, tmp_path: Path
) -> None:
    folder = tmp_path / "report"
    ran = dataclasses.replace(chosen, measured_peak_bytes=chosen.predicted_peak_bytes)
    wrote = write_report(
        profile,
        ran,
        folder,
        formats=("png", "svg"),
        frontier_points=8,
        measured={"none": profile.measured_peak_bytes},
    )
    names = {path.name for path in wrote}
    assert names == {
        f"{chart}.{fmt}"
        for chart in ("tradeoff", "modules", "memory_timeline")
        for fmt in ("png", "svg")
    } | {"summary.md"}
    # Atomic writes leave no temporary files behind.
    assert {path.name for path in folder.iterdir()} == names
    for path in wrote:
        assert path.stat().st_size > 1000
    summary = (folder / "summary.md").read_text()
    for chart in ("tradeoff", "modules", "memory_timeline"):
        assert f"]({chart}.png)" in summary
    for number in (ran.budget_bytes, profile.measured_peak_bytes, ran.predicted_peak_bytes):
        assert format_bytes(number) in summary
    assert f"{ran.predicted_overhead:.1%}" in summary
    for name in ("none", "every-block", "every-2nd-block"):
        assert f"| {name} |" in summary
    for module_name in ran.module_names:
        assert f"`{module_name}`" in summary
    with pytest.raises(ValueError, match="formats"):
        write_report(profile, ran, folder, formats=("jpeg",))


# -- ckpt-plan report --------------------------------------------------------------------


@pytest.mark.slow
def test_cli_report_on_a_saved_profile_and_plan(
    profile: Profile, chosen: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    save_profile(profile, tmp_path / "run" / "profile.json")
    runner = CliRunner()

    # A profile alone: reported as measured, with no plan, into reports/<model name>/.
    result = runner.invoke(app, ["report", "run/profile.json"])
    assert result.exit_code == 0, result.output
    folder = Path("reports") / profile.model_name
    for name in ("tradeoff.png", "modules.png", "memory_timeline.png", "summary.md"):
        assert (folder / name).is_file()
        assert f"wrote {folder / name}" in result.stdout
    summary = (folder / "summary.md").read_text()
    assert f"budget | {format_bytes(profile.measured_peak_bytes)}" in summary
    assert "| modules checkpointed | 0 " in summary

    # A profile and a budget: planned now (not run).
    budget = str(chosen.budget_bytes)
    result = runner.invoke(
        app, ["report", "run/profile.json", "--budget", budget, "--out-dir", "at_budget", "--svg"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "at_budget" / "tradeoff.svg").is_file()
    summary = (tmp_path / "at_budget" / "summary.md").read_text()
    assert "not measured" in summary and chosen.module_names[0] in summary

    # A plan: its profile is read from beside it.
    save_plan(chosen, tmp_path / "run" / "plan.json")
    result = runner.invoke(app, ["report", "run/plan.json", "--out-dir", "from_plan"])
    assert result.exit_code == 0, result.output
    assert (
        format_bytes(chosen.predicted_peak_bytes) in (tmp_path / "from_plan/summary.md").read_text()
    )


@pytest.mark.parametrize(
    ("setup", "code", "fragment"),
    [
        ("missing", 6, "does not exist"),
        ("corrupt", 6, "not valid JSON"),
        ("plan_without_profile", 6, "profile.json does not exist"),
        ("plan_of_another_model", 6, "another model"),
        ("plan_with_budget", 2, "is a plan"),
        ("budget_too_small", 3, "smallest budget"),
    ],
)
def test_cli_report_errors_are_one_line(
    profile: Profile,
    chosen: Plan,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    setup: str,
    code: int,
    fragment: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    arguments = ["report", "input.json"]
    if setup == "corrupt":
        Path("input.json").write_text('{"schema_version": 1, "modu')
    elif setup.startswith("plan"):
        save_plan(chosen, "input.json")
        if setup == "plan_of_another_model":
            other = dataclasses.replace(profile, fingerprint={"digest": "another"})
            save_profile(other, "profile.json")
        elif setup == "plan_with_budget":
            save_profile(profile, "profile.json")
            arguments += ["--budget", "1GB"]
    elif setup == "budget_too_small":
        save_profile(profile, "input.json")
        arguments += ["--budget", "1KiB"]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == code, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
    assert "Traceback" not in result.output
    assert not Path("reports").exists()


def test_empty_plan_report_has_no_planned_curve(profile: Profile) -> None:
    plan = build_plan(profile, [], profile.measured_peak_bytes, strategy="none")
    figure = memory_timeline_figure(profile, plan)
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert not any("with plan" in label for label in labels)
    assert module_frame(profile, plan)["chosen_count"].sum() == 0


def test_what_a_unit_recomputes(profile: Profile) -> None:
    """One answer for the cost, the probe and the charts: a module recomputes itself;
    ``name#k`` recomputes the children in its k-1 checkpointed segments, not the last."""
    from planner.solve.planning import recomputed_modules, unit_children, unit_cost_ms

    container = next(
        m.module_name for m in profile.modules if len(unit_children(profile, m.module_name)) >= 4
    )
    children = unit_children(profile, container)
    assert recomputed_modules(profile, Unit(children[0])) == [children[0]]
    size = len(children) // 2
    assert recomputed_modules(profile, Unit(container, segments=2)) == children[:size]
    assert unit_cost_ms(profile, Unit(container, segments=2)) == pytest.approx(
        sum(profile.module(child).forward_ms for child in children[:size])
    )
