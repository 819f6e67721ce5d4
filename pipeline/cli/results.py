"""``python -m pipeline report <run>`` and ``compare <run-a> <run-b>``, and the headline a run ends with.

Neither command starts a database or an executor: they read a run's provenance, its points' manifests,
raw query files and ``results.parquet`` (:mod:`pipeline.runs`, :mod:`pipeline.rerender`,
:mod:`pipeline.compare`, :mod:`pipeline.headline`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from core.errors import PipelineError, os_message
from pipeline.cli.output import console, out, warn
from pipeline.cli.output import error as _error
from pipeline.cli.output import fail as _fail

RunArg = Annotated[str, typer.Argument(help="A run id (looked up under <workdir>/runs) or a run directory")]
WorkdirOption = Annotated[
    Path | None,
    typer.Option(help="Workdir whose runs/ holds the run ids (default: $PIPELINE_WORKDIR, else .)"),
]


def _guarded(action) -> None:
    """Run ``action``; a known failure ends the command with one line (no traceback)."""
    import pyarrow as pa

    try:
        action()
    except PipelineError as exc:
        _fail(exc)
    except OSError as exc:
        _error(os_message(exc), 1)
    except (pa.ArrowException, ValueError) as exc:  # an unreadable raw or results file
        from core.errors import describe

        _error(describe(exc), 1)


def report(run: RunArg, workdir: WorkdirOption = None) -> None:
    """Rewrite a run's report (results.parquet, report.md, figures) from its raw results; no database runs."""
    from pipeline.headline import print_headline
    from pipeline.rerender import rerender
    from pipeline.runs import find_run

    def action() -> None:
        record = find_run(run, workdir)
        written = rerender(record)
        console.print(
            f"rewrote the report of [bold]{record.run_id}[/] from {len(record.points)} point(s) "
            f"({written['rows']} result rows) in {written['report'].parent}",
            highlight=False,
            soft_wrap=True,
        )
        print_headline(out, written["results"], written["report"], record.run_id)

    _guarded(action)


def compare(run_a: RunArg, run_b: RunArg, workdir: WorkdirOption = None) -> None:
    """Two runs side by side: each database's headline figures, the ratio b/a, and config differences."""
    from pipeline.compare import print_comparison
    from pipeline.runs import find_run

    def action() -> None:
        a, b = find_run(run_a, workdir), find_run(run_b, workdir)
        a.vdb, b.vdb  # noqa: B018 - a run without a vdb stage: its error
        print_comparison(out, a, b)

    _guarded(action)


def run_headline(run_dir: Path) -> None:
    """After ``run``: the headline table and the report's path (nothing for a run without databases)."""
    from pipeline.headline import print_headline
    from pipeline.runs import find_run

    try:
        record = find_run(str(run_dir))
        if "vdb" not in record.stages:
            return
        directory = record.report_dir
        print_headline(out, directory / "results.parquet", directory / "report.md", record.run_id)
    except (PipelineError, OSError, ValueError) as exc:  # the run itself succeeded: say why, exit 0
        warn(f"no headline table: {exc}")
