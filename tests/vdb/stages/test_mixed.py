"""The mixed insert + query workload (apps/mixed*.py): checkpoints, per-step ground truth, a real Milvus run.

The slow test runs the whole phase against the real Milvus standalone server (PyPI ``milvus``) on
fmnist1k and recomputes every mixed-phase query's recall independently here, with numpy brute force over
the prefix its checkpoint says.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from apps.dataset.groundtruth.checkpoints import (
    assign_checkpoints,
    checkpoint_sizes,
    checkpoint_truth,
    ready_times,
)
from apps.dataset.layout import finalize_dataset, vectors_to_arrow
from apps.evaluate.mixed import truth_for
from apps.evaluate.results import results_table
from apps.interchange.vecs import read_vecs
from apps.vdb.config import VdbConfig
from apps.vdb.stages.mixed_config import MixedConfig
from core.store import write_parquet_atomic
from tests.conftest import SHARED

DATA = SHARED / "ann" / "fmnist1k"


def write_dataset(directory: Path, vectors: np.ndarray, parts: int = 2, row_group: int = 100) -> Path:
    """``vectors`` as a dataset (ids = row numbers) in ``parts`` Parquet parts."""
    directory.mkdir(parents=True, exist_ok=True)
    records = []
    for shard, rows in enumerate(np.array_split(np.arange(len(vectors)), parts)):
        table = pa.table(
            {"id": rows.astype(np.int64), "embedding": vectors_to_arrow(vectors[rows], "float32")}
        )
        name = f"part-{shard:05d}.parquet"
        written = write_parquet_atomic(table, directory / name, row_group_rows=row_group)
        records.append({"file": name, "shard": shard, **written})
    finalize_dataset(str(directory), "mixed-test", records, {"dimension": vectors.shape[1]}, {})
    return directory


def test_checkpoints_are_increasing_prefixes_from_the_preload_to_the_whole_dataset() -> None:
    assert checkpoint_sizes(1000, 500, 0.1) == list(range(500, 1001, 50))
    assert checkpoint_sizes(10, 3, 0.5) == [3, 7, 10]  # ceil(3.5) = 4 rows in the first step
    assert checkpoint_sizes(10, 9, 0.05) == [9, 10]  # steps smaller than a row collapse
    with pytest.raises(ValueError):
        checkpoint_sizes(10, 0, 0.5)


def test_a_checkpoint_is_ready_when_every_batch_holding_its_rows_is_acknowledged() -> None:
    sizes = [4, 6, 8, 10]
    # batches [4,6) [6,8) [8,10), acknowledged out of order (two clients): the second before the first
    ready = ready_times(sizes, 4, np.array([4, 6, 8]), np.array([6, 8, 10]), np.array([5.0, 3.0, 7.0]))
    assert ready.tolist() == [-np.inf, 5.0, 5.0, 7.0]
    sent = np.array([0.0, 4.9, 5.0, 6.0, 7.5])
    # a query sent exactly at an acknowledgement counts it as visible
    assert assign_checkpoints(sent, ready).tolist() == [0, 0, 2, 2, 3]
    never = ready_times(
        sizes, 4, np.array([4]), np.array([6]), np.array([1.0])
    )  # only the first batch acknowledged
    assert never[2:].tolist() == [np.inf, np.inf]


@pytest.mark.parametrize("metric", ["l2", "cosine", "ip"])
def test_checkpoint_truth_equals_brute_force_over_each_prefix(tmp_path: Path, metric: str) -> None:
    rng = np.random.default_rng(7)
    base = rng.standard_normal((230, 8)).astype(np.float32)
    queries = rng.standard_normal((9, 8)).astype(np.float32)
    dataset = write_dataset(tmp_path / "data", base, parts=3, row_group=40)
    sizes = checkpoint_sizes(230, 100, 0.25)
    table = checkpoint_truth(dataset, np.arange(9) + 1000, queries, sizes, 5, metric)
    assert sorted(set(table.column("rows").to_pylist())) == sizes
    for number, size in enumerate(sizes):
        part = table.filter(pa.compute.equal(table.column("checkpoint"), number))
        assert part.column("query_id").to_pylist() == list(range(1000, 1009))
        x, q = base[:size].astype(np.float64), queries.astype(np.float64)
        if metric == "l2":
            d = np.linalg.norm(x[None] - q[:, None], axis=2)
        elif metric == "ip":
            d = -(q @ x.T)
        else:
            d = (
                1
                - (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (x / np.linalg.norm(x, axis=1)[:, None]).T
            )
        expected = np.argsort(d, axis=1, kind="stable")[:, :5]
        assert np.array(part.column("neighbors").to_pylist()).tolist() == expected.tolist()


def test_mixed_section_is_optional_sweepable_and_refused_for_in_process_engines() -> None:
    db = {"name": "milvus"}
    assert VdbConfig.model_validate({"databases": [db]}).mixed is None
    swept = VdbConfig.model_validate(
        {"databases": [db], "mixed": {"insert_clients": [1, 2], "insert_rate": "max"}}
    )
    assert [p.config.mixed.insert_clients for p in swept.points] == [1, 2]
    assert (
        VdbConfig.model_validate({"databases": [db], "mixed": {"insert_rate": 500}}).mixed.insert_rate == 500
    )
    with pytest.raises(ValidationError, match="insert_rate"):
        MixedConfig.model_validate({"insert_rate": "fast"})
    with pytest.raises(ValidationError, match="mixed workload needs separate insert and query client"):
        VdbConfig.model_validate({"databases": [{"name": "qdrant"}], "mixed": {}})


# --------------------------------------------------------------------------------------------------------
# A real run on Milvus
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def milvus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    """One real Milvus standalone server for the module; always stopped."""
    from apps.vdb import database
    from apps.vdb.milvus.settings import MilvusSettings

    # Bounded consistency (the default): rows inserted in the last moments may not be visible yet, so the
    # mixed recall is not trivially 1 (Strong waits ~200 ms per search for Milvus's time tick).
    settings = MilvusSettings(name="milvus", min_segment_rows_to_index=100)
    deployment = database("milvus").deployment(settings)
    try:
        endpoints = deployment.start(tmp_path_factory.mktemp("milvus"), timeout=180)
        yield settings, endpoints
    finally:
        deployment.stop()


def _distances(q: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.sqrt(((x.astype(np.float64) - q.astype(np.float64)) ** 2).sum(axis=1))


@pytest.mark.slow
def test_mixed_run_on_milvus_recall_equals_an_independent_recomputation(milvus, tmp_path: Path) -> None:
    from apps.evaluate.mixed import mixed_rows
    from apps.report.mixed import mixed_figure
    from apps.vdb.base import CollectionSpec
    from apps.vdb.records import DatabaseTarget
    from apps.vdb.stages.mixed import mixed_workload

    settings, endpoints = milvus
    base = read_vecs(DATA / "fmnist1k_base.fvecs")
    queries = read_vecs(DATA / "fmnist1k_query.fvecs")[:40]
    # 200 rows past the 1,000 the point loads (vdb.insert.rows): the workload must leave them out
    dataset = write_dataset(tmp_path / "data", np.vstack([base, base[:200] + 1.0]))
    queries_file = tmp_path / "queries.parquet"
    ids = np.arange(5000, 5040, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "embedding": vectors_to_arrow(queries, "float32")}), queries_file)
    spec = CollectionSpec(name="mixed_test", dim=784, metric="l2", index_type="hnsw")
    target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=spec)
    cfg = MixedConfig(
        preload_fraction=0.5,
        checkpoint_fraction=0.1,
        insert_clients=2,
        insert_batch_size=10,
        insert_rate=250,  # 500 rows in about two seconds
        query_clients=1,
        query_batch_size=4,
        ef=10,  # a small ef: recall below 1, so the comparison below can fail
        k=10,
        warmup_queries=4,
        baseline_duration_s=1.0,
        timeout_s=300,
    )
    record = mixed_workload(target, str(dataset), str(queries_file), cfg, str(tmp_path / "point"), 250, 1000)
    assert (record.preload_rows, record.total_rows) == (500, 1000)

    rows = {row["stage"]: row for row in mixed_rows(record, dataset, queries_file, "l2")}
    assert set(rows) == {"mixed", "mixed_baseline"}
    results_table(list(rows.values()))  # the rows fit results.parquet's schema
    for row in rows.values():
        assert row["status"] == "ok" and row["queries_sent"] > 0 and row["window_s"] > 0
        for column in ("qps", "latency_mean_ms", "latency_p99_ms", "recall"):
            assert np.isfinite(row[column]), column

    # Independent recomputation: every mixed-phase query against the prefix its checkpoint says.
    raw = pq.read_table(record.queries_file).to_pylist()
    inserts = pq.read_table(record.inserts_file).to_pylist()
    last_ack = max(b["t_ack"] for b in inserts)
    assert last_ack == record.last_ack
    assert sorted((b["row_start"], b["row_stop"]) for b in inserts) == [
        (s, s + 10) for s in range(500, 1000, 10)
    ]
    sizes = list(range(500, 1001, 50))
    truth = pq.read_table(Path(record.queries_file).with_name("truth.parquet"))
    assert sorted(set(truth.column("rows").to_pylist())) == sizes  # checkpoints: increasing prefixes
    ready = [max([b["t_ack"] for b in inserts if b["row_start"] < s], default=-np.inf) for s in sizes]
    query_vectors = dict(zip(ids.tolist(), queries, strict=True))
    recalls, used = [], set()
    for row in raw:
        prefix = max(s for s, t in zip(sizes, ready, strict=True) if t <= row["t_start"])
        used.add(prefix)
        q = query_vectors[row["query_id"]]
        kth = np.sort(_distances(q, base[:prefix]))[cfg.k - 1]
        returned = [i for i in dict.fromkeys(row["ids"][: cfg.k]) if 0 <= i < len(base)]
        d = _distances(q, base[returned]) if returned else np.zeros(0)
        recalls.append(float((d <= kth + max(1e-5 * abs(kth), 1e-6)).sum()) / cfg.k)
    assert rows["mixed"]["recall"] == pytest.approx(float(np.mean(recalls)), abs=1e-12)
    assert len(used) > 1  # the queries really ran while rows were being inserted
    assert rows["mixed"]["recall"] > 0.5 and rows["mixed_baseline"]["recall"] > 0.5  # random: ~0.01

    # The checkpoints' truth is kept beside the raw files for what it was computed for, and only for that.
    truth_path = Path(record.queries_file).with_name("truth.parquet")
    written = truth_path.stat().st_mtime_ns
    assert truth_for(record, dataset, queries_file, "l2").equals(truth)
    assert truth_path.stat().st_mtime_ns == written  # read, not recomputed
    inner = truth_for(record, dataset, queries_file, "ip")  # another metric: other neighbours, recomputed
    assert truth_path.stat().st_mtime_ns != written and not inner.equals(truth)
    print(
        {
            stage: {k: row[k] for k in ("qps", "latency_p99_ms", "recall", "queries_sent")}
            for stage, row in rows.items()
        },
        sorted(used),
    )

    # The queries stopped when the last insert was acknowledged (up to one request in flight, and the
    # clients' look for the insert clients' markers every MARKER_POLL_S).
    from apps.vdb.stages.mixed import MARKER_POLL_S

    longest = max(r["t_end"] - r["t_start"] for r in raw)
    assert all(r["t_start"] <= last_ack + longest + MARKER_POLL_S for r in raw)

    figure = mixed_figure(record, "milvus mixed", tmp_path / "mixed.png")
    assert figure is not None and figure.stat().st_size > 1000


@pytest.mark.slow
def test_open_loop_queries_beside_paced_inserts(milvus, tmp_path: Path) -> None:
    """query_rate: the baseline and the mixed phase send on a schedule; every request carries its intended
    time, the inserts theirs; the rows carry the open-loop figures, the P99 from the intended time."""
    from apps.evaluate.mixed import mixed_rows
    from apps.vdb.base import CollectionSpec
    from apps.vdb.records import DatabaseTarget
    from apps.vdb.stages.mixed import mixed_workload
    from apps.vdb.stages.query_raw import read_requests

    settings, endpoints = milvus
    base = read_vecs(DATA / "fmnist1k_base.fvecs")
    queries = read_vecs(DATA / "fmnist1k_query.fvecs")[:40]
    dataset = write_dataset(tmp_path / "data", base)
    queries_file = tmp_path / "queries.parquet"
    ids = np.arange(40, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "embedding": vectors_to_arrow(queries, "float32")}), queries_file)
    spec = CollectionSpec(name="mixed_open", dim=784, metric="l2", index_type="hnsw")
    target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=spec)
    cfg = MixedConfig(
        preload_fraction=0.5,
        insert_clients=1,
        insert_batch_size=10,
        insert_rate=250,  # 500 rows in about two seconds
        query_clients=2,
        query_batch_size=1,
        query_rate=40,
        arrivals="constant",
        max_lag_ms=50,  # the test checks the path and the schedule, not this machine's timer
        ef=10,
        k=10,
        warmup_queries=4,
        baseline_duration_s=1.0,
        timeout_s=300,
    )
    record = mixed_workload(target, str(dataset), str(queries_file), cfg, str(tmp_path / "point"), 250)
    assert record.query_rate == 40 and record.setting.endswith(",rate=40")
    phase = read_requests(record.queries_file)
    intended = np.sort(phase.column("t_intended").to_numpy())
    assert np.allclose(np.diff(intended), 1 / 40, atol=1e-6)  # constant spacing over both clients
    assert intended[0] == pytest.approx(record.released_at)
    assert (phase.column("t_start").to_numpy() >= phase.column("t_intended").to_numpy()).all()
    inserts = pq.read_table(record.inserts_file).sort_by("batch")
    planned = inserts.column("t_intended").to_numpy()
    assert np.allclose(np.diff(planned), 10 / 250, atol=1e-6)  # 10 rows a batch at 250 rows/s
    rows = {row["stage"]: row for row in mixed_rows(record, dataset, queries_file, "l2")}
    results_table(list(rows.values()))
    for stage in ("mixed", "mixed_baseline"):
        row = rows[stage]
        assert row["rate"] == 40 and row["intended_p99_ms"] >= row["p99_ms"] > 0
        assert row["latency_p99_ms"] == row["intended_p99_ms"]
        assert row["achieved_rate"] == pytest.approx(40, rel=0.25)


def test_query_clients_look_for_the_insert_markers_once_a_poll(tmp_path: Path, monkeypatch) -> None:
    """Not a file-system round trip before every request (on Lustre it would be measured as latency):
    a marker touched between two looks is seen at the next look, MARKER_POLL_S later."""
    from apps.vdb.stages import mixed

    clock = [100.0]
    monkeypatch.setattr(mixed.time, "monotonic", lambda: clock[0])
    markers = [str(tmp_path / "inserted.0"), str(tmp_path / "inserted.1")]
    done = mixed._InsertsDone(markers)
    assert not done()
    for marker in markers:
        Path(marker).touch()
    clock[0] += mixed.MARKER_POLL_S / 2
    assert not done()  # within the poll: not looked at again
    clock[0] += mixed.MARKER_POLL_S
    assert done() and done()


def test_unsent_queries_are_those_due_before_the_last_insert() -> None:
    """Due at 0, 1, 2 before the last acknowledgement (3.0), sent for 0 and 1: one unsent; the requests
    sent for 3.01 and 3.02, before the clients saw the end, do not make up for it. Closed loop: none."""
    from apps.vdb.stages.mixed import _unsent

    open_loop_client = {"schedule": [0, 1, 2, 3.01, 3.02, 3.03], "t_intended": [0, 1, 3.01, 3.02]}
    closed_loop_client = {"schedule": [], "t_intended": [None, None]}
    assert _unsent([open_loop_client, closed_loop_client], last_ack=3.0) == 1
