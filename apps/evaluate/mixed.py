"""Metrics of the mixed insert + query workload, computed afterwards from its raw files.

:func:`mixed_rows` gives two result rows per point: ``stage: "mixed_baseline"`` (the query setting on the
preloaded collection alone) and ``stage: "mixed"`` (the same queries while the rest of the rows are
inserted), each with ``qps``, ``latency_mean_ms``, ``p50_ms``, ``p95_ms``, ``p99_ms`` (also as
``latency_p99_ms``), ``recall``,
``queries_sent`` and ``window_s``; degradation = mixed / baseline. Recall of the mixed phase scores each
query against the exact top-k of the last prefix checkpoint fully acknowledged before it was sent
(:mod:`apps.dataset.groundtruth.checkpoints`; the checkpoints' ground truth is computed once and kept beside
the raw files); recall of the baseline against the preloaded prefix. Distances are recomputed from the vectors
and ties count as hits (:func:`apps.evaluate.recall.recall_at_k`), so a returned row inserted after the
query's checkpoint but nearer than its k-th neighbour counts as found.

Its figure is drawn by :func:`apps.report.mixed.mixed_figure`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from apps.dataset.groundtruth import exact_distance
from apps.dataset.groundtruth.checkpoints import (
    assign_checkpoints,
    checkpoint_sizes,
    checkpoint_truth,
    read_truth,
    ready_times,
    write_truth,
)
from apps.dataset.lookup import fetch_vectors, read_query_vectors
from apps.evaluate.metrics import evaluate, window_stats
from apps.evaluate.recall import recall_at_k
from apps.vdb.stages.mixed_config import MixedRecord
from apps.vdb.stages.open_loop import open_loop_stats
from apps.vdb.stages.query_raw import OPEN_LOOP_META, read_raw, read_requests, requests_from_raw

TRUTH_FILE = "truth.parquet"
TRUTH_TAG = b"pes2o.mixed_truth"  # what a cached truth file was computed for (recomputed when it differs)


def truth_for(
    record: MixedRecord, dataset_dir: str | Path, queries_file: str | Path, metric: str
) -> pa.Table:
    """The checkpoints' exact top-k: computed on first use, then read from beside the raw files while what
    it was computed for (dataset, metric, k, checkpoints, the queries answered) is unchanged."""
    path = Path(record.queries_file).with_name(TRUTH_FILE)
    raw = pa.concat_tables([read_raw(record.queries_file), read_raw(record.baseline_file)])
    if raw.num_rows == 0:
        raise ValueError(f"{record.baseline_file}: no query answered in the mixed workload's baseline")
    wanted = np.unique(raw.column("query_id").to_numpy())
    k = int(raw.column("k")[0].as_py())
    sizes = checkpoint_sizes(record.total_rows, record.preload_rows, record.checkpoint_fraction)
    tag = json.dumps(
        {
            "dataset": str(Path(dataset_dir).resolve()),
            "metric": metric,
            "k": k,
            "sizes": sizes,
            "queries": hashlib.sha256(np.ascontiguousarray(wanted, np.int64).tobytes()).hexdigest(),
            "exact": exact_distance.VERSION,
        },
        sort_keys=True,
    )
    if path.exists():
        cached = read_truth(path)
        if (cached.schema.metadata or {}).get(TRUTH_TAG) == tag.encode():
            return cached
    vectors = read_query_vectors(queries_file).get(wanted)
    table = checkpoint_truth(dataset_dir, wanted, vectors, sizes, k, metric)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), TRUTH_TAG: tag.encode()})
    write_truth(table, path)
    return table


def query_checkpoints(record: MixedRecord, raw: pa.Table, sizes: list[int]) -> np.ndarray:
    """Per raw row of the mixed phase, the checkpoint it is scored against."""
    inserts = pq.read_table(record.inserts_file)
    ready = ready_times(
        sizes,
        record.preload_rows,
        inserts.column("row_start").to_numpy(),
        inserts.column("row_stop").to_numpy(),
        inserts.column("t_ack").to_numpy(),
    )
    return assign_checkpoints(raw.column("t_start").to_numpy(), ready)


def _truth_of(truth: pa.Table, checkpoint: int) -> pa.Table:
    return truth.filter(pc.equal(truth.column("checkpoint"), checkpoint))


def mixed_recall(
    raw: pa.Table, checkpoints: np.ndarray, truth: pa.Table, queries: Any, base: Any, metric: str
) -> np.ndarray:
    """Per raw row, its tie-aware recall@k against its checkpoint's exact top-k."""
    per_row = np.full(raw.num_rows, np.nan)
    for checkpoint in np.unique(checkpoints):
        rows = np.flatnonzero(checkpoints == checkpoint)
        part = raw.take(pa.array(rows))
        _, recall = recall_at_k(part, _truth_of(truth, int(checkpoint)), queries, base, metric)
        per_row[rows] = recall
    return per_row


