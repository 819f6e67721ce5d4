"""``vdb.insert.rows``: a point loads the first N rows of the dataset, scored against their ground truth.

The database is the FAISS engine (in process, a real index: ``flat`` is the exact scan); the dataset is
two shards whose ids are ``shard x 10^9 + row`` (as the embed stage writes them), so the prefix is the
dataset's row order, not an id range.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from apps.dataset.groundtruth.checkpoints import loaded_rows, prefix_groundtruth, prefix_groundtruth_file
from apps.dataset.layout import finalize_dataset, iter_vectors, row_id, vectors_to_arrow
from apps.evaluate.metrics import evaluate_files
from apps.vdb import database
from apps.vdb.base import CollectionSpec
from apps.vdb.config import QuerySweepConfig, VdbConfig
from apps.vdb.faiss.settings import FaissSettings
from apps.vdb.records import DatabaseTarget
from apps.vdb.stages import insert
from core.store import atomic_write_json, write_parquet_atomic

DIM, SHARD_ROWS, N = 8, 150, 170  # 300 rows in row groups of 40: N ends inside a row group of part 1


def make_dataset(directory: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """(dataset dir, ids in row order, vectors in row order)."""
    rng = np.random.default_rng(7)
    records, all_ids, all_vectors = [], [], []
    for shard in range(2):
        ids = np.array([row_id(shard, r) for r in range(SHARD_ROWS)], np.int64)
        vectors = rng.standard_normal((SHARD_ROWS, DIM)).astype(np.float32)
        table = pa.table({"id": ids, "embedding": vectors_to_arrow(vectors, "float32")})
        name = f"part-{shard:05d}.parquet"
        records.append(
            {"file": name, "shard": shard, **write_parquet_atomic(table, directory / name, row_group_rows=40)}
        )
        all_ids.append(ids)
        all_vectors.append(vectors)
    finalize_dataset(str(directory), "tiny", records, {"dimension": DIM}, {})
    return directory, np.concatenate(all_ids), np.concatenate(all_vectors)


def make_queries(path: Path, count: int = 40) -> np.ndarray:
    queries = np.random.default_rng(11).standard_normal((count, DIM)).astype(np.float32)
    table = {"id": np.arange(count), "text": [""] * count, "embedding": vectors_to_arrow(queries, "float32")}
    write_parquet_atomic(pa.table(table), path)
    return queries


def brute_force(queries: np.ndarray, vectors: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    d = ((queries[:, None, :].astype(np.float64) - vectors[None, :, :]) ** 2).sum(-1)
    return ids[np.argsort(d, axis=1, kind="stable")[:, :k]]


def test_work_units_cover_exactly_the_first_rows(tmp_path: Path) -> None:
    directory, ids, _ = make_dataset(tmp_path / "data")
    units = insert.work_units(str(directory), N)
    read = [insert.read_unit(*unit)[0] for unit in units]
    assert np.concatenate(read).tolist() == ids[:N].tolist()  # the first N rows in row order, no more
    assert len(units[-1]) == 3 and all(len(u) == 2 for u in units[:-1])  # only the last unit is clipped
    assert all(len(u) == 2 for u in insert.work_units(str(directory)))
    assert sum(len(insert.read_unit(*u)[0]) for u in insert.work_units(str(directory), 300)) == 300
    with pytest.raises(ValueError, match=r"vdb\.insert\.rows = 301 exceeds the dataset's 300 rows"):
        insert.work_units(str(directory), 301)


def test_rows_field_is_validated_and_sweepable() -> None:
    for bad in (0, -5):
        with pytest.raises(ValidationError, match="rows"):
            VdbConfig(databases=[{"name": "faiss"}], insert={"rows": bad})
    # model_validate, as the run configuration is read (VdbConfig(...) with a sweep reuses one instance)
    cfg = VdbConfig.model_validate({"databases": [{"name": "faiss"}], "insert": {"rows": [2000, 8000]}})
    assert [p.params for p in cfg.points] == [{"insert.rows": 2000}, {"insert.rows": 8000}]
    assert [p.config.insert.rows for p in cfg.points] == [2000, 8000]
    assert VdbConfig(databases=[{"name": "faiss"}]).insert.rows is None
    assert loaded_rows(300, None) == 300 and loaded_rows(300, 170) == 170
    with pytest.raises(ValueError, match=r"vdb\.insert\.rows = 400 exceeds the dataset's 300 rows"):
        loaded_rows(300, 400)


def test_prefix_groundtruth_equals_brute_force_over_the_first_rows(tmp_path: Path) -> None:
    directory, ids, vectors = make_dataset(tmp_path / "data")
    queries = make_queries(tmp_path / "queries.parquet")
    truth = prefix_groundtruth(directory, tmp_path / "queries.parquet", N, 10, "l2")
    assert truth.column_names == ["query_id", "neighbors", "distances"]
    assert truth.schema.field("neighbors").type == pa.list_(pa.int64(), 10)  # groundtruth.parquet's layout
    expected = brute_force(queries, vectors[:N], ids[:N], 10)
    np.testing.assert_array_equal(np.array(truth.column("neighbors").to_pylist()), expected)
    # cached: a second call reuses the file, another prefix recomputes it
    path = prefix_groundtruth_file(tmp_path / "point", directory, tmp_path / "queries.parquet", N, 10, "l2")
    stamp = path.stat().st_mtime_ns
    assert (
        prefix_groundtruth_file(tmp_path / "point", directory, tmp_path / "queries.parquet", N, 10, "l2")
        == path
    )
    assert path.stat().st_mtime_ns == stamp
    prefix_groundtruth_file(tmp_path / "point", directory, tmp_path / "queries.parquet", 60, 10, "l2")
    assert path.stat().st_mtime_ns != stamp


def test_a_point_with_rows_loads_them_and_is_exact_against_the_prefix_truth(tmp_path: Path) -> None:
    from apps.vdb.stages.index import build_index
    from apps.vdb.stages.query_sweep import query_sweep

    directory, ids, vectors = make_dataset(tmp_path / "data")
    make_queries(tmp_path / "queries.parquet")
    adapter, settings = database("faiss"), FaissSettings(threads=1)
    deployment = adapter.deployment(settings)
    endpoints = deployment.start(tmp_path / "server")
    try:
        spec = CollectionSpec(name="rows", dim=DIM, metric="l2", index_type="flat")
        target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=spec)
        insert.prepare_collection(target, False)
        part = insert.insert_partition(target, insert.work_units(str(directory), N), 32, 1, 0)
        assert part.rows == N
        searchable = insert.wait_searchable(target, N, 60, part)
        assert searchable.count == N
        index = build_index(target, N, 60, searchable)
        # every row of the dataset finds its own id when it was loaded, only loaded ids otherwise
        db_client = adapter.client(settings, endpoints)
        db_client.create_collection(spec)
        first = db_client.search(vectors, 1, 16).ids[:, 0]
        db_client.close()
        assert first[:N].tolist() == ids[:N].tolist() and set(first[N:].tolist()) <= set(ids[:N].tolist())
        sweep = QuerySweepConfig(
            ef=[16], batch_size=[40], clients=[1], k=[10], warmup_queries=0, duration_s=None
        )
        records = query_sweep(target, str(tmp_path / "queries.parquet"), sweep, str(tmp_path / "out"), index)
    finally:
        deployment.stop()
    raw = [r.file for r in records]
    prefix = prefix_groundtruth_file(tmp_path / "point", directory, tmp_path / "queries.parquet", N, 10, "l2")
    full = tmp_path / "full.parquet"
    write_parquet_atomic(prefix_groundtruth(directory, tmp_path / "queries.parquet", 300, 10, "l2"), full)
    assert sum(len(b[0]) for b in iter_vectors(directory)) == 300
    queries_file = tmp_path / "queries.parquet"
    against_prefix = evaluate_files(raw, prefix, queries_file, directory, "l2")[0]
    against_full = evaluate_files(raw, full, queries_file, directory, "l2")[0]
    assert against_prefix["recall"] == 1.0 and against_prefix["unknown_ids"] == 0
    assert against_full["recall"] < 0.9  # the full truth holds rows the point never loaded


def test_the_report_scores_a_prefix_point_against_the_prefix_truth(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from pipeline.report_stage import point_groundtruth

    directory, _, _ = make_dataset(tmp_path / "data")
    make_queries(tmp_path / "queries" / "queries.parquet")
    full = tmp_path / "gt" / "groundtruth.parquet"
    write_parquet_atomic(
        prefix_groundtruth(directory, full.parent.parent / "queries" / "queries.parquet", 300, 10, "l2"), full
    )
    dirs = {"embed": directory, "queries": tmp_path / "queries", "groundtruth": tmp_path / "gt"}
    plan = SimpleNamespace(
        stage=lambda name: SimpleNamespace(directory=dirs[name]),
        config=SimpleNamespace(groundtruth=SimpleNamespace(metric="l2", memory_budget_mb=64)),
    )
    point = tmp_path / "point"
    loaded = SimpleNamespace(insert=[SimpleNamespace(rows=N)], label="faiss", database="faiss")
    assert point_groundtruth(plan, loaded, point) == point / "groundtruth-prefix.parquet"  # type: ignore[arg-type]
    expected = prefix_groundtruth(directory, tmp_path / "queries" / "queries.parquet", N, 10, "l2")
    assert (
        pq.read_table(point / "groundtruth-prefix.parquet")
        .select(["neighbors"])
        .equals(expected.select(["neighbors"]))
    )
    every = SimpleNamespace(insert=[SimpleNamespace(rows=300)], label="faiss", database="faiss")
    assert point_groundtruth(plan, every, point) == full  # type: ignore[arg-type]


def test_the_plan_refuses_more_rows_than_the_dataset_holds(tmp_path: Path) -> None:
    import yaml

    from core.errors import ConfigError
    from pipeline.config.loader import load_config
    from pipeline.plan import build_plan
    from tests.conftest import base_config, sample_records, write_jsonl

    directory, _, _ = make_dataset(tmp_path / "data")
    corpus = write_jsonl(tmp_path / "corpus.jsonl", sample_records(5))
    vdb = {"databases": [{"name": "faiss"}], "insert": {"rows": [100, 400]}}
    config = base_config(corpus, tmp_path / "wd", dataset={"dir": str(directory)}, vdb=vdb)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    # the dataset as the embed stage of this configuration would have written it (its key and dimension;
    # the plan refuses a dataset.dir holding another dataset)
    manifest = json.loads((directory / "manifest.json").read_text())
    vdb["insert"]["rows"] = [100, 300]
    path.write_text(yaml.safe_dump({**config, "dataset": {"dir": str(tmp_path / "new")}, "vdb": vdb}))
    plan = build_plan(load_config(path))
    assert not plan.stage("embed").complete
    made = {**manifest, "key": plan.stage("embed").key, "dimension": plan.dimension}
    atomic_write_json(directory / "manifest.json", made)
    path.write_text(yaml.safe_dump({**config, "vdb": vdb}))
    assert [p.point.config.insert.rows for p in build_plan(load_config(path)).points] == [100, 300]
    vdb["insert"]["rows"] = [100, 400]
    path.write_text(yaml.safe_dump({**config, "vdb": vdb}))
    with pytest.raises(ConfigError, match=r"vdb\.insert\.rows\.1: 400 rows asked of a dataset of 300 rows"):
        build_plan(load_config(path))
