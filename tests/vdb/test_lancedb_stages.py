"""LanceDB through the pipeline's own insert, index and query-sweep stage functions (in-process pool)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.dataset.layout import finalize_dataset, vectors_to_arrow
from apps.interchange.vecs import read_vecs
from apps.vdb.base import CollectionSpec
from apps.vdb.config import QuerySweepConfig
from apps.vdb.lancedb.deploy import LanceDBDeployment
from apps.vdb.lancedb.settings import LanceDBSettings
from apps.vdb.records import DatabaseTarget
from apps.vdb.stages.index import build_index
from apps.vdb.stages.insert import insert_partition, prepare_collection, wait_searchable, work_units
from apps.vdb.stages.query_sweep import query_sweep
from core.store import write_parquet_atomic

pytestmark = pytest.mark.slow


def write_dataset(base: np.ndarray, directory: Path, shards: int = 4) -> Path:
    """``base`` in the Pes2o-VE dataset layout: ``shards`` Parquet parts, row groups of 500."""
    per = len(base) // shards
    records = []
    for shard in range(shards):
        ids = np.arange(shard * per, (shard + 1) * per, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "doc_id": ids.astype(str),
                "chunk_index": np.zeros(per, np.int32),
                "embedding": vectors_to_arrow(base[ids], "float32"),
            }
        )
        name = f"part-{shard:05d}.parquet"
        info = write_parquet_atomic(table, directory / name, row_group_rows=500)
        records.append({"file": name, "shard": shard, **info})
    finalize_dataset(str(directory), "bigann10k", records, {"dimension": base.shape[1]}, {})
    return directory


def test_stages_insert_index_and_sweep_ivf_pq(shared_data: Path, tmp_path: Path) -> None:
    folder = shared_data / "ann" / "bigann10k"
    base = read_vecs(folder / "bigann10k_base.bvecs").astype(np.float32)
    queries = read_vecs(folder / "bigann10k_query.bvecs").astype(np.float32)
    truth = read_vecs(folder / "bigann10k_groundtruth.ivecs")
    dataset = write_dataset(base, tmp_path / "dataset")

    settings = LanceDBSettings(refine_factor=10)
    deployment = LanceDBDeployment(settings)
    endpoints = deployment.start(tmp_path / "server")
    try:
        spec = CollectionSpec(name="bigann", dim=128, metric="l2", index_type="ivf_pq", ivf_nlist=32, pq_m=16)
        target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=spec)
        prepare_collection(target, False)
        part = insert_partition(target, work_units(str(dataset)), 1000, 2, 1)
        assert part.rows == 10000 and part.clients == 1  # in-process: one client whatever was asked
        assert wait_searchable(target, 10000, 30, part).count == 10000
        # The same upload again (the next batch size reuses a fresh table; here: a full retry) adds nothing.
        insert_partition(target, work_units(str(dataset)), 1000, 1, 0)
        index = build_index(target, 10000, 120, None)
        assert index.count == 10000 and index.segments == 1
        assert 1.0 < index.write_amplification < 1.5  # data + a PQ index far smaller than the vectors

        path = tmp_path / "queries.parquet"
        table = pa.table(
            {"id": np.arange(100), "text": [""] * 100, "embedding": vectors_to_arrow(queries, "float32")}
        )
        write_parquet_atomic(table, path)
        sweep = QuerySweepConfig(ef=[1, 16], batch_size=[1, 25], clients=[2], k=[10], warmup_queries=5)
        records = query_sweep(target, str(path), sweep, str(tmp_path / "out"), index)
        assert [r.setting for r in records] == [
            "ef=1,batch=1,clients=1,k=10",
            "ef=1,batch=25,clients=1,k=10",
            "ef=16,batch=1,clients=1,k=10",
            "ef=16,batch=25,clients=1,k=10",
        ]
        recall = {}
        for record in records:  # one raw row per query: its id and the ids returned
            raw = pq.read_table(record.file).sort_by("query_id")
            ids = np.array(raw.column("ids").to_pylist())
            hits = [len(set(r) & set(t[:10])) / 10 for r, t in zip(ids, truth, strict=True)]
            recall[record.setting] = float(np.mean(hits))
        # Batched and single requests return the same neighbours; more probes find more of them.
        assert recall["ef=16,batch=1,clients=1,k=10"] == recall["ef=16,batch=25,clients=1,k=10"] >= 0.95
        assert recall["ef=1,batch=25,clients=1,k=10"] < 0.8
    finally:
        deployment.stop()
