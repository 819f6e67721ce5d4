"""Ground truth of dataset prefixes: the mixed workload's checkpoints, and a point that loaded only its first
rows.

## The mixed workload

Rows are inserted in the dataset's row order, so what a query can see is (at least) a prefix of the rows.
:func:`checkpoint_sizes` gives the prefixes: the preloaded one and one every ``checkpoint_fraction`` of the
inserted part, up to the whole dataset. :func:`checkpoint_truth` computes the exact top-k of every query at
each of them in one pass over the dataset, with the ground-truth stage's own exact search
(:class:`apps.dataset.groundtruth.faiss_kernel.FaissExactSearch`: a running top-k decided in float64, the same
on every machine, read out whenever the stream reaches a checkpoint). :func:`assign_checkpoints` scores each
query against the largest checkpoint whose rows were all acknowledged before the query was sent; several
insert clients acknowledge batches out of order, so a checkpoint is ready when every batch holding one of its
rows has been acknowledged.

## A point that loaded a prefix

A point with ``insert.rows: N`` (``vdb.insert.rows``) holds rows ``[0, N)`` of the dataset in its row order,
so its recall is scored against the exact top-k of those rows, not the whole dataset's ground truth. The exact
search is the ground-truth stage's own (:func:`apps.dataset.groundtruth.checkpoints.checkpoint_truth` with one
checkpoint at ``N``: the FAISS exact search, ties by position); the result is written in
``groundtruth.parquet``'s layout (``query_id``, ``neighbors``, ``distances``) so
:func:`apps.evaluate.metrics.evaluate_files` takes it unchanged, and cached in the point's directory (its key
covers the dataset, queries and ground truth).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from apps.dataset.groundtruth import exact_distance
from apps.dataset.groundtruth.faiss_kernel import FaissExactSearch
from apps.dataset.groundtruth.stage import groundtruth_table
from apps.dataset.layout import iter_vectors
from apps.dataset.lookup import read_query_vectors
from core.store import write_parquet_atomic

PREFIX_TRUTH_FILE = "groundtruth-prefix.parquet"
_PREFIX_META_KEY = b"prefix_truth"
TRUTH_SCHEMA = pa.schema(
    [
        pa.field("checkpoint", pa.int32(), nullable=False),  # position in the list of checkpoints
        pa.field("rows", pa.int64(), nullable=False),  # the prefix: rows [0, rows) of the dataset
        pa.field("query_id", pa.int64(), nullable=False),
        pa.field("neighbors", pa.list_(pa.int64()), nullable=False),  # exact top-k ids, nearest first
        pa.field("distances", pa.list_(pa.float32()), nullable=False),
    ]
)


def checkpoint_sizes(total: int, preload: int, fraction: float) -> list[int]:
    """Prefix sizes: ``preload``, then every ``fraction`` of the ``total - preload`` inserted rows, and
    ``total``; strictly increasing."""
    if not 0 < preload <= total:
        raise ValueError(f"preload {preload} must be in 1..{total}")
    inserted = total - preload
    steps = max(1, math.ceil(1 / fraction - 1e-9))
    sizes = [preload + min(inserted, math.ceil(i * fraction * inserted - 1e-9)) for i in range(steps + 1)]
    sizes.append(total)
    return sorted(set(sizes))


def checkpoint_truth(
    dataset_dir: str | Path,
    query_ids: np.ndarray,
    queries: np.ndarray,
    sizes: list[int],
    k: int,
    metric: str,
    memory_budget_mb: int = 512,
) -> pa.Table:
    """Exact top-``k`` of every query at each prefix in ``sizes`` (:data:`TRUTH_SCHEMA`), one pass.

    The dataset's batches are cut at the checkpoints, so the running top-k after a cut is exactly the
    top-k of that prefix (ties by position, as in the ground-truth stage).
    """
    if k > sizes[0]:
        raise ValueError(f"k={k} exceeds the preloaded prefix of {sizes[0]} rows")
    search = FaissExactSearch(queries, k, metric, memory_budget_mb)
    # NumPy blocks, one per checkpoint: checkpoints x queries x k ids and distances, whatever the dataset's
    # size (Python lists of them took about 6 times the memory).
    columns: dict[str, list[np.ndarray]] = {name: [] for name in TRUTH_SCHEMA.names}
    position, pending = 0, list(sizes)
    try:
        for ids, vectors in iter_vectors(Path(dataset_dir)):
            start = 0
            while start < len(ids):
                take = len(ids) - start if not pending else min(len(ids) - start, pending[0] - position)
                stop = start + take
                search.add(ids[start:stop], vectors[start:stop])
                position += take
                start = stop
                if pending and position == pending[0]:
                    _snapshot(columns, search, len(sizes) - len(pending), position, query_ids)
                    pending.pop(0)
            if not pending:
                break
    finally:
        search.close()
    if pending:
        raise ValueError(f"{dataset_dir}: {position} rows, fewer than the checkpoint of {pending[0]}")
    ids, distances = (np.concatenate(columns[name]) for name in ("neighbors", "distances"))
    offsets = pa.array(np.arange(0, ids.size + 1, ids.shape[1], dtype=np.int32))
    return pa.table(
        {
            "checkpoint": pa.array(np.concatenate(columns["checkpoint"]), pa.int32()),
            "rows": pa.array(np.concatenate(columns["rows"]), pa.int64()),
            "query_id": pa.array(np.concatenate(columns["query_id"]), pa.int64()),
            "neighbors": pa.ListArray.from_arrays(offsets, pa.array(ids.ravel(), pa.int64())),
            "distances": pa.ListArray.from_arrays(offsets, pa.array(distances.ravel(), pa.float32())),
        },
        schema=TRUTH_SCHEMA,
    )


def _snapshot(
    columns: dict[str, list], search: FaissExactSearch, number: int, rows: int, query_ids: np.ndarray
) -> None:
    """Append the running top-k (the exact top-k of the first ``rows`` rows) as checkpoint ``number``."""
    ids, distances = search.current()
    n = len(query_ids)
    columns["checkpoint"].append(np.full(n, number, np.int32))
    columns["rows"].append(np.full(n, rows, np.int64))
    columns["query_id"].append(np.asarray(query_ids, np.int64))
    columns["neighbors"].append(np.asarray(ids, np.int64).reshape(n, -1))
    columns["distances"].append(np.asarray(distances, np.float32).reshape(n, -1))


def write_truth(table: pa.Table, path: str | Path) -> None:
    """Write the checkpoints' ground truth atomically."""
    write_parquet_atomic(table, Path(path), row_group_rows=65536)


