"""The bundled GPT (examples/gpt.py) with 48 blocks: hundreds of checkpoint candidates.

Used by benchmarks/profile_cost.py to check that profiling costs a small constant number
of steps whatever the number of modules.
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "ckpt_plan_gpt_example", Path(__file__).resolve().parents[2] / "examples" / "gpt.py"
)
assert _spec is not None and _spec.loader is not None
gpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpt)
gpt.N_LAYER = 48
gpt.BATCH_SIZE = 4

sample_batch = gpt.sample_batch


def build_model():
    return gpt.build_model()
