"""Measure, then evaluate: the raw query-result layout and the metrics computed from it.

The query stage stores what it measured, one Parquet file per database × setting, one row per query
(:data:`RAW_QUERY_SCHEMA`): the returned ids and scores and the wall-clock start and end of the request
(one batch) that carried the query. Everything below is computed afterwards from those rows, so a metric
can be corrected without re-running a cluster (ARCHITECTURE.md, "Metric definitions"):

* :func:`qps`: queries completed ÷ wall time of the query phase (max ``t_end`` − min ``t_start``);
  a batch of B queries counts B.
* :func:`latency_stats`: end-to-end time of each request (unique ``client``, ``request``): mean, P50,
  P95, P99 in milliseconds.
* :func:`recall_at_k`: tie-aware recall@k against the exact ground truth, with distances recomputed
  from the vectors (never the database's scores).
* :func:`evaluate`: all of the above per setting; :func:`best_operating_point`: the studies' selection
  rule (highest QPS among settings with recall ≥ 0.95).

Base vectors for the recall come from :func:`fetch_vectors`, which streams the dataset parts and keeps
only the requested rows (the returned ids and the exact top-k), so memory follows the result size, not
the dataset size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# ---------------------------------------------------------------------------------------------------------
# Raw query results
# ---------------------------------------------------------------------------------------------------------

RAW_QUERY_SCHEMA = pa.schema(
    [
        pa.field("database", pa.string(), nullable=False),
        pa.field("setting", pa.string(), nullable=False),  # setting_label(...), e.g. "ef=64,batch=32,..."
        pa.field("ef", pa.int32(), nullable=True),  # search-time parameter; null when not applicable
        pa.field("batch_size", pa.int32(), nullable=False),
        pa.field("clients", pa.int32(), nullable=False),
        pa.field("k", pa.int32(), nullable=False),
        pa.field("client", pa.int32(), nullable=False),  # index of the client process
        pa.field("request", pa.int32(), nullable=False),  # request (batch) index within the client
        pa.field("query_id", pa.int64(), nullable=False),
        pa.field("ids", pa.list_(pa.int64()), nullable=False),  # returned ids, nearest first; -1 pads
        pa.field("scores", pa.list_(pa.float32()), nullable=False),  # as the database reports them
        pa.field("t_start", pa.float64(), nullable=False),  # time.time() when the request was sent
        pa.field("t_end", pa.float64(), nullable=False),  # time.time() when its answer was complete
    ]
)
"""One row per query. Every query of one request (batch) shares ``client``, ``request``, ``t_start``
and ``t_end``. Files may hold several requests and clients; one file per database × setting."""

_SETTING_COLUMNS = ("database", "setting", "ef", "batch_size", "clients", "k")


def setting_label(ef: int | None, batch_size: int, clients: int, k: int) -> str:
    """The canonical ``setting`` string: ``ef=64,batch=32,clients=2,k=10`` (``ef=none`` without ef)."""
    ef_text = "none" if ef is None else str(int(ef))
    return f"ef={ef_text},batch={int(batch_size)},clients={int(clients)},k={int(k)}"


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
) -> pa.Table:
    """Build a table in :data:`RAW_QUERY_SCHEMA` from Python lists / numpy arrays.

    ``query_ids`` gives the number of rows n. ``client``, ``request``, ``t_start`` and ``t_end`` are
    scalars (one request: every row shares them) or per-row arrays. ``ids`` / ``scores`` are (n, m)
    arrays (e.g. ``SearchResult.ids`` / ``.scores``) or ragged sequences. ``setting`` defaults to
    :func:`setting_label`. Concatenate the tables of many requests with :func:`concat_raw`.
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
    return concat_raw(pq.read_table(p) for p in paths)


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
    setting. NaN when the phase has no measurable duration.
    """
    _single_group(raw, "qps")
    wall = pc.max(raw.column("t_end")).as_py() - pc.min(raw.column("t_start")).as_py()
    return raw.num_rows / wall if wall > 0 else math.nan


def _requests(raw: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) per unique request (client, request)."""
    client = raw.column("client").to_numpy().astype(np.int64)
    request = raw.column("request").to_numpy().astype(np.int64)
    _, group = np.unique(np.stack([client, request], axis=1), axis=0, return_inverse=True)
    group = group.reshape(-1)
    count = int(group.max()) + 1
    start = np.full(count, np.inf)
    end = np.full(count, -np.inf)
    np.minimum.at(start, group, raw.column("t_start").to_numpy())
    np.maximum.at(end, group, raw.column("t_end").to_numpy())
    return start, end


