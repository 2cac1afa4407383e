"""Recipe: a ckpt-plan plan in Hugging Face's ``Trainer`` (tiny random GPT-2, CPU).

    python examples/recipes/hf_trainer.py

1. Plan the model and the batch it trains on (``profile_and_plan`` on the model file
   ``examples/hf_gpt2.py``: its ``build_model()`` and ``sample_batch()``).
2. Apply the plan to the model, then construct the ``Trainer``: ``apply_plan`` wraps the
   chosen submodules in place, so the model the Trainer (and accelerate inside it) trains is
   the planned one.
3. Keep Hugging Face's own gradient checkpointing off (``TrainingArguments``'
   ``activation_checkpointing``, ``gradient_checkpointing`` in transformers 4.x, left at its
   default, False): the plan replaces it. Both at once recompute more and free nothing the
   plan does not; the plan's first-forward guard warns if it is on.

The Trainer's step is the plan's step only if its batch is the plan's batch
(``per_device_train_batch_size`` rows of the planned sequence length: a larger batch is a
larger step, which the guard warns about) and its optimizer is the one the plan counted (the
model file's, here torch's ``AdamW``), so the optimizer is built here and handed to the
Trainer. The Trainer zeroes gradients after each optimizer step, so none are alive during
the next forward, as in the plain loop the plan was made for.

Its data loader (accelerate's) collates each batch into new tensors and fetches the next
one before a step runs: two collated batches are alive in a step where the plan counted one
batch, so the plan is made for the budget less two batches (16 KiB here; see
``loader_room_bytes``).

Measured (``python benchmarks/recipes.py``; docs/results.md, "Recipes"): 39.83 MiB of live
tensor storages over the whole run, against the 40 MiB budget (59.58 MiB without the plan),
with the unplanned run's losses, step for step.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments

from planner import Plan, apply_plan, profile_and_plan
from planner.measure.workload import load_model_file

MODEL_FILE = Path(__file__).resolve().parent.parent / "hf_gpt2.py"
BUDGET_BYTES = 40 * 2**20  # 40 MiB


def loader_room_bytes(batch: dict[str, torch.Tensor]) -> int:
    """Room to leave for accelerate's data loader beyond the batch the plan counted: it
    collates each batch into new tensors (labels apart from input_ids, which the model file's
    batch shares) and fetches the next batch before yielding one, so during a step two
    collated batches are alive."""
    return 2 * sum(tensor.nbytes for tensor in batch.values())


def make_plan(budget_bytes: int = BUDGET_BYTES, *, check: bool = True) -> Plan:
    """The cheapest plan whose training step fits ``budget_bytes`` with room for the
    Trainer's data loader, accelerate's (``check``: run the plan once, in a separate process,
    to check its peak and that training is unchanged)."""
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
    """Train one step per batch with ``transformers.Trainer`` (``plan`` None: without a
    plan); the loss of each step."""
    torch.manual_seed(seed)
    model = load_model_file(MODEL_FILE).build_model()
    if plan is not None:
        apply_plan(model, plan)  # in place, before the Trainer sees the model
    batch_size = len(batches[0]["input_ids"])
    rows = [
        {key: tensor[row] for key, tensor in batch.items()}
        for batch in batches
        for row in range(batch_size)
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the one the plan counted
    with tempfile.TemporaryDirectory() as output_dir:
        # Hugging Face's own checkpointing stays off, its default: the plan replaces it
        # (activation_checkpointing=True here, gradient_checkpointing in transformers 4.x,
        # would recompute more and free nothing the plan does not).
        arguments = TrainingArguments(
            output_dir=output_dir,
            per_device_train_batch_size=batch_size,  # the plan's: a larger batch is a larger step
            max_steps=len(batches),
            logging_steps=1,  # one loss per step in log_history
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            seed=seed,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model, args=arguments, train_dataset=rows, optimizers=(optimizer, None)
        )
        trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


if __name__ == "__main__":
    plan = make_plan()
    print("checkpointed:", ", ".join(d.module_name for d in plan.modules))
    batches = make_batches()
    print("losses with the plan:   ", train(plan, batches))
    print("losses without the plan:", train(None, batches))