def mixed_rows(
    record: MixedRecord, dataset_dir: str | Path, queries_file: str | Path, metric: str
) -> list[dict[str, Any]]:
    """The ``mixed_baseline`` and ``mixed`` result rows of one point (see the module docstring)."""
    truth = truth_for(record, dataset_dir, queries_file, metric)
    sizes = checkpoint_sizes(record.total_rows, record.preload_rows, record.checkpoint_fraction)
    raw = read_raw(record.queries_file)
    baseline = read_raw(record.baseline_file)
    checkpoints = query_checkpoints(record, raw, sizes) if raw.num_rows else np.zeros(0, np.int64)
    used = sorted({0, *np.unique(checkpoints).tolist()})
    needed = [
        pc.list_flatten(raw.column("ids")).to_numpy(),
        pc.list_flatten(baseline.column("ids")).to_numpy(),
    ]
    for checkpoint in used:
        needed.append(pc.list_flatten(_truth_of(truth, checkpoint).column("neighbors")).to_numpy())
    base = fetch_vectors(dataset_dir, np.concatenate(needed))
    queries = read_query_vectors(queries_file)
    inserts = pq.read_table(record.inserts_file)
    inserted = int(pc.sum(pc.subtract(inserts.column("row_stop"), inserts.column("row_start"))).as_py() or 0)
    first_send = float(pc.min(inserts.column("t_send")).as_py()) if inserts.num_rows else None
    insert_fields = {
        "vectors": inserted,
        "insert_vectors_per_s": inserted / (record.last_ack - first_send) if first_send else None,
    }
    rows = []
    every = {record.setting: read_requests(record.baseline_file, baseline)}
    schedule = (pq.read_schema(record.baseline_file).metadata or {}).get(OPEN_LOOP_META.encode())
    open_loops = None if schedule is None else {record.setting: json.loads(schedule)}
    evaluated = evaluate(
        baseline, _truth_of(truth, 0), queries, base, metric, requests=every, open_loops=open_loops
    )
    for row in evaluated.values():
        rows.append({**_keep(row), "stage": "mixed_baseline", "vectors": record.preload_rows})
    if raw.num_rows:
        recall = mixed_recall(raw, checkpoints, truth, queries, base, metric)
        first = raw.slice(0, 1).to_pylist()[0]
        rows.append(
            {
                **{key: first[key] for key in ("database", "setting", "ef", "batch_size", "clients", "k")},
                "stage": "mixed",
                "status": "ok",
                **window_stats(requests_from_raw(raw)),
                **_open_loop_phase(record),
                "distinct_queries": len(np.unique(raw.column("query_id").to_numpy())),
                "recall": float(recall.mean()),
                "recall_min": float(recall.min()),
                **insert_fields,
            }
        )
    else:
        rows.append(
            {"database": baseline.column("database")[0].as_py(), "stage": "mixed", "status": "failed"}
        )
        rows[-1].update(error="no query was answered during the mixed phase", **insert_fields)
    for row in rows:
        # the degradation table's column: in the open loop the P99 from the intended send time
        row["latency_p99_ms"] = row.get("intended_p99_ms") or row.get("p99_ms")
    return rows


def _open_loop_phase(record: MixedRecord) -> dict[str, Any]:
    """The mixed phase's open-loop figures from its requests file ({} for a closed-loop phase)."""
    if record.query_rate is None or record.released_at is None:
        return {}
    requests = read_requests(record.queries_file)
    sent = requests.num_rows
    figures = open_loop_stats(
        requests,
        record.query_rate,
        sent + (record.queries_unsent or 0),
        max(record.last_ack - record.released_at, 1e-9),
        record.max_lag_ms or 1.0,
    )
    return figures


def _keep(row: dict[str, Any]) -> dict[str, Any]:
    """A query-metrics row without the columns the mixed rows do not carry."""
    return {k: v for k, v in row.items() if k not in ("stage",)}
