"""The report stage: raw measurements of every database -> results.parquet, report.md and plots.

Metrics are computed here, from the raw query files and the exact ground truth (distances recomputed
from the vectors), never inside the measuring tasks: a metric can be corrected and the report rewritten
without running a database again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from apps.dataset.geometry.stage import load_record
from apps.dataset.groundtruth.checkpoints import prefix_groundtruth_file
from apps.dataset.lookup import fetch_vectors
from apps.evaluate.metrics import base_ids_for, evaluate_files
from apps.evaluate.mixed import mixed_rows
from apps.evaluate.results import write_results
from apps.report.document import write_report
from apps.report.mixed import mixed_figure
from apps.vdb.records import DatabaseOutcome
from apps.vdb.stages.query_io import io_columns, read_window
from core.errors import ArtifactError
from core.format import num
from core.store import file_entry, read_manifest
from pipeline.plan import Plan
from pipeline.plan_model import synthetic_like, synthetic_note


def point_columns(outcome: DatabaseOutcome) -> dict[str, Any]:
    """The columns naming an outcome's sweep point on every row it gives."""
    return {
        "database": outcome.database,
        "label": outcome.label,
        "repeat": outcome.repeat,
        "point": outcome.key,
        "sweep": dict(outcome.params),
        "server_version": outcome.server_version or None,
    }


def point_groundtruth(plan: Plan, outcome: DatabaseOutcome, directory: Path | None) -> Path:
    """The ground truth a point's recall is scored against: the run's, or, for a point that loaded only
    the first N rows (``vdb.insert.rows``), the exact top-k of those rows, cached in its ``directory``."""
    full = plan.stage("groundtruth").directory / "groundtruth.parquet"
    loaded = outcome.insert[-1].rows if outcome.insert else None
    dataset_dir = plan.stage("embed").directory
    if loaded is None or loaded >= read_manifest(dataset_dir)["rows"]:
        return full
    if directory is None:
        raise ValueError(f"{outcome.label or outcome.database}: loaded {loaded} rows but has no directory")
    return prefix_groundtruth_file(
        directory,
        dataset_dir,
        plan.stage("queries").directory / "queries.parquet",
        loaded,
        pq.read_schema(full).field("neighbors").type.list_size,
        plan.config.groundtruth.metric,
        plan.config.groundtruth.memory_budget_mb,
    )


def database_rows(outcome: DatabaseOutcome) -> list[dict[str, Any]]:
    """The deploy, insert and index rows of one point (its query rows come from the raw files)."""
    common = point_columns(outcome)
    if outcome.status != "succeeded":
        return [{**common, "stage": "deploy", "status": outcome.status, "error": outcome.reason}]
    params = json.dumps(
        {
            "collection": outcome.collection.model_dump(mode="json"),
            "settings": outcome.settings.model_dump(mode="json"),
        },
        sort_keys=True,
    )
    rows = [{**common, "stage": "deploy", "status": "ok", "deploy_s": outcome.deploy_s, "params": params}]
    for insert in outcome.insert:
        rows.append(
            {
                **common,
                "stage": "insert",
                "status": "ok",
                "setting": insert.setting,
                "vectors": insert.rows,
                "upload_s": insert.upload_s,
                "searchable_s": insert.searchable_s,
                "insert_vectors_per_s": insert.insert_vectors_per_s,
                "batch_size": insert.batch_size,
                "request_size": insert.request_size,
                "clients": insert.clients,
                "workers": insert.workers,
            }
        )
    if outcome.index is not None:
        index = outcome.index
        rows.append(
            {
                **common,
                "stage": "index",
                "status": "ok",
                "index_s": index.index_s,
                "segments": index.segments,
                "disk_bytes": index.disk_bytes,
                "write_amplification": index.write_amplification,
                "index_bytes": index.index_bytes,
                "data_bytes": index.data_bytes,
                "vectors": index.count,
                "params": params,
            }
        )
    return rows


