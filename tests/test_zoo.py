"""The zoo (benchmarks/zoo.py, issue 27) on a few quick architectures, built with their
configs' defaults: each is profiled on fake tensors, planned at the mid budget and at every
block's peak by the tool's own loop, and each plan is run in a separate process against the
unplanned step. The whole zoo is ``python benchmarks/zoo.py``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from benchmarks import zoo
from benchmarks.zoo_models import ZOO

# The quickest (about 15 s each here), none with a cache that keeps its blocks from being
# checkpointed: two encoders (absolute and rotary positions) and a vision Transformer.
ARCHITECTURES = ("bert", "modernbert", "vit")


@pytest.mark.hf
@pytest.mark.slow
def test_the_zoo_plans_fit_their_predictions_and_train_identically(tmp_path: Path) -> None:
    assert zoo.main(["--only", ",".join(ARCHITECTURES), "--out", str(tmp_path)]) == 0
    frame = pd.read_csv(tmp_path / "zoo.csv")
    assert list(frame["architecture"]) == [name for name in ARCHITECTURES for _ in range(2)]
    assert list(frame["budget"]) == ["mid", "every-block"] * len(ARCHITECTURES)
    assert frame["error"].isna().all(), frame["error"].tolist()
    assert (frame["memory_source"] == "fake").all()
    assert frame["bit_identical"].all()
    # Predicted against measured, within 0.1% (exact so far), and within the budget.
    assert (frame["error_pct"].abs() <= 0.1).all(), frame[["architecture", "error_pct"]]
    assert (frame["measured_mib"] <= frame["budget_mib"] + 1e-3).all()
    # A plan that saves something: below the unplanned peak, down to the floor at most.
    assert (frame["plan_mib"] < frame["unplanned_mib"]).all()
    assert (frame["plan_mib"] >= frame["floor_mib"] - 1e-3).all()
    assert (tmp_path / "zoo.md").read_text().startswith("| architecture |")


def test_every_architecture_writes_a_model_file(tmp_path: Path) -> None:
    from planner.measure.workload import load_model_file

    assert len(ZOO) >= 22
    path = zoo.write_model_file(ZOO["llama"], tmp_path)
    model_file = load_model_file(path)
    assert model_file.name == "zoo_llama"
    assert callable(model_file.build_model) and callable(model_file.sample_batch)


def test_an_error_that_is_not_the_tools_own_is_marked_raw() -> None:
    from planner.core.errors import ProfilingError

    assert zoo.one_line(ProfilingError("fake tensors cannot\n run op")) == (
        "fake tensors cannot run op"
    )
    assert zoo.one_line(RuntimeError("Expected BF16")) == "raw RuntimeError: Expected BF16"
    frame = pd.DataFrame(
        {
            "plan_mib": [1.0, None, 1.0, 1.0, 1.0],
            "bit_identical": [True, None, False, True, True],
            "error_pct": [0.0, None, 0.0, 0.2, 0.0],
            "profile_error": [None, None, None, None, "a real unplanned step needs more"],
        }
    )
    assert list(zoo.failed(frame)) == [False, True, True, True, True]
