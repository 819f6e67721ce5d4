"""Milvus's client: pymilvus against one collection.

* Milvus 2.3 cannot load (so cannot count or search) a collection without an index: deferred
  indexing therefore uploads into a FLAT index (exhaustive search, as the study did) and
  ``build_index`` swaps it for the spec's index (release, drop, create, wait, load); the index types
  and their parameters are in :mod:`apps.vdb.milvus.indexes`;
* ``upsert`` (delete + insert by primary key) keeps a retried batch from duplicating rows;
* a server this project started requires root's password, read from the file the endpoint names
  (``extra["password_file"]``); a server given by ``uri`` gets the credentials in the variable
  ``token_env`` names.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pymilvus import DataType, MilvusClient, MilvusException

from apps.vdb.base import Client, CollectionSpec, DatabaseError, Endpoints, SearchResult, StorageStats
from apps.vdb.milvus import DATABASE
from apps.vdb.milvus.env import external_token, node_token
from apps.vdb.milvus.indexes import build_params, index_search_params, milvus_index_type
from apps.vdb.milvus.settings import NO_DISKANN, MilvusSettings
from apps.vdb.noproxy import GRPC_NO_PROXY, bypass_proxy
from apps.vdb.process import directory_bytes

log = logging.getLogger(__name__)
METRICS = {"cosine": "COSINE", "ip": "IP", "l2": "L2"}
ID_FIELD, VECTOR_FIELD = "id", "vector"


def _varint(n: int) -> bytes:
    """Protobuf's base-128 varint of ``n``."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@contextlib.contextmanager
def _errors(what: str) -> Iterator[None]:
    """Re-raise pymilvus errors as DatabaseError saying what was attempted."""
    try:
        yield
    except MilvusException as exc:
        # No cause chain: Parsl pickles causes one by one, and pymilvus's gRPC cause is its own cause.
        raise DatabaseError(f"milvus: {what} failed: {exc}") from None


def _placeholders(header: bytes, rows: np.ndarray) -> bytes:
    """PlaceholderGroup wire bytes: one PlaceholderValue (``header``: its tag and type) whose values
    (field 3) are the rows' little-endian float32 bytes, as pymilvus packs them."""
    value = header + b"".join(b"\x1a" + _varint(len(r)) + r for r in map(bytes, rows))
    return b"\x0a" + _varint(len(value)) + value


def _search_result(results: Any, nq: int, k: int) -> SearchResult:
    """Ids and scores (as pymilvus's hits report them) from a SearchResultData; short rows padded.

    Lists, then one array each: numpy calls right after the reply cost more than the decoding itself."""
    topks, found, dist = list(results.topks), list(results.ids.int_id.data), list(results.scores)
    if len(topks) != nq or sum(topks) != len(found) or len(dist) != len(found) or max(topks) > k:
        raise DatabaseError(f"milvus: search of {nq} queries got topks {topks}, {len(found)} ids")
    if len(found) == nq * k:  # the usual case: k hits for every query
        ids = np.array(found, dtype=np.int64).reshape(nq, k)
        return SearchResult(ids=ids, scores=np.array(dist, dtype=np.float32).reshape(nq, k))
    ids = np.full((nq, k), -1, dtype=np.int64)
    scores = np.full((nq, k), np.nan, dtype=np.float32)
    start = 0
    for row, n in enumerate(topks):
        ids[row, :n], scores[row, :n] = found[start : start + n], dist[start : start + n]
        start += n
    return SearchResult(ids=ids, scores=scores)


