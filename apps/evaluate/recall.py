"""Recall: tie-aware recall@k with exact distances recomputed from the vectors.

* :func:`recall_at_k`: tie-aware recall@k against the exact ground truth, with distances recomputed
  from the vectors (never the database's scores) by the ground truth's own float64 arithmetic
  (:func:`apps.dataset.groundtruth.exact_distance.exact_distances`: the same bits on every machine).
* :func:`needed_base_ids`: the base vectors the recall needs (the returned ids and the exact top-k), which
  :func:`apps.dataset.lookup.fetch_vectors` gathers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from apps.dataset.groundtruth.exact_distance import TIE_ATOL, TIE_RTOL, exact_distances
from apps.dataset.lookup import VectorSource, as_lookup


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
    rel_tol: float = TIE_RTOL,
    abs_tol: float = TIE_ATOL,
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
