"""A timed query setting on a real engine (Qdrant's embedded engine, in process): the window lasts at least
``duration_s``, the clients cycle through the query set, recall rests on each distinct query once."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.dataset.layout import finalize_dataset, vectors_to_arrow
from apps.evaluate.metrics import evaluate_files
from apps.interchange.vecs import read_vecs
from apps.report.document import write_report
from apps.vdb.base import CollectionSpec
from apps.vdb.config import QuerySweepConfig
from apps.vdb.qdrant.deploy import QdrantDeployment
from apps.vdb.qdrant.settings import QdrantSettings
from apps.vdb.records import DatabaseTarget
from apps.vdb.stages import open_loop
from apps.vdb.stages.index import build_index
from apps.vdb.stages.insert import insert_partition, prepare_collection, work_units
from apps.vdb.stages.query_raw import read_raw, requests_path
from apps.vdb.stages.query_sweep import query_sweep
from core.format import num
from core.store import write_parquet_atomic

pytestmark = pytest.mark.slow

SPEC = CollectionSpec(name="fmnist", dim=784, metric="l2", index_type="hnsw", deferred_indexing=True)
QUERIES, K, DURATION = 40, 10, 1.5


@pytest.fixture
def loaded_edge(shared_data: Path, tmp_path: Path):
    """fmnist1k in the dataset layout, loaded and indexed in Qdrant edge; 40 queries; exact top-k."""
    root = shared_data / "ann" / "fmnist1k"
    base = read_vecs(root / "fmnist1k_base.fvecs")
    queries = read_vecs(root / "fmnist1k_query.fvecs")[:QUERIES]
    dataset = tmp_path / "dataset"
    ids = np.arange(len(base), dtype=np.int64)
    table = pa.table(
        {
            "id": ids,
            "doc_id": ids.astype(str),
            "chunk_index": np.zeros(len(base), np.int32),
            "embedding": vectors_to_arrow(base, "float32"),
        }
    )
    record = write_parquet_atomic(table, dataset / "part-00000.parquet", row_group_rows=250)
    finalize_dataset(
        str(dataset), "fmnist", [{"file": "part-00000.parquet", "shard": 0, **record}], {"dimension": 784}, {}
    )
    queries_file = tmp_path / "queries.parquet"
    write_parquet_atomic(
        pa.table(
            {
                "id": np.arange(QUERIES),
                "text": [""] * QUERIES,
                "embedding": vectors_to_arrow(queries, "float32"),
            }
        ),
        queries_file,
    )
    d = np.linalg.norm(queries[:, None, :].astype(np.float64) - base[None, :, :], axis=2)
    order = np.argsort(d, axis=1, kind="stable")[:, :100]
    gt_file = tmp_path / "groundtruth.parquet"
    write_parquet_atomic(
        pa.table(
            {
                "query_id": np.arange(QUERIES),
                "neighbors": pa.array(order.tolist(), pa.list_(pa.int64(), 100)),
                "distances": pa.array(np.take_along_axis(d, order, 1).tolist(), pa.list_(pa.float32(), 100)),
            }
        ),
        gt_file,
    )
    settings = QdrantSettings(name="qdrant", mode="edge", indexing_threshold_kb=1, full_scan_threshold_kb=1)
    deployment = QdrantDeployment(settings)
    endpoints = deployment.start(tmp_path / "qdrant")
    try:
        target = DatabaseTarget(settings=settings, endpoints=endpoints, collection=SPEC)
        prepare_collection(target, False)
        insert_partition(target, work_units(str(dataset)), 250, 1, 0)
        index = build_index(target, len(base), 300, None)
        yield target, index, dataset, queries_file, gt_file, d
    finally:
        deployment.stop()


def test_a_timed_setting_lasts_its_window_and_scores_each_distinct_query_once(
    loaded_edge, tmp_path: Path
) -> None:
    target, index, dataset, queries_file, gt_file, d = loaded_edge
    sweep = QuerySweepConfig(
        ef=[16], batch_size=[4], clients=[1], k=[K], warmup_queries=4, duration_s=DURATION
    )
    [record] = query_sweep(target, str(queries_file), sweep, str(tmp_path / "out"), index)
    assert record.stalled is None
    raw = read_raw(record.file)
    every = pq.read_table(requests_path(record.file))
    # the first answer to each distinct query, once; every request of the window in the requests file
    assert sorted(raw.column("query_id").to_pylist()) == list(range(QUERIES))
    assert record.distinct_queries == QUERIES
    assert record.queries_sent == sum(every.column("queries").to_pylist()) > QUERIES  # cycled
    assert record.window_s >= DURATION
    t_start, t_end = every.column("t_start").to_numpy(), every.column("t_end").to_numpy()
    assert record.window_s == pytest.approx(t_end.max() - t_start.min())

    [row] = evaluate_files([record.file], gt_file, queries_file, dataset, "l2")
    assert row["window_s"] >= DURATION and row["queries_sent"] == record.queries_sent
    assert row["distinct_queries"] == QUERIES and row["requests"] == every.num_rows
    assert row["qps"] == pytest.approx(record.queries_sent / record.window_s)

    # recall recomputed here from the raw ids: a returned id is a hit when its exact distance is at most
    # the k-th exact distance (ties count), once per distinct query
    hits = []
    for qid, returned in zip(raw.column("query_id").to_pylist(), raw.column("ids").to_pylist(), strict=True):
        kth = np.sort(d[qid])[K - 1]
        unique = list(dict.fromkeys(i for i in returned[:K] if i >= 0))
        hits.append(sum(d[qid, i] <= kth * (1 + 1e-5) + 1e-6 for i in unique) / K)
    assert row["recall"] == pytest.approx(np.mean(hits), abs=1e-9)
    assert row["recall"] >= 0.8


def test_open_loop_settings_follow_their_closed_loop_setting(loaded_edge, tmp_path: Path) -> None:
    """Offered rates on the real engine: every scheduled request sent, latency from the intended time,
    recall as for the closed loop, and the report's open-loop section with its knee and figure."""
    target, index, dataset, queries_file, gt_file, _ = loaded_edge
    sweep = QuerySweepConfig(
        ef=[16], batch_size=[1], clients=[1], k=[K], warmup_queries=4, duration_s=1.0, rate=[40, 80], seed=1
    )
    records = query_sweep(target, str(queries_file), sweep, str(tmp_path / "out"), index)
    closed = f"ef=16,batch=1,clients=1,k={K}"
    assert [r.setting for r in records] == [closed, f"{closed},rate=40", f"{closed},rate=80"]
    rows = evaluate_files([r.file for r in records], gt_file, queries_file, dataset, "l2")
    assert [r["stage"] for r in rows].count("open_loop") == 2
    for rate in (40, 80):
        [row] = [r for r in rows if r["setting"] == f"{closed},rate={rate}"]
        every = pq.read_table(requests_path(next(r.file for r in records if r.setting == row["setting"])))
        scheduled = len(open_loop.arrival_offsets(rate, 1.0, "poisson", seed=1))
        assert row["rate"] == rate and row["requests"] == every.num_rows == scheduled and row["unsent"] == 0
        intended = every.column("t_intended").to_numpy()
        assert (every.column("t_start").to_numpy() >= intended).all()
        assert row["intended_p99_ms"] >= row["p99_ms"] > 0  # the intended time is never after the send
        ends = every.column("t_end").to_numpy()
        # answers and intended sends per second, each over its own span
        assert row["achieved_rate"] == pytest.approx((scheduled - 1) / (ends.max() - ends.min()))
        assert row["offered_rate"] == pytest.approx((scheduled - 1) / (intended.max() - intended.min()))
        assert row["recall"] >= 0.8 and row["distinct_queries"] == min(QUERIES, scheduled)
    report = write_report(rows, tmp_path / "report")
    text = report["report"].read_text()
    assert "## Latency under offered load (open loop)" in text and report["figures"]["open_loop"].exists()
    section = text[text.index("## Latency under offered load") :]
    knee_line = next(line for line in section.splitlines() if line.startswith(f"| qdrant | {closed} |"))
    served = [r["rate"] for r in rows if r["stage"] == "open_loop" and open_loop.keeps_up(r, None)]
    assert knee_line.split(" | ")[3] == (num(max(served), 0) if served else "none served")


