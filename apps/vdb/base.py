"""The interface every vector-database adapter implements.

Two halves, because they live in different processes:

* a :class:`Deployment` starts (or connects to) the servers of one database and
  stops them; it runs in the pilot/deploy task and publishes :class:`Endpoints`;
* a :class:`Client` talks to a running deployment given its endpoints; insert and
  query stages create one per worker process (parallel clients are processes,
  not asyncio: batch conversion is CPU-bound, as the studies found).

Everything database-specific (ports, env vars, id mapping, index parameters,
how "searchable" and "steady state" are detected) stays inside the adapter module.
"""

from __future__ import annotations

import abc
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from core.config import Strict
from core.errors import PipelineError, describe, portable

log = logging.getLogger(__name__)

Metric = Literal["cosine", "ip", "l2"]
# Database-neutral index types; each database declares the ones it builds (``Database.index_types``).
# hnsw: graph in memory; ivf_flat / ivf_pq: inverted lists of raw / product-quantised vectors; ivf_hnsw_sq:
# inverted lists with an HNSW graph per list over scalar-quantised vectors (LanceDB); diskann: Vamana graph
# on disk; flat: exact scan; dynamic: flat, switching to HNSW past a size (Weaviate).
IndexType = Literal["hnsw", "ivf_flat", "ivf_pq", "ivf_hnsw_sq", "diskann", "flat", "dynamic"]
# Vector compression next to the index: none, scalar (int8), pq (product), bq (binary).
Quantization = Literal["none", "scalar", "pq", "bq"]
# The search-time knob ``Client.search(ef=...)`` sets, by index type (flat has none):
# HNSW-style graphs take it as ef, IVF indexes as nprobe (capped at the list count), DiskANN as search_list.
SEARCH_KNOB = {
    "hnsw": "ef",
    "dynamic": "ef",
    "ivf_flat": "nprobe",
    "ivf_pq": "nprobe",
    "ivf_hnsw_sq": "ef",  # LanceDB: HNSW ef inside each list; nprobes from its settings
    "diskann": "search_list",
}


class Endpoint(BaseModel):
    """One reachable server process (a rank of a cluster)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = 0
    host: str
    port: int
    grpc_port: int | None = None
    extra: dict[str, str | int] = Field(default_factory=dict)


class Endpoints(BaseModel):
    """What a deploy task publishes for the dependent insert/index/query tasks."""

    model_config = ConfigDict(extra="forbid")

    database: str
    nodes: list[Endpoint]
    data_dir: str
    server_version: str = ""
    log_paths: list[str] = Field(default_factory=list)
    # Set for in-process engines (qdrant-edge): clients must run in the deploying process.
    in_process: bool = False

    def entry(self, client_index: int = 0) -> Endpoint:
        """The node client number ``client_index`` connects to: ``nodes[client_index % len(nodes)]``.

        ``nodes`` are the entry ranks (Qdrant peers, Weaviate nodes, Milvus proxies), each of which serves
        any request; dealing clients round-robin over them keeps one rank from serving every client.
        """
        if not self.nodes:
            raise DatabaseError(f"{self.database}: the endpoints name no server")
        return self.nodes[client_index % len(self.nodes)]


class CollectionConfig(Strict):
    """The collection every database builds (database-neutral; adapters map it)."""

    name: str = Field("pes2o_ve", pattern=r"^[A-Za-z][A-Za-z0-9_]*$", description="Collection name.")
    index_type: IndexType = Field(
        "hnsw",
        description="Vector index: hnsw, ivf_flat, ivf_pq, ivf_hnsw_sq, diskann, flat or dynamic "
        "(each database builds the ones docs/vector-databases.md lists).",
    )
    hnsw_m: int = Field(16, ge=2, description="HNSW graph degree M.")
    ef_construction: int = Field(128, ge=8, description="HNSW ef_construction.")
    ivf_nlist: int = Field(128, ge=1, description="IVF lists (ivf_flat, ivf_pq, ivf_hnsw_sq).")
    pq_m: int = Field(16, ge=1, description="Product quantiser sub-vectors (ivf_pq, quantization: pq).")
    pq_bits: int = Field(8, ge=1, le=16, description="Bits per product-quantiser code.")
    quantization: Quantization = Field(
        "none", description="Vector compression beside the index: none, scalar (int8), pq or bq (binary)."
    )
    on_disk: bool = Field(
        False, description="Keep vectors (and the graph where possible) on disk, not in memory."
    )
    shards: int = Field(1, ge=1, description="Shards of the collection (spread over the cluster's nodes).")
    deferred_indexing: bool = Field(
        True, description="Upload first, build the index afterwards (the vendors' bulk-upload advice)."
    )
    options: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Database-specific knobs passed to the adapters (e.g. segment sizes).",
    )


class CollectionSpec(CollectionConfig):
    """Database-neutral description of the collection to create: ``vdb.collection`` (with its bounds) plus
    the dataset's dimension and the ground truth's metric."""

    dim: int = Field(ge=1, description="Vector dimension (the dataset's).")
    metric: Metric = Field("cosine", description="Distance the ground truth ranks by.")


class SearchResult(BaseModel):
    """Results of one batch of queries: ids are dataset row ids (-1 pads a short list)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    ids: np.ndarray  # (n_queries, k) int64
    scores: np.ndarray  # (n_queries, k) float32, as the database reports them


