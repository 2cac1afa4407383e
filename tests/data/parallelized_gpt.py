"""tests/data/small_gpt.py with its own parallelize(model, mesh): fully_shard on the blocks
only, each block's parameters kept gathered after its forward (reshard_after_forward=False),
as a torchtitan-style parallelize function lays a model out."""

from small_gpt import build_model, gpt, sample_batch  # noqa: F401
from torch.distributed.fsdp import fully_shard


def parallelize(model, mesh):
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh)
    return model
