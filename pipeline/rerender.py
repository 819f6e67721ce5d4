"""``python -m pipeline report <run>``: the report of a run rewritten from its raw results.

The outcomes (:class:`apps.vdb.records.DatabaseOutcome`) are read back from the manifests of the points
the run used; the metrics are computed again from the raw query files and the exact ground truth by the
report stage's own code (:func:`pipeline.report_stage.write_benchmark_report`), so a corrected metric
reaches an old run without starting a database. The new files are rendered into a temporary directory
beside ``<vdb stage dir>/report`` and each is then renamed over its old version: a failure leaves the
old report as it was, and a reader never sees a half-written file. Figures the new render does not draw
are removed, so the directory holds the report's figures only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from apps.vdb.records import DatabaseOutcome
from apps.vdb.stages.query_raw import requests_path
from core.errors import ArtifactError
from core.store import atomic_write_json, read_manifest
from pipeline.provenance import PROVENANCE
from pipeline.report_stage import write_benchmark_report
from pipeline.runs import ProvenanceRecord, RunRecord
from pipeline.sweep import point_damage


def read_outcomes(run: RunRecord) -> list[DatabaseOutcome]:
    """Every outcome the run's report rests on, in run order; an error names what is missing."""
    run.vdb  # noqa: B018 - raises for a run without a vdb stage
    if not run.points:
        raise ArtifactError(
            f"run {run.run_id}: no point of its vdb stage finished ({run.vdb.directory}); nothing to report"
        )
    for point in run.points:  # a raw file cut short or lost since: named as `plan` names it
        if point.status == "succeeded" and (damage := point_damage(point.directory, point.key)):
            raise ArtifactError(
                f"run {run.run_id}: point {point.label} (repeat {point.repeat}): {damage[0]}; "
                "`python -m pipeline run` with the run's config measures that point again"
            )
    outcomes = [run.outcome(point) for point in run.points]
    check_inputs(run, outcomes)
    return outcomes


def check_inputs(run: RunRecord, outcomes: list[DatabaseOutcome]) -> None:
    """Every file the metrics are computed from is there: raw query files, queries, ground truth, dataset."""
    needed: list[tuple[Path, str]] = []
    for stage, name in (("queries", "queries.parquet"), ("groundtruth", "groundtruth.parquet")):
        if stage not in run.stages:
            raise ArtifactError(f"run {run.run_id}: its provenance records no {stage} stage")
        needed.append((run.stage(stage).directory / name, f"the {stage} stage's output"))
    if "embed" not in run.stages:
        raise ArtifactError(f"run {run.run_id}: its provenance records no embed stage")
    dataset = run.stage("embed").directory
    needed.append((dataset / "manifest.json", "the dataset's manifest"))
    for outcome in outcomes:
        for query in outcome.queries:
            raw = Path(query.file)
            needed.append((raw, f"raw query results of {outcome.label or outcome.database} {query.setting}"))
            if query.window_s is not None:  # written with timed windows: its requests file too
                needed.append((requests_path(raw), f"requests of {outcome.label} {query.setting}"))
    missing = [(path, what) for path, what in needed if not path.is_file()]
    if missing:
        path, what = missing[0]
        more = f" (and {len(missing) - 1} more missing file(s))" if len(missing) > 1 else ""
        raise ArtifactError(
            f"run {run.run_id}: raw file {path} is missing ({what}){more}; `python -m pipeline run` with "
            "the run's config measures that point again"
        )


def refuse_a_partial_view(run: RunRecord) -> None:
    """Refuse to rewrite a complete vdb stage's report from a run that holds only some of its points.

    The report lives in the stage directory, which every run of the same content key shares: a run
    stopped after one point, reported after a later run completed the stage, would otherwise replace
    the whole stage's report (and what ``compare`` and the headline read) with its one point.
    """
    manifest = read_manifest(run.vdb.directory)
    if manifest is None:  # the stage is not complete: its report is whichever run's reached furthest
        return
    complete = {(p.get("key"), p.get("repeat")) for p in manifest.get("points") or []}
    missing = complete - {(p.key, p.repeat) for p in run.points}
    if not missing:
        return
    owner = _run_that_completed(run)
    which = f"run {owner}" if owner else "the run that completed it"
    raise ArtifactError(
        f"run {run.run_id} holds {len(complete) - len(missing)} of the {len(complete)} points of its vdb "
        f"stage, which a later run completed: the stage's report ({run.report_dir}) is of all "
        f"{len(complete)}, and is not replaced by a part; `python -m pipeline report "
        f"{owner or '<run id>'}` rewrites it from {which}"
    )


def _run_that_completed(run: RunRecord) -> str | None:
    """A succeeded run (the last by name in ``run``'s runs folder) whose vdb stage is ``run``'s, or None."""
    for path in sorted(run.run_dir.parent.glob(f"*/{PROVENANCE}"), reverse=True):
        try:
            record = ProvenanceRecord.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):  # another run's damaged record: not this question's
            continue
        vdb = record.stages.get("vdb")
        if record.status == "succeeded" and vdb is not None and Path(vdb.directory) == run.vdb.directory:
            return record.run_id or path.parent.name
    return None


def rerender(run: RunRecord) -> dict[str, Any]:
    """Rewrite ``results.parquet``, ``report.md`` and the figures of ``run``; returns the written files.

    Returns ``{"report": Path, "results": Path, "rows": int, "files": [...]}``. The vdb stage's manifest,
    when the stage is complete, is updated to list the new files (so the stage still verifies). A run that
    holds only part of a complete stage is refused (:func:`refuse_a_partial_view`).
    """
    refuse_a_partial_view(run)
    outcomes = read_outcomes(run)
    report_dir = run.report_dir
    report_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = report_dir.parent / f".report-rerender-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        written = write_benchmark_report(run, outcomes, scratch, run.run_id)  # type: ignore[arg-type]
        report_dir.mkdir(exist_ok=True)
        # results.parquet last but one, report.md last: whoever reads report.md finds its figures.
        names = sorted(p.name for p in scratch.iterdir() if p.is_file())
        names.sort(key=lambda n: (n == "report.md", n == "results.parquet"))
        for name in names:
            os.replace(scratch / name, report_dir / name)
        for stale in report_dir.glob("*.png"):  # a figure this render no longer draws must not linger
            if stale.name not in names:
                stale.unlink()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    manifest = read_manifest(run.vdb.directory)
    if manifest is not None:
        manifest["files"] = written["files"]
        atomic_write_json(run.vdb.directory / "manifest.json", manifest)
    return {
        "report": report_dir / "report.md",
        "results": report_dir / "results.parquet",
        "rows": written["rows"],
        "files": written["files"],
    }