def result_rows(plan: Plan, outcomes: list[DatabaseOutcome], run_id: str) -> list[dict[str, Any]]:
    """One row per point x stage x setting, with the provenance keys on every row."""
    keys = {
        "dataset_key": plan.stage("embed").key,
        "queries_key": plan.stage("queries").key,
        "groundtruth_key": plan.stage("groundtruth").key,
        "run_id": run_id,
    }
    rows = [{**row, **keys} for outcome in outcomes for row in database_rows(outcome)]
    points = getattr(plan, "points", None) or [None] * len(outcomes)
    scored = []  # (outcome, its raw files, the ground truth they are scored against)
    for point, outcome in zip(points, outcomes, strict=True):
        raw_files = [q.file for q in outcome.queries]
        if raw_files:
            truth = point_groundtruth(plan, outcome, point.directory if point is not None else None)
            scored.append((outcome, raw_files, truth))
    # One pass over the dataset for every point's vectors: a pass per point read the dataset once per
    # point (on Polaris, 36 points x 0.9 TB of Pes2o-VE).
    dataset_dir = plan.stage("embed").directory
    wanted = [base_ids_for(raw_files, truth) for _, raw_files, truth in scored]
    base = fetch_vectors(dataset_dir, np.concatenate(wanted)) if wanted else None
    for outcome, raw_files, truth in scored:  # each point's raw files alone
        evaluated = evaluate_files(
            raw_files,
            truth,
            plan.stage("queries").directory / "queries.parquet",
            dataset_dir,
            plan.config.groundtruth.metric,
            base,
        )
        windows = {q.setting: read_window(q.file) for q in outcome.queries}
        rows.extend(
            {**row, **keys, **point_columns(outcome), **io_columns(row, windows.get(row["setting"]))}
            for row in evaluated
        )
    for outcome in outcomes:  # the mixed insert + query workload (vdb.mixed)
        if outcome.mixed is not None:
            mixed = mixed_rows(
                outcome.mixed,
                plan.stage("embed").directory,
                plan.stage("queries").directory / "queries.parquet",
                plan.config.groundtruth.metric,
            )
            rows.extend({**row, **keys, **point_columns(outcome)} for row in mixed)
    return rows


def dataset_line(plan: Plan) -> str:
    """The report's line naming the dataset its figures rest on: name, size, metric, where it came from,
    and SYNTHETIC when it is. Read from the dataset's manifest and the config, as a re-render has them
    (:class:`pipeline.runs.RunRecord` stands in for the plan)."""
    cfg, dataset = plan.config, plan.stage("embed")
    try:
        manifest = read_manifest(dataset.directory) or {}
    except ArtifactError:  # one line of the report: a damaged manifest is named where it is read for data
        manifest = {}
    if cfg.dataset.imported is not None:
        origin = "imported (dataset.imported)"
    elif cfg.dataset.stored is not None:
        origin = "stored"
    else:
        origin = f"embedded by {cfg.embedding.model_id or cfg.embedding.model}"
    rows, dimension = num(manifest.get("rows")), num(manifest.get("dimension"))
    line = (
        f"Dataset: `{cfg.dataset.name}`, {rows} vectors × {dimension}, metric {cfg.groundtruth.metric}, "
        f"{origin} (`{dataset.directory.name}`, content key `{dataset.key}`)."
    )
    note = synthetic_note(synthetic_like(manifest))
    return f"{line} **{note}**" if note else line


def write_benchmark_report(
    plan: Plan, outcomes: list[DatabaseOutcome], out_dir: Path, run_id: str
) -> dict[str, Any]:
    """Write results.parquet and report.md (+ PNG plots) into ``out_dir``; return the written files."""
    rows = result_rows(plan, outcomes, run_id)
    results = write_results(rows, out_dir / "results.parquet")
    geometry = load_record(plan.stage("geometry").directory) if "geometry" in plan.stages else None
    mixed: dict[str, Path] = {}  # latency over time while inserting, one figure per point with the phase
    for point, outcome in zip(plan.points, outcomes, strict=True):
        if outcome.mixed is not None:
            title = f"{outcome.label or outcome.database}: mixed insert + query ({outcome.mixed.setting})"
            drawn = mixed_figure(outcome.mixed, title, out_dir / f"mixed-{point.link}.png")
            if drawn is not None:  # captioned by the point's link: its label and repeat
                mixed[f"{point.link}: mixed insert + query ({outcome.mixed.setting})"] = drawn
    written = write_report(
        out_dir / "results.parquet",
        out_dir,
        title=f"Vector database benchmark: {plan.config.name}",
        dataset=dataset_line(plan),
        # Each point's samples, named by its link (a slug of its label): a file-name-safe figure name.
        telemetry={p.link: p.directory / "telemetry.parquet" for p in plan.points},
        geometry=geometry,
        mixed_figures=mixed,
    )
    files = [{"file": "report/results.parquet", **results}]
    for path in [written["report"], *written["figures"].values(), *mixed.values()]:
        files.append(file_entry(Path(path), f"report/{Path(path).name}"))  # the manifest is beside report/
    return {"files": files, "report": str(written["report"]), "rows": len(rows)}
