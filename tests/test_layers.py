"""The import graph points one way: core -> plan -> solve -> report -> apply -> measure ->
check -> pipeline -> cli. Each layer is one package of ``planner`` (one file for
``pipeline``; ``model_switches`` and ``dispatch`` beside ``apply``):

* **core** (``planner.core``: errors, units, records, file writes): plain data and helpers.
* **plan** (``planner.plan``: the memory model, plan and profile files, device targets):
  pure Python over the records.
* **solve** (``planner.solve``: the unit tree, memory rows, the three searches, planning):
  the cheapest plan under a budget.
* **report** (``planner.report``): tables, figures and summaries of a profile and its plans.
* **apply** (``planner.apply``: wrapping, locating the planned model, the first-forward
  guard, the recomputation observer; ``planner.model_switches``; and ``planner.dispatch``,
  the base of every dispatch mode): the lowest torch
  layer, which every training script imports; it knows plans, not model files.
* **measure** (``planner.measure``: model files, workloads, tracking, fake tensors, the
  profiler, timing, measured steps): runs torch.
* **check** (``planner.check``: the recomputation probe, checking and verifying plans):
  runs plans for real.
* **pipeline** (``pipeline``, ``fit``, and ``checked_plan``, the torch-free record of its
  result): profile, solve, probe, check, re-plan.
* **cli**: the typer app over all of the above; nothing in ``planner`` imports it.

A module may import its own layer and the layers below, for annotations too (under ``if
TYPE_CHECKING:``): a record that names an upper layer's type belongs to that layer. core,
plan, solve and report import no torch at run time (annotation-only imports do not load
it), so planning from a saved profile never loads it. A new module must be given a layer
here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS: dict[str, tuple[str, ...]] = {
    "core": ("core",),
    "plan": ("plan",),
    "solve": ("solve",),
    "report": ("report",),
    "apply": ("apply", "model_switches", "dispatch"),
    "measure": ("measure",),
    "check": ("check",),
    "pipeline": ("pipeline", "pipeline_stages", "fit", "checked_plan"),
}
ORDER = list(LAYERS)
LAYER_OF = {module: layer for layer, modules in LAYERS.items() for module in modules}
TORCH_FREE = ("core", "plan", "solve", "report")
# Modules of a higher layer that ``ckpt-plan solve`` imports too, so import no torch either.
TORCH_FREE_MODULES = ("checked_plan",)


def _runtime_imports(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports at run time (function bodies
    included; ``if TYPE_CHECKING:`` blocks left out)."""
    return _imports(path, annotations=False)


def _imports(path: Path, *, annotations: bool = True) -> set[str]:
    """Top-level names of every module ``path`` imports (function bodies included; ``if
    TYPE_CHECKING:`` blocks too, unless not ``annotations``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if (
            not annotations
            and isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test)
        ):
            skipped.update(id(child) for item in node.body for child in ast.walk(item))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "planner":  # from planner import apply, ...
                found.update(f"planner.{alias.name}" for alias in node.names)
    return found


def _planner_modules() -> list[str]:
    """The top-level modules and packages of ``planner`` (a package is one unit: its
    files import each other freely and share its layer)."""
    files = [p.stem for p in (ROOT / "planner").glob("*.py") if p.stem != "__init__"]
    packages = [p.parent.name for p in (ROOT / "planner").glob("*/__init__.py")]
    return sorted(files + packages)


def _sources(name: str) -> list[Path]:
    package = ROOT / "planner" / name
    return sorted(package.glob("*.py")) if package.is_dir() else [package.with_suffix(".py")]


def test_every_planner_module_has_a_layer() -> None:
    missing = [name for name in _planner_modules() if name not in LAYER_OF]
    assert not missing, f"give these modules a layer in tests/test_layers.py: {missing}"


@pytest.mark.parametrize("name", _planner_modules())
def test_imports_point_down_the_layers(name: str) -> None:
    layer = LAYER_OF.get(name)
    if layer is None:
        pytest.skip("no layer yet (test_every_planner_module_has_a_layer fails)")
    imports = set().union(*(_imports(path) for path in _sources(name)))
    assert not any(
        module in ("cli", "planner.cli") or module.startswith(("cli.", "planner.cli."))
        for module in imports
    )
    for module in imports:
        if not module.startswith("planner."):
            continue
        target = LAYER_OF.get(module.split(".")[1])
        if target is None:
            continue
        assert ORDER.index(target) <= ORDER.index(layer), (
            f"planner.{name} ({layer}) imports {module} ({target}), a layer above it"
        )
    if layer in TORCH_FREE or name in TORCH_FREE_MODULES:
        run_time = set().union(*(_runtime_imports(path) for path in _sources(name)))
        torch_imports = sorted(m for m in run_time if m == "torch" or m.startswith("torch."))
        assert not torch_imports, f"planner.{name} ({layer}) must not import {torch_imports}"


def test_the_layer_check_sees_a_violation(tmp_path: Path) -> None:
    """The scan finds imports in function bodies, and annotation-only ones for the
    direction (not for torch)."""
    source = tmp_path / "module.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from planner.check.compare import PlanCheck\n"
        "def f():\n    import torch\n    from planner import apply\n"
    )
    assert _runtime_imports(source) >= {"torch", "planner", "planner.apply"}
    assert "planner.check.compare" not in _runtime_imports(source)
    assert "planner.check.compare" in _imports(source)


def test_the_cli_is_commands_over_options_rendering_and_the_boundary() -> None:
    """``planner.cli.main`` holds the commands; ``options`` and ``render`` sit on
    ``boundary`` (consoles, exit codes, errors), which imports no other cli module."""
    allowed = {
        "boundary": set(),
        "options": {"planner.cli.boundary"},
        "render": {"planner.cli.boundary"},
        "main": {"planner.cli.boundary", "planner.cli.options", "planner.cli.render"},
    }
    for name, may_import in allowed.items():
        path = ROOT / "cli" / f"{name}.py"
        imports = _runtime_imports(path)
        assert not any(module == "cli" or module.startswith("cli.") for module in imports)
        # Within the app, imports are relative (cli/ is installed as planner.cli).
        relative = {
            f"planner.cli.{node.module}"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        }
        used = {module for module in imports | relative if module.startswith("planner.cli")}
        assert used <= may_import, (name, used - may_import)


def test_every_package_of_planner_and_cli_is_in_the_distribution() -> None:
    """The wheel holds one top-level package, planner: pyproject lists every package on
    disk, and cli/ is installed as planner.cli (package-dir), never as a top-level cli."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = config["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    assert setuptools["package-dir"] == {"planner": "planner", "planner.cli": "cli"}
    on_disk = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "planner").rglob("__init__.py")
    } | {
        "planner." + ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "cli").rglob("__init__.py")
    }
    assert listed == on_disk, (sorted(on_disk - listed), sorted(listed - on_disk))
    assert {name.split(".")[0] for name in listed} == {"planner"}
    script = config["project"]["scripts"]["ckpt-plan"]
    assert script.startswith("planner.cli.")
