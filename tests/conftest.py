"""Shared pytest set-up: tests that need CUDA or transformers skipped without them; plan
checks run in this process; torch's threads shared between xdist workers; profiles of the
small test models made once per session.

**Plan checks in this process.** ``check_plan`` (what ``profile``, ``verify``, ``fit`` and
``solve --check`` call) runs :func:`planner.check.compare.run_check` in a child Python: a
fresh interpreter costs seconds (torch's import, and transformers' for a Hugging Face
model), and most tests only need the check's result. Here the child's command
(``python -m planner.<module> ...``) runs in this process instead, through that module's
``_main``: the plan and the reply (the result, or the error) still travel as JSON files
(:mod:`planner.check.child`), so every step of ``check_plan`` but the fork is what runs.
Tests of the process boundary itself carry the ``child_process`` marker and start the real
child.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from planner.core.records import Profile
from planner.measure.profiler import profile_workload
from planner.measure.workload import build_workload
from tests.models import stack_file

# xdist's workers share the machine's cores: one worker's ops on all of them would leave
# the others' threads waiting for a core.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = {}
    if not torch.cuda.is_available():
        missing["cuda"] = pytest.mark.skip(reason="needs a CUDA device")
    if importlib.util.find_spec("transformers") is None:
        missing["hf"] = pytest.mark.skip(reason="needs the transformers package")
    for item in items:
        for marker, skip in missing.items():
            if item.get_closest_marker(marker):
                item.add_marker(skip)
    # Slow tests first, the rest in their order: xdist's workers then start the long ones
    # early and fill in with short ones, so the run does not end on one worker's long test.
    if getattr(config.option, "numprocesses", None):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _planner_child(command: Any) -> list[str] | None:
    """The arguments of a ``python -m planner.<module> ...`` command, else None."""
    if not isinstance(command, list | tuple) or len(command) < 3:
        return None
    executable, flag, module = (str(part) for part in command[:3])
    if executable != sys.executable or flag != "-m" or not module.startswith("planner."):
        return None
    return [str(part) for part in command[2:]]


@pytest.fixture(autouse=True)
def _plan_checks_in_this_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Run ``python -m planner.<module>`` children in this process (module docstring);
    every other command (torchrun, ``python -c``) starts its process as usual."""
    if request.node.get_closest_marker("child_process"):
        yield
        return
    start_process = subprocess.run

    def run(command: Any, *arguments: Any, **options: Any) -> Any:
        child = _planner_child(command)
        if child is None:
            return start_process(command, *arguments, **options)
        module, argv = child[0], child[1:]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = importlib.import_module(module)._main(argv)
            except Exception:  # what the child's interpreter would print, then exit 1
                traceback.print_exc()
                code = 1
        return subprocess.CompletedProcess(command, code, stdout.getvalue(), stderr.getvalue())

    monkeypatch.setattr(subprocess, "run", run)
    yield


@pytest.fixture(autouse=True)
def _torch_checkpoint_debug_logger_propagates() -> Iterator[None]:
    """A check under ``debug`` (torch.utils.checkpoint's debug mode) leaves torch's
    ``LoggingTensor`` logger non-propagating; pytest then attaches its log capture to that
    logger in later tests, and formatting its records (not %-style) fails the test. A child
    process ends with the logger; in this process it is put back after each test."""
    yield
    logging.getLogger("LoggingTensor").propagate = True


# -- profiles shared by the tests (each is made once, on first use) --------------------------
@pytest.fixture(scope="session")
def stack_profile() -> Profile:
    """:func:`tests.models.stack_file`'s model (4 blocks of width 32, batch 64), profiled
    with one timing pass. Profiles are frozen: tests share this one."""
    return profile_workload(build_workload(stack_file(depth=4), seed=0), timing_passes=1)
