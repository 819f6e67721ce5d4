"""Qdrant adapter: the embedded engine ``qdrant-edge-py`` locally, ``qdrant-client`` against servers.

* ``mode: edge`` (local default): Qdrant's own storage engine in-process (segments, HNSW, optimizer,
  WAL). One collection is one ``EdgeShard`` directory under the deployment's data dir. Edge has no
  background optimizer thread: indexing happens only when ``optimize()`` is called.
* ``mode: server``: ``qdrant-client`` against a Qdrant server (``url``, or a ``qdrant`` binary this
  module starts on free loopback ports). ``url: ":memory:"`` or ``local_path`` selects qdrant-client's
  local mode, which runs the same client calls but is a pure-Python exact search: it ignores HNSW and
  optimizer settings and never has pending optimizations, so it checks the code path, not the engine.

Deferred indexing as in the study: ``indexing_threshold = 0`` while uploading, then ``build_index``
sets the real threshold and waits until nothing is left to optimise. Point ids are the int64 row ids
(Qdrant ids are u64), so a retried batch overwrites the same points.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import threading
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from apps.vdb import Adapter
from apps.vdb.base import (
    Client,
    CollectionSpec,
    DatabaseError,
    Deployment,
    Endpoint,
    Endpoints,
    SearchResult,
    StorageStats,
)
from apps.vdb.process import ServerProcess, directory_bytes, free_ports, http_ok
from apps.vdb.qdrant.settings import QdrantSettings

_DISTANCE = {"cosine": "Cosine", "ip": "Dot", "l2": "Euclid"}  # names shared by edge and qdrant-client


def _knob(settings: QdrantSettings, spec: CollectionSpec, name: str) -> Any:
    """A segment/index knob: ``spec.options`` overrides the database settings."""
    return spec.options.get(name, getattr(settings, name))


class _Shared:
    """Process-wide handles that allow one opener per path (edge WAL lock, local-mode lock file)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: dict[str, list[Any]] = {}  # key -> [object, refcount]

    def acquire(self, key: str, open_fn: Any) -> Any:
        with self.lock:
            if key not in self.items:
                self.items[key] = [open_fn(), 0]
            self.items[key][1] += 1
            return self.items[key][0]

    def release(self, key: str, force: bool = False) -> None:
        with self.lock:
            item = self.items.get(key)
            if item is not None:
                item[1] -= 1
                if force or item[1] <= 0:
                    del self.items[key]
                    item[0].close()


_EDGE = _Shared()
_LOCAL = _Shared()


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


