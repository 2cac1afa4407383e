"""Plan a Llama-3-8B-shaped model for an 80 GB H100 on this machine: time, memory, static
memory against the closed form, and the plan.

    python benchmarks/large_model.py

Runs ``ckpt-plan profile examples/llama3_8b.py --budget 80GB --target h100-80gb`` in a
fresh process (wall time; the largest resident set of its process tree), then reads the
profile and plan it wrote. The closed form of the static memory comes from the model's
configuration alone: parameters, gradients and AdamW's two states, each one bf16 copy of
every parameter (each tensor in whole 512-byte CUDA blocks), plus AdamW's step counters
(fused AdamW keeps one fp32 scalar per parameter on the GPU, one block each).
Writes reports/benchmarks/large_model.md.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import plan_text  # noqa: E402
from planner.core.fileio import atomic_write_text  # noqa: E402
from planner.core.units import format_bytes  # noqa: E402

# Llama 3 8B (examples/llama3_8b.py): vocabulary, hidden, intermediate, layers, KV width.
VOCAB, HIDDEN, INTERMEDIATE, LAYERS, KV = 128256, 4096, 14336, 32, 8 * 128
BUDGET = 80 * 10**9


def _blocks(size_bytes: int) -> int:
    return -(-size_bytes // 512) * 512


def parameter_shapes() -> list[int]:
    """Element counts of every parameter tensor, from the configuration."""
    layer = [
        HIDDEN * HIDDEN,  # q_proj
        KV * HIDDEN,  # k_proj
        KV * HIDDEN,  # v_proj
        HIDDEN * HIDDEN,  # o_proj
        INTERMEDIATE * HIDDEN,  # gate_proj
        INTERMEDIATE * HIDDEN,  # up_proj
        HIDDEN * INTERMEDIATE,  # down_proj
        HIDDEN,  # input_layernorm
        HIDDEN,  # post_attention_layernorm
    ]
    return [VOCAB * HIDDEN, *(layer * LAYERS), HIDDEN, VOCAB * HIDDEN]  # + norm, lm_head


def main() -> int:
    shapes = parameter_shapes()
    one_copy = sum(_blocks(2 * numel) for numel in shapes)  # bf16
    closed_form = 4 * one_copy + len(shapes) * 512
    with tempfile.TemporaryDirectory() as folder:
        command = [
            str(Path(sys.executable).parent / "ckpt-plan"),
            "profile",
            str(ROOT / "examples" / "llama3_8b.py"),
            "--budget",
            "80GB",
            "--target",
            "h100-80gb",
        ]
        started = time.perf_counter()
        result = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        if result.returncode != 0:
            print(result.stderr, file=sys.stderr)
            return 1
        profile = json.loads((Path(folder) / "profiles/llama3_8b/profile.json").read_text())
        plan = json.loads((Path(folder) / "profiles/llama3_8b/plan.json").read_text())
    static = (
        profile["parameter_bytes"] + profile["gradient_bytes"] + profile["optimizer_state_bytes"]
    )
    lines = [
        "# Planning a Llama-3-8B-shaped model for an H100 on a 2-core CPU machine",
        "",
        "`ckpt-plan profile examples/llama3_8b.py --budget 80GB --target h100-80gb`",
        "",
        "| | |",
        "|---|---|",
        f"| parameters | {sum(shapes):,} in {len(shapes)} tensors |",
        f"| wall time | {seconds:.1f} s (limit: 5 min) |",
        f"| largest resident set of the run | {rss_mib:.0f} MiB (limit: 4 GB) |",
        f"| static memory, profiled | {static:,} bytes ({format_bytes(static)}) |",
        f"| static memory, closed form | {closed_form:,} bytes ({format_bytes(closed_form)}) |",
        f"| equal | {static == closed_form} |",
        f"| buffers (rotary frequencies) | {profile['buffer_bytes']:,} bytes |",
        f"| cuBLAS workspaces (spec) | {profile['workspace_bytes']:,} bytes |",
        f"| unplanned peak (fake step) | {plan['baseline_peak_bytes']:,} bytes, "
        f"{'above' if plan['baseline_peak_bytes'] > BUDGET else 'NOT above'} 80 GB |",
        f"| plan's predicted peak | {plan['predicted_peak_bytes']:,} bytes, "
        f"{'under' if plan['predicted_peak_bytes'] <= BUDGET else 'NOT under'} 80 GB |",
        f"| modules in the plan | {len(plan['modules'])}: {plan_text(plan['modules'])} |",
        "| host memory (offloaded tensors, pinned blocks) | "
        f"{plan.get('predicted_host_peak_bytes') or 0:,} bytes |",
        "| predicted overhead (roofline on h100-80gb) | "
        f"{100 * plan['predicted_overhead']:+.1f}% |",
        f"| checked | {plan['checked']} (no H100 here: `ckpt-plan verify` on one) |",
    ]
    text = "\n".join(lines) + "\n"
    atomic_write_text(ROOT / "reports" / "benchmarks" / "large_model.md", text)
    print(text)
    ok = (
        static == closed_form
        and plan["baseline_peak_bytes"] > BUDGET >= plan["predicted_peak_bytes"]
        and seconds <= 300
        and rss_mib <= 4000
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
