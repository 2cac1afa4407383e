"""The profiler on real (tiny) models: its predictions checked against measured steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.apply import apply_plan
from planner.core.records import NoteTopic, Unit
from planner.measure.candidates import find_block_stacks, find_blocks
from planner.measure.profiler import profile_workload
from planner.measure.step import measure_step
from planner.measure.workload import build_workload, load_model_file
from planner.plan.memory_model import MemoryModel
from planner.solve.planning import build_plan
from tests.models import (
    BatchNormNet,
    Block,
    SharedBlockModel,
    caching_file,
    model_file,
    stack_file,
    tricky_file,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _units(names: tuple[str, ...]) -> tuple[Unit, ...]:
    """The whole-module units of ``names``."""
    return tuple(Unit(name) for name in names)


def _measured_peak(file, names, profile) -> int:  # type: ignore[no-untyped-def]
    workload = build_workload(file, seed=0)
    apply_plan(workload.model, build_plan(profile, _units(names), 0, strategy="test"))
    return measure_step(workload, seed=0).peak_bytes


@pytest.fixture(scope="module")
def stack_profile():  # type: ignore[no-untyped-def]
    file = stack_file(width=64, depth=4, batch=128)
    return file, profile_workload(build_workload(file, seed=0), timing_passes=1)


def test_replaying_the_timeline_gives_the_measured_peak(stack_profile) -> None:  # type: ignore[no-untyped-def]
    _, profile = stack_profile
    assert MemoryModel(profile.timeline).peak_bytes(()) == profile.measured_peak_bytes
    assert profile.measured_peak_bytes > profile.static_bytes > 0


def test_static_memory_is_parameters_gradients_and_adamw_state(stack_profile) -> None:  # type: ignore[no-untyped-def]
    file, profile = stack_profile
    model = file.build_model()
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert profile.parameter_bytes == parameter_bytes
    assert profile.gradient_bytes == parameter_bytes
    # AdamW keeps two moments per parameter, plus a scalar step counter each.
    assert 2 * parameter_bytes <= profile.optimizer_state_bytes <= 2 * parameter_bytes + 4096


def test_candidates_are_the_modules_whose_checkpointing_frees_memory(stack_profile) -> None:  # type: ignore[no-untyped-def]
    """Blocks and inner containers, by what checkpointing them frees; never the root, a
    module that frees nothing, or one of torch.nn's own single layers."""
    _, profile = stack_profile
    names = {m.module_name for m in profile.candidates}
    assert {"blocks.0", "blocks.3", "blocks.0.mlp"} <= names
    assert "" not in names
    for record in profile.modules:
        if record.module_name in names:
            assert record.checkpoint_saving_bytes > 0
        elif record.module_name and record.call_count:
            assert record.checkpoint_saving_bytes <= 0 or record.excluded_reason
    # torch.nn's own layers are not candidates: alone they free a mask or a norm's
    # statistics at most (LayerNorm and Dropout here) for a checkpoint call each.
    assert profile.module("blocks.0.norm").checkpoint_saving_bytes > 0
    assert not {"blocks.0.norm", "blocks.0.dropout", "blocks.0.mlp.0"} & names
    assert profile.module("blocks.0.dropout").excluded_reason.startswith("one of torch.nn's")
    assert profile.block_names == ("blocks.0", "blocks.1", "blocks.2", "blocks.3")


def test_dropout_is_detected_as_random(stack_profile) -> None:  # type: ignore[no-untyped-def]
    _, profile = stack_profile
    assert profile.module("blocks.0").uses_rng
    assert not profile.module("blocks.0.mlp").uses_rng


@pytest.mark.parametrize(
    "names",
    [
        (),
        ("blocks.0",),
        ("blocks.1", "blocks.2"),
        ("blocks.0.mlp", "blocks.3"),
        ("blocks.0", "blocks.1", "blocks.2", "blocks.3"),
    ],
)
def test_predicted_peak_matches_a_measured_step(stack_profile, names) -> None:  # type: ignore[no-untyped-def]
    file, profile = stack_profile
    predicted = MemoryModel(profile.timeline).peak_bytes(_units(names))
    measured = _measured_peak(file, names, profile)
    assert abs(predicted - measured) <= 0.01 * measured, (predicted, measured)


