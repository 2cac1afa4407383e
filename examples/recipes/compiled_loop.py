"""Recipe: a plain training loop with ``torch.compile`` after ``apply_plan`` (tiny random
GPT-2, CPU).

    python examples/recipes/compiled_loop.py

1. Plan the model and the batch it trains on (``profile_and_plan`` on the model file
   ``examples/hf_gpt2.py``).
2. Apply the plan, then compile: ``torch.compile`` traces the checkpointed modules as
   checkpointed regions, and its partitioner recomputes them in the backward instead of
   saving their activations. (Applying the plan to the compiled model also works: it finds
   the model inside, and a compiled model that already ran recompiles.)
3. Train as in the plain loop the plan was made for: ``zero_grad`` before the forward.

**What budget a compiled plan holds.** The plan's figures are for the eager step;
compiling changes what the step keeps alive (fused kernels save fewer, different tensors),
so the plan's prediction is not the compiled step's peak. Measured on this tiny GPT-2 at a
40 MiB budget (``python benchmarks/recipes.py``: torch 2.13 CPU, 3 steps, whole run; peaks
from the CPU allocator's accounting, because compiled kernels allocate below the dispatcher
the storage tracker watches; docs/results.md, "Recipes"), with a plan predicted at 39.32 MiB:

=====================================  =========
run                                    peak
=====================================  =========
eager, no plan                         59.56 MiB
eager, planned                         39.32 MiB
compiled, no plan                      42.90 MiB
compiled, planned                      32.26 MiB
=====================================  =========

The compiled planned step held the budget with 7.74 MiB to spare, and peaked 10.64 MiB below
the compiled unplanned step, which is itself over the budget: compiling alone does not make
this model fit. Two other plans for the same budget (ckpt-plan's choice moves with timing
noise) measured 30.44 and 33.45 MiB compiled. Losses equal the compiled unplanned run's,
step for step (compiled and eager losses differ in the last digits: inductor's dropout
draws its own random numbers). The room depends on the model and on torch's version:
measure your compiled step (``planner.measure.tracking.AllocatorPeakTracker``) before
lowering a budget to use it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from planner import Plan, apply_plan, profile_and_plan
from planner.measure.workload import load_model_file

MODEL_FILE = Path(__file__).resolve().parent.parent / "hf_gpt2.py"
BUDGET_BYTES = 40 * 2**20  # 40 MiB


def make_plan(budget_bytes: int = BUDGET_BYTES, *, check: bool = True) -> Plan:
    """The cheapest plan whose (eager) training step fits ``budget_bytes`` (``check``: run it
    once, in a separate process, to check its peak and that training is unchanged)."""
    return profile_and_plan(MODEL_FILE, budget_bytes, check=check).plan


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
    compile: bool = True,
    backend: str = "inductor",
) -> list[float]:
    """Train one step per batch in a plain loop, compiled unless ``compile`` is False (by
    ``backend``: ``"aot_eager"`` traces and partitions the step as inductor does, without
    generating kernels); the loss of each step."""
    torch.manual_seed(seed)
    model = load_model_file(MODEL_FILE).build_model()
    if plan is not None:
        apply_plan(model, plan)  # first the plan, then compile
    step_model = torch.compile(model, backend=backend) if compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the one the plan counted
    losses = []
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = step_model(**batch).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    plan = make_plan()
    print("checkpointed:", ", ".join(d.module_name for d in plan.modules))
    batches = make_batches()
    print("losses with the plan, compiled:   ", train(plan, batches))
    print("losses without the plan, compiled:", train(None, batches))
