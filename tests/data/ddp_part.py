"""tests/data/small_gpt.py whose parallelize(model, mesh) wraps only a part of the model in
DistributedDataParallel: ckpt-plan plans DDP of the whole model and says so."""

import torch
from small_gpt import build_model, gpt, sample_batch  # noqa: F401


def parallelize(model, mesh):
    model.blocks = torch.nn.parallel.DistributedDataParallel(model.blocks, device_mesh=mesh)
    return model
