"""The two sides of ``python -m benchmarks.peer_vectordbbench`` and the collection they share.

* :func:`load_collection`: one collection per server, in the name VectorDBBench looks for. Milvus: the
  project's own stages (prepare_collection -> insert_partition -> wait_searchable -> build_index), whose
  schema (primary key ``id``, ``vector``) VectorDBBench can search, then a compaction waited for
  (:func:`settle_milvus`). Weaviate: the project's
  ``create_collection`` (named vector ``default``, the HNSW settings of configs/local.yaml) plus the numeric
  property ``key`` VectorDBBench's GraphQL query returns, filled here with the row id next to the object
  UUID ``UUID(int=row id)`` the project's client reads; then the project's wait and index steps.
* :func:`run_project`: ``apps.vdb.stages.query_sweep.query_sweep`` for one client count (batch 1, k, ef),
metrics from
  its raw Parquet rows (``apps.evaluate.metrics``) and the measured skew between the clients' first requests.
* :func:`run_vdbbench`: ``vdbbench_driver.py`` in VectorDBBench's venv.
* :func:`plain_recall` (VectorDBBench's definition) and :func:`tie_aware_recall` (the project's).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from apps.vdb.milvus.env import node_token
from apps.vdb.weaviate.rest import node_key, rest_json
from benchmarks import common
from benchmarks.common import vdb
from benchmarks.peer_vectordbbench import vdbbench_venv

COLLECTION = {"milvus": "VDBBench", "weaviate": "VectorDBBenchCollection"}  # VectorDBBench's defaults
# Run by path in VectorDBBench's venv, where the project is not importable: it imports nothing of it.
DRIVER = Path(__file__).resolve().parent / "vdbbench_driver.py"


# --- the shared collection ---------------------------------------------------------------------------------


def load_collection(ctx: dict[str, Any], cfg: Any) -> dict[str, Any]:
    """Load the dataset once (untimed set-up); returns what the index stage recorded, and the load time."""
    if ctx["database"] == "milvus":
        setup = vdb.load_collection(ctx, cfg)  # the project's own stages
        return {**setup, "compact_s": settle_milvus(ctx, cfg.index_timeout_s)}
    return _load_weaviate(ctx, cfg)


def settle_milvus(ctx: dict[str, Any], timeout: float) -> float:
    """Compact the loaded collection and wait until the compacted segment is indexed and serving.

    The upserts of the insert stage leave delete records; about a minute after loading, Milvus 2.3 compacts
    the segment by itself, indexes the new one and swaps it in, and searches (the recall too) change in the
    middle of a measurement. VectorDBBench's own optimize step compacts too. Returns the seconds it took.
    """
    from pymilvus import MilvusClient

    node, name = ctx["endpoints_model"].nodes[0], COLLECTION["milvus"]
    client = MilvusClient(uri=f"http://{node.host}:{node.port}", token=node_token(node))
    started = time.monotonic()
    try:
        job = client.compact(name)
        while client.get_compaction_state(job) != "Completed":
            _deadline(started, timeout, "compaction")
        while True:
            index = client.describe_index(name, "vector")
            persistent = {s.segment_id for s in client.list_persistent_segments(name)}
            if index.get("pending_index_rows") == 0 and set(milvus_segments(ctx, client)) == persistent:
                return time.monotonic() - started
            _deadline(started, timeout, "the compacted segment to be indexed and loaded")
    finally:
        client.close()


def _deadline(started: float, timeout: float, what: str) -> None:
    if time.monotonic() - started > timeout:
        raise SystemExit(f"milvus: waited {timeout:.0f} s for {what}")
    time.sleep(0.5)


def milvus_segments(ctx: dict[str, Any], client: Any = None) -> list[int]:
    """The ids of the segments Milvus serves searches from (a change means another index)."""
    from pymilvus import MilvusClient

    node = ctx["endpoints_model"].nodes[0]
    own = client is None
    client = client or MilvusClient(uri=f"http://{node.host}:{node.port}", token=node_token(node))
    try:
        return sorted(s.segment_id for s in client.list_loaded_segments(COLLECTION["milvus"]))
    finally:
        if own:
            client.close()


def _load_weaviate(ctx: dict[str, Any], cfg: Any) -> dict[str, Any]:
    import urllib.request

    from weaviate.classes.data import DataObject

    from apps.vdb.noproxy import urlopen
    from apps.vdb.stages.index import build_index
    from apps.vdb.stages.insert import prepare_collection

    target = vdb.target_of(ctx)
    ids, vectors = ctx["data"]["ids"], ctx["data"]["vectors"]
    started = time.monotonic()
    prepare_collection(target, True)
    node = ctx["endpoints_model"].nodes[0]
    # "number", not VectorDBBench's "int": GraphQL's Int is 32-bit, so Weaviate answers null for a row id
    # >= 2**31 (the project's ids are shard * 10**9 + row); a float64 holds them exactly (< 2**53).
    body = json.dumps({"name": "key", "dataType": ["number"]}).encode()
    url = f"http://{node.host}:{node.port}/v1/schema/{COLLECTION['weaviate']}/properties"
    headers = {"Content-Type": "application/json"}
    if key := node_key(node):  # the deployment's API key (the server refuses anonymous requests)
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, body, headers, method="POST")
    with urlopen(request, timeout=30):
        pass
    client, name = common.weaviate_connect(ctx)
    try:
        collection = client.collections.use(name)
        size = cfg.insert.batch_sizes[0]
        for start in range(0, len(ids), size):
            batch = [
                DataObject(properties={"key": float(i)}, uuid=uuid.UUID(int=int(i)), vector=v.tolist())
                for i, v in zip(ids[start : start + size], vectors[start : start + size], strict=True)
            ]
            result = collection.data.insert_many(batch)
            if result.errors:
                first = next(iter(result.errors.values()))
                raise SystemExit(f"weaviate load: {len(result.errors)} objects failed; first: {first}")
    finally:
        client.close()
    db = target.open_client()
    try:
        db.create_collection(target.collection)
        db.wait_searchable(len(ids), cfg.insert.timeout_s)
    finally:
        db.close()
    loaded = time.monotonic()
    index = build_index(target, len(ids), cfg.index_timeout_s, None)
    return {"upload_s": loaded - started, "index_s": time.monotonic() - loaded, **index.model_dump()}


def set_ef(ctx: dict[str, Any], queries: np.ndarray, k: int, ef: int) -> None:
    """Weaviate keeps ef in the collection: one search of the project's client sets it (and waits until
    the node applied it); VectorDBBench's search-only path sets none (its optimize step, part of loading,
    would)."""
    db = vdb.target_of(ctx).open_client()
    try:
        db.create_collection(vdb.target_of(ctx).collection)
        db.search(queries[:1], k, ef)
    finally:
        db.close()


def server_ef(ctx: dict[str, Any]) -> int | None:
    """The ef the server applies to the collection now (Weaviate: schema; Milvus: per request)."""
    if ctx["database"] != "weaviate":
        return None
    node = ctx["endpoints_model"].nodes[0]
    url = f"http://{node.host}:{node.port}/v1/schema/{COLLECTION['weaviate']}"
    schema = rest_json(url, node_key(node), timeout=30)
    return schema["vectorConfig"]["default"]["vectorIndexConfig"].get("ef")


def milvus_consistency(ctx: dict[str, Any]) -> str | None:
    """The collection's default consistency level (what VectorDBBench's searches, which name none, get)."""
    from pymilvus import MilvusClient

    node = ctx["endpoints_model"].nodes[0]
    client = MilvusClient(uri=f"http://{node.host}:{node.port}", token=node_token(node))
    try:
        return client.describe_collection(COLLECTION["milvus"]).get("consistency_level_name")
    finally:
        client.close()


# --- the project's side ------------------------------------------------------------------------------------


def run_project(ctx: dict[str, Any], clients: int, args: Any, out_dir: Path) -> dict[str, Any]:
    """The query stage for one setting (ef, batch 1, ``clients``, k) over the cycled query file."""
    from apps.evaluate.metrics import latency_stats, qps
    from apps.vdb.config import QuerySweepConfig
    from apps.vdb.stages.query_sweep import query_sweep

    query_cfg = QuerySweepConfig(
        ef=[args.ef],
        batch_size=[1],
        clients=[clients],
        k=[args.k],
        warmup_queries=args.warmup,
        duration_s=None,  # the query set cycled to --project-queries, sent once
    )
    records = query_sweep(vdb.target_of(ctx), str(ctx["project_queries"]), query_cfg, str(out_dir), None)
    if records[0].stalled:
        raise SystemExit(
            f"{ctx['database']}: the query stage flagged its run as stalled: {records[0].stalled}"
        )
    raw = pq.read_table(records[0].file)
    stats = latency_stats(raw)
    start, end = min(raw.column("t_start").to_pylist()), max(raw.column("t_end").to_pylist())
    by_client = raw.group_by("client").aggregate([("t_start", "min"), ("t_end", "max"), ("t_start", "count")])
    spans = [
        {"start_s": a - start, "end_s": b - start, "queries": n}
        for a, b, n in zip(
            *(by_client.column(c).to_pylist() for c in ("t_start_min", "t_end_max", "t_start_count")),
            strict=True,
        )
    ]
    return {
        "client_spans": spans,  # when each client process sent its first and got its last answer
        "start_skew_ms": 1000 * max(s["start_s"] for s in spans),
        "end_skew_ms": 1000 * (max(s["end_s"] for s in spans) - min(s["end_s"] for s in spans)),
        "qps": qps(raw),  # the stage's own definition: queries / (last answer - first request)
        "qps_common_window": common_window_qps(spans),
        "p99_ms": stats["p99_ms"],
        "p50_ms": stats["p50_ms"],
        "queries": raw.num_rows,
        "seconds": end - start,
        "query_ids": raw.column("query_id").to_numpy(),
        "ids": raw.column("ids").to_pylist(),
    }


def common_window_qps(spans: list[dict[str, Any]]) -> float:
    """For reference: queries per second while every client ran (last first request -> first last answer),
    each client's queries counted pro rata over that window."""
    opened, closed = max(s["start_s"] for s in spans), min(s["end_s"] for s in spans)
    if closed <= opened:
        return float("nan")
    share = [s["queries"] * (closed - opened) / (s["end_s"] - s["start_s"]) for s in spans]
    return sum(share) / (closed - opened)


