"""Qdrant's embedded engine (``qdrant-edge-py``): segments, HNSW, optimizer and WAL in this process.

One collection is one ``EdgeShard`` directory under the deployment's data dir. Edge has no background
optimizer thread: indexing happens only when ``optimize()`` is called.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from apps.vdb.base import CollectionSpec, DatabaseError, SearchResult, StorageStats
from apps.vdb.process import directory_bytes
from apps.vdb.qdrant.client import DISTANCE, QdrantClientBase, knob
from apps.vdb.qdrant.handles import EDGE
from apps.vdb.qdrant.storage import edge_quantization, edge_search_params, plan
from core import memory


class _EdgeHandle:
    """An open EdgeShard that can be reopened with a new config (edge reads config only at load)."""

    def __init__(self, shard: Any) -> None:
        self.shard = shard

    def reopen(self, path: Path, config: Any) -> None:
        from qdrant_edge import EdgeShard

        self.shard.close()
        self.shard = EdgeShard.load(str(path), config)

    def close(self) -> None:
        self.shard.flush()
        self.shard.close()


class EdgeClient(QdrantClientBase):
    """A collection as an in-process EdgeShard at ``<data_dir>/<collection>``."""

    handle: _EdgeHandle
    visible_on_return = True  # update() is synchronous: a point is searchable when it returns

    def _path(self, spec: CollectionSpec) -> Path:
        return Path(self.endpoints.data_dir) / spec.name

    def _config(self, spec: CollectionSpec, indexing_threshold: int) -> Any:
        import qdrant_edge as qe

        s, opt, storage = self.settings, lambda n: knob(self.settings, spec, n), plan(spec)
        return qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(
                size=spec.dim,
                distance=getattr(qe.Distance, DISTANCE[spec.metric]),
                on_disk=storage.on_disk or None,
                quantization_config=edge_quantization(storage),
            ),
            hnsw_config=qe.HnswIndexConfig(
                m=spec.hnsw_m,
                ef_construct=spec.ef_construction,
                full_scan_threshold=opt("full_scan_threshold_kb"),
                max_indexing_threads=s.max_indexing_threads,
                on_disk=storage.on_disk or None,
            ),
            optimizers=qe.EdgeOptimizersConfig(
                indexing_threshold=indexing_threshold,
                default_segment_number=opt("default_segment_number"),
                max_segment_size=opt("max_segment_size_kb"),
            ),
            max_search_threads=s.edge_search_threads,
        )

    def _upload_threshold(self, spec: CollectionSpec) -> int:
        # 0 disables HNSW builds: deferred indexing, and "flat" which never builds one.
        deferred = spec.deferred_indexing or spec.index_type == "flat"
        return 0 if deferred else knob(self.settings, spec, "indexing_threshold_kb")

    def create_collection(self, spec: CollectionSpec, *, recreate: bool = False) -> None:
        """Create (or attach to) the shard; an existing one must have the same dimension and metric."""
        from qdrant_edge import EdgeShard

        self._check_spec(spec)
        if spec.shards != 1:
            raise DatabaseError("qdrant edge is a single shard: set shards: 1 or use mode: server")
        self.close()
        path = self._path(spec)
        config_file = path / "edge_config.json"  # edge persists its config here; no getter on the shard
        if recreate and path.exists():
            EDGE.release(str(path), force=True)
            shutil.rmtree(path)
        exists = config_file.exists()
        if exists:
            vectors = json.loads(config_file.read_text())["vectors"][""]
            self._check_existing(spec, int(vectors["size"]), str(vectors["distance"]))

        def open_shard() -> _EdgeHandle:  # load keeps the persisted config (e.g. indexing still deferred)
            if exists:
                return _EdgeHandle(EdgeShard.load(str(path)))
            return _EdgeHandle(EdgeShard.create(str(path), self._config(spec, self._upload_threshold(spec))))

        try:
            self.handle = EDGE.acquire(str(path), open_shard)
        except Exception as exc:  # edge raises plain Exception, e.g. the WAL locked by another process
            raise DatabaseError(f"qdrant edge: cannot open {path} (one process at a time): {exc}") from None
        self.spec = spec

    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Upsert one batch (synchronous: visible when this returns)."""
        from qdrant_edge import Point, UpdateOperation

        vectors = np.ascontiguousarray(self._check_batch("vectors", vectors))
        # A row's memoryview reads as its float32 values without a Python list of floats in between:
        # ~40% less conversion than vectors.tolist() (python -m benchmarks.ingest --profile).
        row_ids = self._check_ids(ids, len(vectors))
        points = [Point(i, memoryview(v)) for i, v in zip(row_ids, vectors, strict=True)]
        self.handle.shard.update(UpdateOperation.upsert_points(points))
        if self._upload_threshold(self._bound()) > 0:
            # No background optimizer in edge: index as we go, as a server would in the background.
            self.handle.shard.optimize()

    def build_index(self, timeout: float) -> None:
        """Reopen with the real indexing threshold and run the optimizer until nothing is left to do.

        ``optimize()`` blocks in native code and cannot be interrupted, so ``timeout`` is not enforced here.
        """
        spec = self._bound()
        if spec.index_type == "flat":
            return
        threshold = knob(self.settings, spec, "indexing_threshold_kb")
        self.handle.reopen(self._path(spec), self._config(spec, threshold))
        self.handle.shard.optimize()

    def search(self, queries: np.ndarray, k: int, ef: int | None) -> SearchResult:
        """One planned batch (``query_batch``): the segments are scanned once for all queries."""
        import qdrant_edge as qe

        queries = self._check_batch("queries", queries)
        params = edge_search_params(plan(self._bound()), ef)
        batch = qe.QueryBatchRequest(
            [qe.QueryRequest(limit=k, query=qe.Query.Nearest(q), params=params) for q in queries.tolist()]
        )
        hits = self.handle.shard.query_batch(batch)
        return self._result([[(p.id, p.score) for p in points] for points in hits], k)

    def count(self) -> int:
        """Exact number of points."""
        from qdrant_edge import CountRequest

        self._bound()
        return self.handle.shard.count(CountRequest(exact=True))

    def describe(self) -> StorageStats:
        """Points, segments (indexed ones plus the appendable one), bytes of the shard directory, and the
        vector storage the shard persisted (quantisation, on-disk vectors and graph)."""
        path = self._path(self._bound())
        self.handle.shard.flush()
        info = self.handle.shard.info()
        persisted = json.loads((path / "edge_config.json").read_text())
        return StorageStats(
            count=info.points_count,
            segments=info.segments_count,
            disk_bytes=directory_bytes(path),
            details={
                "indexed_vectors_count": info.indexed_vectors_count,
                "apparent_bytes": directory_bytes(path, apparent=True),
                **plan(self._bound()).details(),  # what was asked; engine_*: what it holds
                **persisted_storage(persisted),
            },
        )

    def close(self) -> None:
        """Release this client's reference to the shared shard (closed with the last one), and return the
        freed memory to the system, not to this worker's next task (:mod:`core.memory`)."""
        if self.spec is not None:
            EDGE.release(str(self._path(self.spec)))
            self.spec = None
            memory.release_freed_memory()


def persisted_storage(config: dict) -> dict[str, str | bool | None]:
    """Quantisation and on-disk flags as the shard persisted them (``edge_config.json``)."""
    vectors = config.get("vectors", {}).get("", {})
    quant = vectors.get("quantization_config") or config.get("quantization_config") or {}
    hnsw = vectors.get("hnsw_config") or config.get("hnsw_config") or {}
    return {
        "engine_quantization": json.dumps(quant, sort_keys=True) if quant else "none",
        "engine_vectors_on_disk": bool(vectors.get("on_disk")),
        "engine_hnsw_on_disk": bool(hnsw.get("on_disk")),
    }
