"""The bundled GPT (examples/gpt.py) shrunk in width and grown to 334 blocks: about 1,000
checkpoint candidates (each block, its attention and its MLP). For the solver benchmark."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "ckpt_plan_gpt_example_334", Path(__file__).resolve().parents[2] / "examples" / "gpt.py"
)
assert _spec is not None and _spec.loader is not None
gpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpt)
gpt.N_LAYER = 334
gpt.N_EMBD = 32
gpt.N_HEAD = 2
gpt.SEQ_LEN = 32
gpt.BATCH_SIZE = 2

sample_batch = gpt.sample_batch


def build_model():
    return gpt.build_model()
