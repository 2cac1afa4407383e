"""diffusers' models as users train them (benchmarks/models/diffusers/, the model files
of benchmarks/diffusers_sweep.py): the blocks found are the ones diffusers' own gradient
checkpointing wraps, and the fake step is the real step."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("diffusers")

from benchmarks.diffusers_sweep import own_checkpointed
from planner.core.records import MemorySource
from planner.measure.fake import build_fake_workload
from planner.measure.profiler import profile_workload, record_memory
from planner.measure.workload import build_workload, load_model_file

MODELS = Path(__file__).resolve().parent.parent / "benchmarks" / "models" / "diffusers"


def _fake_profile(path: Path):  # type: ignore[no-untyped-def]
    workload, session = build_fake_workload(load_model_file(path))
    return record_memory(workload, session=session)


@pytest.mark.slow
def test_a_unets_blocks_are_what_diffusers_checkpoints() -> None:
    """An SD 1.5-style U-Net: every residual block and transformer block of its down,
    middle and up blocks, in the order they ran (diffusers runs the middle block's first
    residual block outside its loop, unwrapped: the one block more). Before: a resampler
    and one up block."""
    path = MODELS / "unet2d_condition_sd15.py"
    blocks = _fake_profile(path).block_names
    own = own_checkpointed(path)
    assert own is not None and len(own) == 17
    assert [block for block in blocks if block != "mid_block.resnets.0"] == own
    assert "mid_block.resnets.0" in blocks


def test_flux_blocks_are_both_streams() -> None:
    """Flux's double-stream and single-stream blocks, as diffusers checkpoints both (before:
    the double-stream blocks alone)."""
    path = MODELS / "flux.py"
    assert list(_fake_profile(path).block_names) == own_checkpointed(path)


@pytest.mark.parametrize("name", ["unet2d_ddpm", "lumina2"])
def test_the_fake_step_of_a_diffusion_model_is_the_real_one(name: str) -> None:
    """A U-Net trained on ``F.mse_loss`` (its loss keeps the storage of each element's
    loss) and Lumina 2 (rotary tables in a list attribute): storage by storage."""
    model_file = load_model_file(MODELS / f"{name}.py")
    fake = _fake_profile(MODELS / f"{name}.py")
    real = profile_workload(build_workload(model_file, seed=0), timing_passes=1)
    assert real.memory_source is MemorySource.REAL
    assert fake.measured_peak_bytes == real.measured_peak_bytes
    assert fake.timeline.storages == real.timeline.storages


def test_diffusers_own_checkpointing_is_switched_off_the_diffusers_way() -> None:
    """A model file that turned on diffusers' gradient checkpointing: the step is planned
    without it, and the note names the call that does so in training."""
    from planner.measure.workload import switch_off_own_checkpointing

    model = load_model_file(MODELS / "flux.py").build_model()
    model.enable_gradient_checkpointing()
    (note,) = switch_off_own_checkpointing(model)
    assert "with model.disable_gradient_checkpointing();" in note.text
    assert not model.is_gradient_checkpointing