class QdrantDeployment(Deployment):
    """Edge: nothing to start. Server: connect to ``url`` or start the ``qdrant`` binary."""

    name = "qdrant"

    def __init__(self, settings: QdrantSettings) -> None:
        self.settings = settings
        self.proc: ServerProcess | None = None
        self.data_dir: Path | None = None
        self.local_key: str | None = None  # qdrant-client local-mode location opened by clients

    def start(self, workdir: Path, timeout: float = 120.0) -> Endpoints:
        """Return endpoints; in server mode with a binary, start it and wait for ``/readyz``."""
        s, workdir = self.settings, Path(workdir)
        if s.mode == "edge":
            self.data_dir = workdir / "qdrant-edge"
            self.data_dir.mkdir(parents=True, exist_ok=True)
            version = f"qdrant-edge-py {importlib.metadata.version('qdrant-edge-py')}"
            return Endpoints(
                database="qdrant",
                nodes=[],
                data_dir=str(self.data_dir),
                in_process=True,
                server_version=version,
            )
        if s.url == ":memory:" or s.local_path:
            self.local_key = s.local_path or ":memory:"
            node = Endpoint(host="local", port=0, extra={"location": self.local_key})
            version = f"qdrant-client {importlib.metadata.version('qdrant-client')} local mode"
            return Endpoints(
                database="qdrant",
                nodes=[node],
                data_dir=s.local_path or "",
                in_process=True,
                server_version=version,
            )
        if s.url:
            url = urlparse(s.url)
            node = Endpoint(
                host=url.hostname or "localhost",
                port=url.port or 6333,
                grpc_port=s.grpc_port,
                extra={"url": s.url},
            )
            return Endpoints(database="qdrant", nodes=[node], data_dir="", server_version=_version(s.url))
        binary = shutil.which(s.binary)
        if binary is None:
            raise DatabaseError(
                f"qdrant server mode: no url is set and the binary {s.binary!r} was not found. Install the "
                "Qdrant server (release binary or `cargo build --release` of qdrant; on HPC the "
                "qdrant/qdrant container), set `binary:` to its path or `url:` to a running server, "
                "or use `mode: edge` (embedded engine, pip package qdrant-edge-py)."
            )
        return self._start_binary(binary, workdir, timeout)

    def _start_binary(self, binary: str, workdir: Path, timeout: float) -> Endpoints:
        self.data_dir = workdir / "qdrant" / "storage"
        log = workdir / "logs" / "qdrant.log"
        for attempt in range(2):  # a port taken between picking and binding: pick again once
            http, grpc = free_ports(2)
            env = dict(
                os.environ,
                QDRANT__SERVICE__HOST="127.0.0.1",
                QDRANT__SERVICE__HTTP_PORT=str(http),
                QDRANT__SERVICE__GRPC_PORT=str(grpc),
                QDRANT__STORAGE__STORAGE_PATH=str(self.data_dir),
                QDRANT__STORAGE__SNAPSHOTS_PATH=str(workdir / "qdrant" / "snapshots"),
                QDRANT__TELEMETRY_DISABLED="true",
            )
            self.proc = ServerProcess("qdrant", [binary], log, env=env, cwd=self.data_dir.parent)
            self.data_dir.mkdir(parents=True, exist_ok=True)
            try:
                self.proc.start()
                self.proc.wait_healthy(lambda p=http: http_ok(f"http://127.0.0.1:{p}/readyz"), timeout)
            except DatabaseError as exc:
                self.proc.stop()
                if attempt == 0 and "address already in use" in str(exc).lower():
                    continue
                raise
            url = f"http://127.0.0.1:{http}"
            node = Endpoint(host="127.0.0.1", port=http, grpc_port=grpc, extra={"url": url})
            return Endpoints(
                database="qdrant",
                nodes=[node],
                data_dir=str(self.data_dir),
                server_version=_version(url),
                log_paths=[str(log)],
            )
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop the started server, or close the in-process shards/local clients of this deployment."""
        if self.proc is not None:
            self.proc.stop()
        if self.local_key is not None:
            _LOCAL.release(self.local_key, force=True)
        if self.settings.mode == "edge" and self.data_dir is not None:
            for key in list(_EDGE.items):
                if Path(key).parent == self.data_dir:
                    _EDGE.release(key, force=True)


def _version(url: str) -> str:
    """The server's version from ``GET /`` (provenance)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/", timeout=5) as resp:
            return "qdrant " + str(json.load(resp).get("version", "?"))
    except (OSError, ValueError):
        return "qdrant (version unknown)"


