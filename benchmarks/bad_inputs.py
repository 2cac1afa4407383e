"""Every bad input we know of, run through the real CLI; the table of what each one got.

Each case runs ``python -m planner.cli.main ...`` in a fresh empty folder (its own process group, so
a real Ctrl-C can be sent to it), and records the exit code, what it printed on stderr, and
which files it left behind (it should leave none). ``apply_plan`` cases run in this process
and record the exception. Broken model files and plans are made here, in a temporary folder.

    python benchmarks/bad_inputs.py                  # writes docs/bad_inputs.md, prints it

The table is the closing note of issue 6: every bad input tried, the message and exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.apply import apply_plan, model_fingerprint  # noqa: E402
from planner.apply.tensors import describe_batch  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.core.records import Unit  # noqa: E402
from planner.measure.profiler import profile_workload  # noqa: E402
from planner.measure.workload import build_workload, load_model_file  # noqa: E402
from planner.plan.plan_file import PLAN_SCHEMA_VERSION, plan_to_dict, save_plan  # noqa: E402
from planner.solve.planning import build_plan  # noqa: E402

DATA = ROOT / "tests" / "data"
SMALL_CNN = DATA / "small_cnn.py"

# Model files that break the contract in one way each (written into the case's folder).
MODEL_SOURCES = {
    # examples/llama3_8b.py with torch's default optimizer (AdamW, foreach on CUDA).
    "llama3_8b_foreach.py": (
        "import importlib.util\n"
        "spec = importlib.util.spec_from_file_location(\n"
        f"    'l8b', {str(ROOT / 'examples' / 'llama3_8b.py')!r}\n)\n"
        "example = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(example)\n"
        "build_model, sample_batch = example.build_model, example.sample_batch\n"
    ),
    "ia3.json": '{"peft_type": "IA3", "target_modules": ["k_proj", "v_proj", "down_proj"]}',
    "c_attn.json": '{"peft_type": "LORA", "r": 8, "target_modules": ["c_attn"]}',
    "syntax_error.py": "import torch\n\ndef build_model(:\n    pass\n",
    # Hugging Face configs that cannot be planned (for --hf).
    "no_model_type.json": '{"hidden_size": 64, "num_hidden_layers": 2}\n',
    "unknown_model_type.json": '{"model_type": "no-such-architecture"}\n',
    "clap.json": '{"model_type": "clap", "architectures": ["ClapModel"]}\n',
    "detr.json": '{"model_type": "detr", "architectures": ["DetrForObjectDetection"]}\n',
    "videomae_no_frames.json": (
        '{"model_type": "videomae", "architectures": ["VideoMAEForVideoClassification"], '
        '"num_frames": null}\n'
    ),
    "diffusers_unet.json": (
        '{"_class_name": "UNet2DConditionModel", "_diffusers_version": "0.42.1", '
        '"sample_size": 64}\n'
    ),
    "musicgen.json": '{"model_type": "musicgen"}\n',
    "no_build_model.py": "import torch\n\ndef sample_batch():\n    return torch.zeros(2, 3)\n",
    "no_sample_batch.py": "import torch\n\ndef build_model():\n    return torch.nn.Linear(2, 2)\n",
    "raises_on_import.py": "import torch\nraise RuntimeError('no GPU here')\n",
    "optimizer_two_arguments.py": (
        "import torch\nfrom small_cnn import build_model, sample_batch, training_step\n\n"
        "def build_optimizer(model, lr):\n    return torch.optim.SGD(model.parameters(), lr)\n"
    ),
    "not_a_loss.py": (
        "import torch\n\ndef build_model():\n    return torch.nn.Linear(8, 10)\n\n"
        "def sample_batch():\n    return torch.randn(4, 8)\n"
    ),
    # Sends a real SIGINT (what Ctrl-C does) to its process group on its 3rd forward: during
    # profiling's timing pass, before any file is written.
    "ctrl_c_while_profiling.py": (
        "import os, signal\nfrom small_cnn import build_model as _build, sample_batch, "
        "training_step\n\ncalls = 0\n\ndef _count(module, args):\n    global calls\n"
        "    calls += 1\n    if calls == 3:\n        os.killpg(os.getpgrp(), signal.SIGINT)\n\n"
        "def build_model():\n    model = _build()\n    model.register_forward_pre_hook(_count)\n"
        "    return model\n"
    ),
    # Sends SIGINT to its process group from the plan check's child process (python -m
    # planner.check.compare), as Ctrl-C in a terminal reaches both processes.
    "ctrl_c_while_checking.py": (
        "import os, signal, sys\nfrom small_cnn import build_model as _build, sample_batch, "
        "training_step\n\ndef _interrupt(module, args):\n"
        "    if sys.argv[0].endswith(os.path.join('planner', 'check', 'compare.py')):\n"
        "        os.killpg(os.getpgrp(), signal.SIGINT)\n\n"
        "def build_model():\n    model = _build()\n"
        "    model.register_forward_pre_hook(_interrupt)\n    return model\n"
    ),
}


@dataclass(frozen=True)
class Case:
    command: str  # "profile", "fit", "verify" or "apply_plan"
    bad_input: str
    arguments: tuple[str, ...]  # after the command; {data}, {plans} and {examples} are filled in
    expected_exit: int
    # An infeasible budget (exit 3) keeps the profile, to re-solve without profiling again.
    expected_files: str = "none"


PROFILE = "profile"
FIT = "fit"
VERIFY = "verify"
OUT = ("-o", "out/plan.json", "--report-dir", "out/report")
HF_SHAPE = ("--batch-size", "1", "--seq-len", "8", "-b", "1GB")
CASES = [
    Case(PROFILE, "model file missing", ("no_such_model.py", "-b", "1GB", *OUT), 4),
    Case(PROFILE, "model file with a syntax error", ("syntax_error.py", "-b", "1GB", *OUT), 4),
    Case(PROFILE, "model file without build_model", ("no_build_model.py", "-b", "1GB", *OUT), 4),
    Case(PROFILE, "model file without sample_batch", ("no_sample_batch.py", "-b", "1GB", *OUT), 4),
    Case(PROFILE, "model file raising on import", ("raises_on_import.py", "-b", "1GB", *OUT), 4),
    Case(
        PROFILE,
        "forward that raises",
        ("{data}/raising_forward.py", "-b", "1GB", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "FlexAttention on a CPU (torch 2.13 trains it on CUDA only)",
        ("{data}/flex_blocks.py", "-b", "1GB", *OUT),
        4,
    ),
    Case(PROFILE, "output that is not a loss", ("not_a_loss.py", "-b", "1GB", *OUT), 4),
    Case(
        PROFILE,
        "build_optimizer taking two arguments",
        ("optimizer_two_arguments.py", "-b", "1GB", *OUT),
        4,
    ),
    Case(PROFILE, "budget 12XB", ("{data}/small_cnn.py", "--budget", "12XB", *OUT), 2),
    Case(PROFILE, "budget -3GB", ("{data}/small_cnn.py", "--budget", "-3GB", *OUT), 2),
    Case(PROFILE, "budget 0", ("{data}/small_cnn.py", "--budget", "0", *OUT), 2),
    Case(PROFILE, "budget abc", ("{data}/small_cnn.py", "--budget", "abc", *OUT), 2),
    Case(PROFILE, "no budget", ("{data}/small_cnn.py", *OUT), 2),
    Case(
        PROFILE,
        "--grad-accum 0",
        ("{data}/small_cnn.py", "-b", "1GB", "--grad-accum", "0", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--no-sync without gradient accumulation",
        ("{data}/small_cnn.py", "-b", "1GB", "--no-sync", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--no-sync on one process (no gradients to sync)",
        ("{data}/small_cnn.py", "-b", "1GB", "--grad-accum", "2", "--no-sync", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--zero-grad that is not a place in the loop",
        ("{data}/small_cnn.py", "-b", "1GB", "--zero-grad", "sideways", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--world-size 0",
        ("{data}/small_cnn.py", "-b", "1GB", "--world-size", "0", "--parallel", "ddp", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--parallel that is not a layout (foo)",
        ("{data}/small_cnn.py", "-b", "1GB", "--world-size", "2", "--parallel", "foo", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--world-size without --parallel",
        ("{data}/small_cnn.py", "-b", "1GB", "--world-size", "2", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--parallel without --world-size",
        ("{data}/small_cnn.py", "-b", "1GB", "--parallel", "fsdp2", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--world-size with --memory real",
        (
            *("{data}/small_cnn.py", "-b", "1GB", "--world-size", "2", "--parallel", "ddp"),
            *("--memory", "real", *OUT),
        ),
        2,
    ),
    Case(
        PROFILE,
        "model file that shards its model in build_model()",
        ("{data}/self_sharding.py", "-b", "1GB", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "model file that shards its model in build_model(), with --world-size",
        ("{data}/self_sharding.py", "-b", "1GB", "--world-size", "2", "--parallel", "fsdp2", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--tp with --parallel ddp",
        (
            "{data}/tp_gpt.py",
            "-b",
            "1GB",
            "--world-size",
            "4",
            "--parallel",
            "ddp",
            "--tp",
            "2",
            *OUT,
        ),
        2,
    ),
    Case(
        PROFILE,
        "--tp that does not divide --world-size",
        (
            "{data}/tp_gpt.py",
            "-b",
            "1GB",
            "--world-size",
            "6",
            "--parallel",
            "fsdp2",
            "--tp",
            "4",
            *OUT,
        ),
        2,
    ),
    Case(
        PROFILE,
        "--tp alone with another --world-size",
        ("{data}/tp_gpt.py", "-b", "1GB", "--world-size", "4", "--tp", "2", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--tp for a model file without parallelize",
        ("{data}/small_cnn.py", "-b", "1GB", "--tp", "2", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--tp for a model file whose parallelize applies no TP",
        (
            *("{data}/parallelized_gpt.py", "-b", "1GB", "--world-size", "4"),
            *("--parallel", "fsdp2", "--tp", "2", *OUT),
        ),
        4,
    ),
    Case(
        PROFILE,
        "budget too small for any plan (100KiB)",
        ("{data}/small_cnn.py", "--budget", "100KiB", *OUT),
        3,
        "out/profile.json",
    ),
    Case(
        PROFILE,
        "--device cuda on a machine without CUDA",
        ("{data}/small_cnn.py", "-b", "1GB", "--device", "cuda", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--target that is not a known device",
        ("{data}/small_cnn.py", "-b", "1GB", "--target", "h100", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--target spec file that is not JSON",
        ("{data}/small_cnn.py", "-b", "1GB", "--target", "{plans}/corrupt.json", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "budget above the target's memory (30GB on an L4)",
        ("{data}/small_cnn.py", "-b", "30GB", "--target", "l4", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "a budget the optimizer step alone passes (AdamW foreach on CUDA, 8B model, 80GB)",
        ("llama3_8b_foreach.py", "-b", "80GB", "--target", "h100-80gb", *OUT),
        3,
        "out/profile.json",
    ),
    Case(
        PROFILE,
        "Ctrl-C (SIGINT) while profiling",
        ("ctrl_c_while_profiling.py", "-b", "1GB", *OUT),
        130,
    ),
    Case(
        PROFILE,
        "Ctrl-C (SIGINT) while the plan is checked",
        ("ctrl_c_while_checking.py", "-b", "1GB", *OUT),
        130,
    ),
    Case(PROFILE, "--hf config missing", ("--hf", "no_such_config.json", *HF_SHAPE, *OUT), 4),
    Case(PROFILE, "--hf config not JSON", ("--hf", "{plans}/corrupt.json", *HF_SHAPE, *OUT), 4),
    Case(
        PROFILE,
        "--hf config without model_type",
        ("--hf", "no_model_type.json", *HF_SHAPE, *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf config of an architecture transformers lacks",
        ("--hf", "unknown_model_type.json", *HF_SHAPE, *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf given a diffusers config",
        ("--hf", "diffusers_unet.json", *HF_SHAPE, *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf --tp on a model not laid out like Llama",
        ("--hf", "{examples}/configs/gpt2.json", *HF_SHAPE, "--tp", "2", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf --tp that does not divide the key/value heads",
        ("--hf", "{examples}/configs/tiny-llama.json", *HF_SHAPE, "--tp", "4", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf without a batch shape",
        ("--hf", "{examples}/configs/gpt2.json", "-b", "1GB", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--hf sequence longer than the config's positions",
        (
            "--hf",
            "{examples}/configs/gpt2.json",
            "--batch-size",
            "1",
            "--seq-len",
            "5000",
            "-b",
            "1GB",
            *OUT,
        ),
        4,
    ),
    Case(
        PROFILE,
        "--hf --images on a model that takes none",
        ("--hf", "{examples}/configs/gpt2.json", *HF_SHAPE, "--images", "1", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf --clips on a model that takes no audio",
        ("--hf", "{examples}/configs/gpt2.json", *HF_SHAPE, "--clips", "1", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf sequence too short for a speech language model's clip",
        (
            "--hf",
            "{examples}/configs/voxtral-mini-3b.json",
            "--batch-size",
            "1",
            "--seq-len",
            "256",
            "-b",
            "40GB",
            *OUT,
        ),
        4,
    ),
    Case(
        PROFILE,
        "--hf --lora 0",
        ("--hf", "{examples}/configs/tiny-llama.json", *HF_SHAPE, "--lora", "0", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf --lora naming no file",
        ("--hf", "{examples}/configs/tiny-llama.json", *HF_SHAPE, "--lora", "adapter", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf --lora with another kind of adapter (IA3)",
        ("--hf", "{examples}/configs/tiny-llama.json", *HF_SHAPE, "--lora", "ia3.json", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf --lora on layers the model does not have",
        ("--hf", "{examples}/configs/tiny-llama.json", *HF_SHAPE, "--lora", "c_attn.json", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--lora with a model file",
        ("{data}/small_cnn.py", *HF_SHAPE[4:], "--lora", "8", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--hf config with no one text model (MusicGen's)",
        ("--hf", "musicgen.json", *HF_SHAPE, *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf --autocast in a dtype it does not take",
        ("--hf", "{examples}/configs/tiny-llama.json", *HF_SHAPE, "--autocast", "fp8", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--hf --choices on a head that is not multiple choice",
        ("--hf", "{examples}/configs/tiny-llama.json", *HF_SHAPE, "--choices", "3", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf dual encoder of audio and text (CLAP)",
        ("--hf", "clap.json", *HF_SHAPE, *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf object detector (DETR)",
        ("--hf", "detr.json", "--batch-size", "1", "-b", "1GB", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--hf config transformers' validators reject (on several lines)",
        ("--hf", "videomae_no_frames.json", "--batch-size", "1", "-b", "1GB", *OUT),
        4,
    ),
    Case(
        PROFILE,
        "--autocast with a model file",
        ("{data}/small_cnn.py", *HF_SHAPE[4:], "--autocast", "bfloat16", *OUT),
        2,
    ),
    Case(
        PROFILE,
        "MODEL.py and --hf together",
        ("{data}/small_cnn.py", "--hf", "{examples}/configs/gpt2.json", *HF_SHAPE, *OUT),
        2,
    ),
    Case(
        PROFILE,
        "--batch-size on a model file whose sample_batch takes none",
        ("{data}/small_cnn.py", "--batch-size", "3", "-b", "1GB", *OUT),
        4,
    ),
    Case(
        FIT,
        "fit: sample_batch takes no batch size",
        ("{data}/small_cnn.py", "-b", "1GB", "-o", "out/plan.json"),
        4,
    ),
    Case(
        FIT,
        "fit: budget below batch size 1 (100KiB)",
        ("{examples}/mlp.py", "-b", "100KiB", "-o", "out/plan.json"),
        3,
    ),
    Case(
        FIT,
        "fit: --hf with neither --seq-len nor --batch-size",
        ("--hf", "{examples}/configs/gpt2.json", "-b", "1GB"),
        2,
    ),
    Case(VERIFY, "plan file missing", ("{data}/small_cnn.py", "no_such_plan.json"), 6),
    Case(VERIFY, "plan file empty", ("{data}/small_cnn.py", "{plans}/empty.json"), 6),
    Case(
        VERIFY, "plan file corrupt (cut short)", ("{data}/small_cnn.py", "{plans}/corrupt.json"), 6
    ),
    Case(VERIFY, "plan file not a plan (a list)", ("{data}/small_cnn.py", "{plans}/list.json"), 6),
    Case(VERIFY, "plan file missing fields", ("{data}/small_cnn.py", "{plans}/no_fields.json"), 6),
    Case(VERIFY, "plan from a future schema", ("{data}/small_cnn.py", "{plans}/future.json"), 6),
    Case(
        VERIFY,
        "plan with a malformed loop (grad_accum 0)",
        ("{data}/small_cnn.py", "{plans}/bad_loop.json"),
        6,
    ),
    Case(
        VERIFY, "plan made for another model", ("{data}/cache_decoder.py", "{plans}/good.json"), 6
    ),
    Case(
        VERIFY,
        "plan made for another batch shape (warning)",
        ("{data}/small_cnn_batch4.py", "{plans}/good.json"),
        0,
    ),
    Case(VERIFY, "model file missing", ("no_such_model.py", "{plans}/good.json"), 4),
    Case(VERIFY, "model file with a syntax error", ("syntax_error.py", "{plans}/good.json"), 4),
    Case(VERIFY, "model file without build_model", ("no_build_model.py", "{plans}/good.json"), 4),
    Case(
        VERIFY,
        "forward that raises",
        ("{data}/raising_forward.py", "{plans}/raising_forward.json"),
        4,
    ),
    Case(
        VERIFY,
        "plan that changes training (BatchNorm statistics not restored)",
        ("{data}/small_cnn.py", "{plans}/no_restore.json"),
        5,
    ),
    Case(VERIFY, "plan over its budget", ("{data}/small_cnn.py", "{plans}/over_budget.json"), 5),
    Case(
        VERIFY,
        "plan with a selective policy naming no ops",
        ("{data}/small_cnn.py", "{plans}/policy_without_ops.json"),
        6,
    ),
    Case(
        VERIFY,
        "plan nesting a module in one that does not hold it",
        ("{data}/small_cnn.py", "{plans}/misnested.json"),
        6,
    ),
    Case(
        VERIFY,
        "--nproc 2 on a plan for one process",
        ("{data}/small_cnn.py", "{plans}/over_budget.json", "--nproc", "2"),
        2,
    ),
    Case(
        VERIFY,
        "plan whose recomputation differs (cached cross-attention)",
        ("{data}/cache_decoder.py", "{plans}/cached_attention.json"),
        5,
    ),
]


def write_plans(folder: Path) -> None:
    """The plans the verify cases read: a good one for small_cnn.py and broken variants."""
    folder.mkdir(parents=True, exist_ok=True)
    profile = profile_workload(build_workload(load_model_file(SMALL_CNN)), timing_passes=1)
    good = build_plan(profile, [Unit("0"), Unit("1")], profile.measured_peak_bytes, strategy="test")
    save_plan(good, folder / "good.json")
    data = plan_to_dict(good)
    (folder / "empty.json").write_text("")
    (folder / "corrupt.json").write_text(json.dumps(data)[:200])
    (folder / "list.json").write_text("[1, 2, 3]\n")
    (folder / "no_fields.json").write_text('{"schema_version": 1}\n')
    future = {**data, "schema_version": PLAN_SCHEMA_VERSION + 1}  # newer than any it reads
    (folder / "future.json").write_text(json.dumps(future))
    bad_loop = {**data, "loop": {"zero_grad": "before-forward", "grad_accum": 0}}
    (folder / "bad_loop.json").write_text(json.dumps(bad_loop))
    no_restore = tuple(dataclasses.replace(d, restore_buffers=()) for d in good.modules)
    save_plan(dataclasses.replace(good, modules=no_restore), folder / "no_restore.json")
    save_plan(dataclasses.replace(good, budget_bytes=100_000), folder / "over_budget.json")
    no_ops = (dataclasses.replace(good.modules[0], policy="save-matmuls"), *good.modules[1:])
    save_plan(dataclasses.replace(good, modules=no_ops), folder / "policy_without_ops.json")
    misnested = (good.modules[0], dataclasses.replace(good.modules[1], nested_in="0"))
    save_plan(dataclasses.replace(good, modules=misnested), folder / "misnested.json")
    broken = load_model_file(DATA / "raising_forward.py")
    matching_broken = dataclasses.replace(
        good,
        modules=(),
        fingerprint=model_fingerprint(broken.build_model()),
        batch=describe_batch(broken.sample_batch()),
        model_name="raising_forward",
    )
    save_plan(matching_broken, folder / "raising_forward.json")
    decoder = load_model_file(DATA / "cache_decoder.py")
    decoder_profile = profile_workload(build_workload(decoder), timing_passes=1)
    cached = build_plan(decoder_profile, [Unit("decoder.layers.0.cross")], 10**9, strategy="test")
    save_plan(cached, folder / "cached_attention.json")


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _clean(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        text = text.replace(old, new)
    return re.sub(r"\s+", " ", text).strip()


def run_cli_case(case: Case, plans: Path, scratch: Path) -> dict[str, object]:
    folder = Path(tempfile.mkdtemp(prefix="case-", dir=scratch))
    for name, source in MODEL_SOURCES.items():
        (folder / name).write_text(source)
    # The model files that import small_cnn find it beside them, as a user's would.
    (folder / "small_cnn.py").write_text(SMALL_CNN.read_text())
    inputs = set(_files(folder))
    arguments = [
        a.format(data=DATA, plans=plans, examples=ROOT / "examples") for a in case.arguments
    ]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    result = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", case.command, *arguments],
        cwd=folder,
        capture_output=True,
        text=True,
        env=environment,
        start_new_session=True,  # its own process group: the SIGINT cases stay inside it
        timeout=600,
        check=False,
    )
    written = [name for name in _files(folder) if name not in inputs]
    replacements = {str(plans): "<plans>", str(DATA): "tests/data", str(folder): "."}
    # One-line errors and warnings, and the text of a usage error's box (typer draws one).
    messages = [
        _clean(line.strip("│ "), replacements)
        for line in result.stderr.splitlines()
        if line.startswith(("error:", "warning:")) or line.startswith("│")
    ]
    shown = " ".join(case.arguments).format(data="tests/data", plans="<plans>", examples="examples")
    return {
        "command": f"ckpt-plan {case.command} {shown}",
        "bad input": case.bad_input,
        "exit": result.returncode,
        "expected": case.expected_exit,
        "message": " / ".join(messages) or "(none)",
        "files written": ", ".join(written) or "none",
        "expected files": case.expected_files,
    }


def run_apply_cases(plans: Path) -> list[dict[str, object]]:
    """apply_plan in Python: the exception each bad plan raises, and the model untouched."""
    cases: list[tuple[str, Path, Callable[[], object]]] = [
        ("plan file missing", plans / "no_such_plan.json", load_model_file(SMALL_CNN).build_model),
        ("plan file empty", plans / "empty.json", load_model_file(SMALL_CNN).build_model),
        ("plan file corrupt", plans / "corrupt.json", load_model_file(SMALL_CNN).build_model),
        (
            "plan from a future schema",
            plans / "future.json",
            load_model_file(SMALL_CNN).build_model,
        ),
        (
            "plan made for another model",
            plans / "good.json",
            load_model_file(DATA / "cache_decoder.py").build_model,
        ),
    ]
    rows = []
    for bad_input, path, build in cases:
        model = build()
        before = {name: value.clone() for name, value in model.state_dict().items()}  # type: ignore[attr-defined]
        try:
            apply_plan(model, path)  # type: ignore[arg-type]
            outcome = "no error"
        except Exception as error:
            outcome = f"{type(error).__name__}: {error}"
        after = model.state_dict()  # type: ignore[attr-defined]
        untouched = after.keys() == before.keys() and not any(
            "forward" in vars(module)
            for module in model.modules()  # type: ignore[attr-defined]
        )
        rows.append(
            {
                "command": f"apply_plan(model, {path.name!r})",
                "bad input": bad_input,
                "exit": "raises",
                "expected": "raises",
                "message": _clean(outcome, {str(plans): "<plans>"}),
                "files written": "none (model untouched)" if untouched else "MODEL CHANGED",
            }
        )
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    columns = ["bad input", "command", "exit", "message", "files written"]
    lines = [
        "| # | " + " | ".join(columns) + " |",
        "|---|" + "|".join("---" for _ in columns) + "|",
    ]
    for number, row in enumerate(rows, 1):
        cells = []
        for column in columns:
            text = str(row[column]).replace("|", "\\|")
            cells.append(f"`{text}`" if column == "command" else text)
        lines.append(f"| {number} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


HEADER = """# Bad inputs: what each one gets