def latency_stats(raw: pa.Table) -> dict[str, float | int]:
    """Latency of each request (one batch; unique client × request) in milliseconds.

    Returns ``requests``, ``latency_mean_ms``, ``p50_ms``, ``p95_ms``, ``p99_ms`` (percentiles with
    linear interpolation between order statistics, numpy's default).
    """
    _single_group(raw, "latency_stats")
    start, end = _requests(raw)
    latency_ms = (end - start) * 1000.0
    if (latency_ms < 0).any():
        raise ValueError("latency_stats: a request ends before it starts (t_end < t_start)")
    p50, p95, p99 = np.percentile(latency_ms, [50, 95, 99])
    return {
        "requests": len(latency_ms),
        "latency_mean_ms": float(latency_ms.mean()),
        "p50_ms": float(p50),
        "p95_ms": float(p95),
        "p99_ms": float(p99),
    }


# ---------------------------------------------------------------------------------------------------------
# Vectors by id
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VectorLookup:
    """Vectors addressed by int64 id: ``ids`` sorted and unique, ``vectors[i]`` belongs to ``ids[i]``."""

    ids: np.ndarray
    vectors: np.ndarray

    @classmethod
    def from_arrays(cls, ids: Any, vectors: Any) -> VectorLookup:
        """From parallel ids (n,) and vectors (n, dim); a repeated id keeps its first vector."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(ids):
            raise ValueError(f"ids {ids.shape} and vectors {vectors.shape} do not match")
        unique, first = np.unique(ids, return_index=True)
        return cls(unique, np.ascontiguousarray(vectors[first]))

    @classmethod
    def from_mapping(cls, mapping: Mapping[int, Any]) -> VectorLookup:
        """From a dict id -> vector."""
        if not mapping:
            return cls(np.zeros(0, np.int64), np.zeros((0, 0), np.float32))
        ids = np.fromiter((int(i) for i in mapping), dtype=np.int64, count=len(mapping))
        return cls.from_arrays(ids, np.stack([np.asarray(v, np.float32) for v in mapping.values()]))

    @classmethod
    def from_table(
        cls, table: pa.Table, id_column: str = "id", vector_column: str = "embedding"
    ) -> VectorLookup:
        """From a table with an id column and a fixed_size_list vector column (queries.parquet)."""
        from apps.dataset import arrow_to_vectors

        return cls.from_arrays(
            table.column(id_column).to_numpy(), arrow_to_vectors(table.column(vector_column))
        )

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1]) if self.vectors.ndim == 2 else 0

    def positions(self, ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """(row positions, found mask) of ``ids`` (any shape); positions of unknown ids are 0."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(self.ids) == 0:
            return np.zeros(ids.shape, np.int64), np.zeros(ids.shape, bool)
        pos = np.searchsorted(self.ids, ids).clip(max=len(self.ids) - 1)
        found = self.ids[pos] == ids
        return np.where(found, pos, 0), found

    def missing(self, ids: Any) -> np.ndarray:
        """The ids (unique, sorted) that this lookup does not hold."""
        ids = np.unique(np.asarray(ids, dtype=np.int64))
        return ids[~self.positions(ids)[1]]

    def get(self, ids: Any) -> np.ndarray:
        """Vectors of ``ids`` (n,) -> (n, dim); KeyError naming the first unknown id."""
        pos, found = self.positions(np.asarray(ids, dtype=np.int64).reshape(-1))
        if not found.all():
            raise KeyError(f"no vector for id {int(np.asarray(ids).reshape(-1)[~found][0])}")
        return self.vectors[pos]


VectorSource = VectorLookup | Mapping[int, Any] | tuple[Any, Any] | pa.Table


def as_lookup(source: VectorSource) -> VectorLookup:
    """A :class:`VectorLookup` from a lookup, a dict id -> vector, an (ids, vectors) pair in either order,
    or a table with ``id`` and ``embedding`` columns."""
    if isinstance(source, VectorLookup):
        return source
    if isinstance(source, pa.Table):
        return VectorLookup.from_table(source)
    if isinstance(source, Mapping):
        return VectorLookup.from_mapping(source)
    if isinstance(source, tuple | list) and len(source) == 2:
        a, b = (np.asarray(x) for x in source)
        return VectorLookup.from_arrays(a, b) if b.ndim == 2 else VectorLookup.from_arrays(b, a)
    raise TypeError(f"cannot use {type(source).__name__} as vectors by id")