def test_rate_auto_steps_up_until_a_rate_is_not_served(loaded_edge, tmp_path: Path) -> None:
    target, index, dataset, queries_file, gt_file, _ = loaded_edge
    sweep = QuerySweepConfig(
        ef=[16],
        batch_size=[1],
        clients=[1],
        k=[K],
        warmup_queries=4,
        duration_s=0.4,
        rate="auto",
        p99_bound_ms=50,
    )
    records = query_sweep(target, str(queries_file), sweep, str(tmp_path / "out"), index)
    rates = [float(r.setting.split("rate=")[1]) for r in records[1:]]
    assert records[0].setting == f"ef=16,batch=1,clients=1,k={K}" and rates
    # steps of 1.25x up to the first rate not served (the highest tried), then at most AUTO_REFINE
    # halvings of the last step, each between the last rate served and the first not served
    top = rates.index(max(rates))
    assert all(
        b / a == pytest.approx(open_loop.AUTO_FACTOR, rel=0.01)
        for a, b in itertools.pairwise(rates[: top + 1])
    )
    # every rate below the highest was served, the highest was not (or could not be offered)
    rows = {
        r["setting"]: r
        for r in evaluate_files([r.file for r in records], gt_file, queries_file, dataset, "l2")
    }
    served = [open_loop.keeps_up(rows[r.setting], 50) if r.setting in rows else False for r in records[1:]]
    assert served[:top] == [True] * top and not served[top]
    refined = rates[top + 1 :]
    inside = 0 < top < open_loop.AUTO_MAX_STEPS - 1  # a step not served, after one that was
    assert len(refined) in ((open_loop.AUTO_REFINE,) if inside else (0, open_loop.AUTO_REFINE))
    assert all(rates[top - 1] < r < rates[top] for r in refined)
    # the closed loop's rate sets the first step
    every = pq.read_table(requests_path(records[0].file))
    closed_rate = every.num_rows / (
        every.column("t_end").to_numpy().max() - every.column("t_start").to_numpy().min()
    )
    assert rates[0] == pytest.approx(open_loop.AUTO_START * closed_rate, rel=0.01)
