"""FAISS's brute-force kernels as the CPU candidate search of the exact top-k, and how to size its blocks.

Each block of base vectors goes through ``faiss.knn_inner_product`` / ``faiss.knn_L2sqr`` (the kernels behind
``IndexFlatIP`` / ``IndexFlatL2.search``, called on the block in place: no index, no copy into one), asking
for ``k + margin`` neighbours. FAISS's float32 distances only propose candidates: which of them are the
top-k, and in what order, is decided in float64 by :class:`apps.dataset.groundtruth.exact_search.ExactSearch`,
so the answer does not depend on the BLAS kernel OpenBLAS picks for the CPU, FAISS's SIMD level or the thread
count.

Threads work on separate slices of the queries (one FAISS call each, one OpenMP thread per call) rather
than together inside each call: FAISS's calls alternate parallel BLAS and selection phases with a barrier
after each 1,024-row tile and sort their results on one thread, so on a shared machine a thread held up
elsewhere stalls its partner at every barrier.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import numpy as np

from apps.dataset.groundtruth.exact_search import ExactSearch, margin, rescore_scratch_bytes

_TILE_QUERIES = 4096  # faiss.cvar.distance_compute_blas_query_bs: queries per BLAS tile
_TILE_BASE = 1024  # faiss.cvar.distance_compute_blas_database_bs: base rows per BLAS tile
MIN_BLOCK_ROWS = 1024
# FAISS computes distances per pair (SIMD) below 128,000 query floats (faiss.cvar.
# distance_compute_blas_threshold, counted as queries x dim), with BLAS above. For a search of many base
# vectors BLAS wins from about 4 queries on (measured with faiss 1.15.1 at dim 128, 384 and 784: 5x at 100
# queries x 128 dims, bigann10k's shape), so the stage moves the switch there during its own calls.
BLAS_MIN_QUERIES = 4
MIN_QUERIES_PER_THREAD = 16  # fewer: one call, its threads inside it (FAISS parallelises over the base)


def query_bytes(dim: int, k: int) -> int:
    """Working memory per query that does not depend on the block: vectors, running top-k, merge, FAISS."""
    kk = k + margin(k)
    # queries (+ normalised copy); running values, positions and ids; merge inputs, order and outputs;
    # the kernel's values and rows, their float64 ranking and exact values; FAISS's per-query reservoir
    # (2 kk candidates of value + label).
    return dim * 4 * 2 + k * 24 + (k + kk) * 32 + k * 24 + kk * 28 + 2 * kk * 12


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
    slices_at_once = query_slices(n_queries, dim, k, budget, threads or default_threads())[1]
    fixed = n_queries * query_bytes(dim, k) + scratch + slices_at_once * rescore_scratch_bytes(dim)
    per_row = dim * 4 * 2 + 8  # the block, its normalised copy, its norms
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


class FaissKernel:
    """FAISS's brute-force kernels on one block: ``knn_inner_product`` (cosine on normalised copies, ip)
    and ``knn_L2sqr`` (l2), called on the arrays in place."""

    name = "faiss"

    def __init__(self, queries: np.ndarray, metric: str) -> None:
        import faiss

        self.faiss, self.metric = faiss, metric
        q = np.array(queries, dtype=np.float32, order="C")  # a copy: normalised in place for cosine
        if metric == "cosine":
            faiss.normalize_L2(q)
        self.q = q
        self._buffer: np.ndarray | None = None  # for normalised copies, reused from block to block

    def prepare(self, block: np.ndarray) -> np.ndarray:
        """The block itself, or for cosine its normalised copy in a reused buffer (fresh memory for every
        block costs page faults)."""
        if self.metric != "cosine":
            return block
        if self._buffer is None or len(self._buffer) < len(block) or self._buffer.shape[1] != block.shape[1]:
            self._buffer = np.empty_like(block)
        out = self._buffer[: len(block)]
        np.copyto(out, block)
        self.faiss.normalize_L2(out)
        return out

    def block_context(self) -> contextlib.AbstractContextManager[None]:
        """FAISS's BLAS kernel from a few queries on, set once around a block's calls (a process-wide
        setting: the threads that search query slices must not each set and restore it)."""
        return blas_from(BLAS_MIN_QUERIES, self.q.shape[1])

    def knn(self, queries: np.ndarray, prepared: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
        """FAISS's top-``kk`` of query rows ``queries`` in the block: (inner products or squared L2, rows)."""
        faiss = self.faiss
        q = np.ascontiguousarray(self.q[queries])
        n, x = len(q), prepared
        raw = np.empty((n, kk), dtype=np.float32)
        rows = np.empty((n, kk), dtype=np.int64)
        ptr = faiss.swig_ptr
        if self.metric == "l2":
            faiss.knn_L2sqr(ptr(q), ptr(x), q.shape[1], n, len(x), kk, ptr(raw), ptr(rows))
        else:
            faiss.knn_inner_product(ptr(q), ptr(x), q.shape[1], n, len(x), kk, ptr(raw), ptr(rows))
        if (rows[:, -1] < 0).any():  # FAISS pads from the end when it finds fewer than asked
            raise ValueError("FAISS returned fewer neighbours than asked: NaN or infinity in the vectors?")
        return raw, rows


class FaissExactSearch(ExactSearch):
    """:class:`apps.dataset.groundtruth.exact_search.ExactSearch` with FAISS proposing the candidates on the
    CPU.

    ``threads``: FAISS's thread count in the calling thread unless given; with enough queries each thread
    searches its own slice of them (see the module docstring).
    """

    def __init__(
        self,
        queries: np.ndarray,
        k: int,
        metric: str,
        memory_budget_mb: int = 512,
        threads: int | None = None,
    ) -> None:
        q = np.asarray(queries)
        slices, parallel = query_slices(
            len(q), q.shape[1], k, memory_budget_mb * 2**20, threads or default_threads()
        )
        super().__init__(
            q,
            k,
            metric,
            FaissKernel(q, metric),
            slices,
            parallel,
            thread_init=_one_openmp_thread,
            max_pairs=max(1 << 16, memory_budget_mb * 2**20 // 256 // parallel),  # a quarter of the budget
        )
