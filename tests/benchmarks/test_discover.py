"""``python -m benchmarks`` finds the benchmarks (every subpackage with a ``__main__.py``), and each one
starts as ``python -m benchmarks.<name>`` from the repository root."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.__main__ import discover, headline
from tests.conftest import REPO

BENCHMARKS = REPO / "benchmarks"


def test_discover_finds_every_benchmark_package_and_only_those() -> None:
    names = discover()
    assert names == [
        "ef_monotonicity",
        "embed",
        "groundtruth",
        "groundtruth_gpu",
        "ingest",
        "memory",
        "peer_vectordbbench",
        "query_harness",
        "scale",
    ]
    assert "common" not in names and "out" not in names
    files = [*BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("*/*.py")]
    helpers = [p for p in files if p.name.startswith("_") and not p.name.startswith("__")]
    assert not helpers, "helpers are modules of a package, not _*.py files"


@pytest.mark.parametrize("name", discover())
def test_each_benchmark_runs_as_a_module(name: str) -> None:
    """``--help`` imports the benchmark's ``__main__`` and its parts: a broken import fails here."""
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m benchmarks.{name} ")


def test_headline_is_the_worst_row_against_the_target() -> None:
    rows = [{"ratio": 1.2, "met": True}, {"ratio": 0.9, "met": False}]
    assert headline({"summary": rows}) == (0.9, False, 2)
    assert headline({"summary": rows, "target_sense": "<="}) == (1.2, False, 2)
    assert headline({"ratio": 1.5, "met": True}) == (1.5, True, 1)
