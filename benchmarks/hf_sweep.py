"""Every Hugging Face architecture of a task as users ship its config, planned and checked:
the models users bring, beyond the zoo's 24.

For each model type of a ``transformers`` task mapping (``--task``: causal-lm, masked-lm,
seq2seq) that the zoo does not hold, benchmarks/hf_sweep_models.py builds the model from
its config's defaults with only the sizes made small. The other tasks (image, ctc: speech
recognition, audio-classification, the fine-tuning heads sequence-classification,
token-classification, question-answering, speech-seq2seq: speech-to-text, and
image-text-to-text: vision-language models, on 4 x 4 patches an image) take every type,
the zoo's too, and go through ``--hf``: the small config is written as a config.json naming
the task's class, and ckpt-plan builds the model and its batch from it (step 1 then runs
that model on that batch, so a skip there can be the tool's own batch at fault: each is
listed with its error, and docs/results.md reviews them).
Then, in a process of its own
(a model that hangs or breaks global state takes only itself down; ``--timeout`` each):

1. one real training step with no plan: where the default config or this step fails
   without the tool, the type is **skipped**, with the error (not the tool's to fix);
2. the zoo's loop (:func:`benchmarks.zoo.plan_model_file`): profiled on fake tensors as
   ``ckpt-plan profile`` does, planned halfway between the floor and the unplanned peak,
   the plan run in another process after ``apply_plan`` and compared with the unplanned
   step bit for bit (loss, every gradient, every buffer), its measured peak with the
   prediction.

A type is **ok** where the plan fits, training is bit-identical and the prediction is within
0.1% of the measured peak; **refused** where the tool refuses on purpose, saying what to do:
a model it cannot plan as built (:data:`REFUSALS`), or a step fake tensors cannot run whose
real unplanned step needs more than the budget (``ckpt-plan profile`` then asks for
``--memory real``; the plan that gives must be ok); **failed** otherwise (the tool's
one-line error, or ``raw TYPE`` for an exception that is not the tool's), or **timeout**.

    python benchmarks/hf_sweep.py --task masked-lm          # every type (minutes)
    python benchmarks/hf_sweep.py --task causal-lm --limit 10
    python benchmarks/hf_sweep.py --task image --only swin,resnet
    python benchmarks/hf_sweep.py --task causal-lm --resume # after Ctrl-C: the rest
    python benchmarks/hf_sweep.py --task causal-lm --lora 8 # LoRA fine-tuning (peft)
    python benchmarks/hf_sweep.py --task causal-lm --autocast bfloat16  # Trainer(bf16=True)

``--lora R`` plans each type as peft fine-tunes it (``--hf CONFIG --lora R``: rank R on every
linear layer but the head, :mod:`planner.measure.hf_lora`), through ``--hf`` for every task;
its reports are hf_sweep_TASK_lora.csv and .md. ``--autocast D`` plans each type's float32
weights trained under ``torch.autocast`` in D, as ``Trainer(bf16=True)`` trains them
(``--hf CONFIG --autocast D``), through ``--hf`` too; its reports are
hf_sweep_TASK_autocast.csv and .md (hf_sweep_TASK_lora_autocast with both).

Writes reports/benchmarks/hf_sweep_TASK.csv and .md (atomically; rows as they come go to
hf_sweep_TASK.partial.jsonl, which ``--resume`` reads) and prints the summary. Exits 1 if a
type failed or timed out.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import markdown_table  # noqa: E402
from benchmarks.hf_sweep_models import (  # noqa: E402
    TASKS,
    build_model,
    model_types,
    sample_batch,
    write_hf_config,
    write_model_file,
)
from benchmarks.zoo import COLUMNS, failed, plan_model_file  # noqa: E402
from planner.core.fileio import atomic_path, atomic_write_text  # noqa: E402
from planner.measure.workload import load_model_file  # noqa: E402

DEFAULT_TIMEOUT_S = 180.0
TIMEOUT_SCALE = {"gemma4": 3.0, "omniasr": 3.0, "vibevoice_asr": 3.0}
"""Types given more than ``--timeout``: Gemma 4's images are 2520 patches each, padded to
its processor's soft-token budget whatever their size (195 s here with 2 cores); OmniASR's
and VibeVoice-ASR's clips are 30 s of raw audio each, 480000 samples through their
convolutions (259 s and 303 s)."""
REFUSALS = (
    "the model's modules changed during its training step",
    "2 of 2 blocks cannot be checkpointed",
)
"""The tool's deliberate refusals: a model it cannot plan as built, refused with what to do
(BigBird's default swaps in full attention at its first forward on short sequences; a plan
naming the modules it trains with would not find them in the model as built); and a budget
below what the model allows once the check finds that none of its blocks can be recomputed
unchanged (I-BERT rebinds buffers each forward): the sweep's budget is halfway to a floor
that counted them, and ckpt-plan names the smallest budget that fits and why."""
SWEEP_COLUMNS = ["task", "model_type", "outcome", "parameters", "detail"]
_ZOO_ONLY = {"architecture", "family", "budget"}
REPORT_COLUMNS = [
    "model_type",
    "unplanned_mib",
    "floor_mib",
    "budget_mib",
    "plan_mib",
    "measured_mib",
    "error_pct",
    "blocks",
    "blocks_excluded",
    "seconds",
]


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def verdict(planned: dict[str, object]) -> tuple[str, str]:
    """A planned row's outcome (ok, refused or failed: module docstring) and why, in one
    line (empty where ok)."""
    # The plan's verdict first; the CLI's refusal of the budget (profile_error) after it.
    plan_only = {key: value for key, value in planned.items() if key != "profile_error"}
    bad = bool(failed(pd.DataFrame([plan_only]).reindex(columns=COLUMNS)).iloc[0])
    reason = str(planned.get("error") or "")
    if bad and not reason:
        if planned.get("bit_identical") is not True:
            reason = "the plan changed the training step"
        else:
            reason = f"predicted {planned.get('error_pct'):+}% from measured"
    refused = any(refusal in reason for refusal in REFUSALS)
    if not bad and planned.get("profile_error"):
        # Fake tensors could not run the step, and ckpt-plan profile will not run a real
        # one over the budget: it says to plan with --memory real (the plan above).
        reason, refused = f"{planned['profile_error']} (with --memory real: ok)", True
    return ("refused" if refused else "failed" if bad else "ok"), _one_line(reason)


def sweep_one(
    task: str, model_type: str, folder: Path, lora: str | None = None, autocast: str | None = None
) -> dict[str, object]:
    """Steps 1 and 2 of the module docstring for one type, in this process: its row
    (``lora``: with LoRA adapters of that rank, through ``--hf``; ``autocast``: its forward
    under autocast in that dtype, through ``--hf``)."""
    import dataclasses

    import torch

    from planner.measure.source import WorkloadSource

    row: dict[str, object] = {"task": task, "model_type": model_type}
    started = time.perf_counter()
    path: Path | str
    try:
        torch.manual_seed(0)
        if TASKS[task].via_hf or lora or autocast:  # the model and batch `--hf` builds
            path = write_hf_config(task, model_type, folder)
            if lora or autocast:
                written = WorkloadSource.parse(path)
                path = str(dataclasses.replace(written, lora=lora, autocast=autocast))
            hf_file = load_model_file(path)
            model, batch = hf_file.build_model(), hf_file.sample_batch()
        else:
            path = write_model_file(task, model_type, folder)
            model, batch = build_model(task, model_type), sample_batch(task, model_type)
        model.train()
        with torch.autocast(
            "cpu", dtype=getattr(torch, autocast or "bfloat16"), enabled=bool(autocast)
        ):
            loss = model(**batch).loss  # the step without a plan, as it trains
        loss.backward()
        row["parameters"] = sum(parameter.numel() for parameter in model.parameters())
        del model
    except Exception as error:
        row.update(
            outcome="skip",
            detail=_one_line(f"{type(error).__name__}: {error}"),
            seconds=round(time.perf_counter() - started, 1),
        )
        return row
    (planned,) = plan_model_file(path, {}, budgets=("mid",))
    row.update({key: value for key, value in planned.items() if key not in _ZOO_ONLY})
    outcome, detail = verdict(planned)
    row["outcome"] = outcome
    if detail:
        row["detail"] = detail
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def _child(task: str, model_type: str, out: Path, lora: str | None, autocast: str | None) -> int:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-hf-sweep-") as folder:
        try:
            row = sweep_one(task, model_type, Path(folder), lora, autocast)
        except Exception as error:  # the sweep's own failure: report it as a row
            row = {
                "task": task,
                "model_type": model_type,
                "outcome": "failed",
                "detail": _one_line(f"raw {type(error).__name__}: {error}"),
            }
            traceback.print_exc()
    atomic_write_text(out, json.dumps(row, default=str))
    return 0


def run_isolated(
    task: str,
    model_type: str,
    timeout_s: float,
    lora: str | None = None,
    autocast: str | None = None,
) -> dict[str, object]:
    """:func:`sweep_one` in a fresh process, killed (with its children) after ``timeout_s``."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-hf-sweep-") as folder:
        out = Path(folder) / "row.json"
        command = [sys.executable, __file__, "--child", task, model_type, str(out)]
        command += ["--lora", lora] if lora else []
        command += ["--autocast", autocast] if autocast else []
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return {
                "task": task,
                "model_type": model_type,
                "outcome": "timeout",
                "detail": f"over {timeout_s:g} s",
                "seconds": round(time.perf_counter() - started, 1),
            }
        if out.exists():
            return dict(json.loads(out.read_text(encoding="utf-8")))
        last = output.strip().splitlines()[-1:] or [f"exit code {process.returncode}"]
        return {
            "task": task,
            "model_type": model_type,
            "outcome": "failed",
            "detail": _one_line(f"the process died: {last[0]}"),
            "seconds": round(time.perf_counter() - started, 1),
        }


