"""A small speech recognizer trained with CTC, as wav2vec 2.0 trains: a convolutional feature
encoder over raw audio, masked frames replaced by a learned vector (SpecAugment: a boolean
mask indexes the frames, in the forward and again in its backward), two encoder blocks, and
``F.ctc_loss`` with the input and target lengths as tensors, the targets packed by
``masked_select``. Every shape that depends on values depends on the batch's (the lengths,
the mask), which fake tensors keep; CTC's ``log_alpha`` is as wide as the longest target."""

import torch
import torch.nn.functional as F
from torch import nn

BATCH, SAMPLES, WIDTH, VOCAB, TARGET = 4, 4000, 64, 32, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.ff = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Recognizer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, WIDTH, 10, stride=5), nn.GELU(), nn.Conv1d(WIDTH, WIDTH, 8, stride=4)
        )
        self.masked = nn.Parameter(torch.randn(WIDTH))
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB)

    def frames(self, samples):  # the feature encoder's output length
        return ((samples - 10) // 5 + 1 - 8) // 4 + 1

    def forward(self, audio, audio_mask, frame_mask, labels):
        hidden = self.features(audio[:, None]).transpose(1, 2)  # (B, frames, width)
        hidden = hidden.clone()
        hidden[frame_mask[:, : hidden.shape[1]]] = self.masked
        for block in self.blocks:
            hidden = block(hidden)
        log_probs = F.log_softmax(self.head(hidden), dim=-1).transpose(0, 1)  # (T, B, V)
        input_lengths = self.frames(audio_mask.sum(-1))
        valid = labels >= 0
        return F.ctc_loss(
            log_probs, labels.masked_select(valid), input_lengths, valid.sum(-1), blank=0
        )


def build_model():
    return Recognizer()


def sample_batch():
    audio_mask = torch.ones(BATCH, SAMPLES, dtype=torch.long)
    audio_mask[1, SAMPLES // 2 :] = 0  # a shorter example, padded
    labels = torch.randint(1, VOCAB, (BATCH, TARGET))
    labels[2, TARGET // 2 :] = -100  # a shorter transcript
    return {
        "audio": torch.randn(BATCH, SAMPLES),
        "audio_mask": audio_mask,
        "frame_mask": torch.rand(BATCH, SAMPLES) < 0.2,
        "labels": labels,
    }
