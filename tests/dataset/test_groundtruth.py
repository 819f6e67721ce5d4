"""Exact ground truth: reproduces published neighbours, breaks ties by id, streams within a budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from apps.dataset.groundtruth.faiss_kernel import FaissExactSearch, margin, query_slices
from apps.dataset.groundtruth.stage import block_rows, exact_topk, rebatch
from apps.interchange.vecs import read_bin, read_vecs


def batches(vectors: np.ndarray, size: int, ids: np.ndarray | None = None):
    ids = np.arange(len(vectors)) if ids is None else ids
    for start in range(0, len(vectors), size):
        yield ids[start : start + size], vectors[start : start + size]


def brute_force(queries: np.ndarray, base: np.ndarray, k: int, metric: str) -> np.ndarray:
    q, b = queries.astype(np.float64), base.astype(np.float64)
    if metric == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        b = b / np.linalg.norm(b, axis=1, keepdims=True)
        d = 1 - q @ b.T
    elif metric == "ip":
        d = -(q @ b.T)
    else:
        d = ((q[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    return np.argsort(d, axis=1, kind="stable")[:, :k]


def test_reproduces_fmnist1k_published_neighbours(shared_data: Path) -> None:
    root = shared_data / "ann" / "fmnist1k"
    base = read_vecs(root / "fmnist1k_base.fvecs")
    queries = read_vecs(root / "fmnist1k_query.fvecs")
    published = read_vecs(root / "fmnist1k_groundtruth.ivecs")
    assert base.shape == (1000, 784) and queries.shape == (500, 784) and published.shape == (500, 100)
    ids, distances = exact_topk(queries, batches(base, 128), 100, "l2", memory_budget_mb=16)
    q64, b64 = queries.astype(np.float64), base.astype(np.float64)  # float64 products: a reference far finer
    squared = (q64 * q64).sum(1)[:, None] + (b64 * b64).sum(1)[None, :] - 2.0 * (q64 @ b64.T)  # than float32
    exact = np.sqrt(np.clip(squared, 0.0, None))
    for row in range(len(queries)):
        ours, theirs = set(ids[row]), set(published[row])
        kth = np.sort(exact[row])[99]
        # any disagreement must be a tie at the 100th distance
        for neighbour in ours ^ theirs:
            assert exact[row, neighbour] == pytest.approx(kth, rel=1e-6)
    assert (ids == published).mean() > 0.99
    np.testing.assert_allclose(distances, np.sort(exact, axis=1)[:, :100], rtol=1e-4)


def test_ties_broken_by_distance_then_id() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(size=(50, 8)).astype(np.float32)
    base[[40, 3, 17]] = base[25]  # four identical vectors: ids 3, 17, 25, 40
    query = base[25:26] + 1e-3
    ids, distances = exact_topk(query, batches(base, 7), 4, "l2")
    assert ids[0].tolist() == [3, 17, 25, 40]
    assert len(set(distances[0].tolist())) == 1


@pytest.mark.parametrize("engine", ["faiss", "torch"])
@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_metrics_match_brute_force(metric: str, engine: str) -> None:
    rng = np.random.default_rng(1)
    base = rng.normal(size=(3000, 32)).astype(np.float32)
    queries = rng.normal(size=(40, 32)).astype(np.float32)
    ids, _ = exact_topk(queries, batches(base, 500), 10, metric, memory_budget_mb=16, engine=engine)
    np.testing.assert_array_equal(ids, brute_force(queries, base, 10, metric))
    blocks, _ = exact_topk(queries, batches(base, 500), 10, metric, engine=engine, rows=333)
    np.testing.assert_array_equal(blocks, ids)


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_faiss_ties_across_blocks_and_at_kth_are_broken_by_id(metric: str) -> None:
    """Runs of equal distances split over blocks and cut at the k-th place come out by position.

    Twelve copies of one vector, ten of them in one 16-row block (more than the k + margin FAISS is asked
    for, so the block is searched again), the rest in other blocks; two exact copies of the query nearer
    still (for cosine and L2; for inner product the copies of the vector win). k = 6 takes both query
    copies and then the four lowest positions of the twelve (inner product: the six lowest).
    """
    rng = np.random.default_rng(4)
    base = rng.normal(size=(64, 8)).astype(np.float32) * 0.1
    v = rng.normal(size=8).astype(np.float32)
    query = v + np.float32(0.05) * rng.normal(size=8).astype(np.float32)
    copies = [2, 21, 22, 24, 25, 26, 27, 28, 29, 30, 31, 50]  # block 0: one; block 1 (16-31): ten
    base[copies] = v
    base[[40, 13]] = query
    k = 6
    assert k + margin(k) < 10
    search = FaissExactSearch(query[None], k, metric)
    for ids, vecs in batches(base, 16):
        search.add(ids, vecs)
    got, distances = search.result()
    assert search.repeats >= 1  # the 16-row block was searched again for the rest of the run
    expected = [2, 21, 22, 24, 25, 26] if metric == "ip" else [13, 40, 2, 21, 22, 24]
    assert got[0].tolist() == expected
    assert len(set(distances[0, 2:].tolist())) == 1
    np.testing.assert_array_equal(got, brute_force(query[None], base, k, metric))
    # exact_topk over other block cuts agrees, ids included (not asked of torch: its CPU matrix products
    # can give equal vectors unequal distances, which are then no tie)
    for rows in (5, 7, 64):
        again, _ = exact_topk(query[None], batches(base, 3), k, metric, engine="faiss", rows=rows)
        assert again[0].tolist() == expected, rows


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_faiss_blas_path_ties_broken_by_id(metric: str) -> None:
    """Enough queries for FAISS's BLAS kernels: every distance comes in runs of 40 equal ones."""
    rng = np.random.default_rng(5)
    distinct = rng.normal(size=(25, 448)).astype(np.float32)
    base = distinct[rng.permutation(np.repeat(np.arange(25), 40))]  # 1,000 rows, each vector 40 times
    queries = rng.normal(size=(300, 448)).astype(np.float32)
    expected = brute_force(queries, base, 100, metric)  # stable: equal distances by position
    for rows in (128, 1000):
        ids, _ = exact_topk(queries, batches(base, 100), 100, metric, rows=rows)
        np.testing.assert_array_equal(ids, expected)