class StorageStats(BaseModel):
    """What ``describe`` reports about a collection after indexing."""

    model_config = ConfigDict(extra="forbid")

    count: int
    segments: int | None = None
    disk_bytes: int | None = None
    # Free-form; ``index_bytes`` / ``data_bytes`` (the footprint of the index and of the vectors and
    # payload) are recorded in the IndexRecord when a database gives them.
    details: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


class DatabaseError(PipelineError):
    """A database failed in a way the user must see (missing binary, failed start, lost rows)."""

    exit_code = 5


class RequestTimeout(DatabaseError):
    """A client request got no answer within the client's request timeout (a stalled server)."""


# Client methods whose errors are converted (see Client.__init_subclass__).
_CONVERTED = ("__init__", "create_collection", "insert", "insert_new", "wait_searchable", "build_index")
_CONVERTED += ("search",)
_CONVERTED += ("count", "describe", "close")
_TIMEOUT_WORDS = ("timed out", "timeout", "deadline")
_REQUESTS = ("__init__", "create_collection", "search", "count")  # single requests, bounded by the timeout


def _database_error(client: Any, method: str, exc: Exception, elapsed: float) -> Exception:
    """The picklable error a client method raises for ``exc`` (a client-library error, usually)."""
    limit = getattr(client, "request_timeout", None)
    waited = limit is not None and elapsed >= 0.9 * limit
    # A request of ours that failed only after the whole request timeout: the server did not answer.
    late = waited and method in _REQUESTS
    if late and isinstance(exc, DatabaseError) and not isinstance(exc, RequestTimeout):
        return RequestTimeout(str(exc))
    if isinstance(exc, PipelineError) or type(exc) in (ValueError, TypeError):  # ours: as they are
        return portable(exc)
    settings = getattr(client, "settings", None)
    name = getattr(settings, "name", type(client).__name__)
    timed_out = isinstance(exc, TimeoutError) or any(w in str(exc).lower() for w in _TIMEOUT_WORDS)
    # Elapsed time marks a stall only for a single request: an insert, index build or wait that fails
    # late is slow by nature, not stalled.
    timed_out = timed_out or (waited and method in _REQUESTS)
    kind = RequestTimeout if timed_out else DatabaseError
    return kind(f"{name}: {method.strip('_')} failed after {elapsed:.1f}s: {describe(exc)}"[:2000])


