"""A workload's source (planner.measure.source): the one line a profile, a plan and a check
process carry, read and written in one place."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.core.errors import ModelFileError
from planner.measure.source import WorkloadSource, workload_in_command

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    "text",
    [
        "/models/gpt.py",
        "/models/gpt.py?batch_size=8",
        "hf:/models/Meta-Llama-3-8B/config.json?batch_size=1&seq_len=4096&dtype=bfloat16",
        "hf:/models/vit-base/config.json?batch_size=64&dtype=float32",  # images: no seq_len
    ],
)
def test_a_source_reads_back_as_it_was_written(text: str) -> None:
    source = WorkloadSource.parse(text)
    assert str(source) == text
    assert WorkloadSource.parse(str(source)) == source


def test_a_source_holds_what_its_text_says() -> None:
    sized = WorkloadSource.parse("/models/gpt.py?batch_size=8")
    assert sized == WorkloadSource.model_file("/models/gpt.py", 8)
    assert not sized.is_hugging_face and sized.name == "gpt"
    hf = WorkloadSource.parse(
        "hf:/m/Meta-Llama-3-8B/config.json?batch_size=2&seq_len=16&dtype=float32"
    )
    assert hf == WorkloadSource.hugging_face("/m/Meta-Llama-3-8B/config.json", 2, 16, "float32")
    assert hf.is_hugging_face and hf.name == "Meta-Llama-3-8B"
    assert WorkloadSource.hugging_face("/m/llama-3-8b.json", 1, 8, "bfloat16").name == "llama-3-8b"


def test_printed_commands_name_the_workload() -> None:
    sized = WorkloadSource.model_file("/models/gpt.py", 8)
    assert sized.command_arguments() == ["/models/gpt.py", "--batch-size", "8"]
    assert workload_in_command(sized) == "MODEL.py --batch-size 8"
    assert workload_in_command(WorkloadSource.model_file("/models/gpt.py")) == "MODEL.py"
    assert workload_in_command(None) == "MODEL.py"
    hf = WorkloadSource.hugging_face("/m/config.json", 2, 16, "float32")
    assert workload_in_command(hf) == (
        "--hf /m/config.json --batch-size 2 --seq-len 16 --dtype float32"
    )
    images = WorkloadSource.hugging_face("/m/config.json", 64, None, "bfloat16")
    assert workload_in_command(images) == "--hf /m/config.json --batch-size 64 --dtype bfloat16"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("/models/gpt.py?batch_size=0", "must be a whole number"),
        ("/models/gpt.py?batch_size=two", "must be a whole number"),
        ("hf:/m/config.json?batch_size=2&seq_len=16", "not a Hugging Face workload source"),
        ("hf:/m/config.json?seq_len=16&dtype=float32", "not a Hugging Face workload source"),
        ("hf:/m/config.json?batch_size=2&seq_len=x&dtype=float32", "not a Hugging Face"),
    ],
)
def test_a_malformed_source_is_a_model_file_error(text: str, message: str) -> None:
    with pytest.raises(ModelFileError, match=message):
        WorkloadSource.parse(text)


def test_a_file_whose_name_holds_the_query_is_that_file(tmp_path: Path) -> None:
    odd = tmp_path / "model.py?batch_size=3"
    odd.write_text("")
    assert WorkloadSource.parse(str(odd)) == WorkloadSource.model_file(odd)


def test_only_a_hugging_face_workload_has_a_sequence_length() -> None:
    hf = WorkloadSource.hugging_face("/m/config.json", 2, 16, "float32")
    assert hf.with_seq_len(32).seq_len == 32 and hf.with_batch_size(4).batch_size == 4
    with pytest.raises(ModelFileError, match="only a Hugging Face workload"):
        WorkloadSource.model_file(EXAMPLES / "mlp.py").with_seq_len(32)


def test_a_profile_made_at_a_batch_size_can_be_run_here() -> None:
    """A profile's model file with its batch size (``PATH?batch_size=N``) is found here by
    its path (not looked up as a file of that name)."""
    from planner.pipeline import _workload_here

    assert _workload_here(f"{EXAMPLES / 'mlp.py'}?batch_size=3")
    assert not _workload_here("/nonexistent/model.py?batch_size=3")
