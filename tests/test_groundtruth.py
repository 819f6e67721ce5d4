"""Exact ground truth: reproduces published neighbours, breaks ties by id, streams within a budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from apps.groundtruth import block_rows, exact_topk
from apps.vecs import read_bin, read_vecs


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
    exact = np.sqrt(((queries[:, None, :].astype(np.float64) - base[None].astype(np.float64)) ** 2).sum(-1))
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


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_metrics_match_brute_force(metric: str) -> None:
    rng = np.random.default_rng(1)
    base = rng.normal(size=(3000, 32)).astype(np.float32)
    queries = rng.normal(size=(40, 32)).astype(np.float32)
    ids, _ = exact_topk(queries, batches(base, 500), 10, metric, memory_budget_mb=16)
    np.testing.assert_array_equal(ids, brute_force(queries, base, 10, metric))


def test_budget_changes_blocks_not_results() -> None:
    rng = np.random.default_rng(2)
    base = rng.normal(size=(4000, 16)).astype(np.float32)
    queries = rng.normal(size=(64, 16)).astype(np.float32)
    assert block_rows(64, 16, 16) < block_rows(64, 16, 512)
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
