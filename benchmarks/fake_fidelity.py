"""Does the fake step allocate what the real step allocates? Storage by storage, on CPU;
and where not, which op laid out its output otherwise.

Every plan rests on the step recorded on fake tensors being the real step: the same storages
made and freed, in the same order. A fake tensor's strides come from the op's fake (meta)
kernel, sometimes a Python decomposition whose outputs follow their inputs' strides while
the real kernel chooses its own layout; a later ``reshape`` or ``contiguous`` then copies on
one side only, and the fake step records memory the real step never allocates (Swin's last
stage, 0.14% over-predicted: ``native_layer_norm_backward`` returned its gradient in the
incoming gradient's transposed strides, the CPU kernel returns it contiguous, and five
reshapes copied 196 KiB each on fake tensors only). planner/measure/kernel_layouts.py
corrects the ops this found.

For each model this records one step for real and one on fake tensors as ``ckpt-plan
profile`` does and compares their storages (size, kind, the op that made it, when it was
made and freed); a mixture-of-experts step whose shapes follow its routing is not compared
(the fake step plans for an assumed routing, the real one runs what its router drew).
It also runs both steps op by op, aligns the two op sequences and names the ops whose
outputs were laid out otherwise given inputs laid out alike (strides of size-1 dimensions
aside, unless ``--size-one-strides``).

    python benchmarks/fake_fidelity.py --zoo                     # the zoo's 24
    python benchmarks/fake_fidelity.py --task image              # a sweep task's types
    python benchmarks/fake_fidelity.py --task image --only swin,pvt
    python benchmarks/fake_fidelity.py --model-file examples/gpt.py

Prints a line a model and writes reports/benchmarks/fake_fidelity_NAME.md (NAME: zoo, the
task, or files). Exits 1 if a model's storages differed for a reason not known (one that
cannot run, for real or on fake tensors, is listed, not counted: the sweep and the zoo
report those; a model that writes in place into views is marked, :data:`VIEW_WRITES`).
"""

from __future__ import annotations

import argparse
import difflib
import random
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.hf_sweep_models import TASKS  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.core.records import Profile  # noqa: E402
from planner.measure.fake import build_fake_workload  # noqa: E402
from planner.measure.profiler import record_memory  # noqa: E402
from planner.measure.tracking import returns_view, written_arguments  # noqa: E402
from planner.measure.workload import build_workload, load_model_file, run_training_step  # noqa: E402

Layout = tuple[tuple[int, ...], tuple[int, ...], int, str]


