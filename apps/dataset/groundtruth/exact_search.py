"""Running exact top-k over base vectors fed block by block: a float32 kernel proposes, float64 decides.

For each block a kernel (FAISS on the CPU, torch on a GPU) returns each query's ``kk`` nearest rows by
its own float32 arithmetic. Those candidates that could enter the running top-k are re-scored with
:func:`apps.dataset.groundtruth.exact_distance.ranking_values` (float64, fixed summation order) and merged by
(exact value, position in the stream); positions ascend with ids, so ties are broken by id.

Nothing is lost at the kernel's cut: a row the kernel did not return has a kernel value at least the
last one it returned, ``cut``, and so an exact value of at least ``cut − ε`` (ε:
:func:`apps.dataset.groundtruth.exact_distance.float32_error`). When the new k-th exact value is below that,
the block is done for the query; when not (duplicates, or a gap narrower than float32 can tell), the kernel is
asked again for twice the rows, for those queries only, until the bound clears or the whole block was
returned. The result therefore depends on neither the kernel, its BLAS or SIMD path, the thread count nor the
block size: the same ids and distances to the bit on every machine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from apps.dataset.groundtruth.exact_distance import float32_error, ranking_values, reported, squared_norms

_PAIR_FLOATS = 1 << 16  # float64 values per re-scoring chunk (512 KiB for each operand: in cache)
_POSITION_LIMIT = 1 << 62


def rescore_scratch_bytes(dim: int) -> int:
    """Peak temporaries of one thread's re-scoring, for one chunk of pairs: the gathered float32 operands,
    the float64 buffer of their products or differences (summed in place) and cosine's norms; counted
    generously as six float64 copies with ``dim`` rounded up to a power of two."""
    pairs = max(1, _PAIR_FLOATS // dim)
    return 6 * 8 * pairs * (1 << (dim - 1).bit_length())


# Norms a float32 kernel ranks within its error bound: squares and sums stay far from float32's underflow
# and overflow, and torch's normalisation floor (1e-12) lies below. Zero vectors are fine.
NORM_RANGE = (2.0**-40, 2.0**60)


def check_norms(norms: np.ndarray, what: str, labels: np.ndarray) -> None:
    """ValueError naming the first vector that is not finite or whose nonzero L2 norm is outside
    :data:`NORM_RANGE` (its float32 distances could not be bounded)."""
    low, high = NORM_RANGE
    bad = ~np.isfinite(norms) | ((norms != 0) & ((norms < low) | (norms > high)))
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        value = norms[first]
        reason = (
            "holds NaN or infinity"
            if not np.isfinite(value)
            else f"has L2 norm {value:.3g}, outside [{low:.3g}, {high:.3g}] (rescale the vectors)"
        )
        raise ValueError(f"{what} {int(labels[first])} {reason}: the exact search cannot rank it")


def margin(k: int) -> int:
    """Extra rows asked of the kernel per block beyond k, so that a few near ties at the k-th place need
    no second call; more costs every call's selection time for a rare gain."""
    return 2


class Kernel(Protocol):
    """A float32 nearest-neighbour kernel over one block at a time."""

    name: str

    def prepare(self, block: np.ndarray) -> Any:
        """The block as the kernel searches it (a normalised copy, a device tensor); ``block`` is kept."""

    def block_context(self) -> AbstractContextManager[None]:
        """Process-wide settings the kernel needs, held around one block's calls on the calling thread."""

    def knn(self, queries: np.ndarray, prepared: Any, kk: int) -> tuple[np.ndarray, np.ndarray]:
        """(kernel values (n, kk) float32, rows (n, kk) int64) of query rows ``queries``, nearest first:
        inner products (ip, cosine: largest first) or squared L2 distances (smallest first)."""


def kernel_ranking(raw: np.ndarray, metric: str) -> np.ndarray:
    """Kernel values -> ranking values (smaller is nearer), in float64 so no rounding is added."""
    values = np.asarray(raw, dtype=np.float64)
    if metric == "cosine":
        return 1.0 - values
    if metric == "ip":
        return -values
    return values