def fetch_vectors(dataset_dir: str | Path, ids: Any, batch_rows: int = 8192) -> VectorLookup:
    """The base vectors of ``ids``, gathered in one streaming pass over the dataset parts.

    Only the requested rows are kept (memory follows ``len(ids)``, not the dataset). Ids absent from
    the dataset (and -1 pads) are simply not in the result: check with ``lookup.missing(ids)``.
    """
    from apps.dataset import iter_vectors

    wanted = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
    wanted = wanted[wanted >= 0]
    kept_ids: list[np.ndarray] = []
    kept_vectors: list[np.ndarray] = []
    dim = 0
    for batch_ids, vectors in iter_vectors(Path(dataset_dir), batch_rows=batch_rows):
        dim = vectors.shape[1]
        if len(wanted) == 0:
            break
        keep = np.isin(batch_ids, wanted)
        if keep.any():
            kept_ids.append(batch_ids[keep].astype(np.int64))
            kept_vectors.append(np.array(vectors[keep], dtype=np.float32))
    if not kept_ids:
        return VectorLookup(np.zeros(0, np.int64), np.zeros((0, dim), np.float32))
    return VectorLookup.from_arrays(np.concatenate(kept_ids), np.concatenate(kept_vectors))


def read_query_vectors(queries_file: str | Path) -> VectorLookup:
    """Query vectors by id from ``queries.parquet`` (columns ``id``, ``embedding``)."""
    return VectorLookup.from_table(pq.read_table(queries_file, columns=["id", "embedding"]))


def read_groundtruth(path: str | Path) -> pa.Table:
    """``groundtruth.parquet`` (query_id, neighbors, distances)."""
    return pq.read_table(path, columns=["query_id", "neighbors", "distances"])


def needed_base_ids(raw: pa.Table, groundtruth: pa.Table, k: int | None = None) -> np.ndarray:
    """Ids whose vectors :func:`recall_at_k` needs: every returned id and the exact top-k of each query."""
    returned = pc.list_flatten(raw.column("ids")).to_numpy()
    gt = _fixed_matrix(groundtruth.column("neighbors"), np.int64)
    if k is not None:
        gt = gt[:, :k]
    both = np.unique(np.concatenate([returned.astype(np.int64), gt.ravel()]))
    return both[both >= 0]


# ---------------------------------------------------------------------------------------------------------
# Recall
# ---------------------------------------------------------------------------------------------------------


def _fixed_matrix(column: pa.Array | pa.ChunkedArray, dtype: Any) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_fixed_size_list(column.type):
        width = column.type.list_size
    else:  # a plain list column of equal lengths
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        if len(set(lengths.tolist())) > 1:
            raise ValueError("ground truth rows have different lengths")
        width = int(lengths[0]) if len(lengths) else 0
    return column.flatten().to_numpy(zero_copy_only=False).astype(dtype).reshape(-1, width)


