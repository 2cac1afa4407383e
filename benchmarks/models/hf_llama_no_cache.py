"""Issue 17's Llama config with use_cache=False, as training should build it: every
layer is a candidate again. The model and batch are hf_llama_use_cache.py's."""

import functools
import runpy
from pathlib import Path

_base = runpy.run_path(str(Path(__file__).with_name("hf_llama_use_cache.py")))
build_model = functools.partial(_base["build_model"], use_cache=False)
sample_batch = _base["sample_batch"]
