"""Profiles survive a save/load round trip with everything the solver needs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from planner.core.errors import ProfileFileError
from planner.core.loop import PLAIN_LOOP, LoopShape
from planner.core.records import Phase, Profile, StorageKind, Unit
from planner.plan.memory_model import MemoryModel
from planner.plan.profile_file import load_profile, module_table, save_profile, save_profile_table
from planner.solve import solve


@pytest.fixture(scope="module")
def profile(stack_profile: Profile) -> Profile:
    return stack_profile


def test_round_trip_keeps_the_profile_and_its_predictions(profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    loaded = load_profile(save_profile(profile, tmp_path / "profile.json"))
    assert loaded == profile
    names = [Unit(m.module_name) for m in profile.candidates][:2]
    assert MemoryModel(loaded.timeline).peak_bytes(names) == MemoryModel(
        profile.timeline
    ).peak_bytes(names)
    budget = (profile.measured_peak_bytes + MemoryModel(profile.timeline).peak_bytes(names)) // 2
    assert solve(loaded, budget) == solve(profile, budget)


def test_the_profile_records_its_loop_and_one_without_it_is_for_the_plain_loop(  # type: ignore[no-untyped-def]
    profile, tmp_path: Path
) -> None:
    assert profile.loop == PLAIN_LOOP
    accumulating = dataclasses.replace(profile, loop=LoopShape(grad_accum=8))
    path = save_profile(accumulating, tmp_path / "profile.json")
    data = json.loads(path.read_text())
    assert data["loop"] == {"zero_grad": "before-forward", "grad_accum": 8}
    assert load_profile(path) == accumulating
    del data["loop"]  # a profile written before the loop was recorded
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load_profile(tmp_path / "old.json").loop == PLAIN_LOOP
    data["loop"] = {"zero_grad": "whenever"}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ProfileFileError, match="malformed"):
        load_profile(tmp_path / "bad.json")


def test_the_vocabulary_is_typed_and_files_keep_the_plain_words(profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Storage kinds and phases are enums in memory and plain words in the file; a word the
    vocabulary does not know makes the file malformed, not a late KeyError."""
    path = save_profile(profile, tmp_path / "profile.json")
    loaded = load_profile(path)
    assert all(type(s.kind) is StorageKind for s in loaded.timeline.storages)
    assert all(type(phase) is Phase for phase in loaded.timeline.phase_end_events)
    assert {s.kind for s in loaded.timeline.storages} >= {
        StorageKind.PARAMETER,
        StorageKind.ACTIVATION,
    }
    raw = json.loads(path.read_text())
    assert set(raw["timeline"]["phase_end_events"]) == {"forward", "backward", "optimizer"}
    column = raw["timeline"]["storage_columns"].index("kind")
    assert raw["timeline"]["storages"][0][column] in {kind.value for kind in StorageKind}
    assert f"{StorageKind.OPTIMIZER_STATE}" == str(StorageKind.OPTIMIZER_STATE) == "optimizer_state"
    raw["timeline"]["storages"][0][column] = "cache"
    path.write_text(json.dumps(raw))
    with pytest.raises(ProfileFileError, match="malformed"):
        load_profile(path)


def test_the_table_has_one_row_per_module(profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = save_profile_table(profile, tmp_path / "profile.csv")
    frame = module_table(profile)
    assert len(frame) == len(profile.modules)
    assert {
        "module_name",
        "saved_bytes",
        "checkpoint_saving_bytes",
        "forward_ms",
        "call_count",
    } <= set(frame.columns)
    assert path.read_text().count("\n") == len(profile.modules) + 1


def test_bad_profile_files_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ProfileFileError, match="does not exist"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ProfileFileError, match="not valid JSON"):
        load_profile(tmp_path / "bad.json")
    (tmp_path / "future.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(ProfileFileError, match="newer"):
        load_profile(tmp_path / "future.json")


def test_solving_a_saved_profile_imports_no_torch(profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`ckpt-plan solve PROFILE --budget B` (no --check) is pure Python: a new process
    solves a saved profile and writes the plan without importing torch."""
    import subprocess
    import sys

    path = save_profile(profile, tmp_path / "profile.json")
    budget = (MemoryModel(profile.timeline).peak_bytes() * 9) // 10
    code = (
        "import sys; from typer.testing import CliRunner; from planner.cli.main import app; "
        f"result = CliRunner().invoke(app, ['solve', {str(path)!r}, '--budget', '{budget}B']); "
        "print(result.output); "
        "sys.exit(result.exit_code or ('torch' in sys.modules and 9))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "plan.json").is_file()
