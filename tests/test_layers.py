"""The layers read bottom-up, no import goes round in a cycle, and no module is too long to read.

Layers: ``core`` <- ``executors`` <- ``apps`` <- ``pipeline``, and inside ``apps`` one package per concern:
``taskinfo`` <- ``dataset`` <- ``interchange`` and ``vdb`` (siblings; ``vdb`` also imports ``telemetry`` and
``executors``) <- ``evaluate`` <- ``report``. Every import counts, including those inside functions (a
lazy import is still an arrow in the graph).
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.conftest import REPO

TOP_LEVEL = ("core", "executors", "apps", "pipeline")
# Each unit and the units directly below it; a unit may import itself and everything below, transitively.
BELOW: dict[str, tuple[str, ...]] = {
    "core": (),
    "executors": ("core",),
    "apps.taskinfo": ("core",),
    "apps.telemetry": ("core",),
    "apps.dataset": ("apps.taskinfo",),
    "apps.interchange": ("apps.dataset",),
    "apps.vdb": ("executors", "apps.telemetry", "apps.dataset"),
    "apps.evaluate": ("apps.vdb",),
    "apps.report": ("apps.evaluate",),
    "pipeline": ("apps.report", "apps.interchange"),
}
OURS = {*TOP_LEVEL, "benchmarks", "tests"}
WARN_LINES = 700  # a module this long is worth a look: does it do one job?
MAX_LINES = 1000  # refused: split it by job

GENERATED = REPO / "benchmarks" / "out"  # benchmark outputs (gitignored), e.g. the VectorDBBench venv


def allowed(unit: str) -> set[str]:
    """``unit`` and every unit below it."""
    seen = {unit}
    todo = list(BELOW[unit])
    while todo:
        lower = todo.pop()
        if lower not in seen:
            seen.add(lower)
            todo.extend(BELOW[lower])
    return seen


def modules(*packages: str) -> list[Path]:
    found = (p for package in packages for p in (REPO / package).rglob("*.py"))
    return sorted(p for p in found if not p.is_relative_to(GENERATED))


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The layer unit of a dotted module name: ``apps.<package>`` inside apps, else its top-level package."""
    parts = module.split(".")
    return f"apps.{parts[1]}" if parts[0] == "apps" and len(parts) > 1 else parts[0]


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in ``path`` (``module``), nested and relative ones included; for
    ``from a.b import c`` both ``a.b`` and ``a.b.c`` (c may be a module or a name)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}".rstrip(".")
            if base:
                found.append((node.lineno, base))
                found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return found


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``path``, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (a ``from`` import of a name counts as its module)."""
    paths = {module_name(p, root): p for package in packages for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets = set()
        for _, name in imported_modules(path, module):
            while name and name not in paths:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def violations(unit: str) -> list[str]:
    ok = allowed(unit)
    found = []
    for path in modules(*TOP_LEVEL):
        module = module_name(path)
        if unit_of(module) != unit:
            continue
        for line, name in imported_modules(path, module):
            top = name.split(".")[0]
            if top in OURS and (top not in TOP_LEVEL or unit_of(name) not in ok):
                found.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    return sorted(set(found))


@pytest.mark.parametrize("unit", list(BELOW))
def test_layer_imports_only_lower_layers(unit: str) -> None:
    assert violations(unit) == []


def test_only_the_commands_import_the_cli() -> None:
    """``pipeline.cli`` is the top: the workflow, the DAG and the stages under it take a console, they do
    not reach up for the command line's (a Globus Compute task runs them with no command line)."""
    found = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in modules("pipeline")
        if not (module := module_name(path)).startswith(("pipeline.cli", "pipeline.__main__"))
        for line, name in imported_modules(path, module)
        if name == "pipeline.cli" or name.startswith("pipeline.cli.")
    ]
    assert found == []


def test_every_module_belongs_to_a_declared_layer() -> None:
    """A new package under apps/ must say where it sits (a line in BELOW), not slip in unchecked."""
    units = {unit_of(module_name(path)) for path in modules(*TOP_LEVEL)} - {"apps"}
    assert units <= set(BELOW)


def test_a_violation_is_found(tmp_path: Path) -> None:
    """The checker sees imports inside functions too."""
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from pipeline.plan import Plan\n")
    assert imported_packages(path) == [(2, "pipeline")]
    assert imported_modules(path, "apps.report.m") == [(2, "pipeline.plan"), (2, "pipeline.plan.Plan")]


def test_no_import_cycle() -> None:
    assert cycles(import_graph(REPO, (*TOP_LEVEL, "benchmarks"))) == []


def lazy_targets(path: Path) -> list[str]:
    """The modules named by ``Lazy("module:attr")`` in ``path``: a database declaration's deferred imports."""
    return [
        node.args[0].value.split(":")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "Lazy"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ]


def test_a_database_declaration_points_only_into_its_own_folder() -> None:
    """The registry's deferred imports (``Lazy`` paths) escape the import graph above, so they are held to
    their own folder: a declaration cannot reach upward or into another database."""
    declarations = sorted((REPO / "apps" / "vdb").glob("*/__init__.py"))
    outside = {
        str(path.relative_to(REPO)): target
        for path in declarations
        for target in lazy_targets(path)
        if not target.startswith(f"apps.vdb.{path.parent.name}.")
    }
    found = [target for path in declarations for target in lazy_targets(path)]
    assert len(found) >= 12 and outside == {}


def test_a_cycle_is_found_even_through_a_lazy_import(tmp_path: Path) -> None:
    package = tmp_path / "apps"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from apps.b import g\n")
    (package / "b.py").write_text("def g():\n    from apps import c\n")
    (package / "c.py").write_text("from . import a\n")
    (package / "d.py").write_text("from apps.a import g\n")  # imports into the cycle, not part of it
    assert cycles(import_graph(tmp_path, ["apps"])) == [["apps.a", "apps.b", "apps.c"]]


def test_module_sizes() -> None:
    """Modules are sized by their job: above WARN_LINES a warning names them, above MAX_LINES they fail."""
    sizes = {
        str(path.relative_to(REPO)): len(path.read_text().splitlines())
        for path in modules(*TOP_LEVEL, "benchmarks")
    }
    for name, n in sorted(sizes.items()):
        if WARN_LINES < n <= MAX_LINES:
            warnings.warn(f"{name}: {n} lines (above {WARN_LINES}): does it do one job?", stacklevel=1)
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