def _layout(tensor: torch.Tensor, size_one_strides: bool) -> Layout:
    """Shape, strides, storage offset and dtype; a size-1 dimension's stride shown as 0
    unless ``size_one_strides`` (it moves nothing; only ATen's memory-format tests read
    it)."""
    strides = tuple(
        0 if size == 1 and not size_one_strides else stride
        for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    return (tuple(tensor.shape), strides, int(tensor.storage_offset()), str(tensor.dtype))


class OpLog(TorchDispatchMode):
    """Every op of a step with its tensor inputs' and outputs' layouts (prims, which fake
    tensors run for device queries, are left out)."""

    def __init__(self, size_one_strides: bool = False) -> None:
        super().__init__()
        self.size_one_strides = size_one_strides
        self.ops: list[tuple[str, tuple[Layout, ...], tuple[Layout, ...]]] = []
        self.views: set[str] = set()
        self.view_writes = 0  # in-place writes into a view of a tensor that needs a gradient

    def _layouts(self, value: Any) -> tuple[Layout, ...]:
        leaves, _ = tree_flatten(value)
        return tuple(
            _layout(leaf, self.size_one_strides)
            for leaf in leaves
            if isinstance(leaf, torch.Tensor)
        )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.view_writes += any(
            tensor._is_view() and tensor.requires_grad and torch.is_grad_enabled()
            for tensor in written_arguments(func, args, kwargs or {})
        )
        output = func(*args, **(kwargs or {}))
        name = str(func)
        if not name.startswith("prim."):
            self.ops.append((name, self._layouts((args, kwargs)), self._layouts(output)))
            if returns_view(func):
                self.views.add(name)
        return output


def _seed_other_rngs() -> None:
    """Seed Python's and NumPy's generators, which the tool does not (torch's it does):
    SpecAugment (wav2vec 2.0's masked frames) draws its mask from NumPy, and both steps
    should draw the same one."""
    random.seed(0)
    numpy.random.seed(0)


ROUTING = "routing assumed"
VIEW_WRITES = "in-place writes into views"
"""A known difference (docs/results.md, "The fake step against the real step"): for
real tensors autograd rebuilds such a view's backward as an ``as_strided`` of its base,
which allocates a zeroed buffer of the base's size; for fake tensors (a tensor subclass) it
replays the views instead."""


def storages_differ(path: Path | str) -> str:
    """How the storages of the model file's step recorded on fake tensors differ from the
    real step's ('' where they are the same; :data:`ROUTING` where shapes depend on a
    mixture-of-experts routing, which the fake step assumes)."""
    model_file = load_model_file(path)
    _seed_other_rngs()
    real = record_memory(build_workload(model_file, "cpu"))
    _seed_other_rngs()
    fake_workload, session = build_fake_workload(model_file, "cpu")
    fake = record_memory(fake_workload, session=session)
    session.release()
    if fake.timeline.storages == real.timeline.storages:
        return ""
    if fake.switches.expert_load is not None:
        # Sizes follow the routing: the fake step's is the one assumed (balanced), the real
        # step's whatever its random router drew. Not comparable storage by storage.
        return ROUTING

    def made(profile: Profile) -> Counter[tuple[str, int]]:
        return Counter((s.alloc_op, s.size_bytes) for s in profile.timeline.storages)

    extra, missing = made(fake) - made(real), made(real) - made(fake)
    parts = [f"peak {fake.measured_peak_bytes - real.measured_peak_bytes:+,} bytes"]
    for side, made_only in (("fake", extra), ("real", missing)):
        parts += [
            f"{side} only: {op} {size:,} B x{n}" for (op, size), n in made_only.most_common(3)
        ]
    if not extra and not missing:
        parts.append("the same storages, made or freed at other points")
    return "; ".join(parts)


def logged_steps(
    path: Path | str, size_one_strides: bool = False
) -> tuple[list[Any], list[Any], set[str], int]:
    """One real and one fake training step of the model file, op by op; the names of the
    ops among them that return views; how many ops wrote into a view of a tensor that needs
    a gradient (in the real step)."""
    model_file = load_model_file(path)
    _seed_other_rngs()
    real = build_workload(model_file, "cpu")
    with OpLog(size_one_strides) as real_log:
        run_training_step(real, seed=0)
    del real
    _seed_other_rngs()
    fake, session = build_fake_workload(model_file, "cpu")
    with session.running(), OpLog(size_one_strides) as fake_log:
        run_training_step(fake, seed=0)
    session.release()
    views = real_log.views | fake_log.views
    return real_log.ops, fake_log.ops, views, real_log.view_writes


@dataclass
class Differences:
    """The ops that laid out their outputs otherwise on fake tensors than for real although
    given the same inputs (``ops``: how often; ``first``: the first one's inputs, real
    outputs and fake outputs), how many aligned ops differed only because their inputs
    did (``followed``), and how many ops did not align."""

    ops: Counter[str] = field(default_factory=Counter)
    first: dict[str, tuple[Any, Any, Any]] = field(default_factory=dict)
    followed: int = 0
    unaligned: int = 0


def compare(real: list[Any], fake: list[Any], views: Collection[str] = ()) -> Differences:
    """Align the two op sequences by op name and compare each aligned pair. An op whose
    outputs differ although its inputs are laid out alike is the fake kernel's own doing;
    one whose inputs already differ only follows an op before it. A copy made on one side
    only (a ``reshape`` of a tensor that is contiguous on one side) leaves ops unaligned:
    counted, not compared. A view (``views``: op names) computes its layout from its input
    alike on both sides, so a view that differs was aligned with another call of its op
    near an unaligned stretch: counted as following."""
    found = Differences()
    matcher = difflib.SequenceMatcher(
        a=[op[0] for op in real], b=[op[0] for op in fake], autojunk=False
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            found.unaligned += max(i2 - i1, j2 - j1)
            continue
        for (name, real_in, real_out), (_, fake_in, fake_out) in zip(
            real[i1:i2], fake[j1:j2], strict=True
        ):
            if real_out == fake_out:
                continue
            if real_in != fake_in or name in views:
                found.followed += 1
                continue
            found.ops[name] += 1
            found.first.setdefault(name, (real_in, real_out, fake_out))
    return found


def _model_files(args: argparse.Namespace, folder: Path) -> list[tuple[str, Path | str]]:
    """(name, workload) to check: a model file, or a task's ``--hf`` source."""
    files: list[tuple[str, Path | str]] = []
    only = set(args.only.split(",")) if args.only else None
    if args.zoo:
        from benchmarks.zoo_models import ZOO, write_model_file

        for name, model in ZOO.items():
            if only is None or name in only:
                files.append((name, write_model_file(model, folder)))
    if args.task:
        from benchmarks import hf_sweep_models

        for model_type in hf_sweep_models.model_types(args.task):
            if only is None or model_type in only:
                write = (
                    hf_sweep_models.write_hf_config
                    if TASKS[args.task].via_hf
                    else hf_sweep_models.write_model_file
                )
                files.append((model_type, write(args.task, model_type, folder)))
    files += [(Path(path).stem, Path(path)) for path in args.model_file]
    return files


def check_model(path: Path | str, size_one_strides: bool = False) -> dict[str, Any]:
    """One model's row: whether its storages differ, and the ops behind a difference."""
    storages = storages_differ(path)
    real, fake, views, view_writes = logged_steps(path, size_one_strides)
    found = compare(real, fake, views)
    if storages and storages != ROUTING and view_writes:
        storages += f" ({VIEW_WRITES}: {view_writes})"
    return {"ops": len(real), "storages": storages, "found": found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", action="store_true", help="the zoo's architectures")
    parser.add_argument("--task", choices=list(TASKS))
    parser.add_argument("--only", help="comma-separated names")
    parser.add_argument("--model-file", action="append", default=[])
    parser.add_argument(
        "--size-one-strides", action="store_true", help="compare size-1 dimensions' strides too"
    )
    parser.add_argument("--out", type=Path, help="the report (default: by what was checked)")
    args = parser.parse_args(argv)
    name = "zoo" if args.zoo else args.task or "files"
    out = args.out or ROOT / f"reports/benchmarks/fake_fidelity_{name}.md"
    torch.set_num_threads(1)
    rows: list[str] = []
    differing = run = 0
    everywhere: Counter[str] = Counter()
    examples: dict[str, tuple[str, Any]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for model, path in _model_files(args, Path(folder)):
            try:
                row = check_model(path, args.size_one_strides)
            except Exception as error:  # a model that does not run: listed, not counted
                line = " ".join(traceback.format_exception_only(error)[-1].split())[:160]
                rows.append(f"| {model} | not run: {line} | | | | |")
                print(f"{model}: not run: {line}", flush=True)
                continue
            run += 1
            found = row["found"]
            storages = row["storages"]
            differing += storages not in ("", ROUTING) and VIEW_WRITES not in storages
            summary = ", ".join(f"`{op}` x{count}" for op, count in found.ops.most_common())
            rows.append(
                f"| {model} | {row['storages'] or 'same'} | {row['ops']} | {found.followed} "
                f"| {found.unaligned} | {summary or '-'} |"
            )
            print(
                f"{model}: storages {row['storages'] or 'same'}; {row['ops']} ops, "
                f"{found.followed} followed, {found.unaligned} unaligned; {summary or '-'}",
                flush=True,
            )
            for op, count in found.ops.items():
                everywhere[op] += count
                examples.setdefault(op, (model, found.first[op]))
    command = " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# The fake step against the real step",
        "",
        f"`python benchmarks/fake_fidelity.py {command}` (torch {torch.__version__}): "
        f"{differing} of the {run} models that run differ for a reason not known "
        f"(rows marked '{VIEW_WRITES}' and '{ROUTING}' aside).",
        "",
        "| model | storages (fake against real) | ops | followed | unaligned "
        "| ops laid out otherwise |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    for op, count in everywhere.most_common():
        model, (inputs, real_out, fake_out) = examples[op]
        lines.append(
            f"- `{op}` x{count} (first in {model}): inputs {inputs}; real {real_out}, "
            f"fake {fake_out}"
        )
    atomic_write_text(out, "\n".join(lines) + "\n")
    print(f"{differing} of the {run} models that run differ for a reason not known; {out}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
