"""``results.parquet``: one typed row per sweep point × stage × setting × repeat, grouped for the report.

:func:`write_results` writes the rows the stages produced under the fixed :data:`RESULTS_SCHEMA`
(absent values are typed nulls, so an empty or partial run has the same schema as a full one), followed
by one column per swept parameter (a row's ``sweep`` mapping, e.g. ``collection.hnsw_m``: null where a
point did not sweep it). :class:`ResultRows` groups rows by point label (the database's name without a
sweep) and stage for the tables (:mod:`apps.report.document`) and the figures (:mod:`apps.report.figures`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from apps.evaluate.rules import setting_order
from core.store import write_parquet_atomic

# The stages that write result rows, in pipeline order (mixed_baseline and mixed: apps/report/mixed.py).
STAGES = ("deploy", "insert", "index", "query", "open_loop", "mixed_baseline", "mixed")
SWEEP = "sweep"  # a row's swept parameters (name -> value): one column each in results.parquet

RESULTS_SCHEMA = pa.schema(
    [
        # identity
        pa.field("database", pa.string(), nullable=False),
        pa.field("label", pa.string()),  # the sweep point (unique per entry x swept values); null: database
        pa.field("repeat", pa.int32()),  # 0 .. vdb.repeats - 1
        pa.field("point", pa.string()),  # the point's content key
        pa.field("stage", pa.string(), nullable=False),  # one of STAGES
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
        pa.field("index_bytes", pa.int64()),  # on-disk bytes of the index (where the database tells)
        pa.field("data_bytes", pa.int64()),  # on-disk bytes of vectors and payload (where it tells)
        # query (apps.evaluate.metrics.evaluate)
        pa.field("qps", pa.float64()),
        pa.field("latency_mean_ms", pa.float64()),
        pa.field("p50_ms", pa.float64()),
        pa.field("p95_ms", pa.float64()),
        pa.field("p99_ms", pa.float64()),
        pa.field("latency_p99_ms", pa.float64()),  # mixed / mixed_baseline rows: p99_ms under this name
        pa.field("recall", pa.float64()),  # mean tie-aware recall@k
        pa.field("recall_min", pa.float64()),
        pa.field("queries_sent", pa.int64()),  # queries answered in the window (QPS rests on them)
        pa.field("distinct_queries", pa.int64()),  # distinct queries (recall: the first answer to each)
        pa.field("requests", pa.int64()),  # requests in the window (latency rests on them)
        pa.field("window_s", pa.float64()),  # first request sent -> last answer (QPS's wall time)
        pa.field("unknown_ids", pa.int64()),
        # open_loop rows (apps/vdb/stages/open_loop.py): offered and achieved requests/s, latency from the
        # intended send time (p50_ms ... p999_ms: service time from the actual send), the generator's lag.
        pa.field("rate", pa.float64()),
        pa.field("offered_rate", pa.float64()),  # scheduled / window: a Poisson schedule's realised rate
        pa.field("achieved_rate", pa.float64()),
        pa.field("unsent", pa.int64()),
        pa.field("intended_p50_ms", pa.float64()),
        pa.field("intended_p99_ms", pa.float64()),
        pa.field("intended_p999_ms", pa.float64()),
        pa.field("p999_ms", pa.float64()),
        pa.field("lag_p99_ms", pa.float64()),
        pa.field("lag_ok", pa.bool_()),  # False: the generator lagged; the row's figures are not reported
        pa.field("queued_share", pa.float64()),  # requests that waited for a free sender (> 1%: client-bound)
        pa.field("p99_bound_ms", pa.float64()),  # the configured bound of the knee
        pa.field("stalled", pa.bool_()),  # query: the setting stalled twice (reason in `error`); not a norm
        # query: storage I/O of the database processes in the setting's window (apps.vdb.stages.query_io)
        pa.field("page_cache", pa.string()),  # cold (dropped before the setting) | warm
        pa.field("bytes_read_per_query", pa.float64()),  # bytes fetched from storage / queries
        pa.field("read_calls_per_query", pa.float64()),  # read syscalls / queries
        pa.field("peak_rss_bytes", pa.int64()),  # resident-set high-water mark during the setting
        pa.field("qps_per_gb", pa.float64()),  # QPS / peak RSS in GB (10^9 bytes)
        # query: cores the host's other processes kept busy during the window (a busy neighbour)
        pa.field("other_cpu_cores", pa.float64()),
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
    names = set(RESULTS_SCHEMA.names) | {SWEEP}
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
        clean[SWEEP] = dict(row.get(SWEEP) or {})
        if clean["status"] is None:
            clean["status"] = "failed" if clean["error"] else "ok"
        out.append(clean)
    return out


def swept_names(rows: Iterable[dict[str, Any]]) -> list[str]:
    """The swept parameters of ``rows`` in first-seen order (their columns in results.parquet)."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row.get(SWEEP) or {}))
    return list(names)


