"""The layers read bottom-up: core <- executors <- apps <- pipeline, and no module is too long to read.

Every import counts, including those inside functions (a lazy import is still an arrow in the graph).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

LAYERS = ("core", "executors", "apps", "pipeline")
# What each layer may import of ours (itself included).
ALLOWED = {
    "core": {"core"},
    "executors": {"core", "executors"},
    "apps": {"core", "executors", "apps"},
    "pipeline": {"core", "executors", "apps", "pipeline"},
}
OURS = {*LAYERS, "benchmarks", "tests"}
MAX_LINES = 450


GENERATED = REPO / "benchmarks" / "out"  # benchmark outputs (gitignored), e.g. the VectorDBBench venv


def modules(*packages: str) -> list[Path]:
    found = (p for package in packages for p in (REPO / package).rglob("*.py"))
    return sorted(p for p in found if not p.is_relative_to(GENERATED))


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``path``, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def violations(layer: str) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{line} imports {package}"
        for path in modules(layer)
        for line, package in imported_packages(path)
        if package in OURS and package not in ALLOWED[layer]
    ]


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_imports_only_lower_layers(layer: str) -> None:
    assert violations(layer) == []


def test_a_violation_is_found(tmp_path: Path) -> None:
    """The checker sees imports inside functions too."""
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from pipeline.plan import Plan\n")
    assert imported_packages(path) == [(2, "pipeline")]


def test_no_module_reaches_450_lines() -> None:
    long = {
        str(path.relative_to(REPO)): n
        for path in modules(*LAYERS, "benchmarks")
        if (n := len(path.read_text().splitlines())) >= MAX_LINES
    }
    assert long == {}
