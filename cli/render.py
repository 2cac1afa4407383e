"""What the commands print: the plan summary, notes about the profile, fit's sizes,
verify's report and a calibrated device spec."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from planner.check.result import CheckReference
from planner.core.records import NoteTopic, Profile
from planner.core.units import format_bytes

from .boundary import stdout, warn

if TYPE_CHECKING:
    from planner.plan.targets import DeviceSpec

__all__ = [
    "print_device_spec",
    "print_fit",
    "print_plan_summary",
    "print_verification",
    "rank_table",
    "warn_own_checkpointing",
]


def warn_own_checkpointing(profile: Profile) -> None:
    """Say, on stderr, what checkpointing the model does itself and how it was planned."""
    for note in profile.assumptions:
        if note.topic is NoteTopic.OWN_CHECKPOINTING:
            warn(str(note))


def _print_stages(result: Any) -> None:
    """A pipeline's plan: each stage's peak before and after, and what it checkpoints."""
    table = Table(title="pipeline stages, each planned for its own rank", title_justify="left")
    for column in ("stage", "in flight", "unplanned peak", "predicted peak", "measured peak"):
        table.add_column(column, justify="right")
    table.add_column("checkpointed", overflow="fold")
    table.add_column("recompute (ms)", justify="right")
    for index, stage in enumerate(result.plan.stages):
        pipeline = stage.parallel.pipeline
        how = ", ".join(
            f"{decision.module_name} ({decision.how})"
            for decision in stage.modules
            if decision.nested_in is None
        )
        table.add_row(
            str(index),
            str(pipeline.in_flight(index)),
            format_bytes(stage.baseline_peak_bytes),
            format_bytes(stage.predicted_peak_bytes),
            format_bytes(stage.measured_peak_bytes)
            if stage.measured_peak_bytes is not None
            else "not run",
            how or "nothing",
            f"{stage.recompute_ms:.1f}",
        )
    stdout.print(table)


def print_plan_summary(result: Any, wrote: list[Path]) -> None:
    plan, profile = result.plan, result.profile
    table = Table(title=f"checkpointed modules of {profile.model_name}", title_justify="left")
    table.add_column("module", overflow="fold")
    table.add_column("type")
    table.add_column("how")
    table.add_column("calls", justify="right")
    table.add_column("frees (MiB)", justify="right")
    # An offloaded module recomputes nothing: its cost is the copies the compute does not hide.
    table.add_column(
        "recompute/copies (ms)" if plan.offloads else "recompute (ms)", justify="right"
    )
    table.add_column("RNG replay")
    for decision in plan.modules:
        record = profile.module(decision.module_name)
        table.add_row(
            decision.module_name,
            record.module_type,
            decision.how,
            str(record.call_count),
            f"{decision.saving_bytes / 2**20:.2f}",
            f"{decision.recompute_ms:.1f}",
            "yes" if decision.preserve_rng_state else "no",
        )
    if plan.stages:
        _print_stages(result)
    elif plan.modules:
        stdout.print(table)
    else:
        stdout.print("No checkpointing needed: the unplanned step already fits the budget.")
    fake = plan.memory_source == "fake"
    per_rank = " per rank" if plan.parallel is not None else ""
    rows = [
        *(
            [("torchrun job", f"planned for {plan.parallel.describe()}")]
            if plan.parallel is not None
            else []
        ),
        ("budget" + per_rank, format_bytes(plan.budget_bytes)),
        (
            f"unplanned peak ({'fake-tensor step' if fake else 'measured'})",
            format_bytes(plan.baseline_peak_bytes),
        ),
        ("predicted peak with plan", format_bytes(plan.predicted_peak_bytes)),
    ]
    if plan.measured_peak_bytes is not None:
        measured_where = f" (highest of {plan.parallel.world_size} ranks)" if per_rank else ""
        rows.append(
            ("measured peak with plan" + measured_where, format_bytes(plan.measured_peak_bytes))
        )
    if plan.offloads:
        budget_text = (
            f" of a {format_bytes(plan.host_budget_bytes)} host budget"
            if plan.host_budget_bytes is not None
            else ""
        )
        rows.append(
            (
                "host memory (offloaded tensors)",
                format_bytes(plan.predicted_host_peak_bytes) + budget_text,
            )
        )
    rows += [
        ("static (params+grads+optimizer)", format_bytes(plan.static_bytes)),
        ("training loop", plan.loop.describe()),
        (
            ("recompute + copies per " if plan.offloads else "recompute per ")
            + plan.loop.step_name,
            f"{plan.recompute_ms:.1f} ms = {plan.predicted_overhead:+.1%} "
            f"of a {plan.step_ms:.1f} ms {plan.loop.step_words()}",
        ),
        (
            "figures from",
            ("fake tensors (no memory used)" if fake else "a real unplanned step")
            + "; times "
            + (
                f"estimated for {plan.target} (roofline)"
                if plan.target
                else "estimated from FLOPs and bytes (roofline), not timed"
                if plan.cost_source == "roofline"
                else "measured here"
            ),
        ),
    ]
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column()
    for key, value in rows:
        summary.add_row(key, value)
    stdout.print(summary)
    check = result.check
    if check is not None and check.reference is CheckReference.RECOMPUTATION:
        stdout.print(
            "checked by running it in a separate process, within the budget: every "
            f"recomputation bit-identical to its forward ({check.recomputed_ops} ops), buffers "
            "and RNG state as without the plan, so loss and gradients are the unplanned "
            "step's; state_dict keys unchanged"
        )
    elif check is not None and plan.parallel is not None:
        stdout.print(
            f"checked by running it on {plan.parallel.world_size} real ranks (torchrun): on "
            "every rank within the budget, and loss, gradient shards and buffers equal the "
            "unplanned distributed step's"
        )
    elif check is not None:
        stdout.print(
            "checked by running it in a separate process: loss, gradients and buffers equal "
            "the unplanned step's; state_dict keys unchanged"
        )
    elif plan.target:
        from planner.measure.source import WorkloadSource, workload_in_command

        source = WorkloadSource.parse(plan.model_file) if plan.model_file else None
        stdout.print(
            f"not run: made for {plan.target}, which is not here; run `ckpt-plan verify "
            f"{workload_in_command(source)} PLAN` on it before training"
        )
    elif plan.parallel is not None:
        for note in plan.notes:
            if note.topic is NoteTopic.UNCHECKED:
                stdout.print("not run: " + note.text)
    for path in wrote:
        stdout.print(f"wrote {path}")


def print_fit(result: Any) -> None:
    """The sizes ``fit`` tried (a :class:`planner.fit.FitResult`), and its answers."""
    import shlex

    budget = format_bytes(result.budget_bytes)
    what = result.dimension.replace("_", " ")
    per = "samples/s" if result.dimension == "batch_size" else "tokens/s per sequence"
    table = Table(title=f"{what}s tried under {budget}", title_justify="left")
    # The host memory of the plans that offload, only where one does.
    offloading = any(point.host_peak_bytes for point in result.points)
    columns = [what, "lowest peak", "unplanned peak", "fits", "modules", per]
    if offloading:
        columns.insert(5, "host memory")
    for column in columns:
        table.add_column(column, justify="right")
    for point in result.points:
        fits = point.lowest_peak_bytes <= result.budget_bytes
        rate = point.throughput
        marks = [
            mark
            for mark, size in (("largest", result.largest), ("fastest", result.fastest))
            if point.size == size
        ]
        table.add_row(
            str(point.size) + (f" ({', '.join(marks)})" if marks else ""),
            format_bytes(point.lowest_peak_bytes),
            format_bytes(point.unplanned_peak_bytes),
            "yes" if fits else "no",
            "-" if point.plan_modules is None else str(point.plan_modules),
            *(
                [format_bytes(point.host_peak_bytes) if point.plan_modules is not None else "-"]
                if offloading
                else []
            ),
            "-" if rate is None else f"{rate:,.1f}",
        )
    stdout.print(table)
    largest = result.point(result.largest)
    beyond = [p for p in result.points if p.size == result.largest + 1]
    why = (
        f"; {result.largest + 1} needs {format_bytes(beyond[0].lowest_peak_bytes)} "
        "with every useful module checkpointed"
        if beyond
        else " (the search stopped at its largest size)"
        if result.capped
        else ""
    )
    stdout.print(
        f"largest {what} that fits {budget}: {result.largest} "
        f"(lowest peak {format_bytes(largest.lowest_peak_bytes)}){why}"
    )
    profile = result.planned.profile
    options = ""
    if profile.target:
        times = "estimated for the target"
    elif profile.parallel is not None:
        times = "estimated from the ops: a rank's step is not timed alone"
        options = " " + profile.parallel.command_options()
    else:
        times = "timed here"
    load = profile.switches.expert_load
    if load is not None and load != 1.0:  # the routing planned for, where it is not the default
        options += f" --expert-load {load:g}"
    stdout.print(
        f"fastest: {what} {result.fastest}, {result.point(result.fastest).throughput:,.1f} {per} "
        f"predicted with its cheapest plan ({times}); plan it with: ckpt-plan profile "
        f"{shlex.join(result.point(result.fastest).source.command_arguments())} "
        f"--budget {result.budget_bytes}{options}"
    )


def rank_table(ranks: Any) -> Table:
    """Each real rank's check of a plan for a torchrun job (a
    :class:`planner.check.ranks.RanksCheck`)."""
    table = Table(title="each rank", title_justify="left")
    for column in ("rank", "peak with plan", "unplanned peak", "budget", "step"):
        table.add_column(column, justify="right" if "peak" in column else "left")
    for rank in ranks.ranks:
        table.add_row(
            str(rank.rank),
            format_bytes(rank.measured_peak_bytes),
            format_bytes(rank.unplanned_peak_bytes),
            "within" if rank.within_budget else "OVER",
            "bit-identical"
            if rank.training_unchanged
            else "DIFFERENT: " + ", ".join(map(str, rank.differences[:2])),
        )
    return table


def print_verification(result: Any) -> None:
    """``verify``'s report of a plan run against its model file (a
    :class:`planner.check.verify.Verification`): what it was compared with and how that
    went, its peaks, and each rank's check for a torchrun job."""
    check, plan = result.check, result.plan

    def verdict(equal: bool | None, detail: str = "") -> str:
        if equal is None:
            return "not compared directly" + (f" ({detail})" if detail else "")
        return ("equal" if equal else "DIFFERENT") + (f" ({detail})" if detail else "")

    if check.reference is CheckReference.RECOMPUTATION:
        rows = [
            (
                "reference",
                "recomputation (the unplanned step was not run; every recomputation is "
                "compared with its forward)",
            ),
            (
                "recomputations",
                verdict(check.recomputation_equal, f"{check.recomputed_ops} ops compared"),
            ),
            ("buffers and RNG", verdict(check.buffers_equal, "after backward")),
            (
                "loss and gradients",
                "follow: the forward is unchanged and backward reads what it made"
                if check.training_unchanged
                else "DIFFERENT: a recomputation differs from its forward",
            ),
        ]
    else:
        rows = [
            (
                "reference",
                f"the unplanned distributed step on each of {len(result.ranks.ranks)} "
                "real ranks, from the same seed"
                if result.ranks is not None
                else "the unplanned step, run from the same seed",
            ),
            ("loss", verdict(check.loss_equal)),
            (
                "gradients",
                verdict(
                    check.gradients_equal,
                    f"max difference {check.max_gradient_difference:.3g}"
                    if check.gradients_equal is not None
                    else str(next(iter(check.differences), "")),
                ),
            ),
            ("buffers", verdict(check.buffers_equal)),
        ]
    rows += [
        ("training loop", f"as the plan records it: {plan.loop.describe()}"),
        ("state_dict keys", "unchanged" if check.state_dict_keys_equal else "CHANGED"),
        (
            "peak with plan (measured)",
            f"{format_bytes(check.measured_peak_bytes)} "
            + ("<=" if check.within_budget else "OVER")
            + f" budget {format_bytes(plan.budget_bytes)}",
        ),
        (
            "peak with plan (predicted)",
            f"{format_bytes(plan.predicted_peak_bytes)} "
            f"(measured differs by {result.prediction_error:+.2%})",
        ),
    ]
    if (reserved := check.reserved) is not None:
        rows.append(
            (
                "reserved with plan (measured)",
                f"{format_bytes(reserved.reserved_peak_bytes)} "
                + ("<=" if reserved.reserved_over_bytes == 0 else "OVER")
                + f" budget {format_bytes(plan.budget_bytes)} (the caching allocator's segments)",
            )
        )
    if check.unplanned_peak_bytes is not None:
        rows.append(("unplanned peak (measured)", format_bytes(check.unplanned_peak_bytes)))
    table = Table(
        title=escape(
            f"verify {result.plan_path} on {result.model_path} ({result.device}, seed "
            f"{result.seed}, {len(plan.modules)} modules checkpointed)"
        ),
        title_justify="left",
        show_header=False,
        box=None,
        pad_edge=False,
    )
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    stdout.print(table)
    if result.ranks is not None:
        stdout.print(rank_table(result.ranks))


