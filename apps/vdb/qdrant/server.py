"""``qdrant-client`` against a Qdrant server, or against qdrant-client's local mode.

``url: ":memory:"`` or ``local_path`` selects local mode, which runs the same client calls but is a
pure-Python exact search: it ignores HNSW and optimizer settings and never has pending optimizations, so it
checks the code path, not the engine.

Against a server the client sends the API key: the one in the file the deployment made
(``extra["api_key_file"]``: a started binary or HPC peer), else the one in the environment variable named
by ``api_key_env`` (an existing server). Local mode has no network listener and no key.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import numpy as np

from apps.vdb.base import CollectionSpec, DatabaseError, Endpoints, SearchResult, StorageStats
from apps.vdb.noproxy import GRPC_NO_PROXY, bypass_proxy
from apps.vdb.process import directory_bytes
from apps.vdb.qdrant.client import DISTANCE, QdrantClientBase, knob
from apps.vdb.qdrant.handles import LOCAL
from apps.vdb.qdrant.settings import QdrantSettings
from apps.vdb.qdrant.storage import client_quantization, client_search_params, plan
from apps.vdb.secret import endpoint_secret


class ServerClient(QdrantClientBase):
    """qdrant-client against a server, or against qdrant-client's local mode (see module docstring)."""

    def __init__(self, settings: QdrantSettings, endpoints: Endpoints, client_index: int = 0) -> None:
        from qdrant_client import QdrantClient

        super().__init__(settings, endpoints)
        self.request_timeout = float(settings.timeout_s)
        node = endpoints.entry(client_index) if endpoints.nodes else None  # peers, dealt round-robin
        self.rank = node.rank if node else 0
        self.location = str(node.extra["location"]) if node and "location" in node.extra else None
        if self.location is not None:
            # Local mode warns on every query that search params are ignored: that is expected here.
            warnings.filterwarnings("ignore", message="Local mode performs exact", category=UserWarning)
            loc = self.location
            self.qc = LOCAL.acquire(
                loc, lambda: QdrantClient(location=loc) if loc == ":memory:" else QdrantClient(path=loc)
            )
        elif node is not None:
            api_key = endpoint_secret(node, "api_key_file", "qdrant: the API key file")
            if api_key is None and settings.api_key_env:
                api_key = os.environ.get(settings.api_key_env)
            url = str(node.extra.get("url", f"http://{node.host}:{node.port}"))
            bypass_proxy([url])
            # The key travels in clear over http: the servers listen on loopback or the job's own network.
            warnings.filterwarnings(
                "ignore", message="Api key is used with an insecure", category=UserWarning
            )
            self.qc = QdrantClient(
                url=url,
                grpc_port=node.grpc_port or settings.grpc_port,
                prefer_grpc=settings.prefer_grpc,
                api_key=api_key,
                timeout=settings.timeout_s,
                grpc_options=dict(GRPC_NO_PROXY),
                trust_env=False,  # httpx (REST): no proxy from the environment
            )
        else:
            raise DatabaseError("qdrant server mode: endpoints name no server")

    def create_collection(self, spec: CollectionSpec, *, recreate: bool = False) -> None:
        """Create the collection (indexing disabled when deferred) or attach to a compatible one."""
        from qdrant_client import models as m

        self._check_spec(spec)
        if recreate and self.qc.collection_exists(spec.name):
            self.qc.delete_collection(spec.name)
        if not self.qc.collection_exists(spec.name):
            deferred = spec.deferred_indexing or spec.index_type == "flat"
            try:
                self._create(spec, 0 if deferred else knob(self.settings, spec, "indexing_threshold_kb"))
            except Exception:  # another worker may have created it first: then attach below
                if not self.qc.collection_exists(spec.name):
                    raise
        params = self.qc.get_collection(spec.name).config.params.vectors
        if not isinstance(params, m.VectorParams):
            raise DatabaseError(
                f"qdrant collection {spec.name!r} uses named vectors; expected one unnamed vector"
            )
        self._check_existing(spec, params.size, params.distance.value)
        self.spec = spec

    def _create(self, spec: CollectionSpec, indexing_threshold: int) -> None:
        from qdrant_client import models as m

        opt = lambda n: knob(self.settings, spec, n)  # noqa: E731
        storage = plan(spec)
        self.qc.create_collection(
            spec.name,
            vectors_config=m.VectorParams(
                size=spec.dim, distance=m.Distance(DISTANCE[spec.metric]), on_disk=storage.on_disk or None
            ),
            shard_number=spec.shards,
            hnsw_config=m.HnswConfigDiff(
                m=spec.hnsw_m,
                ef_construct=spec.ef_construction,
                full_scan_threshold=opt("full_scan_threshold_kb"),
                max_indexing_threads=self.settings.max_indexing_threads,
                on_disk=storage.on_disk or None,
            ),
            quantization_config=client_quantization(storage),
            optimizers_config=m.OptimizersConfigDiff(
                indexing_threshold=indexing_threshold,
                default_segment_number=opt("default_segment_number"),
                max_segment_size=opt("max_segment_size_kb"),
            ),
        )

    @property
    def max_request_size(self) -> int:
        """Points one upsert request may carry: the ``request_points`` setting."""
        return self.settings.request_points

    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Upsert the batch as one request (DatabaseError above ``request_points`` points)."""
        from qdrant_client import models as m

        vectors = self._check_batch("vectors", vectors)
        id_list = self._check_ids(ids, len(vectors))
        self.check_request_size(len(id_list), "qdrant setting request_points")
        batch = m.Batch(ids=id_list, vectors=vectors.tolist())
        self.qc.upsert(self._bound().name, points=batch, wait=self.settings.wait_for_writes)

    def build_index(self, timeout: float) -> None:
        """Enable indexing, then wait for steady state (no-op in local mode, which has no optimizer)."""
        from qdrant_client import models as m

        spec = self._bound()
        if spec.index_type != "flat":
            threshold = knob(self.settings, spec, "indexing_threshold_kb")
            self.qc.update_collection(
                spec.name, optimizers_config=m.OptimizersConfigDiff(indexing_threshold=threshold)
            )
        self._wait_steady(spec.name, timeout)

    def _wait_steady(self, name: str, timeout: float) -> None:
        # Green + optimizer ok on consecutive polls: the optimizer may not have picked the work up yet.
        deadline, idle = time.monotonic() + timeout, 0
        while idle < self.settings.settle_polls:
            info = self.qc.get_collection(name)
            busy = info.status.value != "green" or info.optimizer_status != "ok"
            if not busy and self.location is None:
                try:  # servers >= 1.17 also report running and queued optimizations
                    summary = self.qc.get_optimizations(name)
                    busy = bool(summary.running) or summary.summary.queued_optimizations > 0
                except Exception:  # older servers lack the endpoint: status is enough
                    pass
            idle = 0 if busy else idle + 1
            if time.monotonic() > deadline:
                raise DatabaseError(
                    f"qdrant: collection {name!r} not optimised after {timeout:.0f}s: {info.status}"
                )
            if idle < self.settings.settle_polls:
                time.sleep(self.settings.poll_s)

    def search(self, queries: np.ndarray, k: int, ef: int | None) -> SearchResult:
        """One ``query_batch_points`` request for the whole batch."""
        from qdrant_client import models as m

        queries = self._check_batch("queries", queries)
        params = client_search_params(plan(self._bound()), ef)
        requests = [
            m.QueryRequest(query=q, limit=k, params=params, with_payload=False) for q in queries.tolist()
        ]
        responses = self.qc.query_batch_points(self._bound().name, requests=requests)
        return self._result([[(int(p.id), p.score) for p in r.points] for r in responses], k)

    def count(self) -> int:
        """Exact number of points."""
        return self.qc.count(self._bound().name, exact=True).count

    def describe(self) -> StorageStats:
        """Count, segments and, when the storage is on this machine, its bytes."""
        name = self._bound().name
        info = self.qc.get_collection(name)
        config = info.config
        quant = config.quantization_config
        data = Path(self.endpoints.data_dir) if self.endpoints.data_dir else None
        # Server storage: <storage>/collections/<name>; local mode: <path>/collection/<name>.
        sub = "collection" if self.location else "collections"
        disk = directory_bytes(data / sub / name) if data and (data / sub / name).exists() else None
        return StorageStats(
            count=info.points_count or 0,
            segments=info.segments_count,
            disk_bytes=disk,
            details={
                "status": info.status.value,
                "indexed_vectors_count": info.indexed_vectors_count,
                "local_mode": self.location is not None,
                **plan(self._bound()).details(),  # what was asked; engine_*: what it holds
                "engine_quantization": quant.model_dump_json(exclude_none=True) if quant else "none",
                "engine_vectors_on_disk": bool(getattr(config.params.vectors, "on_disk", False)),
                "engine_hnsw_on_disk": bool(config.hnsw_config.on_disk),
            },
        )

    def close(self) -> None:
        """Close the connection (local mode: release the shared local client)."""
        if self.location is not None:
            LOCAL.release(self.location)
            self.location = None
        elif hasattr(self, "qc"):
            self.qc.close()
