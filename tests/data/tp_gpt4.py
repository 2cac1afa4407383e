"""tests/data/tp_gpt.py with 4 blocks (an interleaved pipeline of 2 ranks holds 4 chunks)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_tp_gpt", Path(__file__).with_name("tp_gpt.py"))
assert _spec is not None and _spec.loader is not None
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
_base.N_LAYER = 4

sample_batch = _base.sample_batch


def build_model():
    return _base.Transformer()
