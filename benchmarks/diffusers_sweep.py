"""Diffusion models as users train them: every model file of benchmarks/models/diffusers/
(27: 26 diffusers classes from tiny configs, U-Nets, a VAE, a ControlNet, DiTs, Flux-style
double- and single-stream transformers, video transformers, and Flux LoRA), planned at two
budgets and
checked on a real step, as benchmarks/zoo.py does for Hugging Face's language models.

Each file's ``training_step`` is a diffusers training script's: the model's noise (or
velocity) prediction against a target, ``F.mse_loss``; the VAE reconstructs its input,
aMUSEd's U-ViT predicts tokens (cross-entropy). Per model, as ``ckpt-plan profile`` does
it: profiled on fake tensors, planned at ``mid`` (halfway between the floor and the
unplanned peak) and ``every-block`` (the predicted peak with every block the tool finds
checkpointed), each plan run after ``apply_plan`` and compared with the unplanned step bit
for bit, its measured peak with the prediction.

Beside each model, the blocks diffusers' own ``enable_gradient_checkpointing()`` wraps
(found by running the step once with a checkpointing function that only notes its
argument), against the blocks the tool finds: ``own_blocks``, ``blocks``, and the ones only
one of them has.

    python benchmarks/diffusers_sweep.py                      # all
    python benchmarks/diffusers_sweep.py --only flux,unet2d_condition_sd15
    python benchmarks/diffusers_sweep.py --only flux_lora --merge   # into the last report
    python benchmarks/diffusers_sweep.py --autocast bfloat16          # mixed precision

``--autocast DTYPE`` runs each model's training step under ``torch.autocast`` in DTYPE, its
weights float32 (accelerate's ``mixed_precision="bf16"``, as diffusers' scripts train), and
writes diffusers_autocast_DTYPE.csv/.md.

Writes reports/benchmarks/diffusers.csv and diffusers.md (atomically) and prints the table.
Exits 1 if any plan failed, measured more than 0.1% from its prediction, or changed the
training step.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.zoo import COLUMNS, one_line, plan_model_file, write_report  # noqa: E402
from planner.measure.workload import load_model_file  # noqa: E402

MODELS = ROOT / "benchmarks" / "models" / "diffusers"


def model_names() -> list[str]:
    return sorted(path.stem for path in MODELS.glob("*.py"))


AUTOCAST_FILE = """\"\"\"{name} (benchmarks/models/diffusers/) under torch.autocast({dtype}).\"\"\"
import importlib.util

import torch

_spec = importlib.util.spec_from_file_location("_diffusers_{name}", {path!r})
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
build_model = _base.build_model
sample_batch = _base.sample_batch


def training_step(model, batch):
    with torch.autocast("cpu", dtype=torch.{dtype}):
        return _base.training_step(model, batch)
"""


def autocast_file(path: Path, dtype: str, folder: Path) -> Path:
    """A model file running ``path``'s training step under ``torch.autocast(dtype)``."""
    written = folder / f"{path.stem}_autocast_{dtype}.py"
    written.write_text(AUTOCAST_FILE.format(name=path.stem, dtype=dtype, path=str(path)))
    return written


def own_checkpointed(path: Path) -> list[str] | None:
    """The modules diffusers' ``enable_gradient_checkpointing()`` checkpoints in one step of
    the model file at ``path``, in the order it calls them; None where the class has no
    checkpointing of its own."""
    model_file = load_model_file(path)
    assert model_file.training_step is not None  # every file here has one
    torch.manual_seed(0)
    model = model_file.build_model()
    if not getattr(model, "_supports_gradient_checkpointing", False):
        return None
    names = {id(submodule): name for name, submodule in model.named_modules()}
    wrapped: list[str] = []

    def note(function: Any, *args: Any, **kwargs: Any) -> Any:
        target = function.func if isinstance(function, functools.partial) else function
        owner = getattr(target, "__self__", target)
        wrapped.append(names.get(id(owner), type(owner).__name__))
        return function(*args, **kwargs)

    model.enable_gradient_checkpointing(gradient_checkpointing_func=note)
    model.train()
    model_file.training_step(model, model_file.sample_batch())
    return list(dict.fromkeys(wrapped))


def compare_blocks(path: Path, blocks: list[str]) -> dict[str, object]:
    """The tool's blocks against diffusers' own checkpointing's."""
    try:
        own = own_checkpointed(path)
    except Exception as error:  # the model's own checkpointing path fails: say so
        return {"own_blocks": None, "own_error": one_line(error)}
    if own is None:
        return {"own_blocks": None}
    inside = [name for name in own if any(name.startswith(f"{b}.") for b in blocks)]
    return {
        "own_blocks": len(own),
        "own_only": " ".join(n for n in own if n not in blocks and n not in inside) or None,
        "tool_only": " ".join(
            b for b in blocks if b not in own and not any(n.startswith(f"{b}.") for n in own)
        )
        or None,
        "tool_holds_own": " ".join(inside) or None,
    }


SUMMARY_COLUMNS = [
    "architecture",
    "budget",
    "unplanned_mib",
    "floor_mib",
    "every_block_mib",
    "budget_mib",
    "plan_mib",
    "measured_mib",
    "error_pct",
    "bit_identical",
    "modules",
    "blocks",
    "own_blocks",
    "seconds",
    "error",
]
"""The columns of diffusers.md (diffusers.csv has them all)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", type=lambda text: text.split(","), help="comma-separated model file names"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    parser.add_argument("--autocast", choices=["bfloat16", "float16"])
    parser.add_argument(
        "--merge",
        action="store_true",
        help="replace these models' rows in the last report, keeping the others",
    )
    arguments = parser.parse_args(argv)
    names = arguments.only or model_names()
    unknown = [name for name in names if name not in model_names()]
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)}; one of {', '.join(model_names())}")
    stem = f"diffusers_autocast_{arguments.autocast}" if arguments.autocast else "diffusers"
    folder = Path(tempfile.mkdtemp(prefix="ckpt-plan-diffusers-"))
    rows = []
    for name in names:
        path = MODELS / f"{name}.py"
        started = time.perf_counter()
        if arguments.autocast:
            path = autocast_file(path, arguments.autocast, folder)
        planned = plan_model_file(path, {"architecture": name, "family": "diffusers"})
        blocks = planned[0].get("block_names")
        extra = compare_blocks(path, list(blocks) if isinstance(blocks, tuple) else [])
        for row in planned:
            row.update(extra)
            row.pop("block_names", None)
            rows.append(row)
            print(row, flush=True)
        print(f"{name}: {time.perf_counter() - started:.1f} s", flush=True)
    columns = [*COLUMNS, "own_blocks", "own_only", "tool_only", "tool_holds_own", "own_error"]
    frame = pd.DataFrame(rows).reindex(columns=columns)
    shutil.rmtree(folder, ignore_errors=True)
    if arguments.merge and (arguments.out / f"{stem}.csv").exists():
        kept = pd.read_csv(arguments.out / f"{stem}.csv")
        kept = kept[~kept["architecture"].isin(names)].reindex(columns=columns)
        frame = pd.concat([kept, frame], ignore_index=True)
        frame = frame.sort_values("architecture", kind="stable", ignore_index=True)
    return write_report(frame, arguments.out, stem, SUMMARY_COLUMNS)


if __name__ == "__main__":
    sys.exit(main())
