"""examples/gpt.py at a small size (2 blocks, width 32, 32 tokens): the same classes, with
dropout and tied embeddings, for tests that must run in seconds."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "ckpt_plan_example_gpt", Path(__file__).resolve().parents[2] / "examples" / "gpt.py"
)
assert _spec is not None and _spec.loader is not None
gpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpt)
# The example reads these module constants when it builds the model and the batch.
gpt.VOCAB_SIZE, gpt.SEQ_LEN, gpt.N_EMBD, gpt.N_HEAD, gpt.N_LAYER, gpt.BATCH_SIZE = (
    64,
    32,
    32,
    2,
    2,
    4,
)

build_model = gpt.build_model
sample_batch = gpt.sample_batch
