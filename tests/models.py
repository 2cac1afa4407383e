"""Tiny models shared by the tests (kept small so the suite runs in seconds on a CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from planner.core.records import Unit
from planner.measure.model_file import ModelFile
from planner.measure.source import WorkloadSource


class Block(nn.Module):
    """Pre-norm residual MLP block; dropout makes RNG replay matter."""

    def __init__(self, width: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.mlp(self.norm(x)))


class Stack(nn.Module):
    """Blocks in a ModuleList, a head, and a scalar loss from ``forward(x, y)``."""

    def __init__(self, width: int = 32, depth: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, dropout) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.head(x), y)


class SharedBlockModel(nn.Module):
    """One block applied twice (shared weights) and an output head tied to the input."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(10, width, bias=False)
        self.shared = Block(width)
        self.last = Block(width)
        self.head = nn.Linear(width, 10, bias=False)
        self.head.weight = nn.Parameter(self.embed.weight.t().contiguous())

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = self.shared(self.shared(h))
        return nn.functional.cross_entropy(self.head(self.last(h)), y)


class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
        )
        self.head = nn.Linear(8, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).mean(dim=(2, 3)))


def units_of(names: tuple[str, ...]) -> list[Unit]:
    """Units from their printed names: ``"blocks.1"``, ``"blocks.1@offload"``."""
    units = []
    for name in names:
        module, _, option = name.partition("@")
        units.append(Unit(module, option=option or None))
    return units


def memory_profile(source: Path | ModelFile, **options: Any):  # type: ignore[no-untyped-def]
    """The memory half of a profile (fake tensors, on CPU, the plain loop), as `ckpt-plan
    profile` records it; ``options`` go to ``record_step_memory`` (``expert_load``)."""
    from planner.core.loop import PLAIN_LOOP
    from planner.core.records import MemorySource
    from planner.measure.workload import load_model_file
    from planner.pipeline import record_step_memory

    return record_step_memory(
        load_model_file(source) if isinstance(source, Path) else source,
        device="cpu",
        seed=0,
        memory=MemorySource.FAKE,
        budget_bytes=None,
        target=None,
        loop=PLAIN_LOOP,
        progress=None,
        **options,
    )


def model_file(build: Any, batch: Any, **functions: Any) -> ModelFile:
    """A ModelFile made in memory (no file on disk)."""
    return ModelFile(
        path=Path(__file__),
        name=functions.pop("name", "test_model"),
        build_model=build,
        sample_batch=batch,
        training_step=functions.pop("training_step", None),
        loss_fn=functions.pop("loss_fn", None),
        build_optimizer=functions.pop("build_optimizer", None),
        source=WorkloadSource.model_file(Path(__file__)),
    )


def stack_file(width: int = 32, depth: int = 4, batch: int = 64, dropout: float = 0.1) -> ModelFile:
    return model_file(
        lambda: Stack(width, depth, dropout),
        lambda: (torch.randn(batch, width), torch.randint(0, 10, (batch,))),
        name="stack",
    )


class DictBlock(nn.Module):
    """Takes a keyword argument, returns a dict holding a view and an in-place result."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.act = nn.ReLU(inplace=True)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> dict[str, torch.Tensor]:
        hidden = self.act(self.up(x) * scale)  # in-place ReLU on a fresh tensor
        out = self.down(hidden) + x
        return {"out": out, "flat": out.view(-1)}  # "flat" is a view of "out"


class TrickyModel(nn.Module):
    """Keyword arguments, dict outputs with views, in-place ops, and a first block whose
    input does not require grad; the loss is computed outside the model (training_step)."""

    def __init__(self, width: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(DictBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, scale=0.5)["out"]
        return self.head(x)


def tricky_file(optimizer: str = "adamw") -> ModelFile:
    builders = {
        "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
        "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
        "sgd_momentum": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
    }
    return model_file(
        lambda: TrickyModel(),
        lambda: (torch.randn(128, 32), torch.randint(0, 10, (128,))),
        training_step=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]),
        build_optimizer=builders[optimizer],
        name=f"tricky_{optimizer}",
    )


class KeyValueCache:
    """A cache object as Hugging Face passes one through its layers: each layer stores its
    keys in it during the forward."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []


class CachingBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.key = nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor, cache: KeyValueCache | None = None) -> torch.Tensor:
        key = self.key(x)
        if cache is not None:
            cache.keys.append(key)  # recomputing this block would append again
        return x + self.mlp(torch.tanh(key))


class CachingStack(nn.Module):
    """Blocks sharing one cache object made in the root's forward (``use_cache``)."""

    def __init__(self, width: int = 32, depth: int = 3, use_cache: bool = True) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CachingBlock(width) for _ in range(depth))
        self.use_cache = use_cache

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = KeyValueCache() if self.use_cache else None
        for block in self.blocks:
            x = block(x, cache)
        return x.square().mean()


def caching_file(use_cache: bool = True) -> ModelFile:
    return model_file(
        lambda: CachingStack(use_cache=use_cache),
        lambda: torch.randn(64, 32),
        loss_fn=lambda output, batch: output,
        name=f"caching_{use_cache}",
    )


class AmpBlock(nn.Module):
    """fp32 weights whose bf16 copies (autocast's) are 1 MiB; ``up`` is called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(512, 1024)
        self.down = nn.Linear(1024, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = nn.functional.gelu(self.up(x)) + self.up(x.mul(0.5))
        return x + self.down(hidden)


class AmpModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(AmpBlock() for _ in range(3))
        self.head = nn.Linear(512, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        # A 16 MiB temporary: the step peaks here, inside autocast, after every block.
        return self.head(x).float().pow(2).mean() + x.repeat(16, 1).mean()


def amp_file() -> ModelFile:
    def build() -> AmpModel:
        torch.manual_seed(0)
        return AmpModel()

    def amp_batch() -> torch.Tensor:
        return torch.randn(512, 512, generator=torch.Generator().manual_seed(1))

    def step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x)

    return model_file(
        build,
        amp_batch,
        training_step=step,
        build_optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
        name="amp-model",
    )


def profile_halfway(source: WorkloadSource, profile: Any, folder: Path) -> Any:
    """``ckpt-plan profile`` of ``source`` (run in ``folder``, the working directory) at the
    budget halfway between checkpointing every block of ``profile`` and its unplanned peak:
    the plan written, checked in its own process and predicted to the byte within the
    budget."""
    from typer.testing import CliRunner

    from planner.cli.main import app
    from planner.plan.plan_file import load_plan
    from planner.solve.planning import baseline_every_block

    low = baseline_every_block(profile).predicted_peak_bytes
    budget = (low + profile.measured_peak_bytes) // 2
    result = CliRunner().invoke(
        app, ["profile", *source.command_arguments(), "--budget", str(budget)]
    )
    assert result.exit_code == 0, result.output
    plan = load_plan(folder / "profiles" / source.name / "plan.json")
    assert plan.modules and plan.checked
    assert plan.measured_peak_bytes == plan.predicted_peak_bytes <= budget
    return plan
