"""A speech recognizer on clips longer than the values fake tensors keep, as wav2vec 2.0
counts its frames: ``ones_like(input_values).sum(-1)``, a mask of 2 x 600,000 samples (past
``SHADOW_NUMEL_LIMIT``) made in the forward, whose values size CTC's loss. The mask is one
value at any size, which fake tensors keep (planner/measure/shadows.py)."""

import torch
import torch.nn.functional as F
from torch import nn

BATCH, SAMPLES, WIDTH, VOCAB, TARGET = 2, 600_000, 8, 16, 12


class Recognizer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, WIDTH, 400, stride=320), nn.GELU(), nn.Conv1d(WIDTH, WIDTH, 2, stride=2)
        )
        self.block = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )
        self.head = nn.Linear(WIDTH, VOCAB)

    def frames(self, samples):  # the feature encoder's output length
        return ((samples - 400) // 320 + 1 - 2) // 2 + 1

    def forward(self, audio, labels):
        hidden = self.features(audio[:, None]).transpose(1, 2)  # (B, frames, width)
        hidden = hidden + self.block(hidden)
        log_probs = F.log_softmax(self.head(hidden), dim=-1).transpose(0, 1)  # (T, B, V)
        mask = torch.ones_like(audio, dtype=torch.long)  # as wav2vec 2.0's CTC head counts
        lengths = torch.full((BATCH,), TARGET, dtype=torch.long)
        return F.ctc_loss(log_probs, labels, self.frames(mask.sum(-1)), lengths, blank=0)


def build_model():
    return Recognizer()


def sample_batch():
    return {
        "audio": torch.randn(BATCH, SAMPLES),
        "labels": torch.randint(1, VOCAB, (BATCH, TARGET)),
    }
