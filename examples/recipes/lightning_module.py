"""Recipe: a ckpt-plan plan in a Lightning ``LightningModule`` (tiny random GPT-2, CPU).

    python examples/recipes/lightning_module.py

1. Plan the model and the batch it trains on, for Lightning's loop (``profile_and_plan`` on
   the model file ``examples/hf_gpt2.py`` with ``loop=LIGHTNING_LOOP``; on the command line
   ``ckpt-plan profile examples/hf_gpt2.py --budget 40MiB --zero-grad after-forward``).
2. Apply the plan in ``configure_model``: Lightning calls it in its strategy's context,
   before the optimizers are configured (where a model-parallel strategy shards the model
   in this hook, apply the plan before ``fully_shard``). The hook runs again in each of
   fit, validate, test and predict, and must be idempotent: ``apply_plan`` is.

**The loop's shape.** Lightning's automatic optimization zeroes the gradients inside its
closure, after ``training_step`` (the forward) and before the backward; so from the second
step on, the previous step's gradients are alive during the forward. A plan made for the
plain loop (``zero_grad`` before the forward, ckpt-plan's default) does not count them, and
Lightning's step goes over its budget by up to the gradients' bytes (measured, ``python
benchmarks/recipes.py``: 41.01 MiB against a 40 MiB plan predicted at 39.32 MiB; gradients
3.64 MiB). So plan for Lightning's loop (``LIGHTNING_LOOP``, ``--zero-grad after-forward``):
that plan counts them and fits. Alternatively, zero the gradients yourself before the
forward, as the plain loop does (``zero_grad_before_forward=True`` below:
``on_train_batch_start`` zeroes them to None; Lightning's own ``zero_grad`` after the
forward then has nothing left to free), and keep a plain-loop plan.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import lightning
import torch
from torch.utils.data import DataLoader

from planner import Plan, apply_plan, profile_and_plan
from planner.core.loop import LoopShape, ZeroGrad
from planner.measure.workload import load_model_file

MODEL_FILE = Path(__file__).resolve().parent.parent / "hf_gpt2.py"
BUDGET_BYTES = 40 * 2**20  # 40 MiB


# Lightning's automatic optimization: gradients zeroed after the forward, before backward.
LIGHTNING_LOOP = LoopShape(zero_grad=ZeroGrad.AFTER_FORWARD)


def make_plan(
    budget_bytes: int = BUDGET_BYTES, *, check: bool = True, loop: LoopShape = LIGHTNING_LOOP
) -> Plan:
    """The cheapest plan whose training step, in ``loop`` (default: Lightning's), fits
    ``budget_bytes`` (``check``: run it once, in a separate process, to check its peak and
    that training is unchanged)."""
    return profile_and_plan(MODEL_FILE, budget_bytes, check=check, loop=loop).plan


class PlannedLanguageModel(lightning.LightningModule):
    """The model file's model, trained by Lightning with ``plan`` applied (None: no plan)."""

    def __init__(self, plan: Plan | None, *, zero_grad_before_forward: bool = False) -> None:
        super().__init__()
        self.model = load_model_file(MODEL_FILE).build_model()
        self.plan = plan
        self.zero_grad_before_forward = zero_grad_before_forward
        self.losses: list[float] = []

    def configure_model(self) -> None:
        if self.plan is not None:
            apply_plan(self.model, self.plan)

    def on_train_batch_start(self, batch: Any, batch_index: int) -> None:
        if self.zero_grad_before_forward:  # the plain loop's shape: no gradients in the forward
            self.optimizers().zero_grad(set_to_none=True)

    def training_step(self, batch: dict[str, torch.Tensor], batch_index: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)  # the model file's optimizer


def make_batches(steps: int = 3, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``steps`` batches of the shape the plan was made for (the model file's sample_batch())."""
    model_file = load_model_file(MODEL_FILE)
    torch.manual_seed(seed)
    return [model_file.sample_batch() for _ in range(steps)]


def train(
    plan: Plan | None,
    batches: list[dict[str, torch.Tensor]],
    *,
    seed: int = 0,
    zero_grad_before_forward: bool = False,
) -> list[float]:
    """Train one step per batch with ``lightning.Trainer``; the loss of each step."""
    torch.manual_seed(seed)
    module = PlannedLanguageModel(plan, zero_grad_before_forward=zero_grad_before_forward)
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=len(batches),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(module, DataLoader(batches, batch_size=None))  # batches as they are
    return module.losses


if __name__ == "__main__":
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    plan = make_plan()
    print("checkpointed:", ", ".join(d.module_name for d in plan.modules))
    batches = make_batches()
    print("losses with the plan:   ", train(plan, batches))
    print("losses without the plan:", train(None, batches))
