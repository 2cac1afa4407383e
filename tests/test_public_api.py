"""What ``import planner`` offers: what a training script needs, and ``profile_and_plan``
with every type its signature names; nothing else, and no torch until asked for."""

from __future__ import annotations

import subprocess
import sys
import typing

import planner

TRAINING_SCRIPT = {"apply_plan", "remove_plan", "load_plan", "Plan"}


def test_import_planner_loads_no_torch() -> None:
    code = "import sys, planner; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_every_exported_name_resolves() -> None:
    missing = [name for name in planner.__all__ if getattr(planner, name, None) is None]
    assert not missing


def test_the_exports_are_the_training_script_the_errors_and_profile_and_plan() -> None:
    errors = {
        name
        for name in planner.__all__
        if isinstance(getattr(planner, name), type)
        and issubclass(getattr(planner, name), planner.PlannerError)
    }
    assert "PlannerError" in errors and "PlanFileError" in errors
    hints = typing.get_type_hints(planner.profile_and_plan)
    named: set[str] = set()
    for hint in hints.values():
        for part in (hint, *typing.get_args(hint)):
            for leaf in (part, *typing.get_args(part)):
                module = getattr(leaf, "__module__", "")
                if module.startswith("planner."):
                    named.add(leaf.__name__)
    named.add("ProgressCallback")  # a Callable alias: get_type_hints expands it
    assert named <= set(planner.__all__), named - set(planner.__all__)
    result = hints["return"].__name__
    assert result in planner.__all__
    assert set(planner.__all__) == TRAINING_SCRIPT | errors | named | {
        "profile_and_plan",
        result,
    }