def test_wrapping_a_block_lowers_the_measured_peak_by_the_predicted_amount(stack_profile) -> None:  # type: ignore[no-untyped-def]
    file, profile = stack_profile
    memory = MemoryModel(profile.timeline)
    names = ("blocks.0", "blocks.1")
    predicted_drop = memory.peak_bytes(()) - memory.peak_bytes(_units(names))
    measured_drop = _measured_peak(file, (), profile) - _measured_peak(file, names, profile)
    assert predicted_drop > 0
    assert abs(predicted_drop - measured_drop) <= 0.01 * predicted_drop


def test_shared_block_runs_twice_and_tied_weights_count_once() -> None:
    file = model_file(
        lambda: SharedBlockModel(), lambda: (torch.randn(64, 10), torch.randint(0, 10, (64,)))
    )
    workload = build_workload(file, seed=0)
    profile = profile_workload(workload, timing_passes=1)
    assert profile.module("shared").call_count == 2
    assert profile.module("last").call_count == 1
    model = file.build_model()
    unique = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    assert profile.parameter_bytes == sum(unique.values())
    for names in [("shared",), ("shared", "last")]:
        predicted = MemoryModel(profile.timeline).peak_bytes(_units(names))
        measured = _measured_peak(file, names, profile)
        assert abs(predicted - measured) <= 0.01 * measured, (names, predicted, measured)


def test_batchnorm_modules_record_the_buffers_they_change() -> None:
    file = model_file(
        lambda: BatchNormNet(),
        lambda: torch.randn(8, 3, 16, 16),
        loss_fn=lambda output, batch: output.square().mean(),
    )
    profile = profile_workload(build_workload(file, seed=0), timing_passes=1)
    reason = profile.module("features").excluded_reason
    assert reason == ""
    assert "1.running_mean" in profile.module("features").mutated_buffers


def test_find_blocks_picks_the_repeated_stack() -> None:
    assert find_blocks(SharedBlockModel()) == ()
    assert find_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())) == ()


