"""A run's ground truth for a dataset that brought its own: the published lists when they serve, else exact.

The published neighbours serve when they hold at least the run's k per query, were measured with the run's
metric, and agreed with the project's exact search at import (up to ties, :mod:`apps.interchange.importer`).
They are cut to k and written as the ground-truth stage writes its own, so every later stage reads one
layout. Otherwise the exact top-k is computed (:func:`apps.dataset.groundtruth.stage.compute_groundtruth`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from apps.dataset.groundtruth.stage import STAGE_VERSION, GroundTruthConfig, compute_groundtruth
from apps.taskinfo import task_context
from core.errors import ArtifactError
from core.store import atomic_write_json, complete_manifest, read_manifest, write_parquet_atomic


def too_few_neighbours(held: int, k: int) -> str | None:
    """Why published lists of ``held`` neighbours per query cannot serve a run asking ``k``; None when
    they can."""
    return f"it holds {held} neighbours per query, the run asks {k}" if held < k else None


def unusable_reason(dataset: dict[str, Any], groundtruth: GroundTruthConfig) -> str | None:
    """Why a dataset's published ground truth cannot serve as the run's; None when it can."""
    published = dataset.get("groundtruth")
    if not published:
        return "the dataset has no published ground truth"
    if published.get("metric") != groundtruth.metric:
        return f"it was measured with metric {published.get('metric')}, the run asks {groundtruth.metric}"
    if (short := too_few_neighbours(published["k"], groundtruth.k)) is not None:
        return short
    if published.get("exact"):  # computed here by exact search (a synthetic dataset)
        return None
    check = (dataset.get("import") or {}).get("groundtruth_check") or {}
    if check.get("disagree", 1):
        return f"it disagreed with exact search at import on {check.get('disagree', '?')} queries"
    return None


def _first_k(column: pa.ChunkedArray, k: int) -> pa.FixedSizeListArray:
    """The first ``k`` entries of each fixed-size list in ``column``."""
    lists = column.combine_chunks()
    width = lists.type.list_size
    values = lists.flatten().to_numpy(zero_copy_only=False).reshape(len(lists), width)[:, :k]
    return pa.FixedSizeListArray.from_arrays(pa.array(values.ravel(), lists.type.value_type), k)


def run_groundtruth(
    out_dir: str, dataset_dir: str, queries_file: str, groundtruth: GroundTruthConfig
) -> dict[str, Any]:
    """Write ``out_dir/groundtruth.parquet`` from the dataset's published lists or by exact search."""
    out = Path(out_dir)
    if (done := complete_manifest(out)) is not None:
        return {**done, "cached": True}
    dataset = read_manifest(Path(dataset_dir))
    if dataset is None:
        raise ArtifactError(f"{dataset_dir}: dataset is not complete (no manifest.json)")
    reason = unusable_reason(dataset, groundtruth)
    if reason is not None:
        manifest = {
            **compute_groundtruth(out_dir, dataset_dir, queries_file, groundtruth),
            "source": "exact",
            "published_unused": reason,
        }
        atomic_write_json(out / "manifest.json", manifest)  # says why the published lists were not used
        return manifest
    started = time.time()
    table = pq.read_table(Path(dataset_dir) / dataset["groundtruth"]["file"])
    k = groundtruth.k
    cut = pa.table(
        {
            "query_id": table.column("query_id"),
            "neighbors": _first_k(table.column("neighbors"), k),
            "distances": _first_k(table.column("distances"), k),
        }
    )
    written = write_parquet_atomic(cut, out / "groundtruth.parquet", row_group_rows=4096)
    check = (dataset.get("import") or {}).get("groundtruth_check") or {}
    manifest = {
        "stage": "groundtruth",
        "version": STAGE_VERSION,
        "source": "published",
        "k": k,
        "k_requested": k,
        "metric": groundtruth.metric,
        "published_k": dataset["groundtruth"]["k"],
        "agreed_at_import": {
            key: check[key] for key in ("queries", "identical", "agree_up_to_ties") if key in check
        },
        "queries": cut.num_rows,
        "base_rows": dataset["rows"],
        "warnings": [],
        "files": [{"file": "groundtruth.parquet", **written}],
        **task_context(started),
    }
    atomic_write_json(out / "manifest.json", manifest)
    return manifest
