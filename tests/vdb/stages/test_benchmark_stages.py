"""Vector-database stages for real: insert with parallel clients, faults, query set checks.

Uses the Weaviate server (v1.36.0, started on loopback) and Qdrant's embedded engine on real vectors
(Fashion-MNIST 1k with published ground truth) written in the Pes2o-VE dataset layout.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from apps.dataset.layout import finalize_dataset, vectors_to_arrow
from apps.interchange.vecs import read_vecs
from apps.vdb.base import CollectionSpec, DatabaseError
from apps.vdb.config import QuerySweepConfig
from apps.vdb.qdrant.deploy import QdrantDeployment
from apps.vdb.qdrant.settings import QdrantSettings
from apps.vdb.records import DatabaseTarget
from apps.vdb.stages.insert import insert_partition, prepare_collection, wait_searchable, work_units
from apps.vdb.stages.query_sweep import query_sweep
from apps.vdb.weaviate.deploy import WeaviateDeployment, find_binary
from apps.vdb.weaviate.settings import WeaviateSettings
from core.errors import ArtifactError
from core.store import write_parquet_atomic

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fmnist_dataset(shared_data: Path, tmp_path_factory) -> tuple[Path, np.ndarray]:
    """fmnist1k base vectors as a 4-part dataset with row groups of 100 (40 work units)."""
    base = read_vecs(shared_data / "ann" / "fmnist1k" / "fmnist1k_base.fvecs")
    directory = tmp_path_factory.mktemp("fmnist-dataset")
    records = []
    for shard in range(4):
        rows = base[shard * 250 : (shard + 1) * 250]
        ids = np.arange(shard * 250, (shard + 1) * 250, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "doc_id": ids.astype(str),
                "chunk_index": np.zeros(250, np.int32),
                "embedding": vectors_to_arrow(rows, "float32"),
            }
        )
        name = f"part-{shard:05d}.parquet"
        records.append(
            {
                "file": name,
                "shard": shard,
                **write_parquet_atomic(table, directory / name, row_group_rows=100),
            }
        )
    finalize_dataset(str(directory), "fmnist", records, {"dimension": 784}, {})
    return directory, base


@pytest.fixture
def weaviate_server(tmp_path: Path):
    settings = WeaviateSettings(name="weaviate")
    find_binary(settings)  # fails with the build instructions when the binary is missing
    deployment = WeaviateDeployment(settings)
    try:
        endpoints = deployment.start(tmp_path / "weaviate", timeout=120)
        yield settings, deployment, endpoints
    finally:
        deployment.stop()


SPEC = CollectionSpec(name="fmnist", dim=784, metric="l2", index_type="hnsw", deferred_indexing=True)


def test_parallel_clients_insert_every_row(weaviate_server, fmnist_dataset) -> None:
    settings, _deployment, endpoints = weaviate_server
    dataset, _base = fmnist_dataset
    target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=SPEC)
    prepare_collection(target, False)
    units = work_units(str(dataset))
    assert len(units) == 12  # 4 parts x 3 row groups (100, 100, 50)
    record = insert_partition(target, units, 64, 2, 2)
    assert record.rows == 1000 and record.clients == 2 and record.retried == 0
    visible = wait_searchable(target, 1000, 120, record)
    assert visible.count == 1000
    # a second upload of the same rows (a retried stage) does not duplicate
    insert_partition(target, units[:3], 64, 1, 0)
    assert wait_searchable(target, 1000, 120, record).count == 1000


def test_missing_rows_fail_the_stage_with_the_number(weaviate_server, fmnist_dataset) -> None:
    settings, _deployment, endpoints = weaviate_server
    dataset, _ = fmnist_dataset
    target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=SPEC)
    prepare_collection(target, False)
    record = insert_partition(target, work_units(str(dataset))[:-1], 100, 1, 0)  # last unit never sent
    with pytest.raises(DatabaseError, match="clients sent 950 rows but the dataset has 1000"):
        wait_searchable(target, 1000, 30, record)


def test_server_killed_mid_insert_batches_retried_after_restart(weaviate_server, fmnist_dataset) -> None:
    settings, deployment, endpoints = weaviate_server
    dataset, _ = fmnist_dataset
    target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=SPEC)
    prepare_collection(target, False)
    outcome: dict = {}

    def insert() -> None:
        try:
            outcome["record"] = insert_partition(target, work_units(str(dataset)), 20, 1, 6)
        except Exception as exc:  # recorded for the assertion below
            outcome["error"] = exc

    worker = threading.Thread(target=insert)
    worker.start()
    server = deployment.procs[0]
    probe = target.open_client()
    probe.create_collection(SPEC)
    deadline = time.monotonic() + 120
    while probe.count() < 100 and time.monotonic() < deadline:  # the client is sending batches
        time.sleep(0.05)
    probe.close()
    server.kill()
    time.sleep(1.5)
    server.start()  # same ports, same data directory: a restarted node
    worker.join(timeout=300)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["record"].rows == 1000
    assert outcome["record"].retried >= 1  # batches were retried against the restarted server
    assert wait_searchable(target, 1000, 120, outcome["record"]).count == 1000


def test_server_killed_for_good_fails_clearly(weaviate_server, fmnist_dataset) -> None:
    settings, deployment, endpoints = weaviate_server
    dataset, _ = fmnist_dataset
    target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=SPEC)
    prepare_collection(target, False)
    deployment.procs[0].kill()
    # the client connects before its first request: a server that is gone is named in the error
    with pytest.raises(DatabaseError, match=r"cannot connect to Weaviate at 127\.0\.0\.1:\d+"):
        insert_partition(target, work_units(str(dataset)), 100, 1, 1)


@pytest.fixture
def edge(tmp_path: Path):
    settings = QdrantSettings(name="qdrant", mode="edge", indexing_threshold_kb=1, full_scan_threshold_kb=1)
    deployment = QdrantDeployment(settings)
    endpoints = deployment.start(tmp_path / "qdrant")
    yield settings, endpoints
    deployment.stop()


def test_existing_collection_with_other_dimension_is_refused(edge, fmnist_dataset) -> None:
    settings, endpoints = edge
    small = CollectionSpec(name="fmnist", dim=8, metric="l2")
    prepare_collection(DatabaseTarget(settings=settings, endpoints=endpoints, collection=small), False)
    with pytest.raises(DatabaseError, match=r"8.*784|784.*8"):
        prepare_collection(DatabaseTarget(settings=settings, endpoints=endpoints, collection=SPEC), False)


def test_query_set_with_other_dimension_is_refused(edge, tmp_path: Path) -> None:
    settings, endpoints = edge
    target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=SPEC)
    prepare_collection(target, False)
    queries = tmp_path / "queries.parquet"
    vectors = np.ones((3, 384), dtype=np.float32)
    write_parquet_atomic(
        pa.table(
            {"id": np.arange(3), "text": ["a", "b", "c"], "embedding": vectors_to_arrow(vectors, "float32")}
        ),
        queries,
    )
    sweep = QuerySweepConfig(ef=[16], batch_size=[1], clients=[1], k=[10], warmup_queries=0, duration_s=None)
    with pytest.raises(ArtifactError, match="queries have dimension 384 but the qdrant collection has 784"):
        query_sweep(target, str(queries), sweep, str(tmp_path / "out"), None)


def test_query_sweep_writes_raw_results(edge, fmnist_dataset, shared_data: Path, tmp_path: Path) -> None:
    settings, endpoints = edge
    dataset, _ = fmnist_dataset
    target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=SPEC)
    prepare_collection(target, False)
    record = insert_partition(target, work_units(str(dataset)), 200, 2, 0)
    assert record.clients == 1  # an in-process engine gets one client whatever was asked
    from apps.vdb.stages.index import build_index

    index = build_index(target, 1000, 300, None)
    assert index.count == 1000 and index.write_amplification > 0
    queries = read_vecs(shared_data / "ann" / "fmnist1k" / "fmnist1k_query.fvecs")[:50]
    path = tmp_path / "queries.parquet"
    write_parquet_atomic(
        pa.table({"id": np.arange(50), "text": [""] * 50, "embedding": vectors_to_arrow(queries, "float32")}),
        path,
    )
    sweep = QuerySweepConfig(
        ef=[16, 64], batch_size=[1, 10], clients=[1], k=[10], warmup_queries=5, duration_s=None
    )
    records = query_sweep(target, str(path), sweep, str(tmp_path / "out"), index)
    assert [r.setting for r in records] == [
        "ef=16,batch=1,clients=1,k=10",
        "ef=16,batch=10,clients=1,k=10",
        "ef=64,batch=1,clients=1,k=10",
        "ef=64,batch=10,clients=1,k=10",
    ]
    import pyarrow.parquet as pq

    raw = pq.read_table(records[1].file)
    assert raw.num_rows == 50
    assert (
        len(set(zip(raw.column("client").to_pylist(), raw.column("request").to_pylist(), strict=True))) == 5
    )
    assert all(len(ids) == 10 for ids in raw.column("ids").to_pylist())
    published = read_vecs(shared_data / "ann" / "fmnist1k" / "fmnist1k_groundtruth.ivecs")[:50, :10]
    returned = np.array(pq.read_table(records[3].file).column("ids").to_pylist())
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(returned, published, strict=True)])
    assert recall >= 0.9