class _ScoredPairs:
    """Exact values of (query, block row) pairs already scored in one block, found by a sorted key."""

    def __init__(self, n_rows: int) -> None:
        self.n_rows = n_rows
        self.keys = np.zeros(0, np.int64)
        self.values = np.zeros(0, np.float64)

    def lookup(self, queries: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values, with NaN where unknown; mask of the unknown pairs)."""
        keys = queries.astype(np.int64) * self.n_rows + rows
        values = np.full(len(keys), np.nan)
        if not len(self.keys):
            return values, np.ones(len(keys), bool)
        at = np.searchsorted(self.keys, keys).clip(max=len(self.keys) - 1)
        hit = self.keys[at] == keys
        values[hit] = self.values[at[hit]]
        return values, ~hit

    def add(self, queries: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
        keys = np.concatenate([self.keys, queries.astype(np.int64) * self.n_rows + rows])
        order = np.argsort(keys, kind="stable")
        self.keys, self.values = keys[order], np.concatenate([self.values, values])[order]


class ExactSearch:
    """Running exact top-k of a fixed query set over base vectors fed block by block.

    ``slices`` split the queries into groups searched one kernel call each, ``parallel`` of them at once
    on threads (``thread_init`` runs first on each). Call :meth:`result` or :meth:`close` at the end.
    """

    def __init__(
        self,
        queries: np.ndarray,
        k: int,
        metric: str,
        kernel: Kernel,
        slices: list[slice] | None = None,
        parallel: int = 1,
        thread_init: Callable[[], None] | None = None,
        max_pairs: int = 1 << 21,
    ) -> None:
        self.q = np.ascontiguousarray(queries, dtype=np.float32)
        if self.q.ndim != 2 or not len(self.q):
            raise ValueError(f"queries must be a non-empty (n, dim) array, not shape {self.q.shape}")
        self.k, self.metric, self.kernel = k, metric, kernel
        self.q_sq = squared_norms(self.q)
        self.q_norms = np.sqrt(self.q_sq)
        check_norms(self.q_norms, "query row", np.arange(len(self.q)))
        self.max_pairs = max_pairs  # (query, row) pairs one kernel call may hold: bounds a repeat's memory
        n = len(self.q)
        self.slices = slices or [slice(0, n)]
        self.parallel = parallel
        self._thread_init = thread_init
        self._pool: ThreadPoolExecutor | None = None
        self.best_values = np.zeros((n, 0), np.float64)  # exact ranking values, ascending
        self.best_positions = np.zeros((n, 0), np.int64)
        self.best_ids = np.zeros((n, 0), np.int64)
        self.position = 0
        self.searches = 0  # kernel calls, first and repeated
        self.repeats = 0  # calls repeated for queries whose k-th place the bound could not clear
        self.rescored = 0  # candidate pairs re-scored in float64
        self._lock = threading.Lock()

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Fold one block of base vectors (and their ids, ascending along the stream) into the top-k; the
        block itself is never changed (a kernel that needs it normalised makes its own copy)."""
        n_rows = len(ids)
        if n_rows == 0:
            return
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.q.shape[1] or len(x) != n_rows:
            raise ValueError(f"a block of {n_rows} ids has vectors of shape {x.shape}, dim {self.q.shape[1]}")
        start = self.position
        self.position += n_rows
        if self.position >= _POSITION_LIMIT:
            raise ValueError("too many base vectors for the stream positions")
        block_ids = np.ascontiguousarray(ids, dtype=np.int64)
        norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
        check_norms(norms, "base vector id", block_ids)
        max_norm = float(norms.max())
        prepared = self.kernel.prepare(x)
        eps = float32_error(self.metric, x.shape[1], self.q_norms, max_norm)
        work = [(group, x, prepared, block_ids, start, eps) for group in self.slices]
        with self.kernel.block_context():
            if self.parallel == 1:
                parts = [self._fold(*args) for args in work]
            else:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.parallel, initializer=self._thread_init)
                parts = [f.result() for f in [self._pool.submit(self._fold, *args) for args in work]]
        self.best_values = np.concatenate([p[0] for p in parts])
        self.best_positions = np.concatenate([p[1] for p in parts])
        self.best_ids = np.concatenate([p[2] for p in parts])

    def _fold(
        self,
        group: slice,
        x: np.ndarray,
        prepared: Any,
        block_ids: np.ndarray,
        start: int,
        eps: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, positions, ids) of queries ``group`` after the block, the kernel's cut cleared."""
        values, positions = self.best_values[group], self.best_positions[group]
        found = self.best_ids[group]
        query_rows = np.arange(len(self.q))[group]
        n_rows, k = len(x), self.k
        kk = min(k + margin(k), n_rows)
        width = min(k, values.shape[1] + n_rows)
        out_values = np.empty((len(query_rows), width), np.float64)
        out_positions = np.empty((len(query_rows), width), np.int64)
        out_ids = np.empty((len(query_rows), width), np.int64)
        pending = np.arange(len(query_rows))
        calls = rescored = 0
        known = _ScoredPairs(n_rows)  # a repeated call returns the earlier rows again: score them once
        bound = values[:, k - 1].copy() if values.shape[1] == k else np.full(len(query_rows), np.inf)

        def attempt(part: np.ndarray, kk: int) -> np.ndarray:
            """One kernel call for the queries ``part`` (indices into the group); settle those whose cut
            is cleared, return their mask."""
            nonlocal calls, rescored
            rows_q = query_rows[part]
            raw, rows = self.kernel.knn(rows_q, prepared, kk)
            calls += 1
            if not np.isfinite(raw).all():
                raise ValueError(f"the {self.kernel.name} kernel gave a non-finite distance")
            approx = kernel_ranking(raw, self.metric)
            # Only a row within eps of the k-th exact value so far (before the block, or after the
            # previous call for this block, which can only be larger than the final one) can enter.
            candidate = approx <= (bound[part] + eps[rows_q])[:, None]
            exact = np.full(approx.shape, np.inf)
            pick_q, pick_c = np.nonzero(candidate)
            pair_queries, pair_rows = rows_q[pick_q], rows[pick_q, pick_c]
            scores, new = known.lookup(pair_queries, pair_rows)
            scores[new] = self._rescore(pair_queries[new], x, pair_rows[new])
            known.add(pair_queries[new], pair_rows[new], scores[new])
            exact[pick_q, pick_c] = scores
            rescored += int(new.sum())
            merged_values = np.concatenate([values[part], exact], axis=1)
            merged_positions = np.concatenate([positions[part], rows + start], axis=1)
            merged_ids = np.concatenate([found[part], block_ids[rows]], axis=1)
            order = np.lexsort((merged_positions, merged_values), axis=-1)[:, :width]
            new_values = np.take_along_axis(merged_values, order, axis=1)
            if kk == n_rows:
                done = np.ones(len(part), bool)
            else:  # rows not returned are at least the cut by the kernel, so at least cut - eps exactly
                done = new_values[:, k - 1] < approx[:, -1] - eps[rows_q]
            settled = part[done]
            out_values[settled] = new_values[done]
            out_positions[settled] = np.take_along_axis(merged_positions, order, axis=1)[done]
            out_ids[settled] = np.take_along_axis(merged_ids, order, axis=1)[done]
            if width == k:
                bound[part] = np.minimum(bound[part], new_values[:, k - 1])
            return done

        first_calls = 0
        while pending.size:
            # Queries whose cut did not clear are asked again for twice the rows; a call's arrays grow
            # with queries x rows, so the queries go in groups of at most max_pairs pairs.
            step = max(1, self.max_pairs // kk)
            still = [part[~attempt(part, kk)] for part in np.array_split(pending, -(-len(pending) // step))]
            first_calls = first_calls or calls
            pending = np.concatenate(still)
            kk = min(2 * kk, n_rows)
        with self._lock:
            self.searches += calls
            self.repeats += calls - first_calls
            self.rescored += rescored
        return out_values, out_positions, out_ids

    def _rescore(self, query_rows: np.ndarray, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Exact ranking values of the pairs (query ``query_rows[i]``, block row ``rows[i]``)."""
        out = np.empty(len(rows), np.float64)
        step = max(1, _PAIR_FLOATS // x.shape[1])
        for lo in range(0, len(rows), step):
            hi = lo + step
            chosen = query_rows[lo:hi]
            out[lo:hi] = ranking_values(self.q[chosen], x[rows[lo:hi]], self.metric, self.q_sq[chosen])
        return out

    def current(self) -> tuple[np.ndarray, np.ndarray]:
        """The top-k so far: (ids (Q, k) int64, distances (Q, k) float32), nearest first.

        Distances are 1 − cos, −inner product or L2, computed as
        :mod:`apps.dataset.groundtruth.exact_distance` does.
        """
        return self.best_ids.copy(), reported(self.best_values, self.metric).astype(np.float32)

    def close(self) -> None:
        """Stop the threads (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`current` at the end of the stream; stops the threads."""
        self.close()
        return self.current()
