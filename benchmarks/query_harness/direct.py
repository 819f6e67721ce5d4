"""The direct side of ``benchmarks.query_harness``: each vendor client's own search call, in a loop."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from apps.vdb.milvus.env import node_token
from apps.vdb.weaviate.rest import node_key, rest_json
from benchmarks import common

# --- direct loops: the vendor's own call, minimal handling -------------------------------------------------


class WeaviateDirect:
    def __init__(self, ctx: dict[str, Any]) -> None:
        self.client, self.name = common.weaviate_connect(ctx)
        node = ctx["endpoints_model"].nodes[0]
        self.collection = self.client.collections.use(self.name)
        self.threads = ThreadPoolExecutor(ctx["settings"].search_threads)
        self.http = f"http://{node.host}:{node.port}/v1/schema/{self.name}"
        self.key = node_key(node)  # the REST API wants the deployment's API key too

    def prepare(self, ef: int | None, k: int) -> None:
        """ef is collection configuration in Weaviate: set it (untimed), wait until the node applied it."""
        from weaviate.classes.config import Reconfigure

        if ef is None:
            return
        self.collection.config.update(
            vector_config=Reconfigure.Vectors.update(
                name="default", vector_index_config=Reconfigure.VectorIndex.hnsw(ef=ef)
            )
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cfg = rest_json(self.http, self.key)["vectorConfig"]["default"]["vectorIndexConfig"]
            if cfg.get("ef") == ef:
                return
            time.sleep(0.1)
        raise SystemExit(f"weaviate: ef={ef} not applied after 30 s")

    def search(self, batch: np.ndarray, k: int, ef: int | None) -> list[list[int]]:
        from weaviate.classes.query import MetadataQuery

        def one(vector: np.ndarray) -> list[int]:
            res = self.collection.query.near_vector(
                vector, limit=k, return_properties=[], return_metadata=MetadataQuery(distance=True)
            )
            return [o.uuid.int for o in res.objects]

        if len(batch) == 1:
            return [one(batch[0])]
        return list(self.threads.map(one, batch))

    def close(self) -> None:
        self.threads.shutdown()
        self.client.close()


class MilvusDirect:
    def __init__(self, ctx: dict[str, Any]) -> None:
        from pymilvus import MilvusClient

        from apps.vdb.milvus.client import METRICS

        node, self.settings = ctx["endpoints_model"].nodes[0], ctx["settings"]
        self.client = MilvusClient(
            uri=f"http://{node.host}:{node.port}",
            token=node_token(node),  # root with the deployment's password, from the file the endpoint names
            timeout=self.settings.request_timeout,
        )
        self.name = ctx["spec"]["name"]
        self.metric = METRICS[ctx["spec"]["metric"]]

    def prepare(self, ef: int | None, k: int) -> None:
        pass

    def search(self, batch: np.ndarray, k: int, ef: int | None) -> list[list[int]]:
        res = self.client.search(
            self.name,
            data=batch,
            limit=k,
            search_params={
                "metric_type": self.metric,
                "params": {"ef": max(ef or self.settings.default_ef, k)},
            },
            consistency_level=self.settings.consistency_level,
        )
        return [[hit["id"] for hit in hits] for hits in res]

    def close(self) -> None:
        self.client.close()


class EdgeDirect:
    def __init__(self, ctx: dict[str, Any]) -> None:
        self.path = Path(ctx["endpoints_model"].data_dir) / ctx["spec"]["name"]
        self.shard: Any = None

    def prepare(self, ef: int | None, k: int) -> None:
        from qdrant_edge import EdgeShard

        if self.shard is None:  # one opener at a time: the harness's client is closed by now
            self.shard = EdgeShard.load(str(self.path))

    def search(self, batch: np.ndarray, k: int, ef: int | None) -> list[list[int]]:
        import qdrant_edge as qe

        params = qe.SearchParams(hnsw_ef=ef) if ef else None
        request = qe.QueryBatchRequest(
            [qe.QueryRequest(limit=k, query=qe.Query.Nearest(q), params=params) for q in batch.tolist()]
        )
        return [[p.id for p in points] for points in self.shard.query_batch(request)]

    def close(self) -> None:
        if self.shard is not None:
            self.shard.close()
            self.shard = None


DIRECT = {"weaviate": WeaviateDirect, "milvus": MilvusDirect, "qdrant": EdgeDirect}
DIRECT_CALL = {
    "weaviate": "collection.query.near_vector",
    "milvus": "MilvusClient.search",
    "qdrant": "EdgeShard.query_batch",
}


def direct_loop(direct: Any, vectors: np.ndarray, setting: dict[str, Any], warmup: int) -> dict[str, Any]:
    """Warm-up as run_share does, then every batch; QPS = queries / (last end - first start)."""
    k, ef, size = setting["k"], setting["ef"], setting["batch_size"]
    direct.prepare(ef, k)
    for start in range(0, min(warmup, len(vectors)), size):
        direct.search(vectors[start : min(start + size, warmup)], k, ef)
    ids: list[list[int]] = []
    starts, ends = [], []
    for start in range(0, len(vectors), size):
        t0 = time.time()
        ids += direct.search(vectors[start : start + size], k, ef)
        starts.append(t0)
        ends.append(time.time())
    latency = (np.array(ends) - np.array(starts)) * 1000
    return {
        "queries": len(ids),
        "qps": len(ids) / (ends[-1] - starts[0]),
        "latency_mean_ms": float(latency.mean()),
        "p50_ms": float(np.percentile(latency, 50)),
        "p99_ms": float(np.percentile(latency, 99)),
        "ids": ids,
    }


def _direct_process(database: str, ctx: dict[str, Any], vectors: np.ndarray, setting: dict, warmup: int):
    """Child process: a fresh vendor client (connected before the clock), then the loop."""
    direct = DIRECT[database](ctx)
    try:
        return direct_loop(direct, vectors, setting, warmup)
    finally:
        direct.close()


def run_direct(ctx: dict[str, Any], vectors: np.ndarray, setting: dict[str, Any], warmup: int) -> dict:
    """The direct loop where the harness's client runs: a fresh spawned process for a server (as the
    query stage's ClientPool), this process for the in-process edge engine (as its one-thread pool)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    database = ctx["database"]
    if ctx["endpoints_model"].in_process:
        direct = DIRECT[database](ctx)
        try:
            return direct_loop(direct, vectors, setting, warmup)
        finally:
            direct.close()  # the harness's pool opens the shard next
    small = {k: ctx[k] for k in ("settings", "endpoints_model", "spec")}
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_direct_process, database, small, vectors, setting, warmup).result()
