"""``results.parquet``: one typed row per database × stage × setting, and the rows grouped for the report.

:func:`write_results` writes the rows the stages produced under the fixed :data:`RESULTS_SCHEMA`
(absent values are typed nulls, so an empty or partial run has the same schema as a full one);
:class:`ResultRows` groups them by database and stage for the tables (:mod:`apps.report`) and the
figures (:mod:`apps.report_figures`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from apps.vdb_metrics import best_operating_point
from core.store import write_parquet_atomic

# The stages that write result rows, in pipeline order (the mixed insert + query workload adds its own
# stage here together with the records that feed it).
STAGES = ("deploy", "insert", "index", "query")
MIN_RECALL = 0.95

RESULTS_SCHEMA = pa.schema(
    [
        # identity
        pa.field("database", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),  # deploy | insert | index | query
        pa.field("setting", pa.string()),  # e.g. "ef=64,batch=32,clients=2,k=10"; null for deploy
        pa.field("status", pa.string(), nullable=False),  # ok | failed | skipped
        pa.field("error", pa.string()),  # the reason when status != ok
        # deploy
        pa.field("deploy_s", pa.float64()),  # start -> healthy
        # insert
        pa.field("vectors", pa.int64()),  # vectors inserted
        pa.field("upload_s", pa.float64()),  # first insert request sent -> every vector visible (upload time)
        pa.field("searchable_s", pa.float64()),  # last insert acknowledged -> every vector visible
        pa.field("insert_vectors_per_s", pa.float64()),
        # index
        pa.field("index_s", pa.float64()),  # build triggered -> steady state
        pa.field("segments", pa.int64()),
        pa.field("disk_bytes", pa.int64()),
        pa.field("write_amplification", pa.float64()),  # disk bytes / raw float32 bytes
        # query (apps.vdb_metrics.evaluate)
        pa.field("qps", pa.float64()),
        pa.field("latency_mean_ms", pa.float64()),
        pa.field("p50_ms", pa.float64()),
        pa.field("p95_ms", pa.float64()),
        pa.field("p99_ms", pa.float64()),
        pa.field("recall", pa.float64()),  # mean tie-aware recall@k
        pa.field("recall_min", pa.float64()),
        pa.field("queries_sent", pa.int64()),  # queries answered in the window (QPS rests on them)
        pa.field("distinct_queries", pa.int64()),  # distinct queries (recall: the first answer to each)
        pa.field("requests", pa.int64()),  # requests in the window (latency rests on them)
        pa.field("window_s", pa.float64()),  # first request sent -> last answer (QPS's wall time)
        pa.field("unknown_ids", pa.int64()),
        pa.field("stalled", pa.bool_()),  # query: the setting stalled twice (reason in `error`); not a norm
        # parameters
        pa.field("k", pa.int32()),
        pa.field("ef", pa.int32()),
        pa.field("batch_size", pa.int32()),  # configured (insert: vectors per batch)
        pa.field("request_size", pa.int32()),  # insert: vectors per request actually sent (<= batch_size)
        pa.field("clients", pa.int32()),
        pa.field("workers", pa.int32()),
        pa.field("params", pa.string()),  # JSON: collection parameters, adapter settings
        pa.field("server_version", pa.string()),
        # provenance
        pa.field("dataset_key", pa.string()),
        pa.field("queries_key", pa.string()),
        pa.field("groundtruth_key", pa.string()),
        pa.field("run_id", pa.string()),
    ]
)


def _coerce(value: Any, field: pa.Field) -> Any:
    """One value -> the Python value of the field's type; None, NaN-free ints, JSON for dict params."""
    if value is None:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    kind = field.type
    if pa.types.is_string(kind):
        if isinstance(value, dict | list):
            return json.dumps(value, sort_keys=True, default=str)
        return str(value)
    if pa.types.is_integer(kind):
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"results: {field.name}={value!r} is not an integer")
        return int(value)
    if pa.types.is_floating(kind):
        return float(value)
    if pa.types.is_boolean(kind):
        return bool(value)
    return value


