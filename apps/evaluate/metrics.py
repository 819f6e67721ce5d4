"""Measure, then evaluate: the metrics computed from the raw query results (:mod:`apps.vdb.stages.query_raw`).

Everything here is computed afterwards from the raw rows, so a metric can be corrected without re-running
a cluster (ARCHITECTURE.md, "Metric definitions"):

* :func:`qps`: queries completed ÷ wall time of the query phase (max ``t_end`` − min ``t_start``);
  a batch of B queries counts B.
* :func:`latency_stats`: end-to-end time of each request (unique ``client``, ``request``): mean, P50,
  P95, P99 in milliseconds.
* :func:`window_stats`: both, for a timed setting, from every request of its window (the requests file
  beside the raw rows, :data:`apps.vdb.stages.query_raw.REQUEST_SCHEMA`): ``queries_sent``, ``window_s``,
  ``qps``.
* recall: :mod:`apps.evaluate.recall`, once per distinct query (the raw rows keep the first answer to each).
* :func:`evaluate`: all of the above per setting; :func:`evaluate_files`: the raw files of a run in one
  pass over the dataset. The studies' selection rule (highest QPS among settings with recall ≥ 0.95):
  :func:`apps.evaluate.rules.best_operating_point`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from apps.dataset.groundtruth.exact_distance import TIE_ATOL, TIE_RTOL
from apps.dataset.lookup import (
    VectorLookup,
    VectorSource,
    as_lookup,
    fetch_vectors,
    read_groundtruth,
    read_query_vectors,
)
from apps.evaluate.recall import needed_base_ids, recall_at_k
from apps.evaluate.rules import setting_order
from apps.vdb.records import setting_label
from apps.vdb.stages.open_loop import open_loop_stats
from apps.vdb.stages.query_raw import (
    OPEN_LOOP_META,
    read_raw,
    read_requests,
    requests_from_raw,
    validate_raw,
)

_SETTING_COLUMNS = ("database", "setting", "ef", "batch_size", "clients", "k")


def _single_group(raw: pa.Table, what: str) -> None:
    if raw.num_rows == 0:
        raise ValueError(f"{what}: no raw query rows")
    for name in ("database", "setting"):
        if name in raw.column_names and len(pc.unique(raw.column(name))) > 1:
            raise ValueError(f"{what}: the raw rows mix several values of {name!r}; evaluate one at a time")


# ---------------------------------------------------------------------------------------------------------
# Throughput and latency
# ---------------------------------------------------------------------------------------------------------


def qps(raw: pa.Table) -> float:
    """Queries completed ÷ wall time of the query phase (max ``t_end`` − min ``t_start``).

    Every row is one completed query, so a batch of B queries counts B. ``raw`` holds one database ×
    setting. NaN when the phase has no measurable duration. (A timed window's QPS rests on its requests
    file: :func:`window_stats`.)
    """
    _single_group(raw, "qps")
    return float(window_stats(requests_from_raw(raw))["qps"])


def latency_stats(raw: pa.Table) -> dict[str, float | int]:
    """Latency of each request (one batch; unique client × request) in milliseconds.

    Returns ``requests``, ``latency_mean_ms``, ``p50_ms``, ``p95_ms``, ``p99_ms`` (percentiles with
    linear interpolation between order statistics, numpy's default).
    """
    _single_group(raw, "latency_stats")
    stats = window_stats(requests_from_raw(raw))
    return {key: stats[key] for key in ("requests", "latency_mean_ms", "p50_ms", "p95_ms", "p99_ms")}


def window_stats(requests: pa.Table) -> dict[str, float | int]:
    """QPS and latency of a setting's measured window from every request in it (:data:`REQUEST_SCHEMA`).

    ``queries_sent`` (queries answered in the window, a batch of B counts B), ``requests``,
    ``window_s`` (first request sent -> last answer), ``qps`` = queries_sent / window_s (NaN for an
    empty window), and ``latency_mean_ms``, ``p50_ms``, ``p95_ms``, ``p99_ms`` over every request.
    """
    if requests.num_rows == 0:
        raise ValueError("window_stats: no requests")
    start = requests.column("t_start").to_numpy()
    end = requests.column("t_end").to_numpy()
    latency_ms = (end - start) * 1000.0
    if (latency_ms < 0).any():
        raise ValueError("latency_stats: a request ends before it starts (t_end < t_start)")
    sent = int(pc.sum(requests.column("queries")).as_py())
    window = float(end.max() - start.min())
    p50, p95, p99 = np.percentile(latency_ms, [50, 95, 99])
    return {
        "queries_sent": sent,
        "requests": len(latency_ms),
        "window_s": window,
        "qps": sent / window if window > 0 else math.nan,
        "latency_mean_ms": float(latency_ms.mean()),
        "p50_ms": float(p50),
        "p95_ms": float(p95),
        "p99_ms": float(p99),
    }


# ---------------------------------------------------------------------------------------------------------
# Per-setting evaluation
# ---------------------------------------------------------------------------------------------------------


def evaluate(
    raw_table: pa.Table,
    groundtruth: pa.Table,
    query_vectors: VectorSource,
    base_lookup: VectorSource,
    metric: str,
    *,
    rel_tol: float = TIE_RTOL,
    abs_tol: float = TIE_ATOL,
    requests: Mapping[str, pa.Table] | None = None,
    open_loops: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Metrics of every setting in the raw rows of ONE database: ``{setting: row}``.

    Recall rests on the raw rows (the first answer to each distinct query); QPS and latency on every
    request of the setting's window: ``requests[setting]`` (its requests file), else the raw rows' own
    requests (a setting sent once).

    Each row is ready for :func:`apps.evaluate.results.write_results` (add provenance keys): ``database``,
    ``stage="query"``, ``status="ok"``, ``setting``, ``ef``, ``batch_size``, ``clients``, ``k``,
    ``queries_sent``, ``distinct_queries``, ``requests``, ``window_s``, ``qps``, ``latency_mean_ms``,
    ``p50_ms``, ``p95_ms``, ``p99_ms``, ``recall`` (mean tie-aware recall@k), ``recall_min`` and
    ``unknown_ids`` (returned ids that are not in ``base_lookup``: a sign of an id-mapping bug when the
    lookup came from :func:`fetch_vectors`). Rows are ordered by k, batch size, clients, ef.

    An open-loop setting (``open_loops[setting]``: its schedule from the raw file's metadata) gives a row
    of stage ``open_loop`` with :func:`apps.vdb.stages.open_loop.open_loop_stats` beside the above.
    """
    raw_table = validate_raw(raw_table)
    if raw_table.num_rows == 0:
        return {}
    databases = pc.unique(raw_table.column("database")).to_pylist()
    if len(databases) > 1:
        raise ValueError(f"evaluate: the raw rows hold several databases {databases}; evaluate one at a time")
    queries = as_lookup(query_vectors)
    base = as_lookup(base_lookup)
    rows = []
    for setting in pc.unique(raw_table.column("setting")).to_pylist():
        part = raw_table.filter(pc.equal(raw_table.column("setting"), setting))
        first = part.slice(0, 1).select(list(_SETTING_COLUMNS)).to_pylist()[0]
        for name in ("ef", "batch_size", "clients", "k"):
            if len(pc.unique(part.column(name))) > 1:
                raise ValueError(f"evaluate: setting {setting!r} has several values of {name!r}")
        mean_recall, per_query = recall_at_k(
            part, groundtruth, queries, base, metric, first["k"], rel_tol=rel_tol, abs_tol=abs_tol
        )
        returned = pc.list_flatten(part.column("ids")).to_numpy().astype(np.int64)
        returned = returned[returned >= 0]
        every = (requests or {}).get(setting)
        every = requests_from_raw(part) if every is None else every
        schedule = (open_loops or {}).get(setting)
        rows.append(
            {
                **first,
                "stage": "query" if schedule is None else "open_loop",
                "status": "ok",
                "distinct_queries": len(np.unique(part.column("query_id").to_numpy())),
                **window_stats(every),
                **({} if schedule is None else _open_loop_figures(every, schedule)),
                "recall": mean_recall,
                "recall_min": float(per_query.min()),
                "unknown_ids": int((~base.positions(returned)[1]).sum()),
            }
        )
    rows.sort(key=setting_order)
    return {row["setting"]: row for row in rows}


def _open_loop_figures(requests: pa.Table, schedule: dict[str, Any]) -> dict[str, Any]:
    """An open-loop setting's figures from its requests and its schedule (the raw file's metadata)."""
    figures = open_loop_stats(
        requests, schedule["rate"], schedule["scheduled"], schedule["duration_s"], schedule["max_lag_ms"]
    )
    return {**figures, "p99_bound_ms": schedule.get("p99_bound_ms")}


def scored_base_ids(raw: pa.Table, groundtruth: pa.Table) -> np.ndarray:
    """The base ids the recall of ``raw`` needs: every returned id and the exact top-k it is scored at.

    Only the top-k the settings score, not every published neighbour: with 22,723 queries and a top-100
    truth of 2,560 dimensions that is 2.3 GB of vectors instead of 23 GB."""
    return needed_base_ids(raw, groundtruth, int(pc.max(raw.column("k")).as_py()))


def base_ids_for(raw_files: Iterable[str | Path], groundtruth_file: str | Path) -> np.ndarray:
    """:func:`scored_base_ids` of a point's raw files (empty when none answered a query)."""
    tables = [table for table in (read_raw(p) for p in raw_files) if table.num_rows]
    if not tables:
        return np.zeros(0, np.int64)
    return scored_base_ids(pa.concat_tables(tables), read_groundtruth(groundtruth_file))


def evaluate_files(
    raw_files: Iterable[str | Path],
    groundtruth_file: str | Path,
    queries_file: str | Path,
    dataset_dir: str | Path,
    metric: str,
    base: VectorLookup | None = None,
) -> list[dict[str, Any]]:
    """Evaluate raw files of any databases in one pass over the dataset; returns result rows.

    ``base``: the base vectors, already fetched (at least :func:`base_ids_for` these files), so that
    several points share one pass over the dataset; None fetches them here.
    A file the query stage flagged as stalled gives rows with ``stalled`` and the reason in ``error``
    (a ``failed`` row when it holds no answered query).
    """
    raw_files = list(raw_files)
    tables = [read_raw(p) for p in raw_files]
    if not tables:
        return []
    requests: dict[str, dict[str, pa.Table]] = {}  # database -> setting -> every request of its window
    open_loops: dict[str, dict[str, dict[str, Any]]] = {}  # database -> setting -> open-loop schedule
    for path, table in zip(raw_files, tables, strict=True):
        if table.num_rows:
            database, setting = (table.column(c)[0].as_py() for c in ("database", "setting"))
            requests.setdefault(database, {})[setting] = read_requests(path, table)
            schedule = (pq.read_schema(path).metadata or {}).get(OPEN_LOOP_META.encode())
            if schedule is not None:
                open_loops.setdefault(database, {})[setting] = json.loads(schedule)
    stalled = dict(filter(None, (_stall_of(p) for p in raw_files)))
    not_run = dict(filter(None, (_stall_of(p, b"not_run") for p in raw_files)))
    rows: list[dict[str, Any]] = []
    for (database, setting), (reason, described) in stalled.items():
        empty = not any(t.num_rows and pc.any(pc.equal(t.column("setting"), setting)).as_py() for t in tables)
        if empty:
            rows.append(_setting_row(database, setting, described))
            rows[-1].update(status="failed", stalled=True, error=f"stalled: {reason}")
    for (database, setting), (reason, described) in not_run.items():  # its clients could not offer it
        rows.append(_setting_row(database, setting, described))
        rows[-1].update(status="skipped", error=f"not run: {reason}")
    raw = pa.concat_tables(tables)
    if raw.num_rows == 0:
        return rows
    groundtruth = read_groundtruth(groundtruth_file)
    if base is None:
        base = fetch_vectors(dataset_dir, scored_base_ids(raw, groundtruth))
    queries = read_query_vectors(queries_file)
    for database in pc.unique(raw.column("database")).to_pylist():
        part = raw.filter(pc.equal(raw.column("database"), database))
        evaluated = evaluate(
            part,
            groundtruth,
            queries,
            base,
            metric,
            requests=requests[database],
            open_loops=open_loops.get(database),
        )
        for row in evaluated.values():
            if (database, row["setting"]) in stalled:
                row.update(stalled=True, error=f"stalled: {stalled[database, row['setting']][0]}")
            rows.append(row)
    return rows


def _setting_row(database: str, setting: str, described: dict[str, Any]) -> dict[str, Any]:
    """The start of a result row for a setting without answers (stalled, or not run)."""
    fields = {k: described.get(k) for k in ("ef", "batch_size", "clients", "k")}
    rate = described.get("rate")
    if rate is None:  # a closed-loop setting: its row as before open-loop settings existed
        return {"database": database, "stage": "query", "setting": setting, **fields}
    return {"database": database, "stage": "open_loop", "setting": setting, **fields, "rate": rate}


def _stall_of(
    path: str | Path, flag: bytes = b"stalled"
) -> tuple[tuple[str, str], tuple[str, dict[str, Any]]] | None:
    """``((database, setting), (reason, setting fields))`` of a raw file flagged as stalled (or with
    ``flag``, e.g. ``not_run``), else None."""
    meta = pq.read_schema(path).metadata or {}
    if flag not in meta:
        return None
    described = json.loads(meta.get(b"query_setting", b"{}"))
    label = setting_label(
        described.get("ef"),
        described["batch_size"],
        described["clients"],
        described["k"],
        rate=described.get("rate"),
    )
    return (described["database"], label), (meta[flag].decode(), described)
