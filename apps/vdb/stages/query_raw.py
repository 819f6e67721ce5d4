"""The raw query-result layout: what the query stage measured, one Parquet file per database × setting.

One row per query (:data:`RAW_QUERY_SCHEMA`): the returned ids and scores and the wall-clock start and
end of the request (one batch) that carried the query. Metrics are computed afterwards from these rows
(:mod:`apps.evaluate.metrics`), so a metric can be corrected without re-running a cluster.

A timed setting (``vdb.query.duration_s``) cycles through its queries: its raw rows keep the first answer
to each distinct query, and a companion file (:data:`REQUEST_SCHEMA`, :func:`requests_path`) holds every
request of the window, so a long window stays small on disk.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from apps.vdb.records import setting_label
from core.store import read_store_table

RAW_QUERY_SCHEMA = pa.schema(
    [
        pa.field("database", pa.string(), nullable=False),
        pa.field("setting", pa.string(), nullable=False),  # setting_label(...), e.g. "ef=64,batch=32,..."
        pa.field("ef", pa.int32(), nullable=True),  # search-time parameter; null when not applicable
        pa.field("batch_size", pa.int32(), nullable=False),
        pa.field("clients", pa.int32(), nullable=False),
        pa.field("k", pa.int32(), nullable=False),
        pa.field("client", pa.int32(), nullable=False),  # index of the client process
        pa.field("rank", pa.int32(), nullable=True),  # the entry rank that client talked to; null: unknown
        pa.field("request", pa.int32(), nullable=False),  # request (batch) index within the client
        pa.field("query_id", pa.int64(), nullable=False),
        pa.field("ids", pa.list_(pa.int64()), nullable=False),  # returned ids, nearest first; -1 pads
        pa.field("scores", pa.list_(pa.float32()), nullable=False),  # as the database reports them
        pa.field("t_start", pa.float64(), nullable=False),  # time.time() when the request was sent
        pa.field("t_end", pa.float64(), nullable=False),  # time.time() when its answer was complete
    ]
)
"""One row per query. Every query of one request (batch) shares ``client``, ``rank``, ``request``,
``t_start`` and ``t_end``. Files may hold several requests and clients; one file per database × setting.
Files written before ``rank`` existed read back with a null ``rank``."""


def _list_column(values: Any, value_type: pa.DataType, name: str, n: int) -> pa.Array:
    """A 2-D array (rows, m) or a sequence of sequences (ragged) -> list<value_type> of ``n`` rows."""
    if isinstance(values, np.ndarray) and values.ndim == 2:
        flat = pa.array(np.ascontiguousarray(values).ravel(), value_type)
        offsets = pa.array(np.arange(values.shape[0] + 1, dtype=np.int32) * values.shape[1], pa.int32())
        column = pa.ListArray.from_arrays(offsets, flat)
    else:
        column = pa.array([np.asarray(v).tolist() for v in values], pa.list_(value_type))
    if len(column) != n:
        raise ValueError(f"raw query results: column {name!r} has {len(column)} rows, expected {n}")
    return column


def raw_query_table(
    *,
    database: str,
    ef: int | None,
    batch_size: int,
    clients: int,
    k: int,
    client: int | Sequence[int] | np.ndarray,
    request: int | Sequence[int] | np.ndarray,
    query_ids: Sequence[int] | np.ndarray,
    ids: np.ndarray | Sequence[Sequence[int]],
    scores: np.ndarray | Sequence[Sequence[float]],
    t_start: float | Sequence[float] | np.ndarray,
    t_end: float | Sequence[float] | np.ndarray,
    setting: str | None = None,
    rank: int | Sequence[int] | np.ndarray | None = None,
) -> pa.Table:
    """Build a table in :data:`RAW_QUERY_SCHEMA` from Python lists / numpy arrays.

    ``query_ids`` gives the number of rows n. ``client``, ``request``, ``t_start`` and ``t_end`` are
    scalars (one request: every row shares them) or per-row arrays, and so is ``rank`` (None: unknown).
    ``ids`` / ``scores`` are (n, m) arrays (e.g. ``SearchResult.ids`` / ``.scores``) or ragged
    sequences. ``setting`` defaults to :func:`setting_label`. Concatenate the tables of many requests
    with :func:`concat_raw`.
    """
    query_ids = np.asarray(query_ids, dtype=np.int64).reshape(-1)
    n = len(query_ids)

    def per_row(value: Any, dtype: Any, name: str) -> np.ndarray:
        array = np.asarray(value, dtype=dtype)
        if array.ndim == 0:
            return np.full(n, array, dtype=dtype)
        if array.shape != (n,):
            raise ValueError(f"raw query results: {name!r} has shape {array.shape}, expected ({n},)")
        return array

    columns = {
        "database": pa.array([database] * n, pa.string()),
        "setting": pa.array([setting or setting_label(ef, batch_size, clients, k)] * n, pa.string()),
        "ef": pa.array([None if ef is None else int(ef)] * n, pa.int32()),
        "batch_size": pa.array(per_row(batch_size, np.int32, "batch_size")),
        "clients": pa.array(per_row(clients, np.int32, "clients")),
        "k": pa.array(per_row(k, np.int32, "k")),
        "client": pa.array(per_row(client, np.int32, "client")),
        "rank": pa.nulls(n, pa.int32()) if rank is None else pa.array(per_row(rank, np.int32, "rank")),
        "request": pa.array(per_row(request, np.int32, "request")),
        "query_id": pa.array(query_ids),
        "ids": _list_column(ids, pa.int64(), "ids", n),
        "scores": _list_column(scores, pa.float32(), "scores", n),
        "t_start": pa.array(per_row(t_start, np.float64, "t_start")),
        "t_end": pa.array(per_row(t_end, np.float64, "t_end")),
    }
    return validate_raw(pa.Table.from_pydict(columns, schema=RAW_QUERY_SCHEMA))


def validate_raw(table: pa.Table) -> pa.Table:
    """Check a raw table against :data:`RAW_QUERY_SCHEMA` (columns, types, no nulls where required).

    Returns the table cast to the exact schema (column order, nullability); raises ValueError naming
    the problem otherwise.
    """
    if "rank" not in table.column_names:  # written before clients were spread over ranks
        table = table.append_column("rank", pa.nulls(table.num_rows, pa.int32()))
    missing = [f.name for f in RAW_QUERY_SCHEMA if f.name not in table.column_names]
    if missing:
        raise ValueError(f"raw query results: missing columns {missing}")
    table = table.select(RAW_QUERY_SCHEMA.names)
    for field in RAW_QUERY_SCHEMA:
        column = table.column(field.name)
        if not field.nullable and column.null_count:
            raise ValueError(f"raw query results: column {field.name!r} has {column.null_count} nulls")
    try:
        return table.cast(RAW_QUERY_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"raw query results: {exc}") from None


def concat_raw(tables: Iterable[pa.Table]) -> pa.Table:
    """Concatenate raw tables (requests, clients) into one table."""
    tables = [validate_raw(t) for t in tables]
    if not tables:
        return RAW_QUERY_SCHEMA.empty_table()
    return pa.concat_tables(tables)


def read_raw(paths: str | Path | Iterable[str | Path]) -> pa.Table:
    """Read one or several raw Parquet files into one validated table."""
    if isinstance(paths, str | Path):
        paths = [paths]
    return concat_raw(_read(Path(p)) for p in paths)


def _read(path: Path) -> pa.Table:
    """A raw file; damage is named with the file (core.store.read_store_table)."""
    return read_store_table(path)


# ---------------------------------------------------------------------------------------------------------
# Every request of a timed window (a companion file beside the raw rows)
# ---------------------------------------------------------------------------------------------------------

REQUEST_SCHEMA = pa.schema(
    [
        pa.field("client", pa.int32(), nullable=False),
        pa.field("rank", pa.int32(), nullable=True),
        pa.field("request", pa.int32(), nullable=False),  # request index within the client, from 0
        pa.field("queries", pa.int32(), nullable=False),  # queries the request carried (its batch)
        pa.field("t_start", pa.float64(), nullable=False),
        pa.field("t_end", pa.float64(), nullable=False),
        # Open loop only: when the schedule meant the request to be sent (apps/vdb/stages/open_loop.py).
        pa.field("t_intended", pa.float64(), nullable=True),
        # Open loop only: the request found every sender of its client busy and waited for one.
        pa.field("queued", pa.bool_(), nullable=True),
    ]
)
"""One row per request of a setting's measured window: every pass over the query set, not only the first.
A timed setting (``duration_s``) cycles through its queries; its raw rows (:data:`RAW_QUERY_SCHEMA`) keep
the first answer of each distinct query (recall), this file every request's timing (QPS, latency), so the
stored size grows by ~30 bytes per request, not by the returned ids."""

REQUESTS_SUFFIX = ".requests.parquet"
# The raw file's metadata key of an open-loop setting's schedule (JSON: rate, arrivals, seed, duration_s,
# scheduled, max_lag_ms), read back by the metrics (apps/evaluate/metrics.py).
OPEN_LOOP_META = "open_loop"


def requests_path(raw_path: str | Path) -> Path:
    """The requests file beside a raw file: ``raw/<s>.parquet`` -> ``raw/<s>.requests.parquet``."""
    raw_path = Path(raw_path)
    return raw_path.with_name(raw_path.name.removesuffix(".parquet") + REQUESTS_SUFFIX)


def requests_table(
    client: Sequence[int] | np.ndarray,
    rank: Sequence[int | None] | np.ndarray,
    request: Sequence[int] | np.ndarray,
    queries: Sequence[int] | np.ndarray,
    t_start: Sequence[float] | np.ndarray,
    t_end: Sequence[float] | np.ndarray,
    t_intended: Sequence[float] | np.ndarray | None = None,
    queued: Sequence[bool] | np.ndarray | None = None,
) -> pa.Table:
    """A table in :data:`REQUEST_SCHEMA` from per-request arrays (``rank`` entries may be None;
    ``t_intended`` and ``queued`` None: a closed-loop window, no intended times)."""
    columns = {
        "client": pa.array(np.asarray(client, np.int32)),
        "rank": pa.array([None if r is None else int(r) for r in rank], pa.int32()),
        "request": pa.array(np.asarray(request, np.int32)),
        "queries": pa.array(np.asarray(queries, np.int32)),
        "t_start": pa.array(np.asarray(t_start, np.float64)),
        "t_end": pa.array(np.asarray(t_end, np.float64)),
        "t_intended": (
            pa.nulls(len(t_end), pa.float64())
            if t_intended is None
            else pa.array(np.asarray(t_intended, np.float64))
        ),
        "queued": pa.nulls(len(t_end), pa.bool_()) if queued is None else pa.array(np.asarray(queued, bool)),
    }
    lengths = {len(c) for c in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"requests: columns of different lengths {sorted(lengths)}")
    return pa.Table.from_pydict(columns, schema=REQUEST_SCHEMA)


def requests_from_raw(raw: pa.Table) -> pa.Table:
    """The requests of raw rows (one per unique client × request): a file written without a requests
    file (a single pass, or before timed windows existed) carries every request in its rows."""
    raw = validate_raw(raw)
    if raw.num_rows == 0:
        return REQUEST_SCHEMA.empty_table()
    client = raw.column("client").to_numpy().astype(np.int64)
    request = raw.column("request").to_numpy().astype(np.int64)
    keys, first, group = np.unique(
        np.stack([client, request], axis=1), axis=0, return_index=True, return_inverse=True
    )
    group = group.reshape(-1)
    start = np.full(len(keys), np.inf)
    end = np.full(len(keys), -np.inf)
    np.minimum.at(start, group, raw.column("t_start").to_numpy())
    np.maximum.at(end, group, raw.column("t_end").to_numpy())
    ranks = raw.column("rank").to_pylist()
    return requests_table(keys[:, 0], [ranks[i] for i in first], keys[:, 1], np.bincount(group), start, end)


def read_requests(raw_path: str | Path, raw: pa.Table | None = None) -> pa.Table:
    """Every request of the setting in ``raw_path``: its requests file, else derived from its rows."""
    path = requests_path(raw_path)
    if path.exists():
        table = _read(path)
        for field in REQUEST_SCHEMA:  # columns added later (the open loop's) read as nulls
            if field.name not in table.column_names:
                table = table.append_column(field.name, pa.nulls(table.num_rows, field.type))
        return table.select(REQUEST_SCHEMA.names).cast(REQUEST_SCHEMA)
    return requests_from_raw(read_raw(raw_path) if raw is None else raw)