class _QdrantClientBase(Client):
    """Shared checks and bookkeeping; subclasses talk to edge or to qdrant-client."""

    def __init__(self, settings: QdrantSettings, endpoints: Endpoints) -> None:
        self.settings, self.endpoints = settings, endpoints
        self.spec: CollectionSpec | None = None

    def _bound(self) -> CollectionSpec:
        if self.spec is None:
            raise DatabaseError(
                "qdrant: call create_collection first (it attaches to an existing collection)"
            )
        return self.spec

    def _check_spec(self, spec: CollectionSpec) -> None:
        if spec.index_type not in ("hnsw", "flat"):
            raise DatabaseError(f"qdrant supports index_type hnsw or flat, not {spec.index_type!r}")

    def _check_existing(self, spec: CollectionSpec, dim: int, distance: str) -> None:
        if dim != spec.dim or distance != _DISTANCE[spec.metric]:
            raise DatabaseError(
                f"qdrant collection {spec.name!r} exists with dimension {dim} and distance {distance}, but "
                f"dimension {spec.dim} and distance {_DISTANCE[spec.metric]} were requested "
                "(use another name or recreate it)"
            )

    def _check_batch(self, what: str, array: np.ndarray) -> np.ndarray:
        dim = self._bound().dim
        array = np.asarray(array, dtype=np.float32)
        if array.ndim != 2 or array.shape[1] != dim:
            raise DatabaseError(f"qdrant: {what} have shape {array.shape}, collection dimension is {dim}")
        return array

    @staticmethod
    def _check_ids(ids: np.ndarray, n: int) -> list[int]:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.shape != (n,) or (ids < 0).any():  # Qdrant ids are u64; local mode accepts -1 silently
            raise ValueError(f"qdrant: need {n} non-negative row ids, got shape {ids.shape}")
        return ids.tolist()

    @staticmethod
    def _result(hits: list[list[tuple[int, float]]], k: int) -> SearchResult:
        ids = np.full((len(hits), k), -1, dtype=np.int64)
        scores = np.full((len(hits), k), np.nan, dtype=np.float32)
        for row, points in enumerate(hits):
            for col, (pid, score) in enumerate(points[:k]):
                ids[row, col], scores[row, col] = pid, score
        return SearchResult(ids=ids, scores=scores)

    def wait_searchable(self, expected: int, timeout: float) -> None:
        """Poll the exact count until ``expected`` points are visible."""
        deadline = time.monotonic() + timeout
        while (seen := self.count()) < expected:
            if time.monotonic() > deadline:
                raise DatabaseError(f"qdrant: only {seen} of {expected} points visible after {timeout:.0f}s")
            time.sleep(self.settings.poll_s)


class EdgeClient(_QdrantClientBase):
    """A collection as an in-process EdgeShard at ``<data_dir>/<collection>``."""

    handle: _EdgeHandle

    def _path(self, spec: CollectionSpec) -> Path:
        return Path(self.endpoints.data_dir) / spec.name

    def _config(self, spec: CollectionSpec, indexing_threshold: int) -> Any:
        import qdrant_edge as qe

        s, knob = self.settings, lambda n: _knob(self.settings, spec, n)
        return qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(size=spec.dim, distance=getattr(qe.Distance, _DISTANCE[spec.metric])),
            hnsw_config=qe.HnswIndexConfig(
                m=spec.hnsw_m,
                ef_construct=spec.ef_construction,
                full_scan_threshold=knob("full_scan_threshold_kb"),
                max_indexing_threads=s.max_indexing_threads,
            ),
            optimizers=qe.EdgeOptimizersConfig(
                indexing_threshold=indexing_threshold,
                default_segment_number=knob("default_segment_number"),
                max_segment_size=knob("max_segment_size_kb"),
            ),
            max_search_threads=s.edge_search_threads,
        )

    def _upload_threshold(self, spec: CollectionSpec) -> int:
        # 0 disables HNSW builds: deferred indexing, and "flat" which never builds one.
        deferred = spec.deferred_indexing or spec.index_type == "flat"
        return 0 if deferred else _knob(self.settings, spec, "indexing_threshold_kb")

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
            _EDGE.release(str(path), force=True)
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
            self.handle = _EDGE.acquire(str(path), open_shard)
        except Exception as exc:  # edge raises plain Exception, e.g. the WAL locked by another process
            raise DatabaseError(f"qdrant edge: cannot open {path} (one process at a time): {exc}") from exc
        self.spec = spec

    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Upsert one batch (synchronous: visible when this returns)."""
        from qdrant_edge import Point, UpdateOperation

        vectors = self._check_batch("vectors", vectors)
        points = [
            Point(i, v) for i, v in zip(self._check_ids(ids, len(vectors)), vectors.tolist(), strict=True)
        ]
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
        threshold = _knob(self.settings, spec, "indexing_threshold_kb")
        self.handle.reopen(self._path(spec), self._config(spec, threshold))
        self.handle.shard.optimize()

    def search(self, queries: np.ndarray, k: int, ef: int | None) -> SearchResult:
        """One planned batch (``query_batch``): the segments are scanned once for all queries."""
        import qdrant_edge as qe

        queries = self._check_batch("queries", queries)
        params = qe.SearchParams(hnsw_ef=ef) if ef else None
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
        """Points, segments (indexed ones plus the appendable one) and bytes of the shard directory."""
        path = self._path(self._bound())
        self.handle.shard.flush()
        info = self.handle.shard.info()
        return StorageStats(
            count=info.points_count,
            segments=info.segments_count,
            disk_bytes=directory_bytes(path),
            details={
                "indexed_vectors_count": info.indexed_vectors_count,
                "apparent_bytes": directory_bytes(path, apparent=True),
            },
        )

    def close(self) -> None:
        """Release this client's reference to the shared shard."""
        if self.spec is not None:
            _EDGE.release(str(self._path(self.spec)))
            self.spec = None


