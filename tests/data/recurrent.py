"""Recurrent layers as users stack them: torch.nn's LSTM (two layers, dropout between) and
GRU on token embeddings. On the CPU an LSTM layer runs oneDNN's kernel
(``mkldnn_rnn_layer``), whose workspace for the backward torch's fake kernel made empty: the
fake step was 6 MB (58%) under the real one for three such layers until
planner/measure/kernel_layouts.py measured it. The recurrent layers are candidates
(torch.nn's other leaf layers are not): each holds a whole sequence's gates and states.
"""

import torch
from torch import nn

BATCH, TOKENS, WIDTH, VOCAB = 8, 64, 64, 100


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.lstm = nn.LSTM(WIDTH, WIDTH, num_layers=2, dropout=0.1, batch_first=True)
        self.gru = nn.GRU(WIDTH, WIDTH, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x, y):
        h = self.embed(x)
        h = h + self.lstm(h)[0]
        h = h + self.gru(h)[0]
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


def build_model():
    return Model()


def sample_batch(batch_size=None):
    batch_size = batch_size or BATCH
    tokens = torch.randint(0, VOCAB, (batch_size, TOKENS))
    return tokens, torch.randint(0, VOCAB, (batch_size, TOKENS))