def report(
    task: str, frame: pd.DataFrame, lora: str | None = None, autocast: str | None = None
) -> str:
    """The Markdown report: counts, every type not ok with why, the ok ones' figures."""
    versions = ", ".join(
        f"{package} {importlib.metadata.version(package)}" for package in ("torch", "transformers")
    )
    counts = frame["outcome"].value_counts()
    ok = frame[frame["outcome"] == "ok"]
    how = (
        "every type planned through `--hf` on its config (the batch is ckpt-plan's own), "
        "the zoo's included"
        if TASKS[task].via_hf or lora or autocast
        else "the zoo's types are left out (benchmarks/zoo.py checks them)"
    )
    lora_title = f", LoRA rank {lora}" if lora else ""
    if lora:
        how += (
            f", fine-tuned as peft does it (`--lora {lora}`: rank {lora} on every linear layer "
            "but the head, the base weights frozen)"
        )
    if autocast:
        lora_title += f", autocast {autocast}"
        how += (
            ", float32 weights trained under autocast as "
            f"Trainer({'bf16' if autocast == 'bfloat16' else 'fp16'}=True) trains them "
            f"(`--autocast {autocast}`: the forward under torch.autocast, its outputs cast to "
            "float32)"
        )
    option = (f" --lora {lora}" if lora else "") + (f" --autocast {autocast}" if autocast else "")
    lines = [
        f"# Hugging Face sweep: {task} ({TASKS[task].mapping}){lora_title}",
        "",
        f"Written by `python benchmarks/hf_sweep.py --task {task}{option}` ({versions}); {how}.",
        "",
        ", ".join(f"**{count} {outcome}**" for outcome, count in counts.items())
        + f" of {len(frame)} types.",
    ]
    if len(ok):
        lines += [
            "",
            f"Of the ok ones: largest |prediction - measured| {ok['error_pct'].abs().max():.4f}%;"
            f" {int((ok['blocks_excluded'] > 0).sum())} with blocks the tool would not "
            "checkpoint (excluded, re-planned without them).",
        ]
    not_ok = frame[frame["outcome"] != "ok"]
    if len(not_ok):
        lines += ["", "## Not ok", "", markdown_table(not_ok[["model_type", "outcome", "detail"]])]
    if len(ok):
        lines += ["", "## Ok", "", markdown_table(ok.reindex(columns=REPORT_COLUMNS))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=list(TASKS), default="causal-lm")
    parser.add_argument("--only", type=lambda text: text.split(","), help="comma-separated types")
    parser.add_argument("--limit", type=int, help="only the first N types")
    parser.add_argument("--resume", action="store_true", help="keep the rows of a stopped run")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds a type")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    parser.add_argument("--lora", help="plan LoRA fine-tuning of this rank (--hf --lora R)")
    parser.add_argument(
        "--autocast", choices=["bfloat16", "float16"], help="plan the forward under autocast"
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.child:
        task, model_type, out = arguments.child
        return _child(task, model_type, Path(out), arguments.lora, arguments.autocast)

    types = model_types(arguments.task, via_hf=bool(arguments.lora or arguments.autocast))
    if arguments.only:
        unknown = [name for name in arguments.only if name not in types]
        if unknown:
            parser.error(f"not a {arguments.task} type outside the zoo: {', '.join(unknown)}")
        types = arguments.only
    types = types[: arguments.limit]
    arguments.out.mkdir(parents=True, exist_ok=True)
    suffix = ("_lora" if arguments.lora else "") + ("_autocast" if arguments.autocast else "")
    suffix += "_float16" if arguments.autocast == "float16" else ""
    stem = arguments.out / f"hf_sweep_{arguments.task}{suffix}"
    partial = stem.with_suffix(".partial.jsonl")
    rows: dict[str, dict[str, object]] = {}
    if arguments.resume and partial.exists():
        for line in partial.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            rows[str(row["model_type"])] = row
    else:
        partial.unlink(missing_ok=True)
    started = time.perf_counter()
    with partial.open("a", encoding="utf-8") as progress:
        for index, model_type in enumerate(types, 1):
            if model_type in rows:
                continue
            timeout_s = arguments.timeout * TIMEOUT_SCALE.get(model_type, 1.0)
            row = run_isolated(
                arguments.task, model_type, timeout_s, arguments.lora, arguments.autocast
            )
            rows[model_type] = row
            progress.write(json.dumps(row, default=str) + "\n")
            progress.flush()
            print(
                f"[{index}/{len(types)} {time.perf_counter() - started:5.0f} s] {model_type}: "
                f"{row['outcome']} {row.get('detail') or ''}".rstrip(),
                file=sys.stderr,
                flush=True,
            )
    frame = pd.DataFrame([rows[model_type] for model_type in types if model_type in rows])
    columns = SWEEP_COLUMNS + [c for c in COLUMNS if c not in _ZOO_ONLY and c != "error"]
    frame = frame.reindex(columns=columns)
    for column in ("parameters", "modules", "blocks", "blocks_excluded", "attempts"):
        frame[column] = frame[column].astype("Int64")
    with atomic_path(stem.with_suffix(".csv")) as temp_path:
        frame.to_csv(temp_path, index=False)
    text = report(arguments.task, frame, arguments.lora, arguments.autocast)
    atomic_write_text(stem.with_suffix(".md"), text)
    partial.unlink()
    print(text)
    return 1 if frame["outcome"].isin(["failed", "timeout"]).any() else 0  # refused: said why


if __name__ == "__main__":
    sys.exit(main())
