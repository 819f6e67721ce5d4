"""The headline table a run ends with (and ``report`` and ``compare`` print): per database or sweep point,
the best QPS at recall ≥ 0.95 and its setting, upload time and index time.

The figures are the report's own summary (:func:`apps.report.document.summarize`: each point's repeats folded
into their median, the best operating point chosen by the studies' rule), read from ``results.parquet``; this
module only lays them out for the console.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from apps.evaluate.results import point_name, read_results
from apps.evaluate.rules import MIN_RECALL
from apps.report.document import summarize
from apps.vdb.stages.query_io import disturbed_note
from core.errors import ArtifactError
from core.format import NONE, num

NONE_REACHES = f"none reaches {MIN_RECALL}"


def read_summary(results: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """The report's summary rows of ``results`` (a results.parquet); a missing file is an error naming it."""
    if not results.is_file():
        who = f"run {run_id}: " if run_id else ""
        hint = f" (`python -m pipeline report {run_id}` writes it from the raw files)" if run_id else ""
        raise ArtifactError(f"{who}{results} does not exist{hint}")
    try:
        return summarize(read_results(results))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{results}: not a readable results file ({exc})") from None


def number(value: float | int | None, digits: int = 1) -> str:
    """A figure for the console, always with ``digits`` decimals: ``—`` when absent or not finite."""
    return num(None if value is None else float(value), digits)


def seconds(value: float | None) -> str:
    """A time for the console: three decimals below 1 s, two below 10 s, one above."""
    if value is None or not math.isfinite(value):
        return NONE
    return number(value, 3 if abs(value) < 1 else 2 if abs(value) < 10 else 1)


def ratio(a: float | None, b: float | None) -> str:
    """``b / a`` to two decimals; ``—`` when either is absent or ``a`` is zero."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or a == 0:
        return "—"
    return f"{b / a:.2f}"


def figures(row: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of one summary row (None where there is none)."""
    best, insert, index = row["best"], row["insert"], row["index"]
    return {
        "qps": best["qps"] if best is not None and row["is_best"] else None,
        "recall": best["recall"] if best is not None else None,
        "reached": bool(best is not None and row["is_best"]),
        "setting": best,
        "upload_s": insert["upload_s"] if insert else None,
        "index_s": index["index_s"] if index else None,
        "reason": row["reason"],
    }


def qps_cell(row: dict[str, Any]) -> str:
    """The best QPS at recall ≥ 0.95, ``none reaches 0.95``, or why there is no query figure."""
    fig = figures(row)
    if fig["setting"] is None:
        return fig["reason"] or "no query results"
    return number(fig["qps"]) if fig["reached"] else NONE_REACHES


def setting_cells(best: dict[str, Any] | None) -> list[str]:
    """``ef``, ``batch``, ``clients`` of a query row (``—`` each without one)."""
    if best is None:
        return ["—", "—", "—"]
    return [
        "none" if best["ef"] is None else str(best["ef"]),
        number(best["batch_size"], 0),
        number(best["clients"], 0),
    ]


def headline_table(summary: list[dict[str, Any]], title: str | None = None) -> Table:
    """The headline as a rich Table: one row per database (per sweep point)."""
    table = Table(title=title, title_justify="left")
    width = max((len(row["name"]) for row in summary), default=8)
    table.add_column("database", no_wrap=True, min_width=width)  # a label is never cut
    table.add_column(f"best QPS (recall ≥ {MIN_RECALL})", justify="right")
    table.add_column("recall", justify="right")
    for name in ("ef", "batch", "clients"):
        table.add_column(name, justify="right")
    table.add_column("upload (s)", justify="right")
    table.add_column("index (s)", justify="right")
    for row in summary:
        fig = figures(row)
        table.add_row(
            Text(row["name"]),  # Text: a label's brackets are not markup
            Text(qps_cell(row)),
            number(fig["recall"], 3),
            *setting_cells(fig["setting"]),
            seconds(fig["upload_s"]),
            seconds(fig["index_s"]),
        )
    return table


def print_table(out: Console, table: Table) -> None:
    """Print ``table`` whole: wider than the terminal (or a pipe's 80 columns), it is not squeezed into
    cut-off cells but printed at its natural width (a terminal then wraps the long lines)."""
    needed = Measurement.get(out, out.options.update_width(100_000), table).maximum
    if needed <= out.width:
        out.print(table)
        return
    wide = Console(
        file=out.file,
        width=needed,
        force_terminal=out.is_terminal,
        color_system=out.color_system,  # type: ignore[arg-type]
        no_color=out.no_color,
    )
    wide.print(table)


def print_headline(out: Console, results: Path, report: Path, run_id: str | None = None) -> None:
    """Print the headline table of ``results`` and the report's path."""
    summary = read_summary(results, run_id)
    title = f"Headline{f' of {run_id}' if run_id else ''}: per database, the median over repeats"
    print_table(out, headline_table(summary, title))
    if any(not figures(r)["reached"] and r["best"] is not None for r in summary):
        out.print(
            f"{NONE_REACHES}: the recall column shows the highest recall reached, at its setting.",
            highlight=False,
        )
    best = [r["best"] for r in summary if r["best"] is not None]
    if (note := disturbed_note(best, point_name)) is not None:  # the settings the table shows
        out.print(f"warning: {note}", markup=False, highlight=False, soft_wrap=True)
    out.print(f"report: {report}", markup=False, highlight=False, soft_wrap=True)
