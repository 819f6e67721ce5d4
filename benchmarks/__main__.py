"""Run every benchmark in ``benchmarks/`` (each as a subprocess) and print a summary.

A benchmark is any subpackage ``benchmarks/<name>/`` with a ``__main__.py`` (``common/``, the shared
helpers, has none), found here rather than listed, and run as ``python -m benchmarks.<name>``. Each writes
its raw numbers to ``benchmarks/out/<name>.json`` and prints its own report; this script streams that
output, then summarises from the JSON files (ratio, target, met) and the exit codes. Each runs with
its defaults; to tune one, run it alone (``--help`` lists its options).

    .venv/bin/python -m benchmarks                      # what `make bench` runs
    .venv/bin/python -m benchmarks --only embed memory
    .venv/bin/python -m benchmarks --skip ingest

``peer_vectordbbench`` installs VectorDBBench into its own venv under ``benchmarks/out/`` on its first run
(about a minute, from PyPI) and reuses it afterwards.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"


def discover() -> list[str]:
    """Names of the benchmark packages next to this file (subpackages with a ``__main__.py``), sorted."""
    return sorted(p.parent.name for p in HERE.glob("*/__main__.py") if (p.parent / "__init__.py").is_file())


def run(name: str) -> dict[str, Any]:
    """Run ``python -m benchmarks.<name>``, streaming its output; return exit code, time and its JSON."""
    out = OUT / f"{name}.json"
    before = out.stat().st_mtime if out.exists() else None
    print(f"\n{'=' * 30} {name} {'=' * (80 - len(name))}", flush=True)
    started = time.monotonic()
    code = subprocess.call([sys.executable, "-m", f"{__package__}.{name}"], cwd=HERE.parent)
    seconds = time.monotonic() - started
    fresh = out.exists() and out.stat().st_mtime != before
    return {
        "name": name,
        "exit": code,
        "seconds": seconds,
        "result": json.loads(out.read_text()) if fresh else None,
    }


def headline(result: dict[str, Any]) -> tuple[float | None, bool | None, int]:
    """(worst ratio, met, number of ratios) from a benchmark's JSON.

    Either a top-level ``ratio`` (or ``worst_ratio``) and ``met``, or a ``summary`` list of rows that
    each carry ``ratio`` and ``met`` (one per database and setting); the worst row is the headline.
    """
    ratio = result.get("ratio", result.get("worst_ratio"))
    if isinstance(ratio, int | float):
        return float(ratio), result.get("met"), 1
    rows = [r for r in result.get("summary", []) if isinstance(r, dict) and "ratio" in r]
    if not rows:
        return None, result.get("met"), 0
    mets = [r.get("met") for r in rows]
    met = None if None in mets else all(mets)
    worst = max if result.get("target_sense") == "<=" else min
    return float(worst(r["ratio"] for r in rows)), met, len(rows)


def summary_line(entry: dict[str, Any]) -> str:
    """One line per benchmark: its headline ratio against its target, from its JSON."""
    result = entry["result"]
    head = f"{entry['name']:<14} {entry['seconds']:6.0f} s  "
    if entry["exit"] != 0 or result is None:
        return head + f"FAILED (exit {entry['exit']}; no fresh {entry['name']}.json)"
    ratio, met, count = headline(result)
    sense = result.get("target_sense", ">=")
    verdict = {True: "MET", False: "NOT MET"}.get(met, "?")
    figure = f"{ratio:.2f}x" if ratio is not None else "n/a"
    worst = f" (worst of {count})" if count > 1 else ""
    return head + f"{figure:>7}{worst}  target {sense} {result.get('target')}x  {verdict}"


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument("--skip", nargs="+", metavar="NAME", default=[], help="leave these out")
    args = parser.parse_args()
    names = [n for n in (args.only or discover()) if n not in args.skip]
    unknown = sorted(set(names) - set(discover()))
    if unknown:
        raise SystemExit(f"no such benchmark: {', '.join(unknown)} (have: {', '.join(discover())})")
    entries = [run(name) for name in names]
    print(f"\n{'=' * 30} summary {'=' * 73}")
    for entry in entries:
        print(summary_line(entry))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(entries, indent=2, default=str) + "\n")
    print(f"raw numbers: {OUT}/<name>.json, summary: {OUT / 'summary.json'}")
    sys.exit(1 if any(e["exit"] != 0 for e in entries) else 0)


if __name__ == "__main__":
    main()
