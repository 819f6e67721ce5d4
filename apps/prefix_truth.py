"""Ground truth of a prefix of the dataset, for a point that loaded only its first rows (``vdb.insert.rows``).

A point with ``insert.rows: N`` holds rows ``[0, N)`` of the dataset in its row order, so its recall is
scored against the exact top-k of those rows, not the whole dataset's ground truth. The exact search is
the ground-truth stage's own (:func:`apps.mixed_truth.checkpoint_truth` with one checkpoint at ``N``: the
FAISS exact search, ties by position); the result is written in ``groundtruth.parquet``'s layout
(``query_id``, ``neighbors``, ``distances``) so :func:`apps.vdb_metrics.evaluate_files` takes it
unchanged, and cached in the point's directory (its key covers the dataset, queries and ground truth).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from apps import exact_distance
from apps.mixed_truth import checkpoint_truth
from apps.recall import read_query_vectors
from core.store import write_parquet_atomic

PREFIX_TRUTH_FILE = "groundtruth-prefix.parquet"
_META_KEY = b"prefix_truth"


def loaded_rows(dataset_rows: int, requested: int | None) -> int:
    """The rows a point loads: ``requested`` (``vdb.insert.rows``), or every row when None.

    Raises ValueError naming ``vdb.insert.rows`` when it is not positive or exceeds the dataset.
    """
    if requested is None:
        return dataset_rows
    if requested < 1:
        raise ValueError(f"vdb.insert.rows must be at least 1, got {requested}")
    if requested > dataset_rows:
        raise ValueError(f"vdb.insert.rows = {requested} exceeds the dataset's {dataset_rows} rows")
    return requested


def prefix_groundtruth(
    dataset_dir: str | Path,
    queries_file: str | Path,
    rows: int,
    k: int,
    metric: str,
    memory_budget_mb: int = 512,
) -> pa.Table:
    """Exact top-``min(k, rows)`` of every query over rows ``[0, rows)``, in ``groundtruth.parquet``'s
    layout (``query_id``, ``neighbors``, ``distances``)."""
    queries = read_query_vectors(queries_file)
    k = min(k, rows)
    truth = checkpoint_truth(dataset_dir, queries.ids, queries.vectors, [rows], k, metric, memory_budget_mb)
    neighbors = truth.column("neighbors").combine_chunks().flatten()
    distances = truth.column("distances").combine_chunks().flatten()
    return pa.table(
        {
            "query_id": truth.column("query_id"),
            "neighbors": pa.FixedSizeListArray.from_arrays(neighbors.cast(pa.int64()), k),
            "distances": pa.FixedSizeListArray.from_arrays(distances.cast(pa.float32()), k),
        }
    )


def _cached(path: Path, tag: str) -> bool:
    try:
        return (pq.read_schema(path).metadata or {}).get(_META_KEY) == tag.encode()
    except (FileNotFoundError, OSError, pa.ArrowInvalid):
        return False


def prefix_groundtruth_file(
    directory: str | Path,
    dataset_dir: str | Path,
    queries_file: str | Path,
    rows: int,
    k: int,
    metric: str,
    memory_budget_mb: int = 512,
) -> Path:
    """``<directory>/groundtruth-prefix.parquet`` for ``rows``, ``k`` and ``metric``: computed once, written
    atomically, reused while it was made for the same prefix, k, metric and exact arithmetic."""
    path = Path(directory) / PREFIX_TRUTH_FILE
    tag = f"rows={rows};k={k};metric={metric};exact={exact_distance.VERSION}"
    if not _cached(path, tag):
        table = prefix_groundtruth(dataset_dir, queries_file, rows, k, metric, memory_budget_mb)
        write_parquet_atomic(table, path, metadata={_META_KEY.decode(): tag})
    return path
