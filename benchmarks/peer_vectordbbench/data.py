"""The data of ``python -m benchmarks.peer_vectordbbench``: the dataset ``configs/local.yaml`` builds
(:func:`benchmarks.common.vdb.local_dataset`), read back and exported to VectorDBBench's custom-dataset
layout.

:func:`export_vdbbench` writes what VectorDBBench's ``PerformanceCustomDataset`` reads:

* ``train.parquet``: ``id`` (int64, the dataset row id) and ``emb`` (list<float32>), every dataset row;
* ``test.parquet``: ``id`` (int64, the query id) and ``emb``, every query of ``queries.parquet``;
* ``neighbors.parquet``: ``id`` (the query id) and ``neighbors_id`` (list<int64>): the project's exact
  ground truth (``groundtruth.parquet``), nearest first, in query order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from benchmarks.common.vdb import LocalDataset

EXPORT_FILES = ("train.parquet", "test.parquet", "neighbors.parquet")


def read_base(dataset_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ids, float32 vectors) of every dataset row, in dataset order."""
    from apps.dataset.layout import iter_vectors

    parts = list(iter_vectors(dataset_dir))
    return np.concatenate([i for i, _ in parts]), np.concatenate([v for _, v in parts])


def read_groundtruth(groundtruth_file: Path) -> tuple[np.ndarray, np.ndarray]:
    """(query ids, neighbour ids (queries, k)) of a ``groundtruth.parquet``."""
    from apps.interchange.exporter import read_groundtruth as read_with_distances

    query_ids, neighbors, _ = read_with_distances(groundtruth_file)
    return query_ids, neighbors


def export_vdbbench(data: LocalDataset, out_dir: Path) -> dict[str, Any]:
    """Write ``train.parquet``, ``test.parquet`` and ``neighbors.parquet`` into ``out_dir`` (once: skipped
    when all three exist); return the custom-dataset description VectorDBBench needs."""
    from apps.dataset.layout import iter_vectors
    from apps.interchange.exporter import write_vdbbench
    from apps.vdb.stages.query_sweep import read_queries

    query_ids, query_vectors = read_queries(str(data.queries_file), None)
    gt_ids, neighbors = read_groundtruth(data.groundtruth_file)
    if not np.array_equal(query_ids, gt_ids):
        raise SystemExit(
            f"{data.groundtruth_file}: query ids differ from {data.queries_file} (order or members)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    if not all((out_dir / name).exists() for name in EXPORT_FILES):
        write_vdbbench(out_dir, iter_vectors(data.dataset_dir), query_ids, query_vectors, gt_ids, neighbors)
    rows = pq.read_metadata(out_dir / "train.parquet").num_rows
    return {
        "dir": str(out_dir),
        "size": rows,
        "dim": int(query_vectors.shape[1]),
        "metric_type": {"cosine": "COSINE", "ip": "IP", "l2": "L2"}[data.metric],
        "queries": len(query_ids),
        "gt_width": int(neighbors.shape[1]),
    }
