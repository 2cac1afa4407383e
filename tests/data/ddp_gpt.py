"""tests/data/small_gpt.py with its own parallelize(model, mesh) for a DDP job: the model in
DistributedDataParallel with its gradients as views of the buckets and small buckets, as a
training script that saves the gradients' memory builds it."""

import torch
from small_gpt import build_model, gpt, sample_batch  # noqa: F401


def parallelize(model, mesh):
    return torch.nn.parallel.DistributedDataParallel(
        model,
        device_mesh=mesh,
        gradient_as_bucket_view=True,
        bucket_cap_mb=0.25,
    )
