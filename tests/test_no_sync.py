"""Gradient accumulation without syncing before the last micro-batch (``--no-sync``: DDP's
``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)``, as Hugging Face's Trainer and
accelerate run it; docs/distributed.md, "Gradient accumulation without syncing"): the cycle
is recorded, FSDP2's unsharded gradients are in the plan, real ranks measure what the
simulated one predicts, and the first forward says when the loop is not the plan's."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from planner.apply import apply_plan
from planner.cli.main import app
from planner.core.errors import ParallelLayoutError
from planner.core.loop import LoopShape
from planner.core.parallel import ParallelLayout
from planner.measure.distributed import record_rank_memory, simulated_ranks
from planner.measure.workload import load_model_file
from planner.plan.plan_file import load_plan
from planner.solve.planning import plan_for_budget

DATA = Path(__file__).parent / "data"
SMALL_GPT = DATA / "small_gpt.py"
FSDP2 = ParallelLayout(2, "fsdp2")  # type: ignore[arg-type]


def _calls_per_block(profile) -> set[int]:  # type: ignore[no-untyped-def]
    counts: dict[str, int] = {}
    for call in profile.timeline.calls:
        counts[call.module_name] = counts.get(call.module_name, 0) + 1
    return {count for name, count in counts.items() if name.startswith("blocks.")}


@pytest.fixture(scope="module")
def fsdp2_cycles():  # type: ignore[no-untyped-def]
    """One FSDP2 rank of 2 recorded in three loops: accumulating 3 micro-batches with a sync
    each, and without syncing before the last, for 3 and 6 micro-batches."""
    model_file = load_model_file(SMALL_GPT)
    loops = {
        "synced": LoopShape(grad_accum=3),
        "unsynced": LoopShape(grad_accum=3, no_sync=True),
        "unsynced6": LoopShape(grad_accum=6, no_sync=True),
    }
    return {key: record_rank_memory(model_file, FSDP2, loop=loop) for key, loop in loops.items()}


def test_the_cycle_is_recorded_with_fsdp2_s_unsharded_gradients(fsdp2_cycles) -> None:  # type: ignore[no-untyped-def]
    synced, unsynced, longer = (fsdp2_cycles[k] for k in ("synced", "unsynced", "unsynced6"))
    assert _calls_per_block(synced) == {1} and _calls_per_block(unsynced) == {3}
    # Without syncing FSDP2 keeps each gradient whole until the last micro-batch: a rank of
    # 2 holds its whole gradients (twice its shards) where the synced loop held the shards,
    # about one shard's bytes more (less the shards' padding).
    gradient_shards = sum(
        storage.size_bytes
        for storage in synced.timeline.storages
        if storage.kind.value == "gradient"
    )
    assert gradient_shards > 0
    extra = unsynced.measured_peak_bytes - synced.measured_peak_bytes
    assert 0.95 * gradient_shards <= extra <= gradient_shards, (extra, gradient_shards)
    # The micro-batches between the first and the last are alike: 6 records as 3 does.
    assert _calls_per_block(longer) == {3}
    assert longer.measured_peak_bytes == unsynced.measured_peak_bytes
    assert longer.loop.grad_accum == 6 and longer.loop.no_sync


def test_no_sync_is_refused_where_nothing_syncs() -> None:
    model_file = load_model_file(SMALL_GPT)
    loop = LoopShape(grad_accum=2, no_sync=True)
    with pytest.raises(ParallelLayoutError, match="tensor parallelism alone has none"):
        record_rank_memory(model_file, ParallelLayout(2, "tp"), loop=loop)  # type: ignore[arg-type]
    runner = CliRunner()
    for options, code, fragment in (
        (["--no-sync"], 2, "--no-sync needs --grad-accum N with N > 1"),
        (["--no-sync", "--grad-accum", "2"], 2, "--no-sync is for data-parallel ranks"),
    ):
        result = runner.invoke(
            app, ["profile", str(SMALL_GPT), "--budget", "8MiB", "-o", "/dev/null", *options]
        )
        assert result.exit_code == code, result.output
        assert fragment in " ".join(result.output.split()), result.output
        assert "Traceback" not in result.output


def test_the_first_forward_warns_where_the_loop_syncs_otherwise(fsdp2_cycles, caplog) -> None:  # type: ignore[no-untyped-def]
    """A plan for a loop that syncs every micro-batch, trained in one that does not (Hugging
    Face's Trainer with FSDP2), warns with the fix; and the other way round."""
    from torch.distributed.fsdp import fully_shard

    synced_plan, _ = plan_for_budget(fsdp2_cycles["synced"], 1 << 40)
    unsynced_plan, _ = plan_for_budget(fsdp2_cycles["unsynced"], 1 << 40)
    model_file = load_model_file(SMALL_GPT)
    batch = model_file.sample_batch()
    caplog.set_level(logging.WARNING, logger="planner")
    with simulated_ranks(FSDP2):
        for plan, unsynced, said in (
            (synced_plan, True, "re-run `ckpt-plan profile` with --grad-accum N --no-sync"),
            (unsynced_plan, False, "re-run `ckpt-plan profile` without --no-sync"),
            (synced_plan, False, None),
            (unsynced_plan, True, None),
        ):
            caplog.clear()
            model = apply_plan(model_file.build_model(), plan)
            fully_shard(model)
            model.set_requires_gradient_sync(not unsynced)
            with torch.no_grad():
                model(**batch)  # evaluation: not checked
            model(**batch)
            messages = [r.getMessage() for r in caplog.records if "sync" in r.getMessage()]
            if said is None:
                assert messages == []
            else:
                assert len(messages) == 1 and said in messages[0], messages
                assert "FSDP2 keeps every gradient unsharded" in messages[0]


@pytest.mark.slow
@pytest.mark.ranks
@pytest.mark.parametrize(
    ("model", "strategy", "budget"),
    [
        ("small_gpt.py", "fsdp2", "1.1MiB"),
        # the model file's DDP with gradient_as_bucket_view: unsynced gradients stay outside
        # the buckets until the last micro-batch, so the rank holds more than when synced
        ("ddp_gpt.py", "ddp", "1.2MiB"),
    ],
)
def test_an_unsynced_cycle_is_predicted_for_real_ranks(
    model: str, strategy: str, budget: str, tmp_path: Path
) -> None:
    """Profiled with --grad-accum 5 --no-sync (recorded as a cycle of 3 micro-batches) and
    checked on 2 real gloo ranks running the whole cycle of 5, the first 4 under no_sync:
    every rank within the budget, as predicted to the byte, and bit-identical. The plan made
    for syncing every micro-batch, run in this loop, goes over its prediction."""
    runner = CliRunner()
    common = [str(DATA / model), "--budget", budget, "--world-size", "2", "--parallel", strategy]
    plans = {}
    for key, options in (("unsynced", ["--no-sync"]), ("synced", [])):
        plans[key] = tmp_path / f"{key}.json"
        profiled = runner.invoke(
            app,
            [
                "profile",
                *common,
                "--grad-accum",
                "5",
                *options,
                "-o",
                str(plans[key]),
                "--report-dir",
                str(tmp_path / key),
            ],
        )
        assert profiled.exit_code == 0, profiled.output
    unsynced = load_plan(plans["unsynced"])
    assert unsynced.loop.no_sync and unsynced.checked and unsynced.modules
    assert unsynced.measured_peak_bytes is not None
    assert unsynced.measured_peak_bytes <= unsynced.budget_bytes
    assert unsynced.measured_peak_bytes == unsynced.predicted_peak_bytes
    synced = load_plan(plans["synced"])
    assert unsynced.baseline_peak_bytes > synced.baseline_peak_bytes
    # The synced plan in the unsynced loop: verify runs each rank in the plan's loop.
    data = json.loads(plans["synced"].read_text())
    data["loop"]["no_sync"] = True
    plans["edited"] = tmp_path / "edited.json"
    plans["edited"].write_text(json.dumps(data))
    verified = runner.invoke(
        app, ["verify", str(DATA / model), str(plans["edited"]), "--nproc", "2"]
    )
    output = " ".join(verified.output.split())
    assert output.count("bit-identical") == 2, output
    assert re.search(r"measured differs by \+[0-9.]+%", output), output


def test_the_first_forward_compares_ddp_s_sync_where_gradient_views_make_it_matter(
    fsdp2_cycles, caplog
) -> None:  # type: ignore[no-untyped-def]
    """Under DDP's no_sync() a rank holds more only with gradient_as_bucket_view (its
    default buckets hold the same either way): only then does the first forward warn."""
    synced_plan, _ = plan_for_budget(fsdp2_cycles["synced"], 1 << 40)
    ddp_plan = dataclasses.replace(synced_plan, parallel=ParallelLayout(2, "ddp"))  # type: ignore[arg-type]
    model_file = load_model_file(SMALL_GPT)
    batch = model_file.sample_batch()
    caplog.set_level(logging.WARNING, logger="planner")
    with simulated_ranks(ParallelLayout(2, "ddp")):  # type: ignore[arg-type]
        for views, warned in ((False, False), (True, True)):
            caplog.clear()
            wrapped = torch.nn.parallel.DistributedDataParallel(
                apply_plan(model_file.build_model(), ddp_plan), gradient_as_bucket_view=views
            )
            with wrapped.no_sync():
                wrapped(**batch)  # no backward: the group is fake
            messages = [r.getMessage() for r in caplog.records if "sync" in r.getMessage()]
            assert len(messages) == warned, messages
            if warned:
                assert "gradient_as_bucket_view" in messages[0]
                assert "--grad-accum N --no-sync" in messages[0]


def test_the_sync_check_never_stops_a_step_when_fsdp2_s_state_is_not_as_read(
    fsdp2_cycles, caplog, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """The check reads FSDP2's private state (what set_requires_gradient_sync sets); where a
    torch release lays it out otherwise, the forward runs as without the check."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    synced_plan, _ = plan_for_budget(fsdp2_cycles["synced"], 1 << 40)
    model_file = load_model_file(SMALL_GPT)
    caplog.set_level(logging.WARNING, logger="planner")
    with simulated_ranks(FSDP2):
        model = apply_plan(model_file.build_model(), synced_plan)
        fully_shard(model)
        model.set_requires_gradient_sync(False)
        monkeypatch.setattr(FSDPModule, "_get_fsdp_state", lambda self: object())
        model(**model_file.sample_batch())
    assert not [r for r in caplog.records if "sync" in r.getMessage()]