def print_device_spec(spec: DeviceSpec) -> None:
    """A device spec's values, each with what it is, and where they came from."""
    table = Table(title=f"device spec {spec.name}", title_justify="left")
    table.add_column("field")
    table.add_column("value", justify="right")
    rows = [
        ("memory_bytes", format_bytes(spec.memory_bytes)),
        ("workspace_bytes", format_bytes(spec.workspace_bytes)),
        ("memory_bandwidth_bytes_per_s", f"{spec.memory_bandwidth_bytes_per_s / 1e9:.0f} GB/s"),
        *(
            (f"peak_flops_per_s[{dtype}]", f"{rate / 1e12:.1f} TFLOP/s")
            for dtype, rate in spec.peak_flops_per_s.items()
        ),
        ("matmul_efficiency", f"{spec.matmul_efficiency:.3f}"),
        ("memory_efficiency", f"{spec.memory_efficiency:.3f}"),
        ("kernel_launch_s", f"{spec.kernel_launch_s * 1e6:.1f} us"),
        ("checkpoint_call_s", f"{spec.checkpoint_call_s * 1e6:.0f} us"),
        ("host_link_bytes_per_s", f"{spec.host_link_bytes_per_s / 1e9:.1f} GB/s"),
    ]
    for field, value in rows:
        table.add_row(field, value)
    stdout.print(table)
    stdout.print(escape(spec.source))
