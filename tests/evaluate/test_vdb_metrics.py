"""Metrics from raw query results: tie-aware recall on real vectors, QPS, latency, operating point."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.dataset.layout import row_id, vectors_to_arrow
from apps.dataset.lookup import VectorLookup, fetch_vectors
from apps.evaluate.metrics import evaluate, evaluate_files, latency_stats, qps
from apps.evaluate.recall import needed_base_ids, recall_at_k
from apps.evaluate.results import normalize_rows
from apps.evaluate.rules import best_operating_point
from apps.interchange.vecs import read_vecs
from apps.vdb.records import setting_label
from apps.vdb.stages.query_raw import RAW_QUERY_SCHEMA, concat_raw, raw_query_table, read_raw, validate_raw
from core.store import atomic_write_json, write_parquet_atomic

T0 = 1_700_000_000.0  # realistic time.time() values: float64 keeps microseconds


@pytest.fixture(scope="module")
def fmnist(shared_data: Path) -> dict[str, np.ndarray]:
    root = shared_data / "ann" / "fmnist1k"
    return {
        "base": read_vecs(root / "fmnist1k_base.fvecs"),
        "queries": read_vecs(root / "fmnist1k_query.fvecs"),
        "published": read_vecs(root / "fmnist1k_groundtruth.ivecs").astype(np.int64),
    }


def exact_distances(queries: np.ndarray, base: np.ndarray, metric: str) -> np.ndarray:
    q, b = queries.astype(np.float64), base.astype(np.float64)
    if metric == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        b = b / np.linalg.norm(b, axis=1, keepdims=True)
        return 1 - q @ b.T
    if metric == "ip":
        return -(q @ b.T)
    squared = (q * q).sum(1)[:, None] - 2 * q @ b.T + (b * b).sum(1)[None, :]
    return np.sqrt(np.maximum(squared, 0))


def gt_table(query_ids, neighbors: np.ndarray, dists: np.ndarray) -> pa.Table:
    """groundtruth.parquet layout (query_id, neighbors / distances as fixed_size_list[k])."""
    k = neighbors.shape[1]
    return pa.table(
        {
            "query_id": pa.array(np.asarray(query_ids, np.int64)),
            "neighbors": pa.FixedSizeListArray.from_arrays(pa.array(neighbors.ravel(), pa.int64()), k),
            "distances": pa.FixedSizeListArray.from_arrays(pa.array(dists.ravel(), pa.float32()), k),
        }
    )


def exact_gt(queries, base, ids, metric, k):
    """Exact top-k by numpy (ties broken by position, like the ground-truth stage)."""
    d = exact_distances(queries, base, metric)
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return gt_table(np.arange(len(queries)), ids[order], np.take_along_axis(d, order, 1)), d, order


def raw_for(ids, k=10, query_ids=None, ef=64, batch=10, scores=None, t=(T0, T0 + 0.5)):
    n = len(ids)
    query_ids = np.arange(n) if query_ids is None else query_ids
    if scores is None:  # nonsense scores: recall must not use them
        scores = [np.random.default_rng(0).normal(size=len(r)).astype(np.float32) for r in ids]
    return raw_query_table(
        database="testdb",
        ef=ef,
        batch_size=batch,
        clients=1,
        k=k,
        client=0,
        request=np.arange(n) // batch,
        query_ids=query_ids,
        ids=ids,
        scores=scores,
        t_start=t[0],
        t_end=t[1],
    )


# --------------------------------------------------------------------------------------------- raw layout


def test_raw_table_schema_round_trip(tmp_path: Path) -> None:
    ids = np.array([[5, 7, 9], [1, -1, -1]])
    table = raw_for(ids, k=3, batch=2, scores=np.array([[0.9, 0.8, 0.7], [0.5, 0, 0]], np.float32))
    assert table.schema.equals(RAW_QUERY_SCHEMA)
    assert table.column("setting")[0].as_py() == "ef=64,batch=2,clients=1,k=3" == setting_label(64, 2, 1, 3)
    assert setting_label(None, 1, 4, 10) == "ef=none,batch=1,clients=4,k=10"
    pq.write_table(table, tmp_path / "raw.parquet")
    back = read_raw(tmp_path / "raw.parquet")
    assert back.schema.equals(RAW_QUERY_SCHEMA)
    assert back.column("ids").to_pylist() == [[5, 7, 9], [1, -1, -1]]
    ragged = raw_for([[3], [4, 5, 6, 7]], k=3, ef=None)
    assert ragged.column("ef").null_count == 2
    assert concat_raw([table, ragged]).num_rows == 4


def test_raw_table_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="'ids' has 1 rows, expected 2"):
        raw_query_table(
            database="db",
            ef=None,
            batch_size=2,
            clients=1,
            k=2,
            client=0,
            request=0,
            query_ids=[0, 1],
            ids=[[1, 2]],
            scores=[[0.5, 0.4], [0.3]],
            t_start=T0,
            t_end=T0 + 1,
        )
    with pytest.raises(ValueError, match="'t_start' has shape"):
        raw_for([[1], [2]], t=([T0, T0, T0], T0 + 1))
    broken = raw_for([[1], [2]]).drop_columns(["t_end"])
    with pytest.raises(ValueError, match="missing columns"):
        validate_raw(broken)
    with_nulls = raw_for([[1], [2]]).set_column(0, "database", pa.array(["a", None]))
    with pytest.raises(ValueError, match="'database' has 1 nulls"):
        validate_raw(with_nulls)


# --------------------------------------------------------------------------------------------- recall


def test_exact_answer_has_recall_one_on_fmnist(fmnist) -> None:
    base, queries, published = fmnist["base"], fmnist["queries"], fmnist["published"]
    k = 10
    d = exact_distances(queries, base, "l2")
    gt = gt_table(np.arange(500), published[:, :k], np.take_along_axis(d, published[:, :k], 1))
    lookup = (np.arange(len(base)), base)
    # order within the top-k does not matter, and the DB's (random) scores are not used
    returned = published[:, :k][:, ::-1]
    mean, per_query = recall_at_k(raw_for(returned), gt, (np.arange(500), queries), lookup, "l2")
    assert mean == 1.0 and per_query.shape == (500,) and (per_query == 1.0).all()
    # the query vectors can also be a dict id -> vector; base vectors in (vectors, ids) order
    as_dict = {i: queries[i] for i in range(500)}
    assert recall_at_k(raw_for(returned), gt, as_dict, (base, np.arange(len(base))), "l2")[0] == 1.0


def test_wrong_answers_are_counted_exactly(fmnist) -> None:
    base, queries = fmnist["base"], fmnist["queries"]
    ids = np.arange(len(base))
    k = 10
    gt, d, order = exact_gt(queries, base, ids, "l2", k)
    far = np.argsort(-d, axis=1)[:, :k]  # the farthest base vectors: never near the 10th distance
    correct = np.arange(500) % (k + 1)  # 0..10 right answers per query
    returned = np.array(
        [np.concatenate([order[i, : correct[i]], far[i, : k - correct[i]]]) for i in range(500)]
    )
    rng = np.random.default_rng(3)
    returned = np.array([rng.permutation(r) for r in returned])  # rank positions do not matter
    mean, per_query = recall_at_k(raw_for(returned), gt, (ids[:500], queries), (ids, base), "l2")
    np.testing.assert_array_equal(per_query, correct / k)
    assert mean == pytest.approx(correct.mean() / k, abs=1e-12)


def test_duplicates_padding_and_truncation(fmnist) -> None:
    base, queries = fmnist["base"], fmnist["queries"][:4]
    ids = np.arange(len(base))
    gt, _, order = exact_gt(queries, base, ids, "l2", 10)
    top = order
    returned = [
        [top[0, 0]] * 10,  # one right id repeated: counts once
        [*top[1, :5], -1, -1, -1, -1, -1],  # -1 pads are misses
        list(top[2, :5]),  # a short list: missing positions are misses
        [*top[3, :8], 999_999, 999_999, top[3, 8], top[3, 9]],  # only the first k returned count
    ]
    raw = raw_for(returned)
    _, per_query = recall_at_k(raw, gt, (np.arange(4), queries), (ids, base), "l2")
    np.testing.assert_allclose(per_query, [0.1, 0.5, 0.5, 0.8])
    rows = evaluate(raw, gt, (np.arange(4), queries), (ids, base), "l2")
    assert next(iter(rows.values()))["unknown_ids"] == 2  # 999_999 is no dataset id


@pytest.mark.parametrize("metric", ["l2", "cosine", "ip"])
def test_ties_at_the_kth_distance(fmnist, metric: str) -> None:
    """A returned duplicate of the k-th neighbour is a hit; one just beyond the k-th distance is not."""
    base, queries = fmnist["base"], fmnist["queries"][:20]
    k, n = 10, len(base)
    d = exact_distances(queries, base, metric)
    order = np.argsort(d, axis=1, kind="stable")
    kth_id = order[:, k - 1]
    # Extra base rows: an exact copy of each query's k-th neighbour, one moved to just inside the
    # tolerance, one to just outside it (in distance units, so the -ip sign is exercised).
    copies, inside, outside = [], [], []
    for i, j in enumerate(kth_id):
        x, q = base[j].astype(np.float64), queries[i].astype(np.float64)
        copies.append(x)
        if metric == "l2":
            inside.append(q + (x - q) * (1 + 2e-6))
            outside.append(q + (x - q) * (1 + 1e-4))
        elif metric == "ip":  # distance -q.x is negative: scaling x down by s raises it by s*|d|
            inside.append(x * (1 - 2e-6))
            outside.append(x * (1 - 1e-4))
        else:  # cosine: rotate x away from q, in their common plane, to a chosen 1 - cos
            qh, xh = q / np.linalg.norm(q), x / np.linalg.norm(x)
            uh = xh - (xh @ qh) * qh
            uh /= np.linalg.norm(uh)
            for out, factor in ((inside, 1 + 2e-6), (outside, 1 + 1e-4)):
                c = 1 - (1 - xh @ qh) * factor
                out.append(np.linalg.norm(x) * (c * qh + np.sqrt(1 - c * c) * uh))
    extra = np.concatenate([copies, inside, outside]).astype(np.float32)
    all_ids = np.concatenate([np.arange(n), 10_000 + np.arange(3 * 20)])
    all_vectors = np.concatenate([base, extra])
    gt = gt_table(np.arange(20), order[:, :k], np.take_along_axis(d, order[:, :k], 1))
    full = exact_distances(queries, all_vectors, metric)
    recomputed_kth = np.take_along_axis(full, kth_id[:, None], 1)[:, 0]
    outside_d = full[np.arange(20), n + 40 + np.arange(20)]
    assert (outside_d > recomputed_kth + 1e-5 * np.abs(recomputed_kth)).all()  # really beyond
    beyond = order[:, k]  # the (k+1)-th original neighbour: strictly farther, unless a real tie
    strictly = np.take_along_axis(d, beyond[:, None], 1)[:, 0] > d[np.arange(20), kth_id] * (1 + 1e-4) + 1e-6

    def recall_with(last: np.ndarray) -> np.ndarray:
        returned = np.concatenate([order[:, : k - 1], last[:, None]], axis=1)
        lookup = (all_ids, all_vectors)
        return recall_at_k(raw_for(returned), gt, (np.arange(20), queries), lookup, metric, rel_tol=1e-5)[1]

    np.testing.assert_array_equal(recall_with(10_000 + np.arange(20)), 1.0)  # exact copy: tie
    np.testing.assert_array_equal(recall_with(10_020 + np.arange(20)), 1.0)  # within rel_tol
    np.testing.assert_array_equal(recall_with(10_040 + np.arange(20)), 0.9)  # just outside
    assert strictly.any()
    np.testing.assert_array_equal(recall_with(beyond)[strictly], 0.9)


def test_zero_distances_use_an_absolute_tolerance(fmnist) -> None:
    """The query is a base vector (k-th distance 0): a relative tolerance alone would admit nothing."""
    base = fmnist["base"][:200]
    query = base[5:6].copy()
    blank = int(np.flatnonzero(query[0] == 0)[0])  # a zero pixel: small offsets stay exact in float32
    near, far = query.copy(), query.copy()
    near[0, blank] = 5e-7  # L2 distance 5e-7, under the absolute tolerance 1e-6
    far[0, blank] = 1e-3
    ids = np.concatenate([np.arange(200), [7_000, 7_001, 7_002]])
    vectors = np.concatenate([base, query, near, far])
    gt = gt_table([0], np.array([[5]]), np.array([[0.0]]))

    def recall(returned: int, metric: str = "l2", q: np.ndarray = query) -> float:
        return recall_at_k(raw_for([[returned]], k=1), gt, ([0], q), (ids, vectors), metric)[0]

    assert recall(7_000) == 1.0  # an exact copy
    assert recall(7_001) == 1.0  # within the absolute tolerance
    assert recall(7_002) == 0.0
    assert recall(7_000, "cosine", query * 2.0) == 1.0  # same direction: cosine distance 0
    assert recall(6, "cosine", query * 2.0) == 0.0


def test_recall_errors_name_the_problem(fmnist) -> None:
    base, queries = fmnist["base"], fmnist["queries"][:3]
    gt, _, order = exact_gt(queries, base, np.arange(1000), "l2", 5)
    lookup = (np.arange(1000), base)
    with pytest.raises(ValueError, match="ground truth holds 5 neighbours per query, k=10"):
        recall_at_k(raw_for(order), gt, (np.arange(3), queries), lookup, "l2")
    with pytest.raises(ValueError, match="query id 42 has no ground truth"):
        recall_at_k(raw_for(order, k=5, query_ids=[0, 1, 42]), gt, (np.arange(3), queries), lookup, "l2")
    with pytest.raises(ValueError, match="no vector for query id 2"):
        recall_at_k(raw_for(order, k=5), gt, (np.arange(2), queries[:2]), lookup, "l2")


# --------------------------------------------------------------------------------------------- QPS, latency


def two_client_run() -> pa.Table:
    """Two clients, batches of 4 (the last one 2): request windows in seconds after T0."""
    windows = {(0, 0): (0.0, 0.1), (0, 1): (0.1, 0.3), (1, 0): (0.05, 0.15), (1, 1): (0.15, 0.45)}
    sizes = {(0, 0): 4, (0, 1): 4, (1, 0): 4, (1, 1): 2}
    tables, qid = [], 0
    for (client, request), (start, end) in windows.items():
        b = sizes[(client, request)]
        tables.append(
            raw_query_table(
                database="db",
                ef=32,
                batch_size=4,
                clients=2,
                k=2,
                client=client,
                request=request,
                query_ids=np.arange(qid, qid + b),
                ids=np.zeros((b, 2), np.int64),
                scores=np.zeros((b, 2), np.float32),
                t_start=T0 + start,
                t_end=T0 + end,
            )
        )
        qid += b
    return concat_raw(tables)


def test_qps_counts_queries_over_the_phase_wall_time() -> None:
    raw = two_client_run()
    assert qps(raw) == pytest.approx(14 / 0.45, rel=1e-6)  # 14 queries, phase 0.00 .. 0.45 s


def test_latency_is_per_request_not_per_query() -> None:
    stats = latency_stats(two_client_run())
    assert stats["requests"] == 4
    # request latencies 100, 200, 100, 300 ms (each counted once, whatever its batch size)
    assert stats["latency_mean_ms"] == pytest.approx(175.0, abs=1e-3)
    assert stats["p50_ms"] == pytest.approx(150.0, abs=1e-3)
    assert stats["p95_ms"] == pytest.approx(285.0, abs=1e-3)  # linear between 200 and 300
    assert stats["p99_ms"] == pytest.approx(297.0, abs=1e-3)


def test_metrics_refuse_mixed_settings() -> None:
    mixed = concat_raw([two_client_run(), raw_for([[1, 2]], k=2)])
    with pytest.raises(ValueError, match="mix several values"):
        qps(mixed)


# --------------------------------------------------------------------------------------------- evaluate


def test_evaluate_and_best_operating_point(fmnist) -> None:
    base, queries = fmnist["base"], fmnist["queries"][:100]
    ids = np.arange(len(base))
    k = 10
    gt, d, order = exact_gt(queries, base, ids, "l2", k)
    far = np.argsort(-d, axis=1)[:, :k]

    def answers(right: np.ndarray) -> np.ndarray:
        return np.array([np.concatenate([order[i, :r], far[i, : k - r]]) for i, r in enumerate(right)])

    settings = {  # ef: (right answers per query, seconds per batch of 10)
        16: (np.full(100, 7), 0.010),  # recall 0.70, fastest
        32: (np.where(np.arange(100) < 60, 10, 9), 0.020),  # recall 0.96: the best at >= 0.95
        128: (np.full(100, 10), 0.050),  # recall 1.00, slowest
    }
    tables = []
    for ef, (right, seconds) in settings.items():
        for request in range(10):
            rows = slice(request * 10, request * 10 + 10)
            start = T0 + request * seconds
            tables.append(
                raw_query_table(
                    database="milvus",
                    ef=ef,
                    batch_size=10,
                    clients=1,
                    k=k,
                    client=0,
                    request=request,
                    query_ids=np.arange(100)[rows],
                    ids=answers(right)[rows],
                    scores=np.zeros((10, k), np.float32),
                    t_start=start,
                    t_end=start + seconds,
                )
            )
    raw = concat_raw(tables)
    result = evaluate(raw, gt, (np.arange(100), queries), VectorLookup.from_arrays(ids, base), "l2")
    assert list(result) == [setting_label(ef, 10, 1, k) for ef in (16, 32, 128)]
    row = result[setting_label(32, 10, 1, k)]
    assert row["recall"] == pytest.approx(0.96) and row["recall_min"] == pytest.approx(0.9)
    assert row["qps"] == pytest.approx(100 / 0.2, rel=1e-6)
    assert row["latency_mean_ms"] == pytest.approx(20.0, abs=1e-3) and row["requests"] == 10
    assert row["queries_sent"] == row["distinct_queries"] == 100 and row["window_s"] == pytest.approx(0.2)
    assert row["unknown_ids"] == 0 and row["stage"] == "query"
    assert result[setting_label(16, 10, 1, k)]["recall"] == pytest.approx(0.7)
    best = best_operating_point(result.values())
    assert best is not None and best["ef"] == 32
    assert best_operating_point(result.values(), min_recall=0.99)["ef"] == 128
    assert best_operating_point(result.values(), min_recall=1.01) is None
    assert len(normalize_rows(result.values())) == 3  # the rows fit results.parquet as they are
    with pytest.raises(ValueError, match="several databases"):
        evaluate(concat_raw([raw, two_client_run()]), gt, (np.arange(100), queries), (ids, base), "l2")


def test_best_operating_point_rules() -> None:
    rows = [
        {"stage": "query", "status": "ok", "setting": "a", "qps": 900.0, "recall": 0.94},
        {"stage": "query", "status": "ok", "setting": "b", "qps": 500.0, "recall": 0.95},
        {
            "stage": "query",
            "status": "ok",
            "setting": "c",
            "qps": 500.0,
            "recall": 0.99,
        },  # tie: higher recall
        {"stage": "query", "status": "failed", "setting": "d", "qps": 5000.0, "recall": 1.0},
        {"stage": "query", "status": "ok", "setting": "e", "qps": float("nan"), "recall": 1.0},
        {"stage": "query", "status": "ok", "setting": "f", "qps": None, "recall": None},
        {"stage": "mixed", "status": "ok", "setting": "g", "qps": 9000.0, "recall": 1.0},
    ]
    assert best_operating_point(rows)["setting"] == "c"
    assert best_operating_point(rows, min_recall=0.9)["setting"] == "a"
    assert best_operating_point([]) is None
    assert best_operating_point(rows[:1]) is None


# --------------------------------------------------------------------------------------------- dataset


def write_dataset(directory: Path, vectors: np.ndarray, parts: int) -> np.ndarray:
    """A small dataset in the embed stage's layout (parts + manifest); returns the row ids."""
    files, all_ids = [], []
    for shard, chunk in enumerate(np.array_split(vectors, parts)):
        ids = np.array([row_id(shard, r) for r in range(len(chunk))], np.int64)
        table = pa.table(
            {
                "id": ids,
                "doc_id": pa.array([f"d{i}" for i in ids]),
                "chunk_index": pa.array(np.zeros(len(ids), np.int32)),
                "embedding": vectors_to_arrow(chunk, "float32"),
            }
        )
        name = f"part-{shard:05d}.parquet"
        files.append({"file": name, **write_parquet_atomic(table, directory / name, row_group_rows=100)})
        all_ids.append(ids)
    atomic_write_json(
        directory / "manifest.json",
        {"stage": "embed", "files": files, "dimension": 784, "rows": len(vectors)},
    )
    return np.concatenate(all_ids)


