"""Exact top-k on the CPU with FAISS's brute-force kernels, streamed block by block, ties broken by id.

Each block of base vectors goes through ``faiss.knn_inner_product`` / ``faiss.knn_L2sqr`` (the kernels behind
``IndexFlatIP`` / ``IndexFlatL2.search``, called on the block in place: no index, no copy into one), asking
for ``k + margin`` neighbours. The block's answer is folded into a running top-k ordered by
(distance, position in the dataset): each distance is packed with its position into one int64 whose order
is exactly that, so equal distances come out by position, i.e. by id, since ids ascend along the dataset.

FAISS orders equal distances as it likes and may cut a run of equal distances anywhere. Within what it
returns, the packed keys fix the order. Across the cut: the neighbours a block did *not* return are no
nearer than the last one it did, so when that last distance is beyond the running k-th distance nothing
was lost; when it equals it (a run of at least ``margin + 1`` equal distances at the k-th place), the block
is searched again with twice the neighbours, the same call on the same arrays, so the same distances to the
bit, until the run is whole. Real data pays for that only where such runs exist (duplicate vectors).

Threads work on separate slices of the queries (one FAISS call each, one OpenMP thread per call) rather
than together inside each call: FAISS's calls alternate parallel BLAS and selection phases with a barrier
after each 1,024-row tile and sort their results on one thread, so on a shared machine a thread held up
elsewhere stalls its partner at every barrier. Each query's arithmetic is the same either way.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_POSITION_BITS = 32  # positions up to 4.29e9 vectors
_TILE_QUERIES = 4096  # faiss.cvar.distance_compute_blas_query_bs: queries per BLAS tile
_TILE_BASE = 1024  # faiss.cvar.distance_compute_blas_database_bs: base rows per BLAS tile
MIN_BLOCK_ROWS = 1024
# FAISS computes distances per pair (SIMD) below 128,000 query floats (faiss.cvar.
# distance_compute_blas_threshold, counted as queries x dim), with BLAS above. For a search of many base
# vectors BLAS wins from about 4 queries on (measured with faiss 1.15.1 at dim 128, 384 and 784: 5x at 100
# queries x 128 dims, bigann10k's shape), so the stage moves the switch there during its own calls.
BLAS_MIN_QUERIES = 4
MIN_QUERIES_PER_THREAD = 16  # fewer: one call, its threads inside it (FAISS parallelises over the base)


def margin(k: int) -> int:
    """Extra neighbours asked of each block, so runs of up to two ties past the k-th place need no second
    search. More costs every search time (4% at k + k/8 on fmnist1k), for a rare gain."""
    return 2


def sortable(distances: np.ndarray) -> np.ndarray:
    """float32 array -> int64 array with the same order (the IEEE-754 sign trick; -0.0 counts as +0.0)."""
    bits = (np.asarray(distances, dtype=np.float32) + np.float32(0.0)).view(np.int32)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).astype(np.int64)  # negatives: flip all but the sign


def unsortable(keys: np.ndarray) -> np.ndarray:
    """Inverse of :func:`sortable` for the high half of a packed key -> float32 array."""
    high = (keys >> _POSITION_BITS).astype(np.int32)
    return (high ^ ((high >> 31) & 0x7FFFFFFF)).view(np.float32)


def query_bytes(dim: int, k: int) -> int:
    """Working memory per query that does not depend on the block: vectors, running top-k, merge, FAISS."""
    kk = k + margin(k)
    # queries (+ normalised copy); running keys + ids; merge inputs, order and outputs; FAISS's
    # distances + labels for the block and its per-query reservoir (2 kk candidates of value + label).
    return dim * 4 * 2 + k * 16 + (k + kk) * 32 + kk * 12 + 2 * kk * 12


def query_group(n_queries: int, dim: int, k: int, budget_bytes: int) -> int:
    """Queries per FAISS call, so one call's temporaries (BLAS tile, reservoirs) stay within a quarter of
    ``budget_bytes``; all of them at once unless the query set is large or the budget small."""
    per_query = _TILE_BASE * 4 + (k + margin(k)) * 12 * 3
    group = min(n_queries, _TILE_QUERIES, max(1, budget_bytes // 4 // per_query))
    return max(1, group)


def default_threads() -> int:
    """FAISS's OpenMP thread count in the calling thread (``faiss.omp_set_num_threads``)."""
    import faiss

    return faiss.omp_get_max_threads()


