"""Plan JSON: round trip, the contract (docs/architecture.md, "Plan JSON"), and errors for
files we cannot trust."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from planner.core.errors import PlanFileError
from planner.core.loop import PLAIN_LOOP, LoopShape, ZeroGrad
from planner.core.records import Note, NoteTopic, note_from_line
from planner.plan.plan_file import (
    PLAN_SCHEMA_VERSION,
    CheckpointMethod,
    ModuleDecision,
    Plan,
    load_plan,
    plan_from_dict,
    plan_to_dict,
    save_plan,
)


@pytest.fixture
def sample_plan() -> Plan:
    """A plan with every kind of field filled, as the pipeline would write it."""
    return Plan(
        budget_bytes=12 * 10**9,
        predicted_peak_bytes=11_500_000_000,
        baseline_peak_bytes=15_000_000_000,
        predicted_overhead=0.25,
        recompute_ms=12.5,
        step_ms=50.0,
        static_bytes=4_000_000_000,
        modules=(
            ModuleDecision(
                module_name="blocks.0",
                method=CheckpointMethod.CHECKPOINT,
                preserve_rng_state=True,
                saving_bytes=1_000_000,
                recompute_ms=6.25,
            ),
            ModuleDecision(
                module_name="blocks.1.mlp",
                method=CheckpointMethod.CHECKPOINT_SEQUENTIAL,
                preserve_rng_state=False,
                segments=2,
                policy="save_matmuls",
                saving_bytes=2_000_000,
                recompute_ms=6.25,
            ),
        ),
        fingerprint={
            "digest": "ab" * 32,
            "module_count": 3,
            "parameter_count": 12,
            "modules": ["blocks", "blocks.0", "blocks.1"],
            "parameters": [["blocks.0.weight", [3, 4], "float32"]],
        },
        batch={"input_ids": {"shape": [2, 16], "dtype": "int64"}},
        device="cpu",
        torch_version="2.13.0",
        model_name="tiny",
        strategy="optimal",
        measured_peak_bytes=11_400_000_000,
        notes=(Note(NoteTopic.SOLVER, "cheapest plan under the memory model (search finished)"),),
        assumptions=(
            Note(NoteTopic.GENERAL, "AdamW with foreach=True (torch's default on CUDA)"),
            Note(NoteTopic.TIMES, "measured here in 5 step(s) with 2 modules checkpointed"),
        ),
    )


def _write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_save_then_load_gives_the_same_plan(tmp_path: Path, sample_plan: Plan) -> None:
    path = save_plan(sample_plan, tmp_path / "plan.json")
    assert path == tmp_path / "plan.json"
    loaded = load_plan(path)
    assert loaded == sample_plan
    assert loaded.modules[1].method is CheckpointMethod.CHECKPOINT_SEQUENTIAL
    assert isinstance(loaded.modules, tuple)
    assert isinstance(loaded.notes, tuple)


def test_notes_are_written_as_they_print_and_read_back_by_topic(
    tmp_path: Path, sample_plan: Plan
) -> None:
    """The file holds each note as one line, as in every plan file so far ("times: ..."),
    and reading it gives the note its topic back."""
    unchecked = "made for h100-80gb, which is not here; run `ckpt-plan verify` on it"
    own = "itself (grad_checkpointing on): switched off to plan as if it were not there"
    plan = dataclasses.replace(
        sample_plan,
        notes=(*sample_plan.notes, Note(NoteTopic.UNCHECKED, unchecked)),
        assumptions=(*sample_plan.assumptions, Note(NoteTopic.OWN_CHECKPOINTING, own)),
    )
    path = save_plan(plan, tmp_path / "plan.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["notes"] == [
        "solver: cheapest plan under the memory model (search finished)",
        f"unchecked: {unchecked}",
    ]
    assert data["assumptions"] == [
        "AdamW with foreach=True (torch's default on CUDA)",
        "times: measured here in 5 step(s) with 2 modules checkpointed",
        f"the model checkpoints {own}",
    ]
    loaded = load_plan(path)
    assert loaded == plan
    assert [note.topic for note in loaded.assumptions] == [
        NoteTopic.GENERAL,
        NoteTopic.TIMES,
        NoteTopic.OWN_CHECKPOINTING,
    ]


@pytest.mark.parametrize("topic", list(NoteTopic))
def test_a_note_of_every_topic_reads_back_from_its_line(topic: NoteTopic) -> None:
    note = Note(topic, "some text: with a colon")
    assert note_from_line(str(note)) == note
    assert str(note).endswith("some text: with a colon")
    # A line no topic's words begin (a hand-edited file, say) is a general note.
    assert note_from_line("times are hard") == Note(NoteTopic.GENERAL, "times are hard")


def test_round_trip_of_a_plan_with_defaults(tmp_path: Path, sample_plan: Plan) -> None:
    plan = dataclasses.replace(sample_plan, modules=(), measured_peak_bytes=None, notes=())
    assert load_plan(save_plan(plan, tmp_path / "plan.json")) == plan


def test_save_plan_leaves_only_the_plan_in_the_folder(tmp_path: Path, sample_plan: Plan) -> None:
    save_plan(sample_plan, tmp_path / "plan.json")
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_plan_json_has_the_design_fields(tmp_path: Path, sample_plan: Plan) -> None:
    path = save_plan(sample_plan, tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert next(iter(data)) == "schema_version"  # first, for people opening the file
    # Schema 2 added offloading; a plan that offloads nothing is still written as 1, which
    # older readers take.
    assert data["schema_version"] == 1 < PLAN_SCHEMA_VERSION
    assert data["budget_bytes"] == 12 * 10**9
    assert data["predicted_peak_bytes"] == 11_500_000_000
    assert data["baseline_peak_bytes"] == 15_000_000_000
    assert data["predicted_overhead"] == 0.25
    assert data["fingerprint"] == sample_plan.fingerprint
    assert data["batch"] == sample_plan.batch
    assert data["device"] == "cpu"
    assert data["torch_version"] == "2.13.0"
    assert isinstance(data["modules"], list)
    first, second = data["modules"]
    assert first["module_name"] == "blocks.0"
    assert first["method"] == "checkpoint"
    assert first["preserve_rng_state"] is True
    assert second["module_name"] == "blocks.1.mlp"
    assert second["method"] == "checkpoint_sequential"
    assert second["segments"] == 2
    assert second["preserve_rng_state"] is False
    assert second["policy"] == "save_matmuls"


def test_plan_to_dict_is_json_serialisable(sample_plan: Plan) -> None:
    data = plan_to_dict(sample_plan)
    assert json.loads(json.dumps(data)) == data
    assert plan_from_dict(data) == sample_plan


def test_module_names(sample_plan: Plan) -> None:
    assert sample_plan.module_names == ("blocks.0", "blocks.1.mlp")


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PlanFileError, match="does not exist") as raised:
        load_plan(tmp_path / "nope.json")
    assert "ckpt-plan profile" in str(raised.value)


def test_load_a_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PlanFileError):
        load_plan(tmp_path)


@pytest.mark.parametrize("text", ["", "   \n"])
def test_load_empty_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(PlanFileError, match="empty"):
        load_plan(path)


@pytest.mark.parametrize("text", ['{"schema_version": 1, ', "not json", "{'a': 1}"])
def test_load_invalid_json(tmp_path: Path, text: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(PlanFileError, match="not valid JSON") as raised:
        load_plan(path)
    assert str(path) in str(raised.value)


def test_load_truncated_plan(tmp_path: Path, sample_plan: Plan) -> None:
    path = save_plan(sample_plan, tmp_path / "plan.json")
    path.write_text(path.read_text()[:100])
    with pytest.raises(PlanFileError, match="not valid JSON"):
        load_plan(path)


@pytest.mark.parametrize("data", [[1, 2], "plan", 3, None])
def test_load_json_that_is_not_an_object(tmp_path: Path, data: object) -> None:
    path = _write_json(tmp_path / "plan.json", data)
    with pytest.raises(PlanFileError, match="expected a JSON object"):
        load_plan(path)


@pytest.mark.parametrize("version", [None, "1", 1.0, "missing"])
def test_load_without_a_schema_version(tmp_path: Path, sample_plan: Plan, version: object) -> None:
    data = plan_to_dict(sample_plan)
    if version == "missing":
        del data["schema_version"]
    else:
        data["schema_version"] = version
    path = _write_json(tmp_path / "plan.json", data)
    with pytest.raises(PlanFileError, match="schema_version"):
        load_plan(path)


def test_load_a_plan_from_a_newer_schema(tmp_path: Path, sample_plan: Plan) -> None:
    data = plan_to_dict(sample_plan)
    data["schema_version"] = PLAN_SCHEMA_VERSION + 1
    path = _write_json(tmp_path / "plan.json", data)
    with pytest.raises(PlanFileError) as raised:
        load_plan(path)
    message = str(raised.value)
    assert "upgrade" in message
    assert str(PLAN_SCHEMA_VERSION + 1) in message


@pytest.mark.parametrize(
    "field", ["budget_bytes", "predicted_peak_bytes", "fingerprint", "modules", "device"]
)
def test_load_with_a_missing_required_field(tmp_path: Path, sample_plan: Plan, field: str) -> None:
    data = plan_to_dict(sample_plan)
    del data[field]
    path = _write_json(tmp_path / "plan.json", data)
    with pytest.raises(PlanFileError, match="missing") as raised:
        load_plan(path)
    assert field in str(raised.value)


def test_load_with_a_malformed_module_entry(tmp_path: Path, sample_plan: Plan) -> None:
    data = plan_to_dict(sample_plan)
    data["modules"][0]["method"] = "checkpoint_everything"
    path = _write_json(tmp_path / "plan.json", data)
    with pytest.raises(PlanFileError, match="malformed"):
        load_plan(path)


@pytest.mark.parametrize(
    "modules", [{"blocks.0": {}}, ["blocks.0"], None, [{"module_name": "a", "segments": "two"}]]
)
def test_load_with_malformed_modules(tmp_path: Path, sample_plan: Plan, modules: object) -> None:
    data = plan_to_dict(sample_plan)
    data["modules"] = modules
    path = _write_json(tmp_path / "plan.json", data)
    with pytest.raises(PlanFileError, match="malformed"):
        load_plan(path)


def test_load_with_a_module_entry_without_a_name(tmp_path: Path, sample_plan: Plan) -> None:
    data = plan_to_dict(sample_plan)
    del data["modules"][0]["module_name"]
    path = _write_json(tmp_path / "plan.json", data)
    with pytest.raises(PlanFileError, match="malformed"):
        load_plan(path)


def test_unknown_extra_fields_are_ignored(tmp_path: Path, sample_plan: Plan) -> None:
    # "a new field is fine" (docs/architecture.md, "Plan JSON"): an older reader ignores it.
    data = plan_to_dict(sample_plan)
    data["some_future_field"] = {"x": 1}
    path = _write_json(tmp_path / "plan.json", data)
    assert load_plan(path) == sample_plan


def test_optional_module_options_default(tmp_path: Path, sample_plan: Plan) -> None:
    data = plan_to_dict(sample_plan)
    data["modules"] = [{"module_name": "blocks.0"}]
    path = _write_json(tmp_path / "plan.json", data)
    (decision,) = load_plan(path).modules
    assert decision.method is CheckpointMethod.CHECKPOINT
    assert decision.preserve_rng_state is True
    assert decision.segments is None
    assert decision.policy is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("fingerprint", []), ("budget_bytes", "12GB")],
)
def test_load_with_a_field_of_the_wrong_type(
    tmp_path: Path, sample_plan: Plan, field: str, value: object
) -> None:
    data = plan_to_dict(sample_plan)
    data[field] = value
    path = _write_json(tmp_path / "plan.json", data)
    with pytest.raises(PlanFileError):
        load_plan(path)


def test_the_plan_records_its_loop_and_a_plan_without_one_is_for_the_plain_loop(
    tmp_path: Path, sample_plan: Plan
) -> None:
    accumulating = dataclasses.replace(
        sample_plan, loop=LoopShape(zero_grad=ZeroGrad.AFTER_FORWARD, grad_accum=4)
    )
    path = save_plan(accumulating, tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert data["loop"] == {"zero_grad": "after-forward", "grad_accum": 4}
    assert load_plan(path) == accumulating
    del data["loop"]  # a plan written before the loop was recorded
    assert load_plan(_write_json(tmp_path / "old.json", data)).loop == PLAIN_LOOP


@pytest.mark.parametrize(
    "loop",
    ["lightning", {"zero_grad": "sideways"}, {"grad_accum": 0}, {"grad_accum": "2"}],
)
def test_load_with_a_malformed_loop(tmp_path: Path, sample_plan: Plan, loop: object) -> None:
    data = plan_to_dict(sample_plan)
    data["loop"] = loop
    with pytest.raises(PlanFileError, match="malformed"):
        load_plan(_write_json(tmp_path / "plan.json", data))
