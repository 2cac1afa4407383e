"""tests/data/small_gpt.py whose parallelize(model, mesh) uses torch.distributed's composable
replicate(), which builds DistributedDataParallel on a list of the model's parameters:
ckpt-plan plans DistributedDataParallel(model) and says so."""

from small_gpt import build_model, gpt, sample_batch  # noqa: F401
from torch.distributed._composable.replicate import replicate


def parallelize(model, mesh):
    replicate(model, device_mesh=mesh)
    return model
