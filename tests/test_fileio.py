"""Atomic writes: an interrupted write leaves the old file and no temp file behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.core.fileio import atomic_path, atomic_write_text


def test_atomic_write_text_writes_utf8(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    atomic_write_text(target, "héllo\n")
    assert target.read_bytes() == "héllo\n".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_atomic_write_text_replaces_existing_content(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    target.write_text("old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_atomic_write_text_creates_missing_folders(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "plan.json"
    atomic_write_text(target, "x")
    assert target.read_text() == "x"


def test_atomic_path_yields_a_temp_file_beside_the_target(tmp_path: Path) -> None:
    target = tmp_path / "chart.png"
    with atomic_path(target) as temp_path:
        assert temp_path.parent == tmp_path
        assert temp_path != target
        assert not target.exists()  # nothing at the target until the block succeeds
        temp_path.write_bytes(b"png")
    assert target.read_bytes() == b"png"
    assert not temp_path.exists()


@pytest.mark.parametrize("error_type", [RuntimeError, KeyboardInterrupt])
def test_atomic_path_interrupted_keeps_old_content_and_no_temp_file(
    tmp_path: Path, error_type: type[BaseException]
) -> None:
    target = tmp_path / "plan.json"
    target.write_text("previous plan")
    with pytest.raises(error_type), atomic_path(target) as temp_path:
        temp_path.write_text("half a pl")
        raise error_type("interrupted")
    assert target.read_text() == "previous plan"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


@pytest.mark.parametrize("error_type", [RuntimeError, KeyboardInterrupt])
def test_atomic_path_interrupted_creates_nothing_when_no_file_existed(
    tmp_path: Path, error_type: type[BaseException]
) -> None:
    target = tmp_path / "plan.json"
    with pytest.raises(error_type), atomic_path(target) as temp_path:
        temp_path.write_text("partial")
        raise error_type()
    assert list(tmp_path.iterdir()) == []


def test_atomic_path_interrupted_before_writing_anything(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    target.write_text("previous")
    with pytest.raises(KeyboardInterrupt), atomic_path(target):
        raise KeyboardInterrupt
    assert target.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_written_files_get_the_usual_permissions(tmp_path: Path) -> None:
    import os

    umask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "plan.json", "{}")
    finally:
        os.umask(umask)
    assert (tmp_path / "plan.json").stat().st_mode & 0o777 == 0o644