class MilvusVectorClient(Client):
    """pymilvus client for one collection; ``create_collection`` also attaches to an existing one."""

    insert_concurrency = 2  # one request built while the previous one is in the server's hands

    def __init__(self, settings: MilvusSettings, endpoints: Endpoints, client_index: int = 0) -> None:
        node = endpoints.entry(client_index)  # one of the proxies, dealt round-robin
        self.settings = settings
        self.rank = node.rank
        self.uri = settings.uri or f"http://{node.host}:{node.port}"
        self.data_dir = endpoints.data_dir
        self.server_version = endpoints.server_version
        self.spec: CollectionSpec | None = None
        self.request_timeout = settings.request_timeout
        self._template: Any = None  # (collection, one-row InsertRequest) for packed inserts; False: off
        self._search_template: Any = None  # (key, SearchRequest, ...) for packed searches; False: off
        bypass_proxy([self.uri])
        token = external_token(settings) if settings.uri else node_token(node)
        with _errors(f"connect to {self.uri}"):
            self.client = MilvusClient(
                uri=self.uri,
                token=token,
                timeout=settings.request_timeout,
                grpc_options=dict(GRPC_NO_PROXY),
            )

    def _spec(self) -> CollectionSpec:
        if self.spec is None:
            raise DatabaseError("milvus: call create_collection(spec) first (it attaches to an existing one)")
        return self.spec

    def _index_params(self, spec: CollectionSpec, index_type: str) -> Any:
        index = MilvusClient.prepare_index_params()
        index.add_index(
            field_name=VECTOR_FIELD,
            index_type=index_type,
            metric_type=METRICS[spec.metric],
            params=build_params(spec, index_type),
        )
        return index

    def create_collection(self, spec: CollectionSpec, *, recreate: bool = False) -> None:
        """Create (or attach to) the collection: int64 row-id key, float vector of ``spec.dim``."""
        target = milvus_index_type(spec)  # DatabaseError for a combination Milvus lacks
        if spec.on_disk and target != "DISKANN":
            why = DATABASE.limits["on_disk"]
            raise DatabaseError(f"milvus: on_disk with index_type {spec.index_type!r}: {why}")
        if target == "DISKANN" and self.server_version.endswith("-lite"):
            raise DatabaseError(f"milvus {self.server_version}: no DISKANN index: {NO_DISKANN}")
        name, c = spec.name, self.client
        with _errors(f"create collection {name!r}"):
            if c.has_collection(name) and recreate:
                c.drop_collection(name)
            if c.has_collection(name):
                fields = c.describe_collection(name)["fields"]
                dim = next((int(f["params"]["dim"]) for f in fields if f["name"] == VECTOR_FIELD), None)
                if dim != spec.dim:
                    raise DatabaseError(
                        f"milvus: collection {name!r} exists with dimension {dim}, but the data has "
                        f"dimension {spec.dim}; drop it or recreate it (recreate=True)"
                    )
                if c.list_indexes(name) and str(c.get_load_state(name)["state"]) != "Loaded":
                    c.load_collection(name)
                self.spec = spec
                return
            schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field(ID_FIELD, DataType.INT64, is_primary=True)
            schema.add_field(VECTOR_FIELD, DataType.FLOAT_VECTOR, dim=spec.dim)
            # 2.3 only loads indexed collections: deferred indexing uploads into FLAT (exhaustive search).
            first = "FLAT" if spec.deferred_indexing else target
            c.create_collection(
                name, schema=schema, index_params=self._index_params(spec, first), num_shards=spec.shards
            )
            if spec.options:  # collection properties, e.g. {"mmap.enabled": True}
                c.alter_collection_properties(name, properties=dict(spec.options))
        self.spec = spec

    def _check_dim(self, vectors: np.ndarray, what: str) -> None:
        dim = self._spec().dim
        if vectors.ndim != 2 or vectors.shape[1] != dim:
            raise DatabaseError(f"milvus: {what} have shape {vectors.shape}, collection dimension is {dim}")

    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Upsert a batch keyed by dataset row id (a retried batch replaces, never duplicates)."""
        self._write(ids, vectors, self.settings.insert_mode)

    def insert_new(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Insert rows absent from the collection: a plain insert (an upsert also deletes by key, which
        cost the server ~40% more per row in python -m benchmarks.ingest), built from the vectors' bytes."""
        self._check_dim(vectors, "vectors")
        if self._packed_insert(ids, vectors):
            return
        self._write(ids, vectors, "insert")

    def _write(self, ids: np.ndarray, vectors: np.ndarray, mode: str) -> None:
        self._check_dim(vectors, "vectors")
        rows = [{ID_FIELD: i, VECTOR_FIELD: v} for i, v in zip(ids.tolist(), vectors, strict=True)]
        write = self.client.upsert if mode == "upsert" else self.client.insert
        with _errors(f"{mode} of {len(rows)} rows"):
            write(self._spec().name, rows, timeout=self.request_timeout)

    def _packed_insert(self, ids: np.ndarray, vectors: np.ndarray) -> bool:
        """One InsertRequest whose float vectors are parsed from their bytes; False: not available.

        pymilvus packs a row's vector through a Python list of floats (~5 ms of client CPU per 256 x 384
        rows, as much as the server's own work per batch on a small machine). Here pymilvus builds a
        one-row request once (every header field as it sets them: schema timestamp, field types) and each
        batch replaces its rows: the ids, and the float vector field parsed from the packed little-endian
        floats (protobuf's own wire format). It is sent with pymilvus's stub and checked as pymilvus
        checks it. Any pymilvus that lacks these internals gets the public insert.
        """
        if self._template is False:
            return False
        with _errors(f"insert of {len(ids)} rows"):
            try:
                conn, request, metadata = self._request_like(len(ids))
            except (AttributeError, ImportError, TypeError, KeyError) as exc:
                log.info("milvus: packed inserts unavailable (%s); using MilvusClient.insert", exc)
                self._template = False
                return False
            from pymilvus.client import ts_utils
            from pymilvus.client.utils import check_status
            from pymilvus.grpc_gen import schema_pb2

            for field in request.fields_data:
                if field.field_name == ID_FIELD:
                    field.scalars.long_data.data.extend(np.asarray(ids, dtype=np.int64).tolist())
                else:
                    packed = np.ascontiguousarray(vectors, dtype="<f4").tobytes()
                    # FloatArray's one field (data = 1) as packed wire bytes: tag 0x0a, length, floats.
                    wire = b"\x0a" + _varint(len(packed)) + packed
                    field.vectors.float_vector.CopyFrom(schema_pb2.FloatArray.FromString(wire))
            resp = conn._stub.Insert(request=request, timeout=self.request_timeout, metadata=metadata)
            check_status(resp.status)
            if resp.insert_cnt != len(ids):
                raise DatabaseError(f"milvus: insert of {len(ids)} rows acknowledged {resp.insert_cnt}")
            ts_utils.update_collection_ts(self._spec().name, resp.timestamp, conn.server_address, "")
        return True

    def _request_like(self, rows: int) -> tuple[Any, Any, Any]:
        """(connection, an empty InsertRequest for ``rows`` rows, call metadata) from pymilvus's own."""
        from pymilvus.client.call_context import _api_level_md

        spec = self._spec()
        conn = self.client._get_connection()
        context = self.client._generate_call_context()
        if self._template is None or self._template[0] != spec.name:
            one = [{ID_FIELD: 0, VECTOR_FIELD: [0.0] * spec.dim}]
            template = conn._prepare_row_insert_request(spec.name, one, "", None, self.request_timeout)
            names = sorted(f.field_name for f in template.fields_data)
            if names != sorted([ID_FIELD, VECTOR_FIELD]) or template.fields_data[0].field_name != ID_FIELD:
                raise KeyError(f"unexpected fields {names}")
            for field in template.fields_data:  # keep the headers, drop the row
                if field.field_name == ID_FIELD:
                    field.scalars.long_data.ClearField("data")
                else:
                    field.vectors.float_vector.ClearField("data")
            self._template = (spec.name, template)
        request = type(self._template[1])()
        request.CopyFrom(self._template[1])
        request.num_rows = rows
        return conn, request, _api_level_md(context)

    def count(self) -> int:
        """Rows visible to a strongly consistent count query (deleted/replaced rows excluded)."""
        with _errors("count"):
            res = self.client.query(
                self._spec().name,
                filter="",
                output_fields=["count(*)"],
                consistency_level="Strong",
                timeout=self.request_timeout,
            )
        return int(res[0]["count(*)"])

    def wait_searchable(self, expected: int, timeout: float) -> None:
        """Flush, then poll the count (every 50 ms: upload time ends here) until it equals ``expected``."""
        deadline = time.monotonic() + timeout
        with _errors("flush"):
            self.client.flush(self._spec().name)
        while (seen := self.count()) != expected:
            if time.monotonic() > deadline:
                raise DatabaseError(
                    f"milvus: {seen} rows visible after {timeout:.0f}s, expected {expected} "
                    + (f"({expected - seen} missing)" if seen < expected else f"({seen - expected} too many)")
                )
            time.sleep(0.05)

    def build_index(self, timeout: float) -> None:
        """Replace the upload index by the spec's index, wait until every row is indexed, load."""
        spec = self._spec()
        name, c, target = spec.name, self.client, milvus_index_type(spec)
        deadline = time.monotonic() + timeout
        with _errors(f"build {target} index"):
            c.flush(name)
            current = c.describe_index(name, VECTOR_FIELD) if c.list_indexes(name) else {}
            wanted = {k: str(v) for k, v in build_params(spec, target).items()}  # as describe_index
            if any(current.get(k) != v for k, v in {"index_type": target, **wanted}.items()):
                c.release_collection(name)  # 2.3 refuses to drop the index of a loaded collection
                if current:
                    c.drop_index(name, VECTOR_FIELD)
                c.create_index(name, self._index_params(spec, target))
            while True:
                info = c.describe_index(name, VECTOR_FIELD)
                if info.get("state") == "Failed":
                    raise DatabaseError(f"milvus: index build failed: {info}")
                done = info.get("state") == "Finished" and info.get("pending_index_rows", 0) == 0
                if done and info.get("indexed_rows") == info.get("total_rows"):
                    break
                if time.monotonic() > deadline:
                    raise DatabaseError(f"milvus: index not finished after {timeout:.0f}s: {info}")
                time.sleep(0.5)
            c.load_collection(name, timeout=max(1.0, deadline - time.monotonic()))

    def search(self, queries: np.ndarray, k: int, ef: int | None) -> SearchResult:
        """One search request for the batch; ``ef`` is HNSW's ef (>= k), IVF's nprobe or DiskANN's
        search_list (>= k)."""
        spec = self._spec()
        self._check_dim(queries, "queries")
        s = self.settings
        params = index_search_params(spec, ef, k, s.default_ef, s.default_nprobe)
        search_params = {"metric_type": METRICS[spec.metric], "params": params}
        with _errors(f"search of {len(queries)} queries"):
            fast = self._packed_search(queries, k, search_params)
            if fast is not None:
                return fast
            res = self.client.search(
                spec.name,
                # Lists of floats: pymilvus packs a numpy row element by element (struct.pack(*row)), a
                # numpy scalar each, which costs more client CPU than the request's own encoding.
                data=np.asarray(queries, dtype=np.float32).tolist(),
                limit=k,
                search_params=search_params,
                consistency_level=self.settings.consistency_level,
                timeout=self.request_timeout,
            )
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.full((len(queries), k), np.nan, dtype=np.float32)
        for row, hits in enumerate(res):  # each query's hits carry their ids and distances as lists
            n = len(hits.ids)
            ids[row, :n], scores[row, :n] = hits.ids, hits.distances
        return SearchResult(ids=ids, scores=scores)

    def _packed_search(self, queries: np.ndarray, k: int, search_params: dict) -> SearchResult | None:
        """The search sent as pymilvus sends it, minus its per-call Python work; None: use the public call.

        pymilvus spends ~0.2 ms of client CPU per single-query search beyond gRPC's own (argument
        checks, the request built from dicts, each float packed, each hit wrapped), CPU taken from the
        server on a small machine. Here pymilvus prepares the request once per (collection, k, params);
        each call swaps in the placeholder values (the rows' float32 bytes, as pymilvus packs them), the
        query count and the guarantee timestamp (recomputed as pymilvus does for the consistency level),
        sends it with pymilvus's stub and call metadata, checks the status as pymilvus does and reads ids
        and scores (the distances pymilvus reports, unconverted) from the reply. A failed RPC is redone
        by the public call, which retries what pymilvus retries, except a timed-out one (a stalled server
        is reported after one request timeout, as a RequestTimeout).
        """
        if self._search_template is False or not len(queries):
            return None
        try:
            conn, request, header, context, api = self._search_request(k, search_params)
        except (AttributeError, ImportError, TypeError, KeyError, IndexError, ValueError) as exc:
            log.info("milvus: packed searches unavailable (%s); using MilvusClient.search", exc)
            self._search_template = False
            return None
        ts_utils, metadata, check_status, rpc_error = api
        request.placeholder_group = _placeholders(header, np.ascontiguousarray(queries, dtype="<f4"))
        request.nq = len(queries)
        level = {"consistency_level": self.settings.consistency_level}
        ts_utils.construct_guarantee_ts(
            request.collection_name, level, conn.server_address, context.get_db_name()
        )
        request.guarantee_timestamp = level["guarantee_timestamp"]
        try:
            resp = conn._stub.Search(request, timeout=self.request_timeout, metadata=metadata(context))
        except rpc_error as exc:
            if "DEADLINE_EXCEEDED" in str(getattr(exc, "code", lambda: "")()):
                raise  # a stalled server: one request timeout, not a second through the public call
            return None
        check_status(resp.status)
        return _search_result(resp.results, len(queries), k)

    def _search_request(self, k: int, search_params: dict) -> tuple[Any, ...]:
        """(connection, a copy of the SearchRequest pymilvus prepares for these parameters, the wire
        header of its placeholder value, the call context, the pymilvus/grpc functions the call uses)."""
        spec, client = self._spec(), self.client
        conn = client._get_connection()
        key = (spec.name, spec.dim, k, repr(search_params), self.settings.consistency_level)
        if not self._search_template or self._search_template[0] != key:
            self._search_template = (key, *self._search_template_for(conn, k, search_params))
        _, template, header, context, api = self._search_template
        request = type(template)()
        request.CopyFrom(template)
        return conn, request, header, context, api

    def _search_template_for(self, conn: Any, k: int, search_params: dict) -> tuple[Any, ...]:
        """MilvusClient.search's and GrpcHandler.search's own steps with one row as the data; raises
        (any of the errors ``_packed_search`` catches) when this pymilvus differs from what is expected."""
        import grpc
        from pymilvus.client import ts_utils
        from pymilvus.client.call_context import _api_level_md
        from pymilvus.client.prepare import Prepare
        from pymilvus.client.utils import check_status
        from pymilvus.grpc_gen import common_pb2

        spec, client = self._spec(), self.client
        kwargs = client._with_cluster_id({"consistency_level": self.settings.consistency_level})
        context = client._generate_call_context(**kwargs)
        default = ts_utils.construct_guarantee_ts(
            spec.name, kwargs, conn.server_address, context.get_db_name()
        )
        probe = np.arange(spec.dim, dtype=np.float32)[None] / 7  # any row: the check below compares bytes
        # The arguments GrpcHandler.search passes that differ from the defaults (no filter: expr "").
        args = {"expr": "", "use_default_consistency": default, **kwargs}
        template = Prepare.search_requests_with_expr(spec.name, "", search_params, k, probe.tolist(), **args)
        group = common_pb2.PlaceholderGroup.FromString(template.placeholder_group)
        value = group.placeholders[0]
        header = common_pb2.PlaceholderValue(tag=value.tag, type=value.type).SerializeToString()
        if _placeholders(header, probe) != template.placeholder_group:
            raise ValueError("pymilvus packs search vectors differently")
        return template, header, context, (ts_utils, _api_level_md, check_status, grpc.RpcError)

    def describe(self) -> StorageStats:
        """Count, loaded (sealed) segment count, index state and on-disk bytes of the data directory."""
        name = self._spec().name
        with _errors("describe"):
            loaded = self.client.list_loaded_segments(name)
            persistent = self.client.list_persistent_segments(name)
            index = self.client.describe_index(name, VECTOR_FIELD) if self.client.list_indexes(name) else {}
        data = Path(self.data_dir) if self.data_dir else None
        # Per part: etcd's WAL and rocksmq preallocate ~64 MB each, whatever the data size.
        parts = (
            {f"bytes_{p.name}": directory_bytes(p) for p in data.iterdir()} if data and data.is_dir() else {}
        )
        params = {k: v for k, v in index.items() if k in ("M", "efConstruction", "nlist", "m", "nbits")}
        return StorageStats(
            count=self.count(),
            segments=len(loaded),
            disk_bytes=directory_bytes(data) if parts else None,
            details={
                "persistent_segments": len(persistent),
                "segment_rows": sum(seg.num_rows for seg in loaded),  # replaced rows count until compaction
                "index_type": index.get("index_type"),
                "index_params": str(params),
                "indexed_rows": index.get("indexed_rows"),
                **parts,
            },
        )

    def close(self) -> None:
        """Close the gRPC channel."""
        self.client.close()
