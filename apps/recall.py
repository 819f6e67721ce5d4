"""Recall: exact distances recomputed from the vectors, and the base vectors fetched by id.

* :func:`recall_at_k`: tie-aware recall@k against the exact ground truth, with distances recomputed
  from the vectors (never the database's scores) by the ground truth's own float64 arithmetic
  (:func:`apps.exact_distance.exact_distances`: the same bits on every machine).
* :func:`fetch_vectors`: the base vectors the recall needs, gathered in one streaming pass over the
  dataset parts keeping only the requested rows (the returned ids and the exact top-k), so memory follows
  the result size, not the dataset size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from apps.exact_distance import exact_distances

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
        d = exact_distances(q, base_vectors[pos], metric)
        kth_pos, kth_found = base.positions(top[:, k - 1])
        kth = np.where(
            kth_found,
            exact_distances(q, base_vectors[kth_pos][:, None, :], metric)[:, 0],
            gt_dist[gt_row[lo:hi], k - 1],
        )
        threshold = kth + np.maximum(rel_tol * np.abs(kth), abs_tol)
        in_top = (ret[:, :, None] == top[:, None, :]).any(axis=2)
        hit = (in_top | (found & (d <= threshold[:, None]))) & (ret >= 0)
        repeated = ((ret[:, :, None] == ret[:, None, :]) & earlier).any(axis=2)
        per_row[lo:hi] = (hit & ~repeated).sum(axis=1) / k
    return float(per_row.mean()), per_row