class ServerClient(_QdrantClientBase):
    """qdrant-client against a server, or against qdrant-client's local mode (see module docstring)."""

    def __init__(self, settings: QdrantSettings, endpoints: Endpoints) -> None:
        from qdrant_client import QdrantClient

        super().__init__(settings, endpoints)
        node = endpoints.nodes[0] if endpoints.nodes else None
        self.location = str(node.extra["location"]) if node and "location" in node.extra else None
        if self.location is not None:
            # Local mode warns on every query that search params are ignored: that is expected here.
            warnings.filterwarnings("ignore", message="Local mode performs exact", category=UserWarning)
            loc = self.location
            self.qc = _LOCAL.acquire(
                loc, lambda: QdrantClient(location=loc) if loc == ":memory:" else QdrantClient(path=loc)
            )
        elif node is not None:
            api_key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
            self.qc = QdrantClient(
                url=str(node.extra.get("url", f"http://{node.host}:{node.port}")),
                grpc_port=node.grpc_port or settings.grpc_port,
                prefer_grpc=settings.prefer_grpc,
                api_key=api_key,
                timeout=settings.timeout_s,
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
                self._create(spec, 0 if deferred else _knob(self.settings, spec, "indexing_threshold_kb"))
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

        knob = lambda n: _knob(self.settings, spec, n)  # noqa: E731
        self.qc.create_collection(
            spec.name,
            vectors_config=m.VectorParams(size=spec.dim, distance=m.Distance(_DISTANCE[spec.metric])),
            shard_number=spec.shards,
            hnsw_config=m.HnswConfigDiff(
                m=spec.hnsw_m,
                ef_construct=spec.ef_construction,
                full_scan_threshold=knob("full_scan_threshold_kb"),
                max_indexing_threads=self.settings.max_indexing_threads,
            ),
            optimizers_config=m.OptimizersConfigDiff(
                indexing_threshold=indexing_threshold,
                default_segment_number=knob("default_segment_number"),
                max_segment_size=knob("max_segment_size_kb"),
            ),
        )

    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Upsert the batch in requests of ``request_points`` points."""
        from qdrant_client import models as m

        vectors = self._check_batch("vectors", vectors)
        id_list, step = self._check_ids(ids, len(vectors)), self.settings.request_points
        for lo in range(0, len(id_list), step):
            batch = m.Batch(ids=id_list[lo : lo + step], vectors=vectors[lo : lo + step].tolist())
            self.qc.upsert(self._bound().name, points=batch, wait=self.settings.wait_for_writes)

    def build_index(self, timeout: float) -> None:
        """Enable indexing, then wait for steady state (no-op in local mode, which has no optimizer)."""
        from qdrant_client import models as m

        spec = self._bound()
        if spec.index_type != "flat":
            threshold = _knob(self.settings, spec, "indexing_threshold_kb")
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
        params = m.SearchParams(hnsw_ef=ef) if ef else None
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
            },
        )

    def close(self) -> None:
        """Close the connection (local mode: release the shared local client)."""
        if self.location is not None:
            _LOCAL.release(self.location)
            self.location = None
        elif hasattr(self, "qc"):
            self.qc.close()


def _client(settings: QdrantSettings, endpoints: Endpoints) -> Client:
    return EdgeClient(settings, endpoints) if settings.mode == "edge" else ServerClient(settings, endpoints)


ADAPTER = Adapter(name="qdrant", settings=QdrantSettings, deployment=QdrantDeployment, client=_client)