def _returned_matrix(column: pa.ChunkedArray | pa.Array, k: int) -> np.ndarray:
    """Ragged list<int64> -> (n, k) int64: the first k returned ids, -1 where fewer were returned."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n = len(column)
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.int64)
    out = np.full((n, k), -1, dtype=np.int64)
    rows = np.repeat(np.arange(n), lengths)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    take = cols < k
    out[rows[take], cols[take]] = flat[take]
    return out


def distances(queries: np.ndarray, vectors: np.ndarray, metric: str) -> np.ndarray:
    """Exact distances in float64, the ground-truth stage's definitions: 1 − cos, −ip, or L2.

    ``queries`` (n, dim), ``vectors`` (n, m, dim) -> (n, m).
    """
    q = np.asarray(queries, dtype=np.float64)
    x = np.asarray(vectors, dtype=np.float64)
    if metric == "cosine":
        qn = np.linalg.norm(q, axis=-1, keepdims=True)
        xn = np.linalg.norm(x, axis=-1, keepdims=True)
        q = q / np.where(qn > 0, qn, 1.0)
        x = x / np.where(xn > 0, xn, 1.0)
        return 1.0 - np.einsum("nd,nmd->nm", q, x)
    if metric == "ip":
        return -np.einsum("nd,nmd->nm", q, x)
    if metric == "l2":
        diff = x - q[:, None, :]
        return np.sqrt(np.einsum("nmd,nmd->nm", diff, diff))
    raise ValueError(f"unknown metric {metric!r}; expected cosine, ip or l2")


def _single_k(raw: pa.Table) -> int:
    values = pc.unique(raw.column("k")).to_pylist()
    if len(values) != 1:
        raise ValueError(f"recall_at_k: the raw rows have several k values {sorted(values)}; pass k")
    return int(values[0])


def recall_at_k(
    raw: pa.Table,
    groundtruth_table: pa.Table,
    query_vectors: VectorSource,
    base_lookup: VectorSource,
    metric: str,
    k: int | None = None,
    rel_tol: float = 1e-5,
    abs_tol: float = 1e-6,
) -> tuple[float, np.ndarray]:
    """Tie-aware recall@k of every raw row; returns (mean, per-row recall aligned with ``raw``).

    A returned id (among the first ``k`` returned) is a hit when it is in the exact top-k, or when its
    exact distance to the query, recomputed from the vectors, is at most the k-th exact distance plus a
    tolerance ``max(rel_tol × |d_k|, abs_tol)`` (the absolute part covers zero distances; using |d_k|
    keeps the direction right for the negative −ip distances). The k-th exact distance is recomputed the
    same way from the vector of the k-th exact neighbour (falling back to the stored distance when that
    vector is not in ``base_lookup``). A repeated id counts once, -1 pads and ids not in ``base_lookup``
    (and not in the exact top-k) are misses; recall = hits / k. The database's scores are not used.

    ``query_vectors`` and ``base_lookup``: a :class:`VectorLookup`, a dict id -> vector or an
    (ids, vectors) pair. ``base_lookup`` needs at least :func:`needed_base_ids` (see
    :func:`fetch_vectors`). ``k`` defaults to the raw rows' ``k`` column.
    """
    if raw.num_rows == 0:
        return math.nan, np.zeros(0)
    k = _single_k(raw) if k is None else int(k)
    if k <= 0:
        raise ValueError(f"recall_at_k: k must be positive, got {k}")
    gt_qids = groundtruth_table.column("query_id").to_numpy().astype(np.int64)
    gt_ids = _fixed_matrix(groundtruth_table.column("neighbors"), np.int64)
    gt_dist = _fixed_matrix(groundtruth_table.column("distances"), np.float64)
    if gt_ids.shape[1] < k:
        raise ValueError(f"recall_at_k: ground truth holds {gt_ids.shape[1]} neighbours per query, k={k}")
    order = np.argsort(gt_qids, kind="stable")
    qids = raw.column("query_id").to_numpy().astype(np.int64)
    slot = np.searchsorted(gt_qids[order], qids).clip(max=max(len(order) - 1, 0))
    known = (gt_qids[order][slot] == qids) if len(order) else np.zeros(len(qids), bool)
    if not known.all():
        raise ValueError(f"recall_at_k: query id {int(qids[~known][0])} has no ground truth")
    gt_row = order[slot]
    queries = as_lookup(query_vectors)
    qpos, qfound = queries.positions(qids)
    if not qfound.all():
        raise ValueError(f"recall_at_k: no vector for query id {int(qids[~qfound][0])}")
    base = as_lookup(base_lookup)
    base_vectors = base.vectors if len(base) else np.zeros((1, queries.dim), np.float32)
    returned = _returned_matrix(raw.column("ids"), k)

    per_row = np.empty(len(qids), dtype=np.float64)
    step = max(1, (1 << 22) // max(1, (k + 1) * max(queries.dim, 1)))  # ~32 MB of float64 per chunk
    earlier = np.tril(np.ones((k, k), dtype=bool), -1)  # earlier[i, j]: j comes before i
    for lo in range(0, len(qids), step):
        hi = min(lo + step, len(qids))
        q = queries.vectors[qpos[lo:hi]]
        ret = returned[lo:hi]
        top = gt_ids[gt_row[lo:hi], :k]
        pos, found = base.positions(ret)
        d = distances(q, base_vectors[pos], metric)
        kth_pos, kth_found = base.positions(top[:, k - 1])
        kth = np.where(
            kth_found,
            distances(q, base_vectors[kth_pos][:, None, :], metric)[:, 0],
            gt_dist[gt_row[lo:hi], k - 1],
        )
        threshold = kth + np.maximum(rel_tol * np.abs(kth), abs_tol)
        in_top = (ret[:, :, None] == top[:, None, :]).any(axis=2)
        hit = (in_top | (found & (d <= threshold[:, None]))) & (ret >= 0)
        repeated = ((ret[:, :, None] == ret[:, None, :]) & earlier).any(axis=2)
        per_row[lo:hi] = (hit & ~repeated).sum(axis=1) / k
    return float(per_row.mean()), per_row


# ---------------------------------------------------------------------------------------------------------
# Per-setting evaluation and the operating point
# ---------------------------------------------------------------------------------------------------------


def _setting_sort_key(row: dict[str, Any]) -> tuple:
    return (
        row["k"],
        row["batch_size"],
        row["clients"],
        -1 if row["ef"] is None else row["ef"],
        row["setting"],
    )


def evaluate(
    raw_table: pa.Table,
    groundtruth: pa.Table,
    query_vectors: VectorSource,
    base_lookup: VectorSource,
    metric: str,
    *,
    rel_tol: float = 1e-5,
    abs_tol: float = 1e-6,
) -> dict[str, dict[str, Any]]:
    """Metrics of every setting in the raw rows of ONE database: ``{setting: row}``.

    Each row is ready for :func:`apps.report.write_results` (add provenance keys): ``database``,
    ``stage="query"``, ``status="ok"``, ``setting``, ``ef``, ``batch_size``, ``clients``, ``k``,
    ``queries``, ``requests``, ``duration_s``, ``qps``, ``latency_mean_ms``, ``p50_ms``, ``p95_ms``,
    ``p99_ms``, ``recall`` (mean tie-aware recall@k), ``recall_min`` and ``unknown_ids`` (returned ids
    that are not in ``base_lookup``: a sign of an id-mapping bug when the lookup came from
    :func:`fetch_vectors`). Rows are ordered by k, batch size, clients, ef.
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
        wall = pc.max(part.column("t_end")).as_py() - pc.min(part.column("t_start")).as_py()
        rows.append(
            {
                **first,
                "stage": "query",
                "status": "ok",
                "queries": part.num_rows,
                "duration_s": float(wall),
                "qps": qps(part),
                **latency_stats(part),
                "recall": mean_recall,
                "recall_min": float(per_query.min()),
                "unknown_ids": int((~base.positions(returned)[1]).sum()),
            }
        )
    rows.sort(key=_setting_sort_key)
    return {row["setting"]: row for row in rows}