class _Residual(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(width, width, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(width)
        # a 1x1 shortcut as torchvision writes it: a Sequential of leaves, not of blocks
        self.downsample = torch.nn.Sequential(torch.nn.Conv2d(width, width, 1))


class _TimmStage(torch.nn.Module):
    """timm's layout: a stage module with a downsample and an nn.Sequential of blocks."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.downsample = torch.nn.Conv2d(width, width, 2, stride=2)
        self.blocks = torch.nn.Sequential(*(_Residual(width) for _ in range(depth)))


class _Attention(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.q = torch.nn.Linear(width, width)


class _Layer(torch.nn.Module):
    """A transformer layer with a ModuleList of experts (a mixture): not a chain of blocks."""

    def __init__(self, width: int, experts: int) -> None:
        super().__init__()
        self.attention = _Attention(width)
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
            )
            for _ in range(experts)
        )


class _Coder(torch.nn.Module):
    def __init__(self, width: int, depth: int, cross: bool) -> None:
        super().__init__()
        self.block = torch.nn.ModuleList(_Layer(width, 3 if cross else 2) for _ in range(depth))


def test_find_blocks_on_cnns_is_every_residual_block() -> None:
    def built(name: str) -> torch.nn.Module:
        return load_model_file(EXAMPLES / f"{name}.py").build_model()

    # torchvision: layer1..layer4 are sibling Sequentials of blocks, not the largest alone.
    resnet = [f"layer{stage}.{index}" for stage in (1, 2, 3, 4) for index in (0, 1)]
    assert find_blocks(built("resnet")) == tuple(resnet)
    # Nested Sequentials: stages -> stages.N -> blocks.
    cnn = [f"stages.{stage}.{index}" for stage in (0, 1, 2) for index in (0, 1)]
    assert find_blocks(built("cnn")) == tuple(cnn)
    # timm: stages.N.blocks.M (the stage module holds a downsample and one Sequential).
    timm = torch.nn.Module()
    timm.stem = torch.nn.Conv2d(3, 8, 3)
    timm.stages = torch.nn.Sequential(*(_TimmStage(8, depth) for depth in (2, 3)))
    expected = ["stages.0.blocks.0", "stages.0.blocks.1"]
    expected += [f"stages.1.blocks.{index}" for index in range(3)]
    assert find_blocks(timm) == tuple(expected)


def test_find_blocks_keeps_transformer_stacks() -> None:
    # An encoder-decoder's twin stacks (the same path in sibling parents: T5's encoder.block
    # and decoder.block) are both its blocks, in registration order, two stacks.
    seq2seq = torch.nn.Module()
    seq2seq.encoder = _Coder(16, 3, cross=False)
    seq2seq.decoder = _Coder(16, 2, cross=True)
    encoder = ("encoder.block.0", "encoder.block.1", "encoder.block.2")
    decoder = ("decoder.block.0", "decoder.block.1")
    assert find_block_stacks(seq2seq) == (encoder, decoder)
    assert find_blocks(seq2seq) == (*encoder, *decoder)
    # A stack at another path in a sibling (decoder.block), or a lone layer at the same
    # path (head.layers), is not a twin.
    seq2seq.encoder.layers = seq2seq.encoder.block
    del seq2seq.encoder.block
    seq2seq.head = torch.nn.Module()
    seq2seq.head.layers = torch.nn.ModuleList([_Layer(16, 2)])
    assert find_block_stacks(seq2seq) == (
        tuple(name.replace("block", "layers") for name in encoder),
    )
    # A ModuleList of experts inside each layer is not a chain to descend into.
    assert find_blocks(_Coder(16, 3, cross=False)) == ("block.0", "block.1", "block.2")
    # A root Sequential of blocks has no siblings to join.
    root = torch.nn.Sequential(*(_Residual(4) for _ in range(3)))
    assert find_blocks(root) == ("0", "1", "2")


class _Gated(torch.nn.Module):
    """A residual layer of another class than ``Block`` (as a Mamba layer is beside an
    attention layer in a hybrid model)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.proj = torch.nn.Linear(width, 2 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.proj(self.norm(x)).chunk(2, dim=-1)
        return x + self.out(value * torch.sigmoid(gate))


class _Hybrid(torch.nn.Module):
    """Jamba's layout: one ModuleList of layers of two classes, run one after the other."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [_Gated(width), Block(width), _Gated(width), Block(width)]
        )
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return torch.nn.functional.cross_entropy(self.head(x), y)


class _ListStage(torch.nn.Module):
    """Hugging Face ConvNeXt's stage (transformers 5): a ModuleList that downsamples and a
    ModuleList of residual blocks, both run in the stage's own loop."""

    def __init__(self, width: int, out: int, depth: int) -> None:
        super().__init__()
        self.downsampling_layer = torch.nn.ModuleList([torch.nn.Linear(width, out)])
        self.layers = torch.nn.ModuleList(Block(out) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.downsampling_layer:
            x = layer(x)
        for layer in self.layers:
            x = layer(x)
        return x


class _ListStages(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = torch.nn.ModuleList([_ListStage(16, 16, 2), _ListStage(16, 32, 3)])
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return torch.nn.functional.cross_entropy(self.head(x), y)


class _MixtureLayer(torch.nn.Module):
    """A layer holding its experts in a ModuleList, each expert run on its own rows: not a
    chain of blocks, so the layer stays one block."""

    def __init__(self, width: int, experts: int = 2) -> None:
        super().__init__()
        self.attention = Block(width)
        self.experts = torch.nn.ModuleList(Block(width) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        rows = zip(self.experts, x.chunk(len(self.experts)), strict=True)
        return x + torch.cat([expert(part) for expert, part in rows])


class _Mixture(torch.nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_MixtureLayer(width) for _ in range(2))
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return torch.nn.functional.cross_entropy(self.head(x), y)


def _recorded_blocks(build) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    """The blocks of a profile recorded on fake tensors (found with the step's timeline)."""
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory

    file = model_file(build, lambda: (torch.randn(8, 16), torch.randint(0, 10, (8,))))
    workload, session = build_fake_workload(file)
    return record_memory(workload, session=session).block_names


def test_find_blocks_takes_the_layers_the_step_ran_in_a_chain() -> None:
    """The blocks a recorded step shows: the entries of a ModuleList of layers of several
    classes that ran one after the other (a hybrid model: Jamba), and the blocks of a stage
    kept in a ModuleList rather than an nn.Sequential (Hugging Face's ConvNeXt). From the
    structure alone (sharding before any step) neither is a stack of blocks of one class."""
    assert _recorded_blocks(_Hybrid) == ("layers.0", "layers.1", "layers.2", "layers.3")
    assert find_blocks(_Hybrid()) == ()
    stages = ["stages.0.layers.0", "stages.0.layers.1"]
    stages += [f"stages.1.layers.{index}" for index in range(3)]
    assert _recorded_blocks(_ListStages) == tuple(stages)
    assert find_blocks(_ListStages()) == ("stages.0", "stages.1")
    # Experts each run on their own rows are not a chain: the layers stay the blocks.
    assert _recorded_blocks(_Mixture) == ("layers.0", "layers.1")


class _Mixer(torch.nn.Module):
    """A residual block of another class, where a U-Net stage runs attention."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = Block(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class _Stage(torch.nn.Module):
    """A diffusers U-Net block: residual blocks (``resnets``) and attention (``attentions``)
    in two ModuleLists, run in turn by the stage itself, then a resampler in a ModuleList of
    its own. ``skips``: an up block, which joins a skip connection to what each residual
    block takes (``cat``, then summed back to one width: not the block before's output)."""

    def __init__(self, width: int, depth: int, *, attention: bool, skips: bool = False) -> None:
        super().__init__()
        self.resnets = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.attentions = torch.nn.ModuleList(
            _Mixer(width) for _ in range(depth if attention else 0)
        )
        self.samplers = torch.nn.ModuleList([_Mixer(width)])

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        for index, resnet in enumerate(self.resnets):
            if skip is not None:
                x = torch.cat([x, skip], dim=-1).unflatten(-1, (2, -1)).sum(-2)
            x = resnet(x)
            if len(self.attentions):
                x = self.attentions[index](x)
        return self.samplers[0](x)


class _UNet(torch.nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.down_blocks = torch.nn.ModuleList(
            [_Stage(width, 2, attention=True), _Stage(width, 2, attention=False)]
        )
        self.mid_block = _Stage(width, 2, attention=True)
        self.up_blocks = torch.nn.ModuleList(
            [
                _Stage(width, 3, attention=False, skips=True),
                _Stage(width, 3, attention=True, skips=True),
            ]
        )
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down_blocks:
            x = block(x)
            skips.append(x)
        x = self.mid_block(x)
        for block in self.up_blocks:
            x = block(x, skips.pop())
        return torch.nn.functional.cross_entropy(self.head(x), y)


class _TwoStreams(torch.nn.Module):
    """Flux's layout: double-stream blocks, then single-stream blocks, two ModuleLists."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.transformer_blocks = torch.nn.ModuleList(Block(width) for _ in range(2))
        self.single_transformer_blocks = torch.nn.ModuleList(_Mixer(width) for _ in range(3))
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for block in self.transformer_blocks:
            x = block(x)
        for block in self.single_transformer_blocks:
            x = block(x)
        return torch.nn.functional.cross_entropy(self.head(x), y)


class _SublayerLayer(torch.nn.Module):
    """LongCat-Flash's layer: two attention and two MLP sublayers in ModuleLists, with a
    norm before each and experts between: one block, not its sublayers."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(width) for _ in range(2))
        self.attentions = torch.nn.ModuleList(_Mixer(width) for _ in range(2))
        self.mlps = torch.nn.ModuleList(_Mixer(width) for _ in range(2))
        self.experts = Block(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index in range(2):
            x = self.attentions[index](self.norms[index](x))
            x = self.experts(x) if index == 0 else x
            x = self.mlps[index](x)
        return x


class _SublayerStack(torch.nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_SublayerLayer(width) for _ in range(2))
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return torch.nn.functional.cross_entropy(self.head(x), y)


def test_find_blocks_on_a_unet_is_every_residual_and_attention_block() -> None:
    """A diffusers U-Net's blocks: every stage's residual and attention blocks, in the order
    they ran, down the down blocks, through the middle block and up the up blocks (what
    diffusers' own gradient checkpointing checkpoints), without the resamplers. Before: a
    resampler and one up block, the largest stack's, as if they were the model's blocks."""
    expected = []
    for stage, depth, attention in [
        ("down_blocks.0", 2, True),
        ("down_blocks.1", 2, False),
        ("mid_block", 2, True),
        ("up_blocks.0", 3, False),
        ("up_blocks.1", 3, True),
    ]:
        for index in range(depth):
            expected.append(f"{stage}.resnets.{index}")
            if attention:
                expected.append(f"{stage}.attentions.{index}")
    assert _recorded_blocks(_UNet) == tuple(expected)


def test_find_blocks_joins_stacks_run_one_after_the_other() -> None:
    """Two stacks side by side, the second run on the first's output (Flux's double- and
    single-stream blocks), are one path of blocks; a layer that runs its sublayers with
    more between them stays one block."""
    assert _recorded_blocks(_TwoStreams) == (
        "transformer_blocks.0",
        "transformer_blocks.1",
        "single_transformer_blocks.0",
        "single_transformer_blocks.1",
        "single_transformer_blocks.2",
    )
    # Without a recorded step, the larger stack alone.
    assert find_blocks(_TwoStreams()) == tuple(f"single_transformer_blocks.{i}" for i in range(3))
    assert _recorded_blocks(_SublayerStack) == ("layers.0", "layers.1")


@pytest.mark.parametrize(
    ("optimizer", "state_per_parameter"), [("adamw", 2), ("adam", 2), ("sgd_momentum", 1)]
)
def test_predictions_hold_for_awkward_modules_and_each_optimizer(
    optimizer: str, state_per_parameter: int
) -> None:
    file = tricky_file(optimizer)
    profile = profile_workload(build_workload(file, seed=0), timing_passes=1)
    model = file.build_model()
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert state_per_parameter * parameter_bytes <= profile.optimizer_state_bytes
    assert profile.optimizer_state_bytes <= state_per_parameter * parameter_bytes + 4096
    memory = MemoryModel(profile.timeline)
    for names in [
        (),
        ("blocks.0",),
        ("blocks.1", "blocks.2"),
        ("blocks.0", "blocks.1", "blocks.2"),
    ]:
        predicted = memory.peak_bytes(_units(names))
        measured = _measured_peak(file, names, profile)
        assert abs(predicted - measured) <= 0.02 * measured, (optimizer, names, predicted, measured)
    assert profile.module("blocks.0").checkpoint_saving_bytes > 0


def test_a_block_that_stores_tensors_into_its_argument_is_excluded() -> None:
    """A block that appends to a cache it is given would append again when recomputed (a
    Hugging Face model with use_cache=True in training): never a candidate, and the reason
    names the argument. Without the cache the same blocks are candidates."""
    cached = profile_workload(build_workload(caching_file(use_cache=True), seed=0))
    block = cached.module("blocks.0")
    assert not block.is_candidate
    assert "stores tensors into cache (KeyValueCache)" in block.excluded_reason
    assert cached.module("blocks.0.mlp").is_candidate  # reads only its tensor input
    assert cached.excluded_blocks_note().startswith("3 of 3 blocks cannot be checkpointed")
    plain = profile_workload(build_workload(caching_file(use_cache=False), seed=0))
    assert plain.module("blocks.0").is_candidate
    assert plain.excluded_blocks_note() == ""


DATA = Path(__file__).resolve().parent / "data"


def test_a_model_that_checkpoints_itself_behind_a_flag_is_profiled_with_it_off() -> None:
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import record_memory

    timm_style = load_model_file(DATA / "timm_flag.py")
    workload, session = build_fake_workload(timm_style)
    profile = record_memory(workload, session=session)
    assert any(
        note.topic is NoteTopic.OWN_CHECKPOINTING and "grad_checkpointing on" in note.text
        for note in profile.assumptions
    )
    assert profile.module("blocks.0").checkpoint_saving_bytes > 0  # a candidate again
    on = build_workload(timm_style, seed=0)
    off_peak = measure_step(on, seed=0).peak_bytes  # built with the flag switched off
    on = build_workload(timm_style, seed=0)
    on.model.set_grad_checkpointing(True)
    assert profile.measured_peak_bytes == off_peak > measure_step(on, seed=0).peak_bytes


def test_checkpoint_calls_in_the_model_code_are_seen_and_counted(stack_profile) -> None:  # type: ignore[no-untyped-def]
    from planner.measure.fake import build_fake_workload
    from planner.measure.profiler import recomputed_in_backward, record_memory

    own = load_model_file(DATA / "own_checkpoint.py")
    workload, session = build_fake_workload(own)
    profile = record_memory(workload, session=session)
    assert recomputed_in_backward(profile.timeline) == ("blocks.0", "blocks.1")
    (note,) = profile.assumptions
    assert note.topic is NoteTopic.OWN_CHECKPOINTING
    assert "checkpoints blocks.0, blocks.1 itself" in str(note)
    assert "cannot be switched off here, so the plan counts it" in note.text
    # Counted: the recorded step is the real one, recomputation included.
    assert profile.measured_peak_bytes == measure_step(build_workload(own, seed=0)).peak_bytes
    assert profile.module("blocks.0").excluded_reason == "checkpointing it frees nothing"
    assert profile.module("blocks.2").is_candidate
    assert recomputed_in_backward(stack_profile[1].timeline) == ()  # none in a plain model


@pytest.mark.slow
def test_blocks_without_child_modules_are_blocks_and_candidates() -> None:
    """A stack of leaf modules that hold their own parameters and compute with torch
    functions is the model's blocks; each is a candidate, since checkpointing it frees its
    activations; every-block checkpointing lowers the peak, and the check passes."""
    from planner.check.compare import CheckReference, check_plan
    from planner.pipeline import plan_checked, profile_model_file
    from planner.solve.planning import baseline_every_block

    path = Path(__file__).resolve().parent.parent / "examples" / "functional_blocks.py"
    profile = profile_model_file(load_model_file(path))
    assert profile.block_names == tuple(f"blocks.{i}" for i in range(8))
    for name in profile.block_names:
        assert profile.module(name).is_candidate, profile.module(name).excluded_reason
    plan = baseline_every_block(profile, budget_bytes=profile.measured_peak_bytes)
    assert plan.predicted_peak_bytes < 0.7 * profile.measured_peak_bytes
    check = check_plan(path, plan, reference=CheckReference.UNPLANNED)
    assert check.passed and check.measured_peak_bytes == plan.predicted_peak_bytes
    # Planned at the every-block budget, the solver's plan is checked by running it: it
    # fits when measured and trains exactly as the unplanned step does.
    planned = plan_checked(
        profile, plan.predicted_peak_bytes, model_path=path, reference=CheckReference.UNPLANNED
    )
    assert planned.check is not None and planned.check.training_unchanged
    assert planned.plan.measured_peak_bytes <= plan.predicted_peak_bytes


def test_recurrent_layers_are_candidates_predicted_to_the_byte() -> None:
    """torch.nn's LSTM and GRU are candidates (its Linear, LayerNorm, ... are not): an LSTM
    holds its sequence's gates and states, and on the CPU oneDNN's workspace. Checkpointing
    either is predicted to the byte, and lowers the peak."""
    file = load_model_file(Path(__file__).resolve().parent / "data" / "recurrent.py")
    profile = profile_workload(build_workload(file, seed=0), timing_passes=1)
    for name in ("lstm", "gru"):
        assert profile.module(name).is_candidate, profile.module(name).excluded_reason
    assert not profile.module("head").is_candidate
    memory = MemoryModel.for_profile(profile)
    for names in [("lstm",), ("gru",), ("lstm", "gru")]:
        predicted = memory.peak_bytes(_units(names))
        assert predicted == _measured_peak(file, names, profile) < profile.measured_peak_bytes
