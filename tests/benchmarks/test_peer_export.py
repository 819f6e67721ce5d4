"""The export of ``python -m benchmarks.peer_vectordbbench``: the project's dataset, queries and exact ground
truth in VectorDBBench's custom-dataset layout (train / test / neighbors Parquet files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.dataset.groundtruth.stage import GroundTruthConfig, compute_groundtruth
from benchmarks.common import vdb
from benchmarks.peer_vectordbbench import data as peer_data
from benchmarks.peer_vectordbbench import sides


@pytest.fixture
def local(tmp_path: Path) -> vdb.LocalDataset:
    """A small dataset in the project's layout (ids as the pipeline makes them: shard * 10**9 + row),
    queries.parquet and the ground-truth stage's output over them."""
    from apps.dataset.layout import row_id, vectors_to_arrow
    from core.store import write_parquet_atomic

    rng = np.random.default_rng(7)
    sizes = [30, 25, 25, 20]
    ids = np.array([row_id(s, r) for s, n in enumerate(sizes) for r in range(n)], np.int64)
    vectors = rng.standard_normal((len(ids), 12)).astype(np.float32)
    dataset = vdb.write_dataset(tmp_path / "dataset", ids, vectors, sizes, 16)
    queries = rng.standard_normal((9, 12)).astype(np.float32)
    query_file = tmp_path / "queries" / "queries.parquet"
    query_file.parent.mkdir()
    table = pa.table(
        {
            "id": pa.array(np.arange(100, 109), pa.int64()),
            "text": pa.array([f"q{i}" for i in range(9)]),
            "embedding": vectors_to_arrow(queries, "float32"),
        }
    )
    write_parquet_atomic(table, query_file)
    gt_dir = tmp_path / "groundtruth"
    compute_groundtruth(str(gt_dir), str(dataset), str(query_file), GroundTruthConfig(k=20, metric="cosine"))
    return vdb.LocalDataset(dataset, query_file, gt_dir / "groundtruth.parquet", "cosine", "test")


def test_export_has_vectordbbench_columns_and_the_projects_ground_truth(local, tmp_path: Path) -> None:
    out = tmp_path / "export"
    described = peer_data.export_vdbbench(local, out)
    train, test, neighbors = (pq.read_table(out / name) for name in peer_data.EXPORT_FILES)

    assert train.column_names == ["id", "emb"] and test.column_names == ["id", "emb"]
    assert neighbors.column_names == ["id", "neighbors_id"]
    assert described == {
        "dir": str(out),
        "size": 100,
        "dim": 12,
        "metric_type": "COSINE",
        "queries": 9,
        "gt_width": 20,
    }
    base_ids, base = peer_data.read_base(local.dataset_dir)
    assert train.column("id").to_pylist() == base_ids.tolist()
    assert np.array_equal(np.array(train.column("emb").to_pylist(), np.float32), base)
    assert test.column("id").to_pylist() == list(range(100, 109))

    gt = pq.read_table(local.groundtruth_file)
    assert neighbors.column("id").to_pylist() == gt.column("query_id").to_pylist()
    assert neighbors.column("neighbors_id").to_pylist() == gt.column("neighbors").to_pylist()
    assert max(max(row) for row in neighbors.column("neighbors_id").to_pylist()) >= 2**31  # ids kept as is


def test_export_refuses_ground_truth_of_other_queries(local, tmp_path: Path) -> None:
    table = pq.read_table(local.groundtruth_file)
    shuffled = table.take(pa.array(np.arange(table.num_rows)[::-1]))
    pq.write_table(shuffled, local.groundtruth_file)
    with pytest.raises(SystemExit, match="query ids differ"):
        peer_data.export_vdbbench(local, tmp_path / "export")


def test_plain_recall_is_vectordbbenchs_definition() -> None:
    gt_ids = np.array([5, 6])
    gt = np.array([[1, 2, 3, 9], [4, 5, 6, 9]])
    # query 5: 2 of its top-3 found (a repeat counts once); query 6: all three, in another order
    got = [[1, 1, 3], [6, 4, 5]]
    assert sides.plain_recall(np.array([5, 6]), got, gt_ids, gt, 3) == pytest.approx((2 / 3 + 1) / 2)


def _vdbbench_result(qps: float, queries: int, recall: float) -> dict:
    """What ``vdbbench_driver.py`` writes for one client count (the fields the check reads)."""
    metric = {"conc_num_list": [1], "conc_qps_list": [qps], "recall": recall}
    return {"metric": metric, "concurrent": {"1": {"queries": queries, "seconds": 10.0, "qps": qps}}}


def test_vectordbbench_figures_are_checked() -> None:
    import benchmarks.peer_vectordbbench.__main__ as peer

    peer.check_vdbbench("milvus", _vdbbench_result(500.0, 5000, 0.9562), 0.95618, [1])  # real: passes
    with pytest.raises(SystemExit, match=r"QPS 0\.0"):  # every search failed (the 'pk' KeyError)
        peer.check_vdbbench("milvus", _vdbbench_result(0.0, 0, 0.9562), 0.9562, [1])
    with pytest.raises(SystemExit, match=r"is not 500\.0 QPS"):
        peer.check_vdbbench("milvus", _vdbbench_result(500.0, 3000, 0.9562), 0.9562, [1])
    with pytest.raises(SystemExit, match="recomputed from its returned ids"):
        peer.check_vdbbench("weaviate", _vdbbench_result(200.0, 2000, 0.3962), 0.9638, [1])
