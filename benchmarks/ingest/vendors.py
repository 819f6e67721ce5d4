"""The vendor side of ``benchmarks.ingest``: each database's own documented bulk-upload path."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common
from benchmarks.common.vdb import CpuMeter, target_of

# --- the vendors' bulk paths -------------------------------------------------------------------------------


def _batches(ids: np.ndarray, vectors: np.ndarray, size: int):
    for start in range(0, len(ids), size):
        yield ids[start : start + size], vectors[start : start + size]


def source(ctx: dict[str, Any], parquet: bool) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The batches a vendor arm sends: read from the dataset's Parquet work units as it goes (with the
    insert stage's own reader, batches within a unit as the stage makes them; the first unit is read
    before the clock, as the stage's clock also starts at its first request), or sliced from the
    vectors already in memory."""
    size = ctx["batch_size"]
    if not parquet:
        return _batches(ctx["data"]["ids"], ctx["data"]["vectors"], size)
    from apps.vdb.stages.insert import read_unit

    units = ctx["data"]["units"]
    first = read_unit(*units[0])

    def batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for n, unit in enumerate(units):
            ids, vectors = first if n == 0 else read_unit(*unit)
            yield from _batches(ids, vectors, size)

    return batches()


def _poll(check: Callable[[], int], expected: int, timeout: float, what: str, interval: float = 0.05) -> int:
    deadline = time.monotonic() + timeout
    while (seen := check()) != expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: {seen} of {expected} rows visible after {timeout:.0f}s")
        time.sleep(interval)
    return seen


class WeaviateVendor:
    """weaviate-client v4 batching, as Weaviate's import guide shows."""

    def __init__(self, ctx: dict[str, Any]) -> None:
        self.client, self.name = common.weaviate_connect(ctx)

    def upload(self, ctx: dict[str, Any], mode: str, batches: Iterator) -> dict[str, Any]:
        ids, size = ctx["data"]["ids"], ctx["batch_size"]
        collection = self.client.collections.use(self.name)
        started = time.time()
        batcher = collection.batch.dynamic() if mode == "dynamic" else collection.batch.fixed_size(size)
        with batcher as batch:
            for batch_ids, batch_vectors in batches:
                for i, vector in zip(batch_ids.tolist(), batch_vectors, strict=True):
                    batch.add_object(properties={}, uuid=uuid.UUID(int=i), vector=vector)
        sent = time.time()
        failed = collection.batch.failed_objects
        if failed:
            raise SystemExit(f"weaviate {mode}: {len(failed)} objects failed; first: {failed[0].message}")
        collection.batch.wait_for_vector_indexing()

        def count() -> int:
            return int(collection.aggregate.over_all(total_count=True).total_count or 0)

        seen = _poll(count, len(ids), ctx["timeout"], f"weaviate {mode}")
        return _vendor_record(started, sent, time.time(), len(ids), seen)

    def close(self) -> None:
        self.client.close()


class MilvusVendor:
    """pymilvus ``MilvusClient.insert`` per batch of row dicts, then ``flush`` (Milvus's bulk advice)."""

    def __init__(self, ctx: dict[str, Any]) -> None:
        from pymilvus import MilvusClient

        from apps.vdb.milvus.env import node_token

        node, settings = ctx["endpoints_model"].nodes[0], ctx["settings"]
        self.client = MilvusClient(
            uri=f"http://{node.host}:{node.port}",
            token=node_token(node),  # root with the deployment's password, from the file the endpoint names
            timeout=settings.request_timeout,
        )
        self.name = ctx["spec"]["name"]

    def upload(self, ctx: dict[str, Any], mode: str, batches: Iterator) -> dict[str, Any]:
        from apps.vdb.milvus.client import ID_FIELD, VECTOR_FIELD

        ids = ctx["data"]["ids"]
        started = time.time()
        for batch_ids, batch_vectors in batches:
            rows = [
                {ID_FIELD: i, VECTOR_FIELD: v}
                for i, v in zip(batch_ids.tolist(), batch_vectors.tolist(), strict=True)
            ]
            self.client.insert(self.name, rows)
        sent = time.time()
        self.client.flush(self.name)

        def count() -> int:
            res = self.client.query(
                self.name, filter="", output_fields=["count(*)"], consistency_level="Strong"
            )
            return int(res[0]["count(*)"])

        seen = _poll(count, len(ids), ctx["timeout"], "milvus insert")
        return _vendor_record(started, sent, time.time(), len(ids), seen)

    def close(self) -> None:
        self.client.close()