def normalize_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check and coerce result rows to :data:`RESULTS_SCHEMA`; every column present (None if absent).

    Raises ValueError for an unknown column (names the allowed ones), an unknown stage or a missing
    database. ``status`` defaults to ``failed`` when an ``error`` is given, else ``ok``.
    """
    names = set(RESULTS_SCHEMA.names)
    out = []
    for number, row in enumerate(rows):
        unknown = sorted(set(row) - names)
        if unknown:
            raise ValueError(
                f"results row {number}: unknown columns {unknown}; allowed: {RESULTS_SCHEMA.names}"
            )
        if not row.get("database"):
            raise ValueError(f"results row {number}: no database")
        if row.get("stage") not in STAGES:
            raise ValueError(f"results row {number}: stage {row.get('stage')!r} is not one of {STAGES}")
        clean = {field.name: _coerce(row.get(field.name), field) for field in RESULTS_SCHEMA}
        if clean["status"] is None:
            clean["status"] = "failed" if clean["error"] else "ok"
        out.append(clean)
    return out


def results_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Rows -> a table with exactly :data:`RESULTS_SCHEMA` (an empty list gives an empty typed table)."""
    clean = normalize_rows(rows)
    return pa.Table.from_pylist(clean, schema=RESULTS_SCHEMA) if clean else RESULTS_SCHEMA.empty_table()


def write_results(rows: Iterable[dict[str, Any]], path: str | Path) -> dict[str, Any]:
    """Write ``results.parquet`` atomically; returns ``{rows, bytes, sha256}`` for the manifest."""
    return write_parquet_atomic(results_table(rows), Path(path), row_group_rows=65536)


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``results.parquet`` (columns added to the schema later read as None)."""
    table = pq.read_table(path)
    return normalize_rows(
        {k: v for k, v in row.items() if k in RESULTS_SCHEMA.names} for row in table.to_pylist()
    )


def is_ok(row: dict[str, Any]) -> bool:
    return row["status"] == "ok"


def insert_rate(row: dict[str, Any]) -> float | None:
    if row["insert_vectors_per_s"] is not None:
        return row["insert_vectors_per_s"]
    if row["vectors"] and row["upload_s"]:
        return row["vectors"] / row["upload_s"]
    return None


def sent_size(row: dict[str, Any]) -> int | None:
    """Vectors per request actually sent, when the database took smaller requests than the batch."""
    sent = row.get("request_size")
    return sent if sent is not None and sent != row["batch_size"] else None


def param_order(row: dict[str, Any]) -> tuple:
    def key(value: Any) -> float:
        return -1 if value is None else value

    return (key(row["k"]), key(row["batch_size"]), key(row["clients"]), key(row["ef"]), row["setting"] or "")


def operating_point(rows: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, bool]:
    """(row, is_best): the best QPS at recall ≥ 0.95, else the highest-recall setting (is_best False)."""
    best = best_operating_point(rows, MIN_RECALL)
    if best is not None:
        return best, True
    usable = [r for r in rows if is_ok(r) and r["recall"] is not None and r["qps"] is not None]
    if not usable:
        return None, False
    return max(usable, key=lambda r: (r["recall"], r["qps"])), False


class ResultRows:
    """The rows of one results file grouped by database and stage."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.databases = sorted({r["database"] for r in rows})

    def of(self, database: str, stage: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["database"] == database and r["stage"] == stage]

    def failure(self, database: str, stages: Sequence[str] = STAGES) -> dict[str, Any] | None:
        """The first failed row of ``database`` in pipeline order among ``stages``."""
        for stage in stages:
            for row in self.of(database, stage):
                if row["status"] == "failed":
                    return row
        return None

    def queries(self, database: str) -> list[dict[str, Any]]:
        """The ok query rows that are normal measurements (a stalled setting is not)."""
        rows = (r for r in self.of(database, "query") if is_ok(r) and not r.get("stalled"))
        return sorted(rows, key=param_order)

    def stalled(self) -> list[dict[str, Any]]:
        """Query rows of settings that stalled twice (a frozen or overloaded server)."""
        return [r for r in self.rows if r["stage"] == "query" and r.get("stalled")]

    def primary(self, database: str, stage: str) -> dict[str, Any] | None:
        """The ok row of a stage: the one matching the index setting, else the last."""
        rows = [r for r in self.of(database, stage) if is_ok(r)]
        if not rows:
            return None
        index = [r for r in self.of(database, "index") if is_ok(r)]
        for row in rows:
            if index and row["setting"] is not None and row["setting"] == index[-1]["setting"]:
                return row
        return rows[-1]

    def provenance(self) -> dict[str, list[str]]:
        keys = ("run_id", "dataset_key", "queries_key", "groundtruth_key")
        return {k: sorted({r[k] for r in self.rows if r[k]}) for k in keys}
