"""examples/hf_t5.py trained with a cache asked for in the call (``use_cache=True``): the
decoder then builds a key/value cache whatever its config says, every decoder layer writes
to it and cross-attention reads it back, so recomputing a decoder module finds it filled
(a ``CheckpointError``). ckpt-plan turns ``config.use_cache`` off, which an explicit argument
overrides: this file keeps the hazard for the safety tests (tests/test_safety.py)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_hf_t5_example", Path(__file__).resolve().parents[2] / "examples" / "hf_t5.py"
)
assert _spec is not None and _spec.loader is not None
_t5 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_t5)

build_model = _t5.build_model
sample_batch = _t5.sample_batch


def training_step(model, batch):
    return model(**batch, use_cache=True).loss
