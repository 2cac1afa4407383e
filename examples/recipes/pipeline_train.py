"""Recipe: a pipeline (``torch.distributed.pipelining``), one stage per rank (under
interleaved 1F1B, two chunks per rank), each rank with its own plan from one plan file (CPU:
gloo; GPUs: NCCL, one per rank).

    ckpt-plan profile tests/data/tp_gpt.py --budget 330000 --pp 2 --microbatches 4 -o plan.json
    torchrun --nproc-per-node 2 examples/recipes/pipeline_train.py plan.json

    ckpt-plan profile tests/data/tp_gpt4.py --budget 560000 --pp 2 --microbatches 4 \
        --schedule interleaved-1f1b -o plan.json

1. Plan every stage, once, on any machine: ``--pp S --microbatches M --schedule
   1f1b|gpipe|interleaved-1f1b`` (the budget is each rank's peak; each rank is simulated in
   its schedule, and where S is small the plan is checked on S real ranks before it is
   written).
2. On every rank, in this order: build the model; take the shapes that cross the stage
   boundaries (``boundary_metas``, on fake tensors: no memory); make this rank's stage
   (``make_stage``: the other stages' modules taken out, names kept; under interleaved 1F1B
   rank r keeps chunks r and r + S of 2S, both in this one module); ``apply_plan(stage,
   plan)``, which picks this rank's decisions by its modules; THEN the ``PipelineStage``
   objects (one per chunk) and their schedule (``stage_schedule``), THEN the optimizer over
   the stage's parameters.
3. Each step: ``zero_grad``, ``schedule.step`` over the batch's micro-batches (the last
   stage gets its losses), ``optimizer.step``.

Each rank prints one JSON line: its losses (the last stage's: the mean over the
micro-batches; the other stages', none). Without a plan (``--pp S --microbatches M``) it
trains the same pipeline unplanned. ``--compare`` trains the same steps without the plan
first, in the same launch and laid out as the plan says, and each rank's line carries both
runs' losses and whether every one is equal.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from planner import apply_plan, load_plan
from planner.core.parallel import PipelineLayout
from planner.measure.pipeline_stage import stage_schedule
from planner.measure.stage_split import batch_keywords, boundary_metas, make_stage
from planner.measure.workload import load_model_file


def train(
    plan_path: Path | None, model_path: str | None, steps: int, pipeline: PipelineLayout
) -> list[float]:
    """``steps`` training steps of this rank's stage; ``plan_path`` None: unplanned, as
    ``pipeline`` says (with a plan: as the plan says)."""
    plan = load_plan(plan_path) if plan_path is not None else None
    if plan is not None:
        assert plan.parallel is not None and plan.parallel.pipeline is not None, "not a --pp plan"
        pipeline = plan.parallel.pipeline
        model_path = model_path or plan.model_file
    assert model_path is not None, "--model MODEL.py (or a plan that records it)"
    model_file = load_model_file(model_path)
    device = "cpu"
    if torch.cuda.is_available():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank: each keeps its stage's
    model = model_file.build_model().to(device)
    boundaries = boundary_metas(model, model_file, model_file.sample_batch(), pipeline)
    stage_module = make_stage(model, model_file, pipeline, rank)  # 1. the stage
    if plan is not None:
        apply_plan(stage_module, plan)  # 2. this stage's plan
    _, schedule = stage_schedule(stage_module, pipeline, rank, boundaries, device)  # 3.
    optimizer = torch.optim.AdamW(stage_module.parameters(), lr=1e-3)  # 4.
    last = rank == pipeline.stages - 1  # holds the last chunk, under interleaved 1F1B too
    losses = []
    for step in range(steps):
        torch.manual_seed(1000 + step)  # every rank draws the same batch
        batch = {key: value.to(device) for key, value in model_file.sample_batch().items()}
        optimizer.zero_grad(set_to_none=True)
        if last:
            step_losses: list[torch.Tensor] = []
            target = torch.zeros(pipeline.microbatches, device=device)
            schedule.step(
                target=target, losses=step_losses, return_outputs=False, **batch_keywords(batch)
            )
            losses.append(torch.stack(step_losses).mean().item())
        else:
            schedule.step(return_outputs=False, **batch_keywords(batch))
        optimizer.step()
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path, nargs="?", help="plan.json (none: train unplanned)")
    parser.add_argument("--model", default=None, help="the model file the plan was made for")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=4, help="without a plan")
    parser.add_argument(
        "--schedule", default="1f1b", help="without a plan: 1f1b, gpipe or interleaved-1f1b"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="first train without the plan (laid out as the plan says), then with it, and "
        "print both runs' losses",
    )
    arguments = parser.parse_args()
    if arguments.compare and arguments.plan is None:
        parser.error("--compare needs a plan to compare with")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        pipeline = PipelineLayout(dist.get_world_size(), arguments.microbatches, arguments.schedule)
        line: dict[str, object] = {"rank": dist.get_rank()}
        if arguments.compare:
            plan = load_plan(arguments.plan)
            assert plan.parallel is not None and plan.parallel.pipeline is not None, (
                "not a --pp plan"
            )
            model = arguments.model or plan.model_file
            line["unplanned_losses"] = train(None, model, arguments.steps, plan.parallel.pipeline)
        line["losses"] = train(arguments.plan, arguments.model, arguments.steps, pipeline)
        if arguments.compare:
            line["equal"] = line["losses"] == line["unplanned_losses"]
        print(json.dumps(line), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