def test_fetch_vectors_keeps_only_requested_rows(tmp_path: Path, fmnist) -> None:
    base = fmnist["base"]
    ids = write_dataset(tmp_path / "ds", base, parts=3)
    wanted = np.concatenate([ids[[0, 17, 333, 334, 999]], [-1, 5_000_000_000]])
    lookup = fetch_vectors(tmp_path / "ds", wanted, batch_rows=64)
    assert len(lookup) == 5
    np.testing.assert_array_equal(lookup.get(ids[[999, 0, 334]]), base[[999, 0, 334]])
    assert lookup.missing(wanted).tolist() == [-1, 5_000_000_000]
    with pytest.raises(KeyError, match="5000000000"):
        lookup.get([5_000_000_000])


def test_arrow_to_vectors_honours_a_slice() -> None:
    """A batch cut from a larger row group is a slice: its vectors are its own rows, not the group's."""
    from apps.dataset.layout import arrow_to_vectors

    vectors = np.arange(40, dtype=np.float32).reshape(10, 4)
    column = vectors_to_arrow(vectors, "float32")
    np.testing.assert_array_equal(arrow_to_vectors(column.slice(3, 4)), vectors[3:7])
    np.testing.assert_array_equal(arrow_to_vectors(pa.chunked_array([column.slice(8)])), vectors[8:])