def test_threads_split_queries_without_changing_results() -> None:
    """Query slices searched on separate threads give what one call gives, ties included."""
    rng = np.random.default_rng(7)
    distinct = rng.normal(size=(30, 64)).astype(np.float32)
    base = distinct[rng.permutation(np.repeat(np.arange(30), 20))]  # each vector 20 times
    queries = rng.normal(size=(200, 64)).astype(np.float32)
    answers = []
    for threads in (1, 2, 3):
        search = FaissExactSearch(queries, 50, "l2", threads=threads)
        assert search.parallel == threads
        for ids, vecs in batches(base, 256):
            search.add(ids, vecs)
        answers.append(search.result())
    for ids, distances in answers[1:]:
        np.testing.assert_array_equal(ids, answers[0][0])
        np.testing.assert_array_equal(distances, answers[0][1])
    np.testing.assert_array_equal(answers[0][0], brute_force(queries, base, 50, "l2"))


def test_query_slices_cover_every_query_once_within_the_budget() -> None:
    slices, parallel = query_slices(10_000, 384, 100, 16 * 2**20, threads=2)
    assert parallel == 2
    covered = np.concatenate([np.arange(s.start, s.stop) for s in slices])
    np.testing.assert_array_equal(covered, np.arange(10_000))
    assert max(s.stop - s.start for s in slices) < 5_000  # 16 MiB cannot hold one call per half
    assert query_slices(20, 384, 100, 2**30, threads=2) == ([slice(0, 20)], 1)  # too few to share