Generated by `python benchmarks/bad_inputs.py` (do not edit by hand): every case runs the
real CLI (`python -m planner.cli.main`) in an empty folder and records its exit code, the lines
it printed on stderr (`error:`/`warning:`), and the files it left behind. Exit codes are the
README's ("Exit codes"): 2 bad command line, 3 no plan fits, 4 model file, 5 plan failed its check,
6 plan file, 130 interrupted. `<plans>` is the folder of plan files the script makes; the
Ctrl-C cases send a real SIGINT to the command's process group from inside the model's
forward. No case prints a traceback (that needs `--verbose`).
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bad_inputs.md")
    arguments = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ckpt-plan-bad-inputs-") as scratch:
        plans = Path(scratch) / "plans"
        write_plans(plans)
        rows = []
        for case in CASES:
            rows.append(run_cli_case(case, plans, Path(scratch)))
            print(rows[-1], flush=True)
        rows += run_apply_cases(plans)
    wrong = [
        row
        for row in rows
        if row["exit"] != row["expected"]
        or row["files written"] != row.get("expected files", "none (model untouched)")
    ]
    table = markdown(rows)
    summary = (
        f"\n{len(rows)} cases; "
        + (
            f"{len(wrong)} with an unexpected exit code or files written"
            if wrong
            else "all as expected"
        )
        + ".\n"
    )
    atomic_write_text(arguments.out, HEADER + "\n" + table + "\n" + summary)
    print(table + summary)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