def test_fetch_vectors_stops_once_every_id_is_found(tmp_path: Path, fmnist, monkeypatch) -> None:
    """The pass over the parts ends at the last wanted row: ids in the first part read one part only."""
    import apps.dataset.lookup as lookup_module

    ids = write_dataset(tmp_path / "ds", fmnist["base"], parts=4)
    batches = []
    real = lookup_module.iter_vectors

    def counted(*args, **kwargs):
        for batch in real(*args, **kwargs):
            batches.append(len(batch[0]))
            yield batch

    monkeypatch.setattr(lookup_module, "iter_vectors", counted)
    lookup = fetch_vectors(tmp_path / "ds", ids[[3, 3, 40]], batch_rows=50)  # a repeated id counts once
    np.testing.assert_array_equal(lookup.get(ids[[40, 3]]), fmnist["base"][[40, 3]])
    assert len(lookup) == 2 and sum(batches) == 50  # the first batch held both


def test_evaluate_files_fetches_only_the_scored_top_k(tmp_path: Path, fmnist, monkeypatch) -> None:
    """Recall@k needs the exact top-k, not every published neighbour: the report's memory follows the
    queries x k it scores (``evaluate_files`` on a top-100 truth scored at k = 10)."""
    import apps.evaluate.metrics as metrics_module

    base, queries = fmnist["base"], fmnist["queries"][:20]
    ids = write_dataset(tmp_path / "ds", base, parts=2)
    pq.write_table(
        pa.table({"id": pa.array(np.arange(20)), "embedding": vectors_to_arrow(queries, "float32")}),
        tmp_path / "queries.parquet",
    )
    truth, _, order = exact_gt(queries, base, ids, "l2", 100)
    neighbors = ids[order]
    pq.write_table(truth, tmp_path / "gt.parquet")
    raw = raw_query_table(
        database="faiss", ef=64, batch_size=20, clients=1, k=10, client=0, request=0,
        query_ids=np.arange(20), ids=neighbors[:, :10], scores=np.zeros((20, 10), np.float32),
        t_start=T0, t_end=T0 + 0.25,
    )  # fmt: skip
    pq.write_table(raw, tmp_path / "raw-faiss.parquet")
    asked = []
    real = metrics_module.fetch_vectors
    monkeypatch.setattr(
        metrics_module, "fetch_vectors", lambda d, wanted: asked.append(wanted) or real(d, wanted)
    )
    rows = evaluate_files(
        [tmp_path / "raw-faiss.parquet"], tmp_path / "gt.parquet", tmp_path / "queries.parquet",
        tmp_path / "ds", "l2",
    )  # fmt: skip
    assert [r["recall"] for r in rows] == [1.0]
    assert set(asked[0].tolist()) == set(neighbors[:, :10].ravel().tolist())  # not the 100 per query


