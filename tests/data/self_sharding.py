"""A model file that shards its model itself in build_model() (fully_shard on each block and
the root), as a torchrun training script does: ckpt-plan must say to move that into
parallelize(model, mesh), not crash."""

from small_gpt import (
    gpt,
    sample_batch,  # noqa: F401
)
from torch.distributed.fsdp import fully_shard


def build_model():
    model = gpt.build_model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model
