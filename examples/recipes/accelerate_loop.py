"""Recipe: a ckpt-plan plan in a loop run by Hugging Face ``accelerate`` (tiny random Llama, CPU).

    python examples/recipes/accelerate_loop.py

1. Plan the model and the batch it trains on (``profile_and_plan`` on the model file
   ``examples/hf_llama.py``).
2. Apply the plan to the model, then ``Accelerator().prepare`` it: whatever ``prepare`` wraps
   the model in (DDP across processes, ``torch.compile`` with a dynamo plugin) then holds the
   planned model, and the checkpointed modules are part of what it wraps.
3. Train as accelerate's loop does, with ``optimizer.zero_grad()`` before the forward: the
   plain loop's shape, the one the plan was made for. (Zeroing after ``optimizer.step()``
   is the same shape; zeroing between the forward and the backward, as Lightning does, is
   not: see ``lightning_module.py``.)

The data loader yields batches of the plan's shape; the optimizer is the model file's.
accelerate's data loader collates each batch into new tensors and fetches the next one before
a step runs: two collated batches are alive in a step where the plan counted one batch, so
the plan is made for the budget less two batches (32 KiB here; see ``loader_room_bytes``).

Measured (``python benchmarks/recipes.py``; docs/results.md, "Recipes"): 31.53 MiB of live
tensor storages over the whole run, against the 32 MiB budget (74.06 MiB without the plan),
with the unplanned run's losses, step for step.
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from planner import Plan, apply_plan, profile_and_plan
from planner.measure.workload import load_model_file

MODEL_FILE = Path(__file__).resolve().parent.parent / "hf_llama.py"
BUDGET_BYTES = 32 * 2**20  # 32 MiB


def loader_room_bytes(batch: dict[str, torch.Tensor]) -> int:
    """Room to leave for accelerate's data loader beyond the batch the plan counted: it
    collates each batch into new tensors (labels apart from input_ids, which the model file's
    batch shares) and fetches the next batch before yielding one, so during a step two
    collated batches are alive."""
    return 2 * sum(tensor.nbytes for tensor in batch.values())


def make_plan(budget_bytes: int = BUDGET_BYTES, *, check: bool = True) -> Plan:
    """The cheapest plan whose training step fits ``budget_bytes`` with room for
    accelerate's data loader (``check``: run the plan once, in a separate process, to check its
    peak and that training is unchanged)."""
    room = loader_room_bytes(load_model_file(MODEL_FILE).sample_batch())
    return profile_and_plan(MODEL_FILE, budget_bytes - room, check=check).plan


def make_batches(steps: int = 3, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``steps`` batches of the shape the plan was made for (the model file's sample_batch())."""
    model_file = load_model_file(MODEL_FILE)
    torch.manual_seed(seed)
    return [model_file.sample_batch() for _ in range(steps)]


def train(
    plan: Plan | None, batches: list[dict[str, torch.Tensor]], *, seed: int = 0
) -> list[float]:
    """Train one step per batch in an accelerate loop; the loss of each step."""
    torch.manual_seed(seed)
    model = load_model_file(MODEL_FILE).build_model()
    if plan is not None:
        apply_plan(model, plan)  # before prepare
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the one the plan counted
    batch_size = len(batches[0]["input_ids"])
    rows = [
        {key: tensor[row] for key, tensor in batch.items()}
        for batch in batches
        for row in range(batch_size)
    ]
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(
        model, optimizer, DataLoader(rows, batch_size=batch_size)
    )
    model.train()
    losses = []
    for batch in loader:
        optimizer.zero_grad(set_to_none=True)  # before the forward, as the plan assumes
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    plan = make_plan()
    print("checkpointed:", ", ".join(d.module_name for d in plan.modules))
    batches = make_batches()
    print("losses with the plan:   ", train(plan, batches))
    print("losses without the plan:", train(None, batches))
