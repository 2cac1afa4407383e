"""small_cnn.py with a batch of 4 instead of 8: same model, so a plan made for small_cnn.py
applies, but it was measured with another batch shape (verify warns)."""

import torch
from small_cnn import build_model, training_step  # noqa: F401  (part of the contract)


def sample_batch():
    return torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
