"""tests/data/small_gpt.py whose rank 1 fails while it builds its model, the way the
environment variable CKPT_PLAN_TEST_RANK_FAILURE says: ``raise`` (an exception) or ``kill``
(SIGKILL: the rank dies without a word). Rank 0 goes on into its step and waits in a
collective for rank 1: the rank check must stop it and name rank 1 (test_distributed)."""

import os
import signal

import torch.distributed as dist
from small_gpt import gpt, sample_batch  # noqa: F401


def build_model():
    if dist.is_initialized() and dist.get_rank() == 1:
        failure = os.environ.get("CKPT_PLAN_TEST_RANK_FAILURE", "raise")
        if failure == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("rank one cannot build its model")
    return gpt.build_model()