def evaluate_files(
    raw_files: Iterable[str | Path],
    groundtruth_file: str | Path,
    queries_file: str | Path,
    dataset_dir: str | Path,
    metric: str,
) -> list[dict[str, Any]]:
    """Evaluate raw files of any databases in one pass over the dataset; returns result rows."""
    tables = [read_raw(p) for p in raw_files]
    if not tables:
        return []
    raw = pa.concat_tables(tables)
    groundtruth = read_groundtruth(groundtruth_file)
    base = fetch_vectors(dataset_dir, needed_base_ids(raw, groundtruth))
    queries = read_query_vectors(queries_file)
    rows: list[dict[str, Any]] = []
    for database in pc.unique(raw.column("database")).to_pylist():
        part = raw.filter(pc.equal(raw.column("database"), database))
        rows.extend(evaluate(part, groundtruth, queries, base, metric).values())
    return rows


def best_operating_point(rows: Iterable[dict[str, Any]], min_recall: float = 0.95) -> dict[str, Any] | None:
    """The row with the highest QPS among those with recall ≥ ``min_recall`` (None when none qualifies).

    Rows of other stages, failed rows and rows without a finite QPS or recall are ignored; equal QPS
    prefers the higher recall. Pass the rows of one database to get its operating point.
    """
    best = None
    for row in rows:
        if row.get("stage", "query") != "query" or row.get("status", "ok") not in (None, "ok"):
            continue
        q, r = row.get("qps"), row.get("recall")
        if q is None or r is None or not (math.isfinite(q) and math.isfinite(r)):
            continue
        if r >= min_recall and (best is None or (q, r) > (best["qps"], best["recall"])):
            best = row
    return best