def _column(name: str) -> str:
    """A swept parameter's column: its name, prefixed when a fixed column already has it."""
    return f"{SWEEP}.{name}" if name in RESULTS_SCHEMA.names else name


def _sweep_array(values: list[Any]) -> pa.Array:
    """A swept parameter's values: typed when they share a type, as text when they mix (1 and "auto")."""
    kinds = {type(v) for v in values if v is not None}
    if len(kinds) > 1 and not kinds <= {int, float}:
        values = [None if v is None else str(v) for v in values]
    return pa.array(values)


def results_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Rows -> a table: :data:`RESULTS_SCHEMA`, then one column per swept parameter (empty: typed, empty)."""
    clean = normalize_rows(rows)
    if not clean:
        return RESULTS_SCHEMA.empty_table()
    table = pa.Table.from_pylist(
        [{k: v for k, v in r.items() if k != SWEEP} for r in clean], schema=RESULTS_SCHEMA
    )
    for name in swept_names(clean):
        table = table.append_column(_column(name), _sweep_array([r[SWEEP].get(name) for r in clean]))
    return table


def write_results(rows: Iterable[dict[str, Any]], path: str | Path) -> dict[str, Any]:
    """Write ``results.parquet`` atomically; returns ``{rows, bytes, sha256}`` for the manifest."""
    return write_parquet_atomic(results_table(rows), Path(path), row_group_rows=65536)


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``results.parquet`` (schema columns added later read as None; the other columns are the
    swept parameters, under ``sweep``)."""
    table = pq.read_table(path)
    fixed = set(RESULTS_SCHEMA.names)
    rows = []
    for row in table.to_pylist():
        swept = {k.removeprefix(f"{SWEEP}."): v for k, v in row.items() if k not in fixed and v is not None}
        rows.append({**{k: v for k, v in row.items() if k in fixed}, SWEEP: swept})
    return normalize_rows(rows)


def point_name(row: dict[str, Any]) -> str:
    """The name a row is reported under: its point's label, else its database (a run without sweeps)."""
    return row.get("label") or row["database"]


def name_order(name: str) -> tuple[Any, ...]:
    """Sort key of point names with their numbers as numbers: ``rows=2000`` before ``rows=10000``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


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


class ResultRows:
    """The rows of one results file grouped by point (label; the database without a sweep) and stage.

    ``databases`` holds those names: one per database in a run without sweeps, as before.
    """

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.databases = sorted({point_name(r) for r in rows}, key=name_order)

    def of(self, database: str, stage: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if point_name(r) == database and r["stage"] == stage]

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
        return sorted(rows, key=setting_order)

    def stalled(self) -> list[dict[str, Any]]:
        """Query rows of settings that stalled twice (a frozen or overloaded server)."""
        return [r for r in self.rows if r["stage"] in ("query", "open_loop") and r.get("stalled")]

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