def test_rebatch_cuts_blocks_at_rows_and_copies_only_to_join() -> None:
    vecs = np.arange(50, dtype=np.float32).reshape(25, 2)
    parts = [(np.arange(0, 10), vecs[:10]), (np.arange(10, 12), vecs[10:12]), (np.arange(12, 25), vecs[12:])]
    blocks = [(ids, v.copy(), owned, np.shares_memory(v, vecs)) for ids, v, owned in rebatch(parts, 8)]
    assert [len(ids) for ids, _, _, _ in blocks] == [8, 8, 8, 1]
    assert [owned for _, _, owned, _ in blocks] == [False, True, False, False]
    # a slice of one batch is passed through, not copied; a joined block is a copy
    assert [shared for _, _, _, shared in blocks] == [True, False, True, True]
    np.testing.assert_array_equal(np.concatenate([ids for ids, _, _, _ in blocks]), np.arange(25))
    np.testing.assert_array_equal(np.concatenate([v for _, v, _, _ in blocks]), vecs)


def test_rebatch_joins_into_float32() -> None:
    vecs = np.arange(24, dtype=np.uint8).reshape(12, 2)
    parts = [(np.arange(i, i + 3), vecs[i : i + 3]) for i in range(0, 12, 3)]
    joined = [(v.dtype, v.copy()) for _, v, _ in rebatch(parts, 6)]
    assert [dtype for dtype, _ in joined] == [np.float32, np.float32]
    np.testing.assert_array_equal(np.concatenate([v for _, v in joined]), vecs.astype(np.float32))


def test_cosine_leaves_the_callers_vectors_alone() -> None:
    rng = np.random.default_rng(6)
    base = rng.normal(size=(100, 8)).astype(np.float32) * 3
    before = base.copy()
    exact_topk(base[:4], batches(base, 100), 3, "cosine")
    np.testing.assert_array_equal(base, before)


def test_budget_changes_blocks_not_results() -> None:
    rng = np.random.default_rng(2)
    base = rng.normal(size=(4000, 16)).astype(np.float32)
    queries = rng.normal(size=(64, 16)).astype(np.float32)
    assert block_rows(64, 16, 16) < block_rows(64, 16, 512)
    assert block_rows(64, 16, 16, engine="torch") < block_rows(64, 16, 512, engine="torch")
    small, _ = exact_topk(queries, batches(base, 100), 20, "cosine", memory_budget_mb=16)
    large, _ = exact_topk(queries, batches(base, 4000), 20, "cosine", memory_budget_mb=512)
    np.testing.assert_array_equal(small, large)


def test_non_contiguous_ids_are_returned() -> None:
    rng = np.random.default_rng(3)
    base = rng.normal(size=(100, 8)).astype(np.float32)
    ids = np.arange(100, dtype=np.int64) * 1_000_000_007
    got, _ = exact_topk(base[:5], batches(base, 30, ids), 1, "l2")
    assert got[:, 0].tolist() == ids[:5].tolist()


def test_vecs_readers(shared_data: Path, tmp_path: Path) -> None:
    root = shared_data / "ann" / "bigann10k"
    bvecs = read_vecs(root / "bigann10k_base.bvecs")
    u8bin = read_bin(root / "base.10k.u8bin")
    assert bvecs.shape == (10000, 128) and bvecs.dtype == np.uint8
    np.testing.assert_array_equal(bvecs, u8bin)
    np.testing.assert_array_equal(
        read_vecs(root / "bigann10k_groundtruth.ivecs"), read_bin(root / "gt100.ibin")
    )
    broken = tmp_path / "broken.fvecs"
    broken.write_bytes((root / "bigann10k_query.bvecs").read_bytes()[:-3])
    with pytest.raises(ValueError, match="not a whole number of rows"):
        read_vecs(broken)