class EdgeVendor:
    """qdrant-edge-py: ``EdgeShard.update(UpdateOperation.upsert_points(points))`` per batch."""

    def __init__(self, ctx: dict[str, Any]) -> None:
        self.path = Path(ctx["endpoints_model"].data_dir) / ctx["spec"]["name"]

    def upload(self, ctx: dict[str, Any], mode: str, batches: Iterator) -> dict[str, Any]:
        from qdrant_edge import CountRequest, EdgeShard, Point, UpdateOperation

        ids = ctx["data"]["ids"]
        shard = EdgeShard.load(str(self.path))  # made by prepare_collection: same config as the harness
        try:
            started = time.time()
            for batch_ids, batch_vectors in batches:
                points = [
                    Point(i, v) for i, v in zip(batch_ids.tolist(), batch_vectors.tolist(), strict=True)
                ]
                shard.update(UpdateOperation.upsert_points(points))
            sent = time.time()
            seen = _poll(lambda: shard.count(CountRequest(exact=True)), len(ids), ctx["timeout"], "edge")
            return _vendor_record(started, sent, time.time(), len(ids), seen)
        finally:
            shard.close()

    def close(self) -> None:
        pass


class LocalModeVendor:
    """qdrant-client ``upload_points`` against qdrant-client's local mode (pure Python: see docstring)."""

    def __init__(self, ctx: dict[str, Any]) -> None:
        self.location = ctx["settings"].local_path
        self.name = ctx["spec"]["name"]

    def upload(self, ctx: dict[str, Any], mode: str, batches: Iterator) -> dict[str, Any]:
        from qdrant_client import QdrantClient
        from qdrant_client import models as m

        ids, size = ctx["data"]["ids"], ctx["batch_size"]
        client = QdrantClient(path=self.location)  # one opener at a time: closed before the harness runs
        try:
            started = time.time()
            points = (
                m.PointStruct(id=i, vector=v)
                for batch_ids, batch_vectors in batches
                for i, v in zip(batch_ids.tolist(), batch_vectors.tolist(), strict=True)
            )
            client.upload_points(self.name, points=points, batch_size=size, wait=True)
            sent = time.time()
            seen = _poll(lambda: client.count(self.name, exact=True).count, len(ids), ctx["timeout"], "local")
            return _vendor_record(started, sent, time.time(), len(ids), seen)
        finally:
            client.close()

    def close(self) -> None:
        pass


def _vendor_record(started: float, sent: float, visible: float, rows: int, count: int) -> dict[str, Any]:
    return {
        "rows": rows,
        "upload_s": visible - started,
        "send_s": sent - started,
        "visible_s": visible - sent,
        "wall_s": visible - started,
        "count": count,
    }


VENDORS = {
    "weaviate": (WeaviateVendor, ["fixed_size", "dynamic"]),
    "milvus": (MilvusVendor, ["insert"]),
    "qdrant": (EdgeVendor, ["upsert_points"]),
    "qdrant-local": (LocalModeVendor, ["upload_points"]),
}
VENDOR_LABELS = {
    "fixed_size": "vendor batch.fixed_size({b})",
    "dynamic": "vendor batch.dynamic()",
    "insert": "vendor insert({b}) + flush",
    "upsert_points": "vendor edge upsert_points({b})",
    "upload_points": "vendor upload_points({b}) [local mode]",
}


def vendor_upload(ctx: dict[str, Any], vendor: Any, mode: str, parquet: bool = True) -> dict[str, Any]:
    """A fresh collection, then the vendor's bulk path fed from the Parquet units or from memory."""
    from apps.vdb.stages.insert import prepare_collection

    prepare_collection(target_of(ctx), True)
    batches = source(ctx, parquet)  # the first unit is read here, before the clock
    cpu = CpuMeter(ctx["server_pids"])
    return {**vendor.upload(ctx, mode, batches), **cpu.read()}