def test_evaluate_files_end_to_end(tmp_path: Path, fmnist) -> None:
    """Raw files of two databases, queries.parquet, groundtruth.parquet and the dataset on disk."""
    from apps.dataset.groundtruth.stage import GroundTruthConfig, compute_groundtruth

    base, queries = fmnist["base"], fmnist["queries"][:50]
    ids = write_dataset(tmp_path / "ds", base, parts=2)
    pq.write_table(
        pa.table({"id": pa.array(np.arange(50)), "embedding": vectors_to_arrow(queries, "float32")}),
        tmp_path / "queries.parquet",
    )
    # the real ground-truth stage (torch, float32) writes groundtruth.parquet
    settings = GroundTruthConfig(k=10, metric="cosine", device="cpu", memory_budget_mb=16)
    compute_groundtruth(
        str(tmp_path / "gt"), str(tmp_path / "ds"), str(tmp_path / "queries.parquet"), settings
    )
    gt = pq.read_table(tmp_path / "gt" / "groundtruth.parquet")
    stage_ids = np.array(gt.column("neighbors").to_pylist())
    _, _, order = exact_gt(queries, base, ids, "cosine", 10)  # numpy float64, an independent top-k
    exact = ids[order]
    half = stage_ids.copy()
    half[:, 5:] = -1
    for name, answer in (("qdrant", exact), ("weaviate", half)):
        raw = raw_query_table(
            database=name,
            ef=64,
            batch_size=50,
            clients=1,
            k=10,
            client=0,
            request=0,
            query_ids=np.arange(50),
            ids=answer,
            scores=np.zeros((50, 10), np.float32),
            t_start=T0,
            t_end=T0 + 0.25,
        )
        pq.write_table(raw, tmp_path / f"raw-{name}.parquet")
    assert len(needed_base_ids(read_raw(tmp_path / "raw-qdrant.parquet"), gt)) == len(np.unique(exact))
    rows = evaluate_files(
        sorted(tmp_path.glob("raw-*.parquet")),
        tmp_path / "gt" / "groundtruth.parquet",
        tmp_path / "queries.parquet",
        tmp_path / "ds",
        "cosine",
    )
    by_db = {r["database"]: r for r in rows}
    assert by_db["qdrant"]["recall"] == 1.0 and by_db["weaviate"]["recall"] == 0.5
    assert by_db["qdrant"]["qps"] == pytest.approx(200.0, rel=1e-6)
    json.dumps(rows)  # plain Python values, ready for provenance
