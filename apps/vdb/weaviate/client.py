"""Weaviate's client: weaviate-client v4 over gRPC, connected to one node (``Endpoints.entry``).

Quirks kept here:

* HNSW ``ef`` is collection configuration, not a query parameter: ``search`` reconfigures it on change.
* With ``ASYNC_INDEXING`` vectors are searchable once the per-shard queue drains (nodes API). The nodes
  API's per-shard object counts only include flushed memtables; exact counts come from aggregate.
* There is no multi-vector search call: a batch runs as parallel single gRPC queries.
* A row id is the object UUID (``UUID(int=row_id)``): a retried batch overwrites, never duplicates.
* Every request carries the deployment's API key (``Auth.api_key``; REST: ``Authorization: Bearer``), read
  from the file each endpoint names (``extra["api_key_file"]``); a server attached by ``url`` is anonymous.
* A config update (ef) makes a shard READONLY while it is applied ("store is read-only due to:
  UpdateVectorIndexConfigs"), and under load it may stay so: before and after an update every shard must
  be READY, and one left READONLY is set back to READY (shard status API) or reported as DatabaseError.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from apps.vdb.base import (
    Client,
    CollectionSpec,
    DatabaseError,
    Endpoint,
    Endpoints,
    RequestTimeout,
    SearchResult,
    StorageStats,
)
from apps.vdb.noproxy import GRPC_NO_PROXY, bypass_proxy
from apps.vdb.process import directory_bytes
from apps.vdb.weaviate.indexes import compression_training_limit, server_index, vector_index
from apps.vdb.weaviate.rest import node_key, rest_json
from apps.vdb.weaviate.settings import WeaviateSettings

log = logging.getLogger(__name__)


def class_name(name: str) -> str:
    """A valid Weaviate class name (``^[A-Z][_0-9A-Za-z]*$``) for a collection name."""
    clean = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "Collection"
    return "C" + clean if not clean[0].isalpha() else clean[0].upper() + clean[1:]


class WeaviateClient(Client):
    """weaviate-client v4 over gRPC to node ``client_index % nodes``; REST calls reach every node."""

    insert_concurrency = 2  # as the library's own batcher (concurrent_requests=2)

    def __init__(self, settings: WeaviateSettings, endpoints: Endpoints, client_index: int = 0) -> None:
        import weaviate
        from weaviate.classes.init import AdditionalConfig, Auth, GrpcConfig, Timeout

        self.settings = settings
        self.endpoints = endpoints
        self.request_timeout = settings.request_timeout
        node = endpoints.entry(client_index)
        self.rank = node.rank
        bypass_proxy(n.host for n in endpoints.nodes)  # the REST calls below reach every node
        # Each node's key from the file its endpoint names (one file locally, one per rank on HPC).
        self._keys = {n.rank: node_key(n) for n in endpoints.nodes}
        key = self._keys.get(node.rank)
        timeout = Timeout(
            init=min(30.0, settings.request_timeout),
            query=settings.request_timeout,
            insert=settings.insert_timeout,
        )
        try:
            self._client = weaviate.connect_to_custom(
                http_host=node.host,
                http_port=node.port,
                http_secure=False,
                grpc_host=node.host,
                grpc_port=node.grpc_port or settings.grpc_port,
                grpc_secure=False,
                auth_credentials=Auth.api_key(key) if key else None,
                additional_config=AdditionalConfig(
                    timeout=timeout,
                    trust_env=False,  # httpx: no proxy from the environment
                    grpc_config=GrpcConfig(channel_options=list(GRPC_NO_PROXY.items())),
                ),
            )
        except Exception as exc:  # no cause chain: weaviate's errors cannot always be unpickled
            # A frozen server times out: a stall the query stage retries, not a dead server.
            kind = RequestTimeout if "timed out" in str(exc).lower() else DatabaseError
            raise kind(f"cannot connect to Weaviate at {node.host}:{node.port}: {exc}") from None
        self._pool = ThreadPoolExecutor(settings.search_threads)
        try:  # the protobuf messages the client library sends (see insert)
            from google.protobuf.struct_pb2 import Struct
            from weaviate.proto.v1 import batch_pb2

            self._pb2: tuple[Any, Any] | None = (batch_pb2, Struct)
        except ImportError:  # another client library layout: insert_many
            self._pb2 = None
        self._spec: CollectionSpec | None = None
        self._ef: int | None = None
        self._handle: tuple[str, Any] | None = None  # (collection name, handle): built once, not per search

    @property
    def _collection(self) -> Any:
        if self._spec is None:
            raise DatabaseError("no collection: call create_collection(spec) first")
        name = class_name(self._spec.name)
        if self._handle is None or self._handle[0] != name:
            self._handle = (name, self._client.collections.use(name))
        return self._handle[1]

    def create_collection(self, spec: CollectionSpec, *, recreate: bool = False) -> None:
        """Create (or reopen) the collection; the spec's dim and metric are kept in its description.

        The vector index and its compression come from :func:`apps.vdb.weaviate.indexes.vector_index`.
        """
        from weaviate.classes.config import Configure

        index = vector_index(spec, self.settings.async_indexing)  # refused before anything is changed
        name = class_name(spec.name)
        if recreate:
            self._client.collections.delete(name)
        if self._client.collections.exists(name):
            dim = self._existing_dim(name)
            if dim is not None and dim != spec.dim:
                raise DatabaseError(
                    f"Weaviate collection {name!r} exists with dimension {dim}, but the data "
                    f"has dimension {spec.dim}; use another collection name or recreate it"
                )
            self._spec = spec
            return
        self._client.collections.create(
            name,
            description=json.dumps({"dim": spec.dim, "metric": spec.metric}),
            vector_config=Configure.Vectors.self_provided(vector_index_config=index),
            sharding_config=Configure.sharding(desired_count=spec.shards),
        )
        self._spec = spec
        self._ef = None

    def _existing_dim(self, name: str) -> int | None:
        """The dimension we recorded in the description, else that of a stored vector (None: empty)."""
        collection = self._client.collections.use(name)
        with contextlib.suppress(ValueError, TypeError, KeyError):
            return int(json.loads(collection.config.get().description)["dim"])
        for obj in collection.query.fetch_objects(limit=1, include_vector=True).objects:
            return len(next(iter(obj.vector.values())))
        return None

    @property
    def max_request_size(self) -> int:
        """Objects one gRPC batch request may carry: the ``insert_request_size`` setting."""
        return self.settings.insert_request_size

    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Upsert rows as objects with UUID(int=row id), one request; a failed object raises DatabaseError.

        The request is built from the vectors' bytes (what the client library's ``insert_many`` sends,
        byte for byte, without a Python float per element: ~7x less client CPU, which on a small machine
        the server's indexing needs), and sent with the library's own gRPC call; ``insert_many`` when
        this client library lacks either.
        """
        ids = np.asarray(ids, dtype=np.int64)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self._check_dim(vectors, "insert")
        if len(ids) != len(vectors) or (ids < 0).any():
            raise DatabaseError(f"insert needs {len(vectors)} non-negative ids, got {len(ids)}")
        self.check_request_size(len(ids), "weaviate setting insert_request_size")
        try:
            errors = self._send_batch(ids, vectors)
        except Exception as exc:  # all objects failed, or the request itself did (one line per object)
            raise DatabaseError(f"Weaviate batch of {len(ids)} objects failed: {str(exc)[:500]}") from None
        if errors:
            raise DatabaseError(
                f"Weaviate rejected {len(errors)} of {len(ids)} objects; first: {next(iter(errors))}"
            )

    def _send_batch(self, ids: np.ndarray, vectors: np.ndarray) -> list[str]:
        """One gRPC batch request; the error message of every rejected object."""
        connection = getattr(self._client, "_connection", None)
        if self._pb2 is None or not hasattr(connection, "grpc_batch_objects"):
            from weaviate.classes.data import DataObject

            objs = [
                DataObject(properties={}, uuid=uuid.UUID(int=int(i)), vector=v)
                for i, v in zip(ids, vectors, strict=True)
            ]
            result = self._collection.data.insert_many(objs)
            return [e.message for e in result.errors.values()]
        name, (batch_pb2, struct) = class_name(self._spec.name), self._pb2
        props = batch_pb2.BatchObject.Properties(non_ref_properties=struct())
        objects = [
            batch_pb2.BatchObject(
                collection=name, uuid=str(uuid.UUID(int=i)), vector_bytes=v.tobytes(), properties=props
            )
            for i, v in zip(ids.tolist(), vectors, strict=True)
        ]
        request = batch_pb2.BatchObjectsRequest(objects=objects)
        # max_retries as insert_many passes it (the library retries UNAVAILABLE with back-off)
        failed = connection.grpc_batch_objects(request, timeout=self.settings.insert_timeout, max_retries=2)
        if len(failed) == len(objects):
            raise DatabaseError("every object failed: " + "; ".join(sorted(set(failed.values())))[:500])
        return list(failed.values())

    def _check_dim(self, vectors: np.ndarray, what: str) -> None:
        dim = self._spec.dim if self._spec else None
        if vectors.ndim != 2 or vectors.shape[1] != dim:
            raise DatabaseError(f"{what}: vectors have shape {vectors.shape}, collection dimension is {dim}")

    def _shards(self) -> list[Any]:
        """Verbose per-shard state (object count, queue length, status) from the nodes API."""
        nodes = self._client.cluster.nodes(collection=class_name(self._spec.name), output="verbose")
        return [shard for node in nodes for shard in node.shards or []]

    def _wait(self, done: Any, timeout: float, what: str, interval: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while True:
            ok, state = done()
            if ok:
                return
            if time.monotonic() > deadline:
                raise DatabaseError(f"Weaviate: {what} not reached after {timeout:.0f}s: {state}")
            time.sleep(interval)

    def wait_searchable(self, expected: int, timeout: float) -> None:
        """Wait until the exact count is ``expected`` and every shard is READY with an empty indexing queue.

        The condition of the client library's ``wait_for_vector_indexing``, read from every node's shard
        status; polled every 50 ms, as upload time ends here.
        """

        def check() -> tuple[bool, str]:
            shards = [shard for node in self.endpoints.nodes for shard in self._rest(node, "/shards")]
            queued = sum(int(shard.get("vectorQueueSize") or 0) for shard in shards)
            # A shard still INDEXING reports an empty queue while its last vectors go into the graph
            # (searches then miss them): READY as well, as wait_for_vector_indexing asks.
            states = sorted({str(shard.get("status")) for shard in shards})
            if queued or states != ["READY"]:  # the cheap check first: the count only once indexed
                return False, f"{queued} queued for indexing, shards {states}"
            count = self.count()
            if count > expected:
                raise DatabaseError(f"Weaviate holds {count} objects, more than the {expected} expected")
            return count == expected, f"{count} of {expected} objects ({expected - count} missing)"

        self._wait(check, timeout, "searchability", interval=0.05)

    def build_index(self, timeout: float) -> None:
        """Weaviate indexes on insert or from its async queue: wait until every shard is READY, drained,
        and compressed once it holds more than the quantizer's training limit (SQ and PQ train in the
        background)."""
        limit = compression_training_limit(self._spec)
        single = len(self.endpoints.nodes) == 1 and self._spec.shards == 1

        def check() -> tuple[bool, str]:
            shards = self._shards()
            # The nodes API's counts lag behind memtable flushes: one shard's exact count is the collection's.
            total = self.count() if single and limit is not None else 0
            state = ", ".join(
                f"{s.node}/{s.name}: {s.vector_indexing_status} q={s.vector_queue_length} "
                f"compressed={s.compressed}"
                for s in shards
            )
            # Compressed once a shard's index holds MORE than the limit (the queue's checkCompressionSettings,
            # adapters/repos/db/vector_index_queue.go, v1.36.0): exactly the limit stays uncompressed.
            due = [
                s
                for s in shards
                if limit is not None and max(s.object_count, total) > limit and not s.compressed
            ]
            return not due and all(
                s.vector_queue_length == 0 and s.vector_indexing_status == "READY" for s in shards
            ), state

        self._wait(check, timeout, "index steady state")

    def _set_ef(self, ef: int) -> None:
        """ef is collection config: update it (unless already set), wait until every node applied it and
        every shard is READY again."""
        from weaviate.classes.config import Reconfigure

        hnsw = Reconfigure.VectorIndex.hnsw(ef=ef)
        index = Reconfigure.VectorIndex.dynamic(hnsw=hnsw) if self._spec.index_type == "dynamic" else hnsw
        for attempt in range(5):
            self._ready_shards()
            if self._node_efs() == [ef] * len(self.endpoints.nodes):  # another client may have set it
                break
            try:
                self._collection.config.update(
                    vector_config=Reconfigure.Vectors.update(name="default", vector_index_config=index)
                )
                break
            except Exception as exc:
                # Another client's update (or a node still applying one) holds a shard READONLY: the
                # update is refused with 422 "store is read-only"; wait for READY and try again.
                if "read-only" not in str(exc) or attempt == 4:
                    raise
                log.info("Weaviate ef update refused while a shard is read-only; retrying: %s", exc)
                time.sleep(0.5 * (attempt + 1))

        def applied() -> tuple[bool, str]:
            seen = self._node_efs()
            return all(s == ef for s in seen), f"ef per node {seen}"

        self._wait(applied, 30, f"ef={ef} on every node")
        self._ready_shards()
        self._ef = ef

    def _rest(self, node: Endpoint, path: str, body: Any = None) -> Any:
        """GET (or PUT ``body``) a REST path of one node, bounded by the request timeout."""
        url = f"http://{node.host}:{node.port}/v1/schema/{class_name(self._spec.name)}{path}"
        return rest_json(url, self._keys.get(node.rank), self.request_timeout, body)

    def _node_efs(self) -> list[int | None]:
        """The ef every node's schema holds."""
        seen = []
        for node in self.endpoints.nodes:
            cfg = self._rest(node, "")["vectorConfig"]["default"]["vectorIndexConfig"]
            seen.append(cfg.get("hnsw", cfg).get("ef"))
        return seen

    def _ready_shards(self, grace: float = 5.0) -> None:
        """Wait until every shard is READY; a shard still READONLY after ``grace`` s is set READY.

        A config update sets a shard READONLY while it applies; under load it can stay so, and the next
        update or write fails ("store is read-only due to: UpdateVectorIndexConfigs").
        """
        deadline, fixed = time.monotonic() + grace, False
        while True:
            states = {
                (i, shard["name"]): shard.get("status")
                for i, node in enumerate(self.endpoints.nodes)
                for shard in self._rest(node, "/shards")
            }
            stuck = {key: status for key, status in states.items() if status != "READY"}
            if not stuck:
                return
            if time.monotonic() > deadline:
                if fixed:
                    raise DatabaseError(
                        f"Weaviate: shards of {class_name(self._spec.name)} not READY after being set "
                        f"READY: {stuck}"
                    )
                for (i, shard), status in stuck.items():
                    if status == "READONLY":
                        log.warning("Weaviate shard %s was READONLY: setting it READY", shard)
                        self._rest(self.endpoints.nodes[i], f"/shards/{shard}", {"status": "READY"})
                deadline, fixed = time.monotonic() + grace, True
            time.sleep(0.2)

    def search(self, queries: np.ndarray, k: int, ef: int | None) -> SearchResult:
        """Run each query as one gRPC near_vector request, in parallel; ids are row ids (-1 pads)."""
        from weaviate.classes.query import MetadataQuery

        queries = np.ascontiguousarray(queries, dtype=np.float32)
        self._check_dim(queries, "search")
        if ef is not None and ef != self._ef and self._spec.index_type != "flat":
            self._set_ef(ef)
        collection = self._collection

        def one(vector: np.ndarray) -> list[Any]:
            return collection.query.near_vector(
                vector, limit=k, return_properties=[], return_metadata=MetadataQuery(distance=True)
            ).objects

        ids = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.full((len(queries), k), np.nan, dtype=np.float32)
        # One query: call it here; a hop to the thread pool costs more than the request on small data.
        results = [one(queries[0])] if len(queries) == 1 else self._pool.map(one, queries)
        for row, objects in enumerate(results):
            ids[row, : len(objects)] = [o.uuid.int for o in objects]
            scores[row, : len(objects)] = [o.metadata.distance for o in objects]
        return SearchResult(ids=ids, scores=scores)

    def count(self) -> int:
        """Exact object count (aggregate; the nodes API count lags behind memtable flushes)."""
        return int(self._collection.aggregate.over_all(total_count=True).total_count or 0)

    def describe(self) -> StorageStats:
        """Count, shards (one HNSW graph each, Weaviate's 'segments') and on-disk bytes of this collection."""
        shards = self._shards()
        details: dict[str, str | int | float | bool | None] = {
            "index_type": self._spec.index_type,
            "quantization": self._spec.quantization,
            "ef": self._ef,
            "async_indexing": self.settings.async_indexing,
            **server_index(self._rest(self.endpoints.nodes[0], "")["vectorConfig"]["default"]),
        }
        for s in shards:
            details[f"shard.{s.node}.{s.name}.objects"] = s.object_count
            details[f"shard.{s.node}.{s.name}.status"] = s.vector_indexing_status
            details[f"shard.{s.node}.{s.name}.compressed"] = s.compressed
        dirs = [Path(str(n.extra["data_dir"])) for n in self.endpoints.nodes if "data_dir" in n.extra]
        disk = None
        if dirs and all(d.is_dir() for d in dirs):  # only when the data dirs are on this machine
            disk = sum(directory_bytes(d / class_name(self._spec.name).lower()) for d in dirs)
            details["data_dir_bytes"] = sum(directory_bytes(d) for d in dirs)
        return StorageStats(count=self.count(), segments=len(shards), disk_bytes=disk, details=details)

    def close(self) -> None:
        """Close the gRPC/HTTP connections and the query threads."""
        self._pool.shutdown(wait=False)
        self._client.close()