def query_slices(
    n_queries: int, dim: int, k: int, budget_bytes: int, threads: int
) -> tuple[list[slice], int]:
    """(query slices, how many run at once): a share of the queries per thread when there are enough of
    them, each cut to what one call may hold of the budget's quarter, shared by the concurrent calls."""
    parallel = threads if threads > 1 and n_queries >= threads * MIN_QUERIES_PER_THREAD else 1
    limit = query_group(n_queries, dim, k, budget_bytes // parallel)
    bounds = np.linspace(0, n_queries, parallel + 1).astype(int)
    slices = [
        slice(s, min(s + limit, hi))
        for lo, hi in itertools.pairwise(bounds.tolist())
        for s in range(lo, hi, limit)
    ]
    return slices, parallel


def faiss_scratch_bytes(n_queries: int, dim: int, k: int, budget_bytes: int, threads: int) -> int:
    """What FAISS itself allocates (C++, unseen by numpy) for the query slices searched at once: a BLAS
    tile of distances and a reservoir of 2 (k + margin) candidates per query."""
    slices, parallel = query_slices(n_queries, dim, k, budget_bytes, threads)
    widest = max(s.stop - s.start for s in slices)
    return parallel * (min(widest, _TILE_QUERIES) * _TILE_BASE * 4 + widest * 2 * (k + margin(k)) * 12)


def block_rows(n_queries: int, dim: int, k: int, memory_budget_mb: int, threads: int | None = None) -> int:
    """Base rows per block so the block (+ its normalised copy and norms), FAISS's scratch and the
    per-query state fit ``memory_budget_mb`` (at least ``MIN_BLOCK_ROWS``)."""
    budget = memory_budget_mb * 2**20
    scratch = faiss_scratch_bytes(n_queries, dim, k, budget, threads or default_threads())
    fixed = n_queries * query_bytes(dim, k) + scratch
    per_row = dim * 4 * 2 + 4
    return max(MIN_BLOCK_ROWS, int((budget - fixed) // per_row))


@contextlib.contextmanager
def blas_from(queries: int, dim: int) -> Iterator[None]:
    """FAISS's BLAS kernel from ``queries`` queries on, for the duration (a process-wide setting)."""
    import faiss

    saved = faiss.cvar.distance_compute_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = queries * dim
    try:
        yield
    finally:
        faiss.cvar.distance_compute_blas_threshold = saved


def _one_openmp_thread() -> None:
    import faiss

    faiss.omp_set_num_threads(1)  # this thread's own setting: the caller's is left alone


class FaissExactSearch:
    """Running exact top-k of a fixed query set over base vectors fed block by block (CPU, FAISS).

    ``threads``: FAISS's thread count in the calling thread unless given. Call :meth:`result` (or
    :meth:`close`) at the end: it stops the threads.
    """

    def __init__(
        self,
        queries: np.ndarray,
        k: int,
        metric: str,
        memory_budget_mb: int = 512,
        threads: int | None = None,
    ) -> None:
        import faiss

        self.faiss = faiss
        self.k, self.metric = k, metric
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if metric == "cosine":
            q = q.copy() if q is queries else q  # normalised in place: not the caller's array
            faiss.normalize_L2(q)
        self.q = q
        self.slices, self.parallel = query_slices(
            len(q), q.shape[1], k, memory_budget_mb * 2**20, threads or default_threads()
        )
        self._pool: ThreadPoolExecutor | None = None
        n = len(q)
        self.best_keys = np.zeros((n, 0), dtype=np.int64)
        self.best_ids = np.zeros((n, 0), dtype=np.int64)
        self.position = 0
        self._buffer: np.ndarray | None = None  # for normalised copies, reused from block to block
        self.searches = 0  # FAISS calls, first and repeated: how often a run of ties cost a second search
        self.repeats = 0

    def _scratch(self, x: np.ndarray) -> np.ndarray:
        """A copy of ``x`` in the reused buffer (fresh memory for every block costs page faults)."""
        if self._buffer is None or len(self._buffer) < len(x) or self._buffer.shape[1] != x.shape[1]:
            self._buffer = np.empty_like(x)
        out = self._buffer[: len(x)]
        np.copyto(out, x)
        return out

    def _knn(self, q: np.ndarray, x: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
        """FAISS's exact top-``kk`` of ``q`` in ``x``: (distances as reported, nearest first; rows)."""
        faiss = self.faiss
        n = len(q)
        raw = np.empty((n, kk), dtype=np.float32)
        rows = np.empty((n, kk), dtype=np.int64)
        ptr = faiss.swig_ptr
        if self.metric == "l2":
            faiss.knn_L2sqr(ptr(q), ptr(x), q.shape[1], n, len(x), kk, ptr(raw), ptr(rows))
        else:
            faiss.knn_inner_product(ptr(q), ptr(x), q.shape[1], n, len(x), kk, ptr(raw), ptr(rows))
        if (rows[:, -1] < 0).any():  # FAISS pads from the end when it finds fewer than asked
            raise ValueError("FAISS returned fewer neighbours than asked: NaN or infinity in the vectors?")
        # Monotone in FAISS's own order, so its cut stays a cut: IP -> -ip, cosine -> 1 - cos, L2 -> sqrt.
        if self.metric == "ip":
            distances = -raw
        elif self.metric == "cosine":
            distances = np.float32(1.0) - raw
        else:
            distances = np.sqrt(raw)
        return distances, rows

    def _fold(self, keys: np.ndarray, ids: np.ndarray, new_keys: np.ndarray, new_ids: np.ndarray):
        """Merge the running (keys, ids) of some queries with a block's: the k smallest keys, sorted."""
        if not keys.shape[1]:
            if (new_keys[:, 1:] > new_keys[:, :-1]).all():  # FAISS's order is already ours: no ties in it
                return new_keys[:, : self.k].copy(), new_ids[:, : self.k].copy()
            all_keys, all_ids = new_keys, new_ids
        else:
            all_keys = np.concatenate([keys, new_keys], axis=1)
            all_ids = np.concatenate([ids, new_ids], axis=1)
        # Keys are all distinct, so any sort is exact; the stable one (timsort) is quickest on what this
        # is: two sorted runs, or one nearly sorted (FAISS's order, up to ties).
        order = np.argsort(all_keys, axis=1, kind="stable")[:, : self.k]
        flat = order + (np.arange(len(order)) * all_keys.shape[1])[:, None]  # take_along_axis, 2x faster
        return np.take(all_keys, flat), np.take(all_ids, flat)

    def add(self, ids: np.ndarray, vectors: np.ndarray, owned: bool = False) -> None:
        """Fold one block of base vectors (and their ids, ascending along the stream) into the top-k.

        ``owned``: the caller hands the block over, so cosine may normalise it in place.
        """
        n_rows = len(ids)
        if n_rows == 0:
            return
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        if self.metric == "cosine":
            if not owned and x is vectors:
                x = self._scratch(x)
            self.faiss.normalize_L2(x)
        block_ids = np.ascontiguousarray(ids, dtype=np.int64)
        start = self.position
        self.position += n_rows
        if self.position >= 1 << _POSITION_BITS:
            raise ValueError("more than 2**32 base vectors: widen the packed position")
        with blas_from(BLAS_MIN_QUERIES, x.shape[1]):
            if self.parallel == 1:
                parts = [self._block_topk(x, block_ids, start, rows_g) for rows_g in self.slices]
            else:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.parallel, initializer=_one_openmp_thread)
                work = [self._pool.submit(self._block_topk, x, block_ids, start, g) for g in self.slices]
                parts = [future.result() for future in work]
        self.best_keys = np.concatenate([keys for keys, _, _ in parts])
        self.best_ids = np.concatenate([found for _, found, _ in parts])
        self.searches += sum(searches for _, _, searches in parts)
        self.repeats += sum(searches - 1 for _, _, searches in parts)

    def _block_topk(self, x: np.ndarray, block_ids: np.ndarray, start: int, rows_g: slice):
        """(keys, ids, FAISS calls) of queries ``rows_g`` after block ``x``, ties at the cut made whole."""
        n_rows = len(x)
        kk = min(self.k + margin(self.k), n_rows)
        searches = 0
        while True:
            distances, rows = self._knn(self.q[rows_g], x, kk)
            searches += 1
            keys = (sortable(distances) << _POSITION_BITS) | (rows + start)
            best_keys, best_ids = self._fold(
                self.best_keys[rows_g], self.best_ids[rows_g], keys, block_ids[rows]
            )
            if kk == n_rows or best_keys.shape[1] < self.k:
                return best_keys, best_ids, searches
            # The block's last returned distance equal to the new k-th: more of that run may be unseen.
            cut = best_keys[:, -1] >> _POSITION_BITS
            if not (sortable(distances[:, -1]) <= cut).any():
                return best_keys, best_ids, searches
            kk = min(2 * kk, n_rows)

    def close(self) -> None:
        """Stop the threads (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(neighbour ids (Q, k) int64, distances (Q, k) float32), nearest first.

        Distances are 1 - cosine, -inner product, or L2.
        """
        self.close()
        return self.best_ids, unsortable(self.best_keys)