def read_truth(path: str | Path) -> pa.Table:
    """The checkpoints' ground truth written by :func:`write_truth`."""
    return pq.read_table(path)


def ready_times(
    sizes: list[int], preload: int, row_start: np.ndarray, row_stop: np.ndarray, ack: np.ndarray
) -> np.ndarray:
    """Per checkpoint, the moment its rows were all acknowledged: ``-inf`` for the preloaded prefix, the
    latest acknowledgement of a batch holding one of its rows otherwise, ``inf`` when some of its rows
    were never acknowledged.

    ``row_start``, ``row_stop``, ``ack``: per acknowledged insert batch, its rows ``[row_start,
    row_stop)`` and its acknowledge time.
    """
    order = np.argsort(row_start, kind="stable")
    starts = np.asarray(row_start, np.int64)[order]
    stops = np.asarray(row_stop, np.int64)[order]
    acks = np.asarray(ack, np.float64)[order]
    covered = preload  # rows [preload, covered) are in acknowledged batches without a gap
    for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
        if start != covered:
            break
        covered = stop
    running = np.maximum.accumulate(acks) if len(acks) else acks
    ready = np.empty(len(sizes), np.float64)
    for i, size in enumerate(sizes):
        if size <= preload:
            ready[i] = -np.inf
        elif size > covered:
            ready[i] = np.inf
        else:
            ready[i] = running[int(np.searchsorted(starts, size, side="left")) - 1]
    return ready


def assign_checkpoints(t_start: np.ndarray, ready: np.ndarray) -> np.ndarray:
    """Per query, the largest checkpoint ready at or before its send time (``ready`` non-decreasing)."""
    return np.searchsorted(ready, np.asarray(t_start, np.float64), side="right") - 1


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
    neighbors = truth.column("neighbors").combine_chunks().flatten().to_numpy().reshape(-1, k)
    distances = truth.column("distances").combine_chunks().flatten().to_numpy().reshape(-1, k)
    return groundtruth_table(truth.column("query_id").to_numpy(), neighbors, distances)


def _prefix_cached(path: Path, tag: str) -> bool:
    try:
        return (pq.read_schema(path).metadata or {}).get(_PREFIX_META_KEY) == tag.encode()
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
    if not _prefix_cached(path, tag):
        table = prefix_groundtruth(dataset_dir, queries_file, rows, k, metric, memory_budget_mb)
        write_parquet_atomic(table, path, metadata={_PREFIX_META_KEY.decode(): tag})
    return path
