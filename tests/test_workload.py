"""Loading model files and running the contract's training step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.apply.tensors import describe_batch
from planner.core.errors import ModelFileError, ProfilingError
from planner.core.records import NoteTopic
from planner.measure.workload import build_workload, compute_loss, load_model_file
from tests.models import model_file

GOOD = """
import torch
def build_model():
    return torch.nn.Linear(4, 1)
def sample_batch():
    return torch.randn(8, 4)
def loss_fn(output, batch):
    return output.square().mean()
"""


def write(tmp_path: Path, text: str, name: str = "model.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_file_loads_and_its_step_is_reproducible(tmp_path: Path) -> None:
    loaded = load_model_file(write(tmp_path, GOOD))
    assert loaded.name == "model" and loaded.loss_fn is not None and loaded.training_step is None
    first = build_workload(loaded, seed=3)
    second = build_workload(loaded, seed=3)
    assert torch.equal(first.model.weight, second.model.weight)
    assert torch.equal(first.batch, second.batch)
    assert isinstance(first.optimizer, torch.optim.AdamW)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("def build_model(:\n", "model.py:1"),
        ("import torch\nraise RuntimeError('boom')\n", "boom"),
        ("def sample_batch():\n    return 1\n", "build_model()"),
        ("def build_model():\n    return 1\n", "sample_batch()"),
        ("build_model = 3\ndef sample_batch():\n    return 1\n", "build_model()"),
    ],
)
def test_broken_files_give_one_line_errors_naming_the_problem(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(ModelFileError) as raised:
        load_model_file(write(tmp_path, text))
    assert expected in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_missing_file_is_a_model_file_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="does not exist"):
        load_model_file(tmp_path / "nope.py")


def test_build_model_must_return_a_module() -> None:
    with pytest.raises(ModelFileError, match=r"not a torch\.nn\.Module"):
        build_workload(model_file(lambda: 3, lambda: torch.zeros(1)))


def test_a_forward_that_raises_is_a_profiling_error_with_the_location(tmp_path: Path) -> None:
    text = GOOD.replace("return output.square().mean()", "raise ValueError('bad loss')")
    loaded = load_model_file(write(tmp_path, text))
    workload = build_workload(loaded)
    from planner.measure.workload import run_training_step

    with pytest.raises(ProfilingError, match="bad loss") as raised:
        run_training_step(workload)
    assert "model.py:" in str(raised.value)


class WithLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        out = self.linear(x)
        return {"logits": out, "loss": (out.squeeze(1) - labels).square().mean()}


class Output(dict):
    """Like a Hugging Face ModelOutput: a dict whose keys are also attributes."""

    def __getattr__(self, name: str) -> object:
        return self[name]


def test_the_loss_comes_from_output_dot_loss_for_dict_batches() -> None:
    model = WithLoss()
    original_forward = model.forward
    model.forward = lambda **kw: Output(original_forward(**kw))  # type: ignore[method-assign]
    batch = {"x": torch.randn(8, 4), "labels": torch.randn(8)}
    loss = compute_loss(model_file(lambda: model, lambda: batch), model, batch)
    assert loss.dim() == 0 and loss.requires_grad


def test_a_non_scalar_output_without_loss_fn_asks_for_one() -> None:
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ModelFileError, match="define loss_fn"):
        compute_loss(model_file(lambda: model, lambda: None), model, torch.randn(3, 4))


def test_describe_batch_records_shapes_and_dtypes() -> None:
    described = describe_batch({"input_ids": torch.zeros(2, 5, dtype=torch.long)})
    assert described == {"input_ids": {"shape": [2, 5], "dtype": "int64"}}
    assert describe_batch((torch.zeros(3),))["0"] == {"shape": [3], "dtype": "float32"}


DATA = Path(__file__).resolve().parent / "data"


def test_build_optimizer_named_model_gets_the_model_on_real_and_fake_workloads() -> None:
    from planner.measure.fake import build_fake_workload

    nanogpt = load_model_file(DATA / "nanogpt_optimizer.py")
    real = build_workload(nanogpt, seed=0)
    fake, _ = build_fake_workload(nanogpt)
    for workload in (real, fake):
        # nanoGPT's weight-decay groups, built from module types: the model was passed.
        groups = workload.optimizer.param_groups
        assert [group["weight_decay"] for group in groups] == [0.1, 0.0]
        grouped = [id(p) for group in groups for p in group["params"]]
        assert sorted(grouped) == sorted(id(p) for p in workload.model.parameters())


@pytest.mark.parametrize(
    ("signature", "gets"),
    [("model", "model"), ("parameters", "parameters"), ("params, lr=1e-3", "parameters")],
)
def test_build_optimizer_gets_the_model_only_when_its_argument_is_named_model(
    tmp_path: Path, signature: str, gets: str
) -> None:
    source = GOOD + (
        f"def build_optimizer({signature}):\n"
        "    first = " + signature.split(",")[0] + "\n"
        "    assert isinstance(first, torch.nn.Module) == " + str(gets == "model") + "\n"
        "    parameters = first.parameters() if isinstance(first, torch.nn.Module) else first\n"
        "    return torch.optim.SGD(parameters, lr=0.1)\n"
    )
    workload = build_workload(load_model_file(write(tmp_path, source)), seed=0)
    assert isinstance(workload.optimizer, torch.optim.SGD)


@pytest.mark.parametrize("signature", ["", "model, parameters", "*groups"])
def test_build_optimizer_with_a_wrong_signature_is_a_one_line_error(
    tmp_path: Path, signature: str
) -> None:
    source = GOOD + f"def build_optimizer({signature}):\n    return None\n"
    with pytest.raises(ModelFileError) as raised:
        load_model_file(write(tmp_path, source))
    message = str(raised.value)
    assert "\n" not in message
    assert f"build_optimizer({signature})" in message
    assert "build_optimizer(model) to get the model" in message


def test_a_timm_style_flag_is_switched_off_and_said() -> None:
    from planner.measure.workload import switch_off_own_checkpointing

    timm_style = load_model_file(DATA / "timm_flag.py")
    model = timm_style.build_model()
    assert model.grad_checkpointing  # the file turns it on
    (note,) = switch_off_own_checkpointing(model)
    assert model.grad_checkpointing is False
    assert note.topic is NoteTopic.OWN_CHECKPOINTING
    assert "checkpoints itself (grad_checkpointing on)" in str(note)
    assert "with model.set_grad_checkpointing(False)" in note.text
    assert switch_off_own_checkpointing(model) == ()  # nothing left on
    # Every workload is built with it off: the profile, the timing and the check alike.
    workload = build_workload(timm_style, seed=0)
    assert workload.model.grad_checkpointing is False and workload.notes == (note,)


class _Stubborn(torch.nn.Module):
    """A module whose checkpointing flag cannot be changed once set."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.gradient_checkpointing = True

    def __setattr__(self, name: str, value: object) -> None:
        if name == "gradient_checkpointing" and name in vars(self):
            raise AttributeError("read-only")
        super().__setattr__(name, value)


def test_a_flag_that_cannot_be_switched_off_is_said_and_counted() -> None:
    from planner.measure.workload import switch_off_own_checkpointing

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), _Stubborn())
    (note,) = switch_off_own_checkpointing(model)
    assert note.topic is NoteTopic.OWN_CHECKPOINTING
    assert "1.gradient_checkpointing on" in note.text
    assert "could not be switched off, so the plan counts" in note.text