# --- VectorDBBench's side ----------------------------------------------------------------------------------


def run_vdbbench(
    python: Path, ctx: dict[str, Any], args: Any, export: dict, clients: int, work: Path
) -> dict[str, Any]:
    """One VectorDBBench search-only case (concurrent at ``clients``, then serial) in its venv."""
    node = ctx["endpoints_model"].nodes[0]
    spec = ctx["spec"]
    work.mkdir(parents=True, exist_ok=True)
    request = {
        "database": ctx["database"],
        "uri": f"http://{node.host}:{node.port}",
        "collection": spec["name"],
        "m": spec["hnsw_m"],
        "ef_construction": spec["ef_construction"],
        "ef": args.ef,
        "k": args.k,
        "duration": args.duration,
        "concurrencies": [clients],
        "dataset": export,
    }
    # The server's secret by its file (0600) only: the driver reads it; this spec is written to disk.
    for key in ("password_file", "api_key_file"):
        if node.extra.get(key):
            request[key] = str(node.extra[key])
    (work / "spec.json").write_text(json.dumps(request))
    timeout = 600 + 3 * args.duration
    with open(work / "driver.log", "w") as log:
        done = subprocess.run(
            [str(python), str(DRIVER), str(work / "spec.json"), str(work / "result.json")],
            cwd=work,
            env=vdbbench_venv.vdbbench_env(work),
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
    if done.returncode != 0:
        tail = (work / "driver.log").read_text().strip().splitlines()[-20:]
        raise SystemExit(
            f"VectorDBBench ({ctx['database']}) failed, exit {done.returncode}:\n  " + "\n  ".join(tail)
        )
    return json.loads((work / "result.json").read_text())


# --- recall ------------------------------------------------------------------------------------------------


def plain_recall(
    query_ids: np.ndarray, ids: list[list[int]], gt_ids: np.ndarray, gt: np.ndarray, k: int
) -> float:
    """VectorDBBench's recall: mean over queries of |set(first k returned) & exact top-k| / k."""
    row = {int(q): i for i, q in enumerate(gt_ids)}
    hits = [
        len(set(map(int, got[:k])) & set(gt[row[int(q)], :k].tolist())) / k
        for q, got in zip(query_ids, ids, strict=True)
    ]
    return float(np.mean(hits))


def tie_aware_recall(
    query_ids: np.ndarray, ids: list[list[int]], tables: dict[str, Any], k: int, metric: str
) -> float:
    """The project's recall (``apps.evaluate.recall.recall_at_k``: ties at the k-th distance count as
    hits)."""
    from apps.evaluate.recall import recall_at_k

    padded = [list(map(int, got[:k])) + [-1] * (k - len(got[:k])) for got in ids]
    raw = pa.table(
        {
            "query_id": pa.array(np.asarray(query_ids, np.int64)),
            "ids": pa.array(padded, pa.list_(pa.int64())),
            "k": pa.array(np.full(len(padded), k, np.int32)),
        }
    )
    mean, _ = recall_at_k(raw, tables["groundtruth"], tables["queries"], tables["base"], metric, k)
    return mean