def _converting(method: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:
            log.debug("%s.%s failed", type(self).__name__, method, exc_info=True)
            raise _database_error(self, method, exc, time.monotonic() - started) from None

    call.__converting__ = True  # type: ignore[attr-defined]
    return call


class Deployment(abc.ABC):
    """Starts and stops the servers of one database (or attaches to existing ones)."""

    name: str
    # Why this server version opens listeners on every interface, when it can do nothing else ("": it must
    # not, and a run that sees one warns that it is reachable from other machines).
    wildcard_reason: str = ""
    # CPUs every server process this deployment starts on this machine is pinned to (None: not pinned);
    # set from vdb.cores_per_worker / vdb.bind (apps.vdb.binding) before ``start``.
    cpus: list[int] | None = None

    @abc.abstractmethod
    def start(self, workdir: Path, timeout: float = 120.0) -> Endpoints:
        """Start the servers with data and logs under ``workdir``; return when healthy.

        Raises DatabaseError with the tail of the server log when a start fails.
        """

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every process started by ``start``; safe to call twice or after a failed start."""

    def server_pids(self) -> dict[str, int]:
        """Name -> pid of each server process ``start`` launched on this machine (none when attached,
        in process, or running as a batch job elsewhere)."""
        return {}


class Client(abc.ABC):
    """Talks to one running deployment. Cheap to create; one per worker process.

    ``max_request_size`` is the most rows one ``insert`` call may carry (None: no limit). Clients never
    split a batch themselves, so the batch the insert stage sends is the request the database receives;
    the stage splits its batches to this size and records what it sent, and ``insert`` raises
    DatabaseError when handed more.

    Every public method (and ``__init__``) of a subclass raises only picklable errors: a client-library
    exception becomes DatabaseError (``RequestTimeout`` when the request timed out) with its type and
    message, inside the client's process, so it crosses pool and Parsl boundaries intact.
    ``request_timeout`` is the seconds one request may take (None: the library's default). ``rank`` is
    the rank of the entry node the client talks to (``Endpoints.entry``), recorded with its results.
    Clients connect to their database directly, never through the HTTP proxy of the environment
    (:mod:`apps.vdb.noproxy`).
    """

    request_timeout: float | None = None
    rank: int = 0
    # Requests the insert stage keeps in flight from one client process (> 1: building the next request
    # overlaps with the server's work on the previous one; the client must be thread-safe).
    insert_concurrency: int = 1
    # True when an inserted row is visible to search as soon as ``insert`` returns (an in-process engine):
    # the insert stage then times searchability from its own last request and a count.
    visible_on_return: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for method in _CONVERTED:
            fn = cls.__dict__.get(method)
            if fn is not None and not getattr(fn, "__converting__", False):
                setattr(cls, method, _converting(method, fn))

    @property
    def max_request_size(self) -> int | None:
        """Most rows one ``insert`` call may carry; None: no limit (the default)."""
        return None

    def check_request_size(self, rows: int, setting: str) -> None:
        """DatabaseError when ``rows`` exceed ``max_request_size`` (``setting`` names where it is set)."""
        limit = self.max_request_size
        if limit is not None and rows > limit:
            raise DatabaseError(
                f"insert of {rows} rows exceeds this client's max_request_size of {limit} ({setting}); "
                "split batches to client.max_request_size before insert()"
            )

    @abc.abstractmethod
    def create_collection(self, spec: CollectionSpec, *, recreate: bool = False) -> None:
        """Create the collection; if it exists with another dimension raise DatabaseError."""

    @abc.abstractmethod
    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Upsert a batch as one request. Idempotent: ids are deterministic, so a retry never duplicates.

        A batch larger than ``max_request_size`` raises DatabaseError (it is never split here).
        """

    def insert_new(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Insert rows known to be absent from the collection (the first attempt into an empty one).

        The default is :meth:`insert`; a database whose upsert costs more than a plain insert overrides it.
        """
        self.insert(ids, vectors)

    @abc.abstractmethod
    def wait_searchable(self, expected: int, timeout: float) -> None:
        """Block until ``expected`` vectors are visible to search (../shared/ARCHITECTURE.md: upload time)."""

    def wait_for_count(self, expected: int, timeout: float, poll_s: float, missing: str) -> None:
        """Poll ``count()`` until ``expected`` rows are there; DatabaseError after ``timeout`` seconds with
        ``missing`` formatted with ``seen``, ``expected`` and ``timeout`` (the database's own wording)."""
        deadline = time.monotonic() + timeout
        while (seen := self.count()) < expected:
            if time.monotonic() > deadline:
                raise DatabaseError(missing.format(seen=seen, expected=expected, timeout=timeout))
            time.sleep(poll_s)

    @abc.abstractmethod
    def build_index(self, timeout: float) -> None:
        """Trigger the (deferred) index build and block until steady state."""

    @abc.abstractmethod
    def search(self, queries: np.ndarray, k: int, ef: int | None) -> SearchResult:
        """Search a batch of queries (one request where the database allows it).

        ``ef`` is the index's search-breadth knob (``SEARCH_KNOB``): ef for HNSW-style graphs, nprobe for IVF
        (capped at the list count), search_list for DiskANN (raised to k); None: the engine's default.
        """

    @abc.abstractmethod
    def count(self) -> int:
        """Number of vectors in the collection."""

    @abc.abstractmethod
    def describe(self) -> StorageStats:
        """Count, segment count and on-disk bytes of the collection."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
