"""Recipe: one plan for every rank of a ``torchrun`` job, with DDP, FSDP2, tensor parallelism
or FSDP2 x TP (CPU: gloo; GPUs: NCCL, one per rank).

    ckpt-plan profile examples/gpt.py --budget 80MiB --world-size 2 --parallel fsdp2 -o plan.json
    torchrun --nproc-per-node 2 examples/recipes/torchrun_train.py plan.json

    ckpt-plan profile tests/data/tp_gpt.py --budget 0.48MB --world-size 4 --parallel fsdp2 \
        --tp 2 -o plan.json
    torchrun --nproc-per-node 4 examples/recipes/torchrun_train.py plan.json \
        --model tests/data/tp_gpt.py

1. Plan ONE rank of the job, once, on any machine: ``--world-size N --parallel ddp|fsdp2``
   (the budget is each rank's peak; the ranks are simulated on a fake process group, and where
   N is small the plan is checked on N real ranks before it is written).
2. On every rank, in this order: build the model, ``apply_plan(model, plan)`` (the same JSON
   on every rank; a plan made for another world size is refused), THEN build the device mesh
   the plan was made for (its shape and dimension names: ``("dp",)``, HSDP's ``("replicate",
   "shard")``, with TP ``"tp"`` last) and lay the model out on it (``fully_shard`` on each
   block and the root, DDP, or the model file's ``parallelize(model, mesh)``: TP on
   ``mesh["tp"]``, then ``fully_shard`` over the data-parallel dimensions), THEN build the
   optimizer over the sharded parameters. The plan must go on before sharding: a
   checkpointed block's recomputation then runs inside FSDP's hooks, with its parameters
   gathered, and TP's hooks stay outside the recomputed forward, as they were planned.
3. Train with the loop the plan was made for (plain: ``zero_grad`` before the forward; with
   ``--grad-accum N`` N micro-batches per optimizer step; with ``--no-sync`` too, the ones
   before the last under DDP's ``no_sync()`` or FSDP2's ``set_requires_gradient_sync(False)``,
   as Hugging Face's Trainer and accelerate run them: :func:`gradients_unsynced`).
   On GPUs, launch with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, as every CUDA
   plan assumes (``apply_plan`` warns once, saying so, where it is not set).

The model (``--model``; default: the one the plan records, else ``examples/gpt.py``) is the
one the plan was made for: a model file, or a Hugging Face workload (``--hf CONFIG``: the plan
records it as ``hf:CONFIG?batch_size=B&seq_len=S``). A model file's ``parallelize(model,
mesh)``, if it defines one (``fully_shard`` for FSDP2, tensor parallelism, or
``DistributedDataParallel(model, ...)`` with its own options for DDP), lays the model out
instead of the default, as ckpt-plan did when planning; a Hugging Face Llama with TP takes
ckpt-plan's built-in plan (``parallelize_hf_llama``). Each rank prints one JSON line: its
losses. The ranks of a TP group must see the same batch: here every rank draws the same one.

``--compare`` trains the same steps without the plan first, in the same launch and laid out
as the plan says, and each rank's line carries both runs' losses and whether every one is
equal (it must be: a plan never changes training).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from planner import LoopShape, ParallelLayout, apply_plan, load_plan
from planner.core.loop import ZeroGrad
from planner.measure.candidates import find_blocks
from planner.measure.tensor_parallel import parallelize_hf_llama
from planner.measure.workload import compute_loss, load_model_file

EXAMPLES = Path(__file__).resolve().parent.parent


def parallelize(
    model: torch.nn.Module, mesh, layout: ParallelLayout, model_file
) -> torch.nn.Module:  # type: ignore[no-untyped-def]
    """The layout ckpt-plan planned for: the model file's own parallelize(model, mesh) where
    it defines one; else, with tensor parallelism, ckpt-plan's built-in plan for a Hugging
    Face Llama-family model (--hf); else DDP with its default buckets (ddp) or fully_shard on
    each block and the root (fsdp2)."""
    if model_file.parallelize is not None:
        return model_file.parallelize(model, mesh) or model
    if "tp" in layout.mesh_dim_names:
        return parallelize_hf_llama(model, mesh)  # TP, then fully_shard over dp (if any)
    if layout.strategy.value == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    for name in find_blocks(model):
        fully_shard(model.get_submodule(name), mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


@contextlib.contextmanager
def gradients_unsynced(model: torch.nn.Module) -> Iterator[None]:
    """The micro-batches before the last of an accumulation cycle, as Hugging Face's Trainer
    and accelerate run them: no gradient sync across ranks (a plan made with --no-sync)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
        return
    model.set_requires_gradient_sync(False)  # fully_shard's root: recurses into the blocks
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def train(
    plan_path: Path | None,
    model_path: str | None,
    steps: int,
    layout: ParallelLayout,
    loop: LoopShape | None = None,
) -> list[float]:
    """``steps`` optimizer steps on this rank; ``plan_path`` None trains without a plan, laid
    out as ``layout`` says (with a plan: as the plan says), in the loop ``loop`` (with a
    plan: the plan's; else the plain loop). ``model_path`` None: the model the plan was made
    for (its model file, or its Hugging Face workload), else examples/gpt.py. Returns the
    loss of each step's last micro-batch."""
    plan = load_plan(plan_path) if plan_path is not None else None
    loop = plan.loop if plan is not None else loop or LoopShape()
    if model_path is None:
        model_path = plan.model_file if plan and plan.model_file else str(EXAMPLES / "gpt.py")
    model_file = load_model_file(model_path)
    device = "cpu"
    if torch.cuda.is_available():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's)
    model = model_file.build_model().to(device)
    if plan is not None:
        if plan.parallel is not None:  # the layout the plan was made for: strategy and mesh
            layout = plan.parallel
        apply_plan(model, plan)  # before sharding
    # ("dp",), HSDP's ("replicate", "shard"), with tensor parallelism "tp" last
    mesh = init_device_mesh(
        device.split(":")[0], layout.mesh_shape, mesh_dim_names=layout.mesh_dim_names
    )
    model = parallelize(model, mesh, layout, model_file)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # over the shards
    losses = []
    for step in range(steps):
        torch.manual_seed(1000 + step)
        batch = {key: value.to(device) for key, value in model_file.sample_batch().items()}
        for micro_batch in range(loop.grad_accum):  # 1 without gradient accumulation
            first, last = micro_batch == 0, micro_batch == loop.grad_accum - 1
            unsynced = loop.no_sync and not last
            with gradients_unsynced(model) if unsynced else contextlib.nullcontext():
                if first and loop.zero_grad is ZeroGrad.BEFORE_FORWARD:
                    optimizer.zero_grad(set_to_none=True)
                loss = compute_loss(model_file, model, batch)
                if loop.grad_accum > 1:
                    loss = loss / loop.grad_accum  # the mean's gradient, as loops do
                if first and loop.zero_grad is ZeroGrad.AFTER_FORWARD:
                    optimizer.zero_grad(set_to_none=True)
                loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path, nargs="?", help="plan.json (none: train unplanned)")
    parser.add_argument(
        "--model",
        help="the model file (or hf:CONFIG?batch_size=B&seq_len=S) the plan was made for",
        default=None,
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--parallel", default="fsdp2", help="without a plan: ddp, fsdp2 or tp")
    parser.add_argument("--tp", type=int, default=1, help="without a plan: the TP degree")
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
        world_size = dist.get_world_size()
        tp = world_size if arguments.parallel == "tp" else arguments.tp
        layout = ParallelLayout(world_size, arguments.parallel, tp=tp)
        line: dict[str, object] = {"rank": dist.get_rank()}
        if arguments.compare:
            plan = load_plan(arguments.plan)
            model = arguments.model or plan.model_file or str(EXAMPLES / "gpt.py")
            line["unplanned_losses"] = train(
                None, model, arguments.steps, plan.parallel or layout, plan.loop
            )
        line["losses"] = train(arguments.plan, arguments.model, arguments.steps, layout)
        if arguments.compare:
            line["equal"] = line["losses"] == line["unplanned_losses"]
        print(json.dumps(line), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
